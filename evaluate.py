"""Score a text with a trained model: python evaluate.py --checkpoint out/tiny --text FILE (or --split val)

Every token is scored once, not a sample of random batches: windows of block_size
tokens move along the text by --stride (default block_size // 2), and each token is
predicted from as much context as its window gives, the method of Hugging Face's
perplexity guide. With --stride block_size the windows do not overlap and every token
after the first is scored once. Prints the loss (nats per token), perplexity, bits per
character and per UTF-8 byte (these two compare char and BPE models), and the counts;
--json prints them as one JSON object. Memory stays bounded however long the text.

A model trained on conversations (data/template.py) is scored by the rule it was trained by:
on a .jsonl file of conversations (--text), or its validation conversations (--split
val), the loss is over the assistant's tokens alone; and each conversation's last answer
is written by the model (greedy, up to its end-of-turn token or --max-new-tokens) and compared
with the reference as the template writes that turn, its text and its tool calls: the
exact-match accuracy, with the answers that call tools scored apart (the right tool, the right
arguments as JSON, the right text). --answers FILE.jsonl keeps each of them (the prompt,
the expected answer, the model's, its kind and its scores); --chat-template FILE scores a model with another
template, or one that has none (the base before fine-tuning).
A transformers model folder (as train.init_from reads it) is scored as it is: the base before
fine-tuning, with its own chat template, or with --chat-template default (the template
fine-tuning gives a model that has none, its markers added the same way).

Preference pairs (a .jsonl, Parquet or hf: source with "chosen" and "rejected", or a DPO run's
--split val; data/preferences.py) are scored as DPO measures them: each answer's implicit
reward β (log π − log π_ref) against a reference (--reference, else the run's train.init_from),
and over the pairs the share whose chosen answer gets the higher reward and the mean margin.
Exit codes: 0 ok, 2 bad input.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from tokenizers import Tokenizer

from cli.program import OneLineParser, UserError, check_output_folder, positive, run_main
from data.config import DataConfig
from data.shared import DataError
from interop.base_model import open_base_model, read_json, with_chat_markers
from jobs import Job, Scoring, job_for
from jobs.chat_data import DEFAULT
from machine.device import DTYPES, resolve_device, resolve_dtype
from machine.threads import AdaptiveThreads, adaptable, set_threads, thread_help
from model import GPT
from runs.folder import RunDir


def scored_model(checkpoint: Path, device) -> tuple[GPT, Tokenizer, str | None]:
    """The model, its tokenizer and its own chat template (None: it has none) of a run folder,
    or of a transformers model folder (Llama, Qwen2, GPT-2 or GPT-NeoX shaped, read as
    train.init_from reads it): the base before fine-tuning."""
    if (checkpoint / RunDir.MODEL_CONFIG).is_file() and "model_type" in read_json(checkpoint / RunDir.MODEL_CONFIG):
        base = open_base_model(str(checkpoint), label=f"--checkpoint {checkpoint}")
        model = GPT(base.config)
        model.load_state_dict(base.state_dict(base.config))
        return model.to(device), base.tokenizer(), base.chat_template()
    model, tokenizer = RunDir(checkpoint).load_model(device)
    return model, tokenizer, RunDir(checkpoint).chat_template()


def scored_job(args) -> Job:
    """The job of what is scored (jobs/): the file --text names, or the run's own data (--split val)."""
    if args.text is not None:  # (a file that is not there is a text's, refused where it is read)
        return job_for(DataConfig(source=str(args.text)))
    try:
        return job_for(RunDir(args.checkpoint).data_config())
    except UserError as e:
        raise UserError(f"--split val needs the run's data settings: {e}") from None


def evaluate(args) -> tuple[Job, dict]:
    """The job of what is scored, and its scores of the model (each kind by its own rule: jobs/)."""
    set_threads("evaluate", args.threads)
    threads = AdaptiveThreads(adaptable("evaluate", args.threads))
    device = resolve_device(args.device)
    job = scored_job(args)
    options = {"stride": args.stride, "answers": args.answers, "chat_template": args.chat_template,
               "max_new_tokens": args.max_new_tokens, "reference": args.reference}
    job.check_options(Scoring(args.checkpoint, args.text, args.batch_size, device, **options))
    if args.answers is not None:
        check_output_folder("--answers", args.answers)
    model, tokenizer, own_template = scored_model(args.checkpoint, device)
    if args.chat_template == DEFAULT:  # its markers come in as fine-tuning brings them in
        model, tokenizer = with_chat_markers(model, tokenizer)
    model = model.to(resolve_dtype(args.dtype, device, training=False)).eval()
    scoring = Scoring(args.checkpoint, args.text, args.batch_size, device, threads, own_template=own_template,
                      open_model=scored_model, **options)
    start = time.perf_counter()
    result = job.evaluate(model, tokenizer, scoring)
    return job, {**result, "seconds": time.perf_counter() - start}


def command(args) -> int:
    job, result = evaluate(args)
    figures, lines = job.report(result, "the validation split" if args.split else str(args.text))
    print(json.dumps(figures) if args.json else "\n".join(lines))
    return 0


def parse_args(argv):
    p = OneLineParser(prog="evaluate.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", type=Path, required=True, help="run directory, e.g. out/tiny, or a transformers "
                   "model folder")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--text", type=Path, help="a UTF-8 text file to score")
    which.add_argument("--split", choices=["val"], help="the run's own validation split")
    p.add_argument("--stride", type=int, help="how far each window moves (default block_size // 2)")
    p.add_argument("--batch-size", type=int, default=16, help="windows per forward pass")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or mps")
    p.add_argument("--dtype", default="auto", choices=["auto", *DTYPES],
                   help="the weights' dtype while scoring (auto: bfloat16 on a GPU that has it, else float32)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--answers", type=Path, metavar="FILE.jsonl", help="conversations: write each last answer, with "
                   "its prompt, the expected one, its kind (text or tool calls) and its scores, a JSON line each")
    p.add_argument("--chat-template", metavar="FILE", help="conversations: the Jinja chat template to use instead "
                   f"of the model's, or {DEFAULT}: the template a model without one is given when it is fine-tuned, "
                   "its markers added the same way: the base as fine-tuning starts it")
    p.add_argument("--max-new-tokens", type=positive, metavar="N", help="conversations: the most tokens a written "
                   "answer may have (default: twice the longest expected answer with its end of turn, at least 16, "
                   "at most the context)")
    p.add_argument("--reference", type=Path, metavar="DIR", help="preference pairs: the model each answer's reward "
                   "is measured from (default: the run's train.init_from, where it tuned from one)")
    p.add_argument("--threads", type=positive, help=thread_help("evaluate"))
    p.add_argument("--debug", action="store_true", help="show full tracebacks")
    args = p.parse_args(argv)
    if args.batch_size < 1:
        p.error(f"--batch-size={args.batch_size}: must be at least 1")
    return args


def main(argv=None) -> int:
    return run_main(parse_args, command, argv, {UserError: 2, DataError: 2})


if __name__ == "__main__":
    sys.exit(main())
