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
Exit codes: 0 ok, 2 bad input.
"""

from __future__ import annotations

import json
import math
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer
from tqdm import tqdm

from common.cli import OneLineParser, UserError, check_output_folder, positive, run_main
from common.device import DTYPES, resolve_device, resolve_dtype
from common.run_dir import RunDir
from common.threads import AdaptiveThreads, adaptable, set_threads, thread_help
from common.chat import replies, run_template
from data.batches import IGNORE, conversation_rows, in_memory
from data.config import DataConfig
from data.conversations import chat_source
from data.prepare import validation_tokens
from data.readers import check_readable
from data.shared import DataError
from data.template import ChatTemplate, chat_tokenizer, encode, prompt_ids, template_for, turn_ends
from data.tool_calls import compare_turn
from data.tokenizer import Encoder, start_ids, unknown_characters
from interop.base_model import open_base_model, read_json, with_chat_markers
from model import GPT
from model.files import write_atomic

CHUNK = 1 << 20  # characters read (or tokens taken) at a time
PROGRESS_BYTES = 1 << 20  # a text this long shows a progress bar while it is scored

DEFAULT = "default"  # --chat-template default: the template fine-tuning gives a model that has none


def text_chunks(path: Path, counts: dict) -> Iterator[str]:
    """The file in pieces of CHUNK characters, counting the characters and UTF-8 bytes
    as they go by. (Encoder.feed puts the cuts where they cannot change the tokens.)
    Newlines are read as training reads a .txt source: \r\n and \r become \n, so a
    char model trained on a Windows text can score that text."""
    with open(path, encoding="utf-8") as f:
        while block := f.read(CHUNK):
            counts["characters"] += len(block)
            counts["bytes"] += len(block.encode("utf-8"))
            yield block


def check_text(path: Path, tokenizer) -> None:
    """A readable, non-empty UTF-8 file whose characters the tokenizer knows."""
    if not path.is_file():
        raise UserError(f"--text {path} does not exist")
    check_readable(path, "text")
    unknown: dict[str, int] = {}
    for chunk in text_chunks(path, {"characters": 0, "bytes": 0}):
        for ch in unknown_characters(tokenizer, chunk):
            unknown[ch] = unknown.get(ch, 0) + chunk.count(ch)
    if unknown:
        shown = " ".join(repr(ch) for ch in sorted(unknown, key=unknown.get, reverse=True)[:5])
        raise UserError(f"{path} has {sum(unknown.values()):,} characters the model's tokenizer never saw "
                        f"({len(unknown)} distinct, e.g. {shown}); a char model scores only text made of "
                        "its training characters")


def scored_windows(chunks: Iterable[np.ndarray], block_size: int, stride: int) -> Iterator[tuple[np.ndarray, int]]:
    """(tokens of one window, how many of its last targets to score), along a stream of
    token arrays. Inputs are window[:-1], targets window[1:]; target j (the token after
    j) is scored in the first window that ends past it, so each is scored exactly once."""
    buffer, start = np.empty(0, dtype=np.int64), 0  # buffer[0] is token number `start`
    begin = scored = 0  # this window's first input; targets before `scored` are done
    for chunk in chunks:
        buffer = np.concatenate([buffer, chunk])
        while start + len(buffer) >= begin + block_size + 1:  # a full window is here
            end = begin + block_size
            yield buffer[begin - start:end + 1 - start], end - scored
            scored, begin = end, begin + stride
            buffer, start = buffer[begin - start:], begin
    end = start + len(buffer) - 1  # the last target of the text
    if end > scored:
        yield buffer[max(0, begin - start):], end - scored


@torch.no_grad()
def score(model, windows: Iterable[tuple[np.ndarray, int]], batch_size: int, device,
          threads: AdaptiveThreads | None = None) -> tuple[float, int]:
    """(sum of the negative log-likelihoods, number of tokens scored), in batches of
    windows of one length (only the last window of a text may be shorter); `threads`
    keeps to the thread count that scores faster now (common/threads.py)."""
    total, count, batch, batches = 0.0, 0, [], 0

    def run(batch) -> float:
        tokens = torch.from_numpy(np.stack([w for w, _ in batch])).to(device)  # [B, L + 1]
        targets = tokens[:, 1:].clone()
        for row, (_, n) in enumerate(batch):
            targets[row, :targets.size(1) - n] = -100  # context only, scored in an earlier window
        logits, _ = model(tokens[:, :-1])
        return model.loss(logits, targets, reduction="sum").item()

    for window in windows:
        if batch and (len(batch) == batch_size or len(window[0]) != len(batch[0][0])):
            total += run(batch)
            batch = []
            batches += 1
            if threads is not None and batches % 8 == 0:
                threads.update(batches)
        batch.append(window)
        count += window[1]
    if batch:
        total += run(batch)
    return total, count


def text_source(path: Path, tokenizer, counts: dict) -> Iterator[np.ndarray]:
    check_text(path, tokenizer)
    encode = Encoder(tokenizer)
    yield np.asarray(start_ids(tokenizer), dtype=np.int64)  # a Llama tokenizer's BOS: as training's documents
    bar = tqdm(total=path.stat().st_size, unit="B", unit_scale=True, desc="scoring", file=sys.stderr,
               disable=path.stat().st_size < PROGRESS_BYTES)
    for chunk in text_chunks(path, counts):
        bar.update(len(chunk.encode("utf-8")))
        yield encode.feed(chunk)
    yield encode.flush()
    bar.close()


def val_source(checkpoint: Path, tokenizer, counts: dict, scratch: Path) -> Iterator[np.ndarray]:
    """The run's validation tokens: its own token files where they are still in the cache
    (config.yaml says where), else the validation text alone, encoded into `scratch`."""
    try:
        data_config = RunDir(checkpoint).data_config()
    except UserError as e:
        raise UserError(f"--split val needs the run's data settings: {e}") from None
    tokens, sizes, cached = validation_tokens(data_config, tokenizer, scratch)
    if not cached:
        print(f"encoded the validation text of {data_config.source} with the run's tokenizer "
              "(the run's token files are not in the cache)", file=sys.stderr)
    counts.update(sizes)
    for start in range(0, len(tokens), CHUNK):
        yield tokens[start:start + CHUNK]  # (windows gathers them into int64)


def conversations_to_score(args) -> list[tuple[list[dict], list[dict] | None]] | None:
    """The conversations --text or --split val names, each (messages, tools) (None: plain text);
    the bad records among them skipped by the rule training skips them by (data.skip_bad_records),
    and said."""
    if args.text is not None:
        parts = [DataConfig(source=str(args.text))]
    else:
        try:
            data_config = RunDir(args.checkpoint).data_config()
        except UserError as e:
            raise UserError(f"--split val needs the run's data settings: {e}") from None
        parts = [part for part, _ in data_config.parts()] if data_config.sources is not None else [data_config]
    held_out = []
    for part in parts:  # (a mixture's every source)
        source = chat_source(part)
        if source is None:
            return None
        records = source.everything() if args.text is not None else source.val()
        held_out += [(messages, tools) for _, messages, tools in records]
        if source.skipped.count:
            print(f"note: {source.skipped.count:,} of {source.skipped.seen:,} conversations of {source.label} are bad "
                  f"and skipped: {source.skipped.said()}", file=sys.stderr)
    return held_out


def last_answer(tokenizer, template: ChatTemplate, messages: list[dict], tools: list[dict] | None) -> tuple[int, list[int]]:
    """(the index of a conversation's last assistant message, its tokens as the model is taught
    to write them): the template's text for that turn (its content and its calls), up to its
    end-of-turn token, which is left out as a reply leaves it out."""
    last = max(i for i, message in enumerate(messages) if message["role"] == "assistant")
    ids, mask = encode(tokenizer, template, messages[:last + 1], tools)
    flagged = np.flatnonzero(mask)
    first = flagged[-1]
    while first > 0 and mask[first - 1]:  # (back to the start of the last run of the assistant's tokens)
        first -= 1
    answer = ids[first:flagged[-1] + 1].tolist()
    return last, answer[:-1] if answer and answer[-1] in turn_ends(tokenizer) else answer


def answer_cap(expected: list[list[int]], block_size: int) -> int:
    """--max-new-tokens' default: twice the longest expected answer with its end-of-turn token
    (at least 16 tokens, at most the context), so that a model that never ends its turn (a base
    before fine-tuning) is cut where no right answer could still be coming."""
    return min(block_size, max(16, 2 * (max(map(len, expected), default=0) + 1)))


@torch.no_grad()
def score_conversations(model, tokenizer, template: ChatTemplate,
                        conversations: list[tuple[list[dict], list[dict] | None]], batch_size: int, device,
                        max_new_tokens: int | None = None) -> dict:
    """The loss over the assistant's tokens (each conversation cut to block_size + 1 tokens,
    as training cuts it), and each conversation's last answer written by the model (greedy, to
    its end-of-turn token or max_new_tokens, default answer_cap) against the one expected,
    both as the template writes the turn: its text and its tool calls (data/tool_calls.py).
    conversations: (messages, the tools they may call) each."""
    block = model.config.block_size
    rows = in_memory([encode(tokenizer, template, messages, tools) for messages, tools in conversations])
    nll, scored = 0.0, 0
    for start in range(0, len(rows), batch_size):
        x, y, _ = conversation_rows(rows, range(start, min(start + batch_size, len(rows))), block)
        logits, _ = model(x.to(device))
        y = y.to(device)
        nll += model.loss(logits, y, reduction="sum").item()
        scored += int((y != IGNORE).sum())
    lasts = [last_answer(tokenizer, template, messages, tools) for messages, tools in conversations]
    cap = max_new_tokens or answer_cap([expected for _, expected in lasts], block)
    answers = []
    progress = tqdm(total=len(conversations), unit="answer", desc="answers", file=sys.stderr, leave=False)
    for start in range(0, len(conversations), batch_size):  # the last answers, written batch_size at a time
        batch = list(zip(conversations[start:start + batch_size], lasts[start:start + batch_size]))
        prompts = [prompt_ids(tokenizer, template, messages[:last], tools)[-block:]
                   for (messages, tools), (last, _) in batch]
        for written, ((messages, tools), (last, expected)) in zip(replies(model, prompts, turn_ends(tokenizer), cap),
                                                                  batch):
            got, wanted = tokenizer.decode(written), tokenizer.decode(expected)
            answers.append({"prompt": messages[:last], **({"tools": tools} if tools else {}), "expected": wanted,
                            "got": got, **compare_turn(wanted, got, messages[last].get("tool_calls")),
                            "at_the_cap": len(written) >= cap})
        progress.update(len(batch))
    progress.close()
    return {"loss": nll / max(scored, 1), "answer_tokens": scored, "conversations": len(conversations),
            "exact_match": sum(a["right"] for a in answers) / len(conversations), "answers": answers,
            "max_new_tokens": cap, "at_the_cap": sum(a["at_the_cap"] for a in answers),
            **answer_kinds(answers)}


def answer_kinds(answers: list[dict]) -> dict:
    """The scores of text answers and of answers that call tools, apart: how many, how many right,
    and for the calls the share with the right names, arguments and text around them."""
    def share(items: list[dict], right) -> float | None:
        return sum(1 for item in items if right(item)) / len(items) if items else None

    text = [a for a in answers if a["kind"] == "text"]
    calls = [a for a in answers if a["kind"] == "tool_call"]
    return {"text_answers": {"count": len(text), "exact_match": share(text, lambda a: a["right"])},
            "tool_call_answers": {"count": len(calls), "exact_match": share(calls, lambda a: a["right"]),
                                  **{key: share(calls, lambda a, key=key: a["calls"][key])
                                     for key in ("name_right", "arguments_right", "text_right")},
                                  "template_writes_json": all(a["calls"]["template_writes_json"] for a in calls)}}


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


def chosen_template(args, tokenizer, own: str | None) -> ChatTemplate:
    """--chat-template's (a file, or `default`: the template fine-tuning gives a model that has
    none), else the model's own, else a one-line refusal."""
    if args.chat_template == DEFAULT:
        return template_for(chat_tokenizer(tokenizer))
    if args.chat_template is not None:  # (another template, or one for a model that has none)
        return template_for(tokenizer, read_template(Path(args.chat_template)), f"--chat-template {args.chat_template}")
    return run_template(args.checkpoint, tokenizer, own, otherwise=f"conversations are scored with --chat-template "
                        f"{DEFAULT} (the template fine-tuning gives it) or --chat-template FILE")


def evaluate_conversations(args, model, tokenizer, template: ChatTemplate, conversations, device) -> dict:
    start = time.perf_counter()
    result = score_conversations(model, tokenizer, template, conversations, args.batch_size, device,
                                 args.max_new_tokens)
    if args.answers is not None:
        lines = "".join(json.dumps(answer, ensure_ascii=False) + "\n" for answer in result["answers"])
        write_atomic(args.answers, lines.encode())
    return {**result, "perplexity": math.exp(min(result["loss"], 50)), "seconds": time.perf_counter() - start}


def read_template(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"--chat-template {path} cannot be read ({e}); give a UTF-8 Jinja file") from None


def check_conversation_options(args, conversations) -> None:
    """--answers, --chat-template and --max-new-tokens are for conversations; --answers never
    overwrites a file."""
    if conversations is None:
        for option, value in (("--answers", args.answers), ("--chat-template", args.chat_template),
                              ("--max-new-tokens", args.max_new_tokens)):
            if value is not None:
                raise UserError(f"{option} is for conversations (a .jsonl of them, or a chat run's --split val); "
                                f"{args.text or 'the validation split'} is plain text")
    if args.answers is not None:
        check_output_folder("--answers", args.answers)
        if args.answers.exists():
            raise UserError(f"--answers {args.answers} already exists; choose another file name")


def evaluate(args) -> dict:
    set_threads("evaluate", args.threads)
    threads = AdaptiveThreads(adaptable("evaluate", args.threads))
    device = resolve_device(args.device)
    conversations = conversations_to_score(args)
    check_conversation_options(args, conversations)
    model, tokenizer, own_template = scored_model(args.checkpoint, device)
    if conversations is not None:
        template = chosen_template(args, tokenizer, own_template)
        if args.chat_template == DEFAULT:  # its markers come in as fine-tuning brings them in
            model, tokenizer = with_chat_markers(model, tokenizer)
        model = model.to(resolve_dtype(args.dtype, device, training=False)).eval()
        return evaluate_conversations(args, model, tokenizer, template, conversations, device)
    model = model.to(resolve_dtype(args.dtype, device, training=False)).eval()
    block = model.config.block_size
    stride = max(1, block // 2) if args.stride is None else args.stride
    if not 1 <= stride <= block:
        raise UserError(f"--stride={stride}: must be between 1 and block_size={block}")
    counts = {"characters": 0, "bytes": 0}
    # (a memory-mapped file that Windows may still hold open when the folder goes: ignore_cleanup_errors)
    with tempfile.TemporaryDirectory(prefix="evaluate-", ignore_cleanup_errors=True) as scratch:
        chunks = val_source(args.checkpoint, tokenizer, counts, Path(scratch)) if args.split else \
            text_source(args.text, tokenizer, counts)
        start = time.perf_counter()
        nll, tokens = score(model, scored_windows(chunks, block, stride), args.batch_size, device, threads)
        chunks.close()  # lets go of the tokens' file
    if tokens == 0:
        raise UserError(f"{args.text or 'the validation split'} is too short to score: it needs at least 2 tokens")
    loss = nll / tokens
    return {"loss": loss, "perplexity": math.exp(min(loss, 50)), "bits_per_char": nll / math.log(2) / counts["characters"],
            "bits_per_byte": nll / math.log(2) / counts["bytes"], "tokens": tokens, **counts,
            "seconds": time.perf_counter() - start, "stride": stride, "block_size": block}


def command(args) -> int:
    r = evaluate(args)
    what = "the validation split" if args.split else str(args.text)
    if "exact_match" in r:
        if args.json:
            print(json.dumps({k: r[k] for k in ("loss", "perplexity", "answer_tokens", "conversations", "exact_match",
                                                "text_answers", "tool_call_answers", "max_new_tokens", "at_the_cap")}))
            return 0
        print(f"{what}: {r['conversations']:,} conversations, {r['answer_tokens']:,} answer tokens scored in "
              f"{r['seconds']:.1f} s")
        print(f"loss {r['loss']:.4f} nats/answer token | perplexity {r['perplexity']:.3f} | exact match of the "
              f"last answer {r['exact_match']:.1%}")
        for line in answer_lines(r):
            print(line)
        return 0
    if args.json:
        print(json.dumps({k: r[k] for k in ("loss", "perplexity", "bits_per_char", "bits_per_byte", "tokens",
                                            "characters", "bytes")}))
        return 0
    print(f"{what}: {r['tokens']:,} tokens scored ({r['characters']:,} characters, {r['bytes']:,} bytes) in "
          f"{r['seconds']:.1f} s, {r['tokens'] / max(r['seconds'], 1e-9):,.0f} tokens/s; windows of "
          f"{r['block_size']} tokens moved by {r['stride']}")
    print(f"loss {r['loss']:.4f} nats/token | perplexity {r['perplexity']:.3f} | "
          f"{r['bits_per_char']:.4f} bits/char | {r['bits_per_byte']:.4f} bits/byte")
    return 0


def answer_lines(r: dict) -> list[str]:
    """The last answers by kind (text, tool calls), and how many the cap on their length cut."""
    text, calls = r["text_answers"], r["tool_call_answers"]
    lines = []
    if calls["count"] and text["count"]:
        lines.append(f"text answers: {text['count']:,}, exact match {text['exact_match']:.1%}")
    if calls["count"]:
        lines.append(f"answers that call tools: {calls['count']:,}, exact match {calls['exact_match']:.1%} | the "
                     f"right tool {calls['name_right']:.1%} | the right arguments (as JSON) {calls['arguments_right']:.1%}"
                     f" | the right text around the calls {calls['text_right']:.1%}")
        if not calls["template_writes_json"]:
            lines.append("note: the chat template writes some calls in a form other than JSON; those calls are "
                         "compared as text only (data/tool_calls.py)")
    cut = r["at_the_cap"]
    lines.append(f"answers written up to {r['max_new_tokens']:,} tokens (--max-new-tokens): "
                 + (f"{cut:,} of {r['conversations']:,} reached it without ending their turn" if cut
                    else "every answer ended its turn before it"))
    return lines


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
