"""Fine-tuning a model brought in, every weight or LoRA's adapters alone: what each
teaches, and what each costs.

1. What it teaches (docs/usage.md): from a base run (--base, e.g. the quick start's
   out/tiny), fine-tuned on a made-up instruction set (data/tasks.py, --task, --count
   conversations, the last tenth held out) for --iters iterations, full (configs/chat.yaml)
   and with LoRA (rank 8, at a learning rate of 3e-3): the held-out exact-match accuracy of the answers before fine-tuning (the base
   model with the chat markers' new embedding rows, where fine-tuning starts) and after
   each, with evaluate.py's rule, and the loss on the answers.
2. What it costs (docs/performance.md): a model of about 10 M parameters (6 layers × 384,
   random weights, saved as a run folder with a char tokenizer) fine-tuned on the built-in
   Shakespeare for --cost-iters iterations, full and with LoRA, each in a child process:
   its peak memory (the kernel's VmHWM) and tokens per second of training.

    python -m bench.finetune [--base out/tiny] [--task add] [--iters 1500] [--quick]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from bench.common import ROOT, machine, save, table
from bench.memory import peak_of

CONFIG = ["--config", "configs/chat.yaml", "train.snapshots=0", "train.dtype=float32"]  # the docs' recipe
LORA = ["lora.rank=8", "lora.alpha=16", "train.lr=3e-3", "train.min_lr=3e-4"]  # adapters take a higher rate


def fine_tune(out: Path, *overrides: str) -> None:
    command = [sys.executable, "train.py", *CONFIG, f"out_dir={out}", *overrides]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"failed: {' '.join(command)}\n{done.stderr[-2000:]}")


def held_out_answers(run: Path) -> dict:
    done = subprocess.run([sys.executable, "evaluate.py", "--checkpoint", str(run), "--split", "val", "--json"],
                          cwd=ROOT, capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def before(base: Path, data: Path, tmp: Path) -> dict:
    """The held-out answers of the model fine-tuning starts from, by evaluate.py's one command:
    the base with the default template's markers added as fine-tuning adds them."""
    from data.config import DataConfig
    from data.conversations import chat_source

    held_out = tmp / "held_out.jsonl"
    held_out.write_text("".join(json.dumps({"messages": messages}) + "\n"
                                for _, messages, _ in chat_source(DataConfig(source=str(data))).val()))
    done = subprocess.run([sys.executable, "evaluate.py", "--checkpoint", str(base), "--text", str(held_out),
                           "--chat-template", "default", "--json"], cwd=ROOT, capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def teaches(base: Path, task: str, count: int, iters: int, tmp: Path) -> list[dict]:
    from data.tasks import conversations, write

    data = tmp / f"{task}.jsonl"
    write(data, conversations(task, count, seed=0))
    rows = [{"model": "base, before fine-tuning", **before(base, data, tmp)}]
    common = [f"data.source={data}", f"data.cache_dir={tmp / 'cache'}", f"train.init_from={base}",
              f"train.max_iters={iters}", f"train.eval_interval={iters}"]
    for name, extra in (("full fine-tuning", []), ("LoRA, rank 8", LORA)):
        fine_tune(tmp / name.split()[0].strip(","), *common, *extra)
        rows.append({"model": name, **held_out_answers(tmp / name.split()[0].strip(","))})
    return rows


def random_base(folder: Path, n_layer: int = 6, n_embd: int = 384) -> Path:
    """A run folder of a model of random weights (6 × 384: about 10 M parameters; 14 × 768:
    about 100 M) and a char tokenizer of the built-in Shakespeare."""
    from runs.folder import RunDir
    from data import shakespeare
    from data.tokenizer import train_tokenizer
    from model import GPT, GPTConfig

    tokenizer = train_tokenizer("char", ["\n".join(s for speeches in shakespeare.load_plays().values() for s in speeches)],
                                0)
    config = GPTConfig(vocab_size=tokenizer.get_vocab_size(), block_size=128, n_layer=n_layer, n_head=n_embd // 64,
                       n_embd=n_embd, pos_encoding="rope")
    RunDir(folder).save_model(GPT.initialised(config, 0), tokenizer)
    return folder


def small_base(folder: Path, task: str) -> Path:
    """--quick without a base run: a run folder of a small random model whose char tokenizer
    knows the task's characters."""
    from runs.folder import RunDir
    from data.tasks import conversations
    from data.tokenizer import train_tokenizer
    from model import GPT, GPTConfig

    text = "".join(m["content"] for r in conversations(task, 200, seed=0) for m in r["messages"])
    tokenizer = train_tokenizer("char", [text], 0)
    config = GPTConfig(vocab_size=tokenizer.get_vocab_size(), block_size=32, n_layer=2, n_head=2, n_embd=32)
    RunDir(folder).save_model(GPT.initialised(config, 0), tokenizer)
    return folder


# what each costs, on a model of about 10 M parameters and one of about 100 M (with the memory savers)
COSTS = {
    "10m": ((6, 384), [("full fine-tuning", []), ("LoRA, rank 8", LORA)]),
    "100m": ((14, 768), [("full fine-tuning", []),
                         ("full, checkpointing", ["train.checkpointing=true"]),
                         ("LoRA, rank 8", LORA),
                         ("LoRA, checkpointing", [*LORA, "train.checkpointing=true"]),
                         ("LoRA, checkpointing, bfloat16 base", [*LORA, "train.checkpointing=true",
                                                                  "train.base_dtype=bfloat16"])]),
}


def costs(size: str, iters: int, tmp: Path) -> list[dict]:
    from runs.folder import RunDir

    (n_layer, n_embd), recipes = COSTS[size]
    base = random_base(tmp / f"base-{size}", n_layer, n_embd)
    dtype = "train.dtype=bfloat16" if size == "100m" else "train.dtype=float32"
    common = [f"train.init_from={base}", "data.source=shakespeare", f"data.cache_dir={tmp / 'cache'}",
              f"train.max_iters={iters}", f"train.eval_interval={iters}", "train.eval_iters=1", "train.batch_size=16",
              dtype]
    fine_tune(tmp / f"warm-up-{size}", *common, "train.max_iters=1")  # the token files, made before anything is measured
    rows = []
    for name, extra in recipes:
        out = tmp / f"cost-{size}-{len(rows)}"
        command = [sys.executable, "train.py", *CONFIG, f"out_dir={out}", *common, *extra]
        peak, anonymous, wall = peak_of(command)
        summary = json.loads((out / "summary.json").read_text())
        trained = sum(t.numel() for t in (torch.load(out / "trainer_state.pt", weights_only=True)["model"].values()))
        rows.append({"size": size, "model": name, "parameters": RunDir(base).load_model()[0].num_parameters(),
                     "trained_parameters": trained,
                     "peak_mb": peak, "anonymous_mb": anonymous,
                     "tokens_per_second": summary["tokens"] / summary["seconds"], "seconds": summary["seconds"]})
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base", type=Path, default=ROOT / "out" / "tiny", help="the base run (default out/tiny)")
    p.add_argument("--task", default="add", choices=["add", "reverse"])
    p.add_argument("--count", type=int, default=3000, help="conversations (the last tenth held out)")
    p.add_argument("--iters", type=int, default=1500)
    p.add_argument("--cost-iters", type=int, default=30)
    p.add_argument("--sizes", default="10m,100m", help="the models whose costs are measured (10m, 100m)")
    p.add_argument("--quick", action="store_true", help="few iterations and conversations: a smoke test")
    p.add_argument("--only", choices=["teaches", "costs"], help="measure one of the two")
    p.add_argument("--out", help="JSON results (default bench/results/finetune.json)")
    args = p.parse_args()
    if args.quick:
        args.count, args.iters, args.cost_iters, args.sizes = 200, 5, 3, "10m"
    with tempfile.TemporaryDirectory() as tmp:
        if args.quick and not args.base.is_dir():
            args.base = small_base(Path(tmp) / "base", args.task)
        taught = [] if args.only == "costs" else teaches(args.base, args.task, args.count, args.iters, Path(tmp))
        print(table(["model", "held-out exact match", "loss on the answers", "conversations"],
                    [[r["model"], f"{r['exact_match']:.1%}", r["loss"], r["conversations"]] for r in taught]))
        cost = [] if args.only == "teaches" else [row for size in args.sizes.split(",")
                                                  for row in costs(size, args.cost_iters, Path(tmp))]
        print(table(["model", "trained parameters", "peak memory (MB)", "anonymous (MB)", "tokens/s"],
                    [[f"{r['size']}: {r['model']}", f"{r['trained_parameters']:,}", r["peak_mb"], r["anonymous_mb"],
                      r["tokens_per_second"]] for r in cost]))
    path = save("finetune", {"machine": machine(torch.get_num_threads()), "base": str(args.base), "task": args.task,
                             "iters": args.iters, "results": taught + cost}, args.out)
    print(f"saved {path}")


if __name__ == "__main__":
    main()
