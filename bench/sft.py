"""Fine-tuning beside trl: the speed and the memory of the same LoRA job here and in trl's
SFTTrainer (with peft), with and without trl's gradient checkpointing (its default is on).

The practitioner's job (docs/usage.md): function calls (data/tasks.py's weather: a system
prompt, the tools, the assistant's call, the tool's reply, the answer) mixed with sums; a random
Qwen2-shaped base with its own byte-level BPE and a ChatML template with tools, whose
{% generation %} blocks mark the answers, so that both train on the same tokens (this project
reads the blocks; trl's assistant_only_loss reads them too); LoRA of rank 8 (alpha 16, no
dropout) on every matrix of the blocks; packing (best-fit here; trl's "bfd"); the same rows of
the same context, the same steps at a constant rate, float32, one thread; each side with and
without recomputing its activations in the backward pass (train.checkpointing; trl's
gradient_checkpointing). Each job runs in its own process: its real tokens a second in
training (what each logged interval measured, the first left out: both sides log every 5
steps), its whole wall time (loading and preparing the data included) and its peak memory
(the kernel's VmHWM).

    pip install trl
    python -m bench.sft [--steps 40] [--count 3000] [--quick]
    python -m bench.sft --write DIR      the base and the conversations alone, to try by hand
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from bench.common import machine, save, table
from bench.memory import peak_of
from data.tasks import WEATHER_TOOL

# ChatML with tools (Qwen2's way of writing calls), its answers in {% generation %} blocks
TEMPLATE = (
    "{{ '<|im_start|>system\\n' + (messages[0]['content'] if messages[0]['role'] == 'system' else '') }}"
    "{% if tools %}{{ '\\n# Tools\\n' }}{% for tool in tools %}{{ tool | tojson + '\\n' }}{% endfor %}{% endif %}"
    "{{ '<|im_end|>\\n' }}"
    "{% for message in messages %}{% if message['role'] == 'assistant' %}{{ '<|im_start|>assistant\\n' }}"
    "{% generation %}{{ message['content'] or '' }}{% for call in message['tool_calls'] or [] %}"
    "{{ '<tool_call>' + {'name': call['function']['name'], 'arguments': call['function']['arguments']} | tojson"
    " + '</tool_call>' }}{% endfor %}{{ '<|im_end|>' }}{% endgeneration %}{{ '\\n' }}"
    "{% elif message['role'] != 'system' %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>\\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
SHAPE = dict(hidden_size=256, intermediate_size=704, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2)
CONTEXT = 512
ROWS = 8  # packed rows a step
RANK, ALPHA, LR = 8, 16, 1e-3


def job_conversations(count: int, seed: int = 0) -> list[dict]:
    """Function calls (data/tasks.py's weather: a system prompt, the tools, the assistant's call,
    the tool's reply, the answer) and sums, one of each in turn."""
    from data.tasks import conversations as made

    calls, sums = made("weather", (count + 1) // 2, seed), made("add", count // 2, seed)
    return [record for pair in zip(calls, sums + [None]) for record in pair if record is not None]


def make_base(folder: Path, records: list[dict]) -> None:
    """A random Qwen2-shaped model with a byte-level BPE trained on the conversations, and the template."""
    import torch
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    texts = [m["content"] for r in records for m in r["messages"]] + [json.dumps(WEATHER_TOOL), "<tool_call></tool_call>"]
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=1024, special_tokens=SPECIAL,
                                                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                             show_progress=False))
    end = tokenizer.token_to_id("<|im_end|>")
    config = transformers.Qwen2Config(vocab_size=tokenizer.get_vocab_size(), max_position_embeddings=CONTEXT,
                                      tie_word_embeddings=True, eos_token_id=end, **SHAPE)
    torch.manual_seed(0)
    transformers.Qwen2ForCausalLM(config).save_pretrained(folder)
    wrapped = transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|im_end|>",
                                                   pad_token="<|endoftext|>", chat_template=TEMPLATE)
    wrapped.save_pretrained(folder)


def trained_here(base: Path, data: Path, out: Path, steps: int, every: int, checkpointing: bool = False) -> dict:
    """This project's train.py on the job, in a process of its own (train.checkpointing: as trl's)."""
    command = [sys.executable, "train.py", "--config", "configs/chat.yaml", f"out_dir={out}", f"data.source={data}",
               f"data.cache_dir={out.parent / 'cache'}", f"train.init_from={base}", f"model.block_size={CONTEXT}",
               f"lora.rank={RANK}", f"lora.alpha={ALPHA}", "lora.dropout=0", f"train.lr={LR}", f"train.min_lr={LR}",
               "train.warmup_iters=0", f"train.max_iters={steps}", f"train.batch_size={ROWS}", "train.packing=true",
               "train.eval_interval=1000000", "train.eval_windows=8", "train.snapshots=0", "train.dtype=float32",
               "train.threads=1", "train.max_minutes=null", f"train.log_interval={every}", "train.grad_clip=1.0",
               f"train.checkpointing={str(checkpointing).lower()}"]
    return measured_here(command, out)


def measured_here(command: list[str], out: Path) -> dict:
    """train.py's command run in a process of its own: its real tokens a second (the logged
    intervals, the first left out), its tokens, its wall time and its peak memory."""
    peak, _, wall = peak_of(command)
    logged = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    speeds = [row["train/tokens_per_sec"] for row in logged if "train/tokens_per_sec" in row][1:]
    summary = json.loads((out / "summary.json").read_text())
    return {"tokens_per_second": sum(speeds) / len(speeds), "tokens": summary["tokens"], "wall_seconds": wall,
            "peak_mb": peak}


def trained_in_trl(base: Path, data: Path, out: Path, steps: int, every: int, checkpointing: bool) -> dict:
    """trl's SFTTrainer with peft on the job, in a process of its own (this module's --child)."""
    result = out / "result.json"
    peak, _, wall = peak_of([sys.executable, "-m", "bench.sft", "--child", str(base), str(data), str(result),
                             str(steps), str(every), str(int(checkpointing))])
    return {**json.loads(result.read_text()), "wall_seconds": wall, "peak_mb": peak}


def child(base: str, data: str, result: str, steps: int, every: int, checkpointing: bool) -> None:
    """The trl run: SFTConfig as the job asks (its defaults otherwise), on one thread."""
    import torch

    torch.set_num_threads(1)
    import datasets
    import peft
    import transformers
    import trl

    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_file=str(Path(base) / "tokenizer.json"),
                                                     eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tokenizer.chat_template = TEMPLATE  # (the folder's tokenizer as it is: transformers would read a qwen2 folder's
    # tokenizer as its Qwen2Tokenizer, which splits text another way)
    model = transformers.AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    records = [json.loads(line) for line in Path(data).read_text().splitlines()]
    dataset = datasets.Dataset.from_list([{"messages": r["messages"], "tools": json.dumps(r.get("tools"))}
                                          for r in records])
    config = trl.SFTConfig(output_dir=str(Path(result).parent / "trl"), max_steps=steps, per_device_train_batch_size=ROWS,
                           max_length=CONTEXT, packing=True, assistant_only_loss=True, learning_rate=LR,
                           lr_scheduler_type="constant", warmup_steps=0, gradient_checkpointing=checkpointing,
                           bf16=False, use_cpu=True, report_to="none", save_strategy="no", logging_steps=every,
                           dataloader_num_workers=0, seed=0)
    lora = peft.LoraConfig(r=RANK, lora_alpha=ALPHA, lora_dropout=0.0, target_modules="all-linear",
                           task_type="CAUSAL_LM")
    timed_in_trl(lambda callbacks: trl.SFTTrainer(model=model, args=config, train_dataset=dataset,
                                                  processing_class=tokenizer, peft_config=lora, callbacks=callbacks),
                 result)


def timed_in_trl(make_trainer, result: str) -> None:
    """A trl trainer (make_trainer(its callbacks)) trained, and its real tokens a second (trl's
    num_tokens at each logging step, the first interval left out, as here) written to result."""
    import transformers

    logged = []  # (when, real tokens so far) at each logging step

    class Clock(transformers.TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "num_tokens" in logs:
                logged.append((time.perf_counter(), logs["num_tokens"]))

    metrics = make_trainer([Clock()]).train().metrics
    (start, before), (end, after) = logged[0], logged[-1]
    Path(result).write_text(json.dumps({"tokens_per_second": (after - before) / (end - start), "tokens": after,
                                        "train_seconds": metrics["train_runtime"]}))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--child", nargs=6, metavar=("BASE", "DATA", "RESULT", "STEPS", "EVERY", "CHECKPOINTING"),
                   help=argparse.SUPPRESS)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--count", type=int, default=3000)
    p.add_argument("--quick", action="store_true", help="a few steps on a few conversations (to check the script)")
    p.add_argument("--out")
    p.add_argument("--write", type=Path, metavar="DIR", help="write the job's base (DIR/base) and conversations "
                   "(DIR/calls.jsonl) and stop, to try them by hand (docs/usage.md)")
    args = p.parse_args()
    if args.child:
        base, data, result, steps, every, checkpointing = args.child
        return child(base, data, result, int(steps), int(every), bool(int(checkpointing)))
    if args.write is not None:
        records = job_conversations(args.count)
        args.write.mkdir(parents=True, exist_ok=True)
        (args.write / "calls.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
        make_base(args.write / "base", records)
        return print(f"wrote {args.write / 'base'} and {args.write / 'calls.jsonl'} ({len(records)} conversations)")
    try:
        import trl
    except ImportError:
        raise SystemExit("this benchmark compares with trl: pip install trl") from None
    steps, count, every = (6, 100, 2) if args.quick else (args.steps, args.count, 5)  # (every: steps a log)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        records = job_conversations(count)
        data = tmp / "calls.jsonl"
        data.write_text("".join(json.dumps(r) + "\n" for r in records))
        make_base(tmp / "base", records)
        env_threads = os.environ.get("OMP_NUM_THREADS")
        results = {"here": trained_here(tmp / "base", data, tmp / "here", steps, every),
                   "here, checkpointing on": trained_here(tmp / "base", data, tmp / "here-checkpointing", steps, every, True),
                   "trl, checkpointing on (its default)": trained_in_trl(tmp / "base", data, tmp, steps, every, True),
                   "trl, checkpointing off": trained_in_trl(tmp / "base", data, tmp, steps, every, False)}
    rows = [[name, r["tokens_per_second"], r["wall_seconds"], r["peak_mb"]] for name, r in results.items()]
    print(table(["job", "real tokens/s in training", "wall s (all of it)", "peak MB"], rows))
    for mine, other in (("here", "trl, checkpointing off"), ("here, checkpointing on", "trl, checkpointing on (its default)")):
        a, b = results[mine], results[other]
        print(f"{mine} / {other}: {a['tokens_per_second'] / b['tokens_per_second']:.2f}x the tokens a second, "
              f"{a['peak_mb'] / b['peak_mb']:.2f}x the peak memory")
    path = save("sft", {"machine": machine(1), "trl": trl.__version__, "steps": steps, "conversations": count,
                        "rows": ROWS, "context": CONTEXT, "shape": SHAPE, "omp_num_threads": env_threads,
                        "results": results}, args.out)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
