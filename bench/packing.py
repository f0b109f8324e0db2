"""Packing, honestly counted: what padding costs fine-tuning on conversations today, and what
packing several conversations a row (train.packing) gives back, on real tokens.

For each set (data/tasks.py: dates written in words, one or two questions each, and sums of up to 8
turns, longer and more uneven), from scratch on the same conversations:

1. the padding: over an epoch of one-a-row batches (each row padded to its batch's longest),
   the share of positions that are padding, and the ideal gain, positions ÷ real tokens;
2. the dense mask: a packed batch's forward and backward through torch's fused attention
   with its block-diagonal mask (which gives up is_causal; rows this short take it) against
   the same batch causal only;
3. training, padded and packed, for the same epochs (so the same real tokens), with about the
   same conversations a step (the packed batch has fewer rows, each holding several): the
   real tokens a second (summary.json's), the wall time, and the held-out exact match
   (evaluate.py). Goal: packed real tokens/s at least 90% of the ideal gain, the same accuracy;
4. long contexts (1k to 8k tokens a row, sequences of 100 to 600 tokens packed in it): the
   peak memory (the kernel's VmHWM, a process each) and tokens a second of a forward and
   backward, each sequence alone (the model's way from model/gpt.py's ALONE_FROM tokens a
   row) against the dense mask: the mask's memory grows with the square of the context; with
   --block qwen3, Qwen3's block at the same width (QK-norm, 4 heads of 64 in a stream of 128,
   RMSNorm, SwiGLU, no biases), as a Qwen3 brought in fine-tunes.

    python -m bench.packing [--epochs 8] [--count 3000] [--quick] [--contexts-only] [--block qwen3]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from bench.common import ROOT, machine, save, table

SETS = {"dates, up to 2 turns": ("dates", 2), "sums, up to 8 turns": ("add", 8)}
MODEL = ["model.n_layer=4", "model.n_head=4", "model.n_kv_head=2", "model.n_embd=128", "model.block_size=256",
         "data.tokenizer=char"]
BATCH = 32  # conversations a step (the padded run's rows)


def padding(conversations, block_size: int, batch_size: int, seed: int = 0) -> dict:
    """Over one epoch of one-a-row batches: real tokens, positions, and conversations per packed row."""
    from data.batches import ConversationSampler

    padded = ConversationSampler(conversations, block_size, batch_size, seed)
    positions = 0
    for _ in range(-(-padded.rows_in(1) // batch_size)):  # (an epoch's batches, the last reaching into the next)
        x, _, _ = padded.next_batch()
        positions += x.numel()
    real = padded.drawn
    packed = ConversationSampler(conversations, block_size, batch_size, seed, pack=True)
    rows = packed.rows_of(0)
    return {"real": real, "positions": positions, "padding_share": 1 - real / positions,
            "ideal_gain": positions / real, "per_packed_row": sum(len(row) for row in rows) / len(rows),
            "packed_fill": int(packed.sizes[packed.usable].sum()) / (len(rows) * block_size)}


def dense_mask_cost(conversations, vocab: int, rows: int, rounds: int) -> dict:
    """Forward and backward of a packed batch of 256-token rows: the fused kernel with the
    block-diagonal mask against the same tokens causal only (what is_causal costs to give
    up), ms each, median."""
    from data.batches import ConversationSampler
    from model import GPT, GPTConfig

    model = GPT(GPTConfig(vocab_size=vocab, block_size=256, n_layer=4, n_head=4, n_kv_head=2, n_embd=128))
    x, y, positions = ConversationSampler(conversations, 256, rows, 0, pack=True).next_batch()
    times = {"block-diagonal mask": [], "causal only": []}
    for _ in range(rounds):
        for name, given in (("block-diagonal mask", positions), ("causal only", None)):
            start = time.perf_counter()
            model(x, y, position_ids=given)[1].backward()
            times[name].append(1000 * (time.perf_counter() - start))
            model.zero_grad(set_to_none=True)
    return {name: float(np.median(ms)) for name, ms in times.items()}


CONTEXTS = (1024, 2048, 4096, 8192)
WAYS = {"alone": "each sequence alone", "dense": "the dense mask"}
BLOCKS = {"tiny": dict(n_kv_head=2),  # the long contexts' model: 4 layers of 128, rope, and one of these blocks
          "qwen3": dict(n_kv_head=2, head_dim=64, qk_norm=True, norm="rmsnorm", mlp="swiglu", bias=False)}


def packed_positions(context: int, rows: int, seed: int = 0) -> torch.Tensor:
    """Position ids [rows, context] of rows packed with sequences of 100 to 600 tokens (the
    last of a row cut to fit)."""
    generator = torch.Generator().manual_seed(seed)
    positions = []
    for _ in range(rows):
        row = []
        while len(row) < context:
            length = int(torch.randint(100, 601, (1,), generator=generator))
            row += range(min(length, context - len(row)))
        positions.append(row)
    return torch.tensor(positions)


def long_context(context: int, way: str, rounds: int, result: str, block: str) -> None:
    """(A process of its own, for its peak memory.) Forward and backward of 2 packed rows of
    `context` tokens, `way` alone or with the dense mask, through `block` (BLOCKS): the median
    ms, written to `result`."""
    from model import GPT, GPTConfig
    from model.attention import Sequences

    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=256, block_size=context, n_layer=4, n_head=4, n_embd=128, pos_encoding="rope",
                          **BLOCKS[block]))
    positions = packed_positions(context, 2)
    x = torch.randint(0, 256, positions.shape)
    mask = Sequences.of(positions).mask()[:, 0] if way == "dense" else None  # [B, T, T]
    times = []
    for _ in range(rounds + 1):  # (the first warms up)
        start = time.perf_counter()
        model(x, x, attention_mask=mask, position_ids=positions)[1].backward()
        times.append(1000 * (time.perf_counter() - start))
        model.zero_grad(set_to_none=True)
    ms = float(np.median(times[1:]))
    Path(result).write_text(json.dumps({"ms": ms, "tokens_per_second": x.numel() / ms * 1000}))


def long_contexts(contexts, rounds: int, threads: int, tmp: Path, block: str = "tiny") -> list[dict]:
    """Each context, each way, in a process of its own: peak memory (VmHWM), ms, tokens a second."""
    from bench.memory import peak_of

    rows = []
    for context in contexts:
        for way in WAYS:
            result = tmp / f"context-{context}-{way}.json"
            peak, _, _ = peak_of([sys.executable, "-m", "bench.packing", "--threads", str(threads), "--context-child",
                                  str(context), way, str(rounds), str(result), block])
            rows.append({"context": context, "way": way, "peak_mb": peak, **json.loads(result.read_text())})
    return rows


def trained(out: Path, data: Path, cache: Path, epochs: float, batch_size: int, pack: bool, threads: int) -> dict:
    command = [sys.executable, "train.py", "--config", "configs/tiny.yaml", f"out_dir={out}", f"data.source={data}",
               f"data.cache_dir={cache}", *MODEL, f"train.epochs={epochs}", "train.max_iters=1000000",
               "train.max_minutes=null", f"train.batch_size={batch_size}", f"train.packing={str(pack).lower()}",
               "train.eval_interval=1000000", "train.eval_windows=64", "train.snapshots=0", "train.sample_tokens=0",
               f"train.threads={threads}", "train.warmup_iters=50", "train.ema=0"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"failed: {' '.join(command)}\n{done.stderr[-2000:]}")
    summary = json.loads((out / "summary.json").read_text())
    scored = subprocess.run([sys.executable, "evaluate.py", "--checkpoint", str(out), "--split", "val", "--json",
                             "--threads", str(threads)], cwd=ROOT, capture_output=True, text=True, check=True)
    return {"iterations": summary["iteration"], "epochs": summary["epochs"], "tokens": summary["tokens"],
            "seconds": summary["seconds"], "tokens_per_second": summary["tokens"] / summary["seconds"],
            "exact_match": json.loads(scored.stdout)["exact_match"], "val_loss": summary["val_loss"]}


def measure_set(name: str, task: str, turns: int, count: int, epochs: float, tmp: Path, rounds: int,
                threads: int) -> dict:
    from data.config import DataConfig
    from jobs import prepare
    from data.tasks import conversations, write

    data = tmp / f"{task}-{turns}.jsonl"
    write(data, conversations(task, count, seed=0, turns=turns))
    prepared = prepare(DataConfig(str(data), tokenizer="char", cache_dir=str(tmp / "cache")), progress=False)
    train_set = prepared.conversations["train"]
    lengths = np.diff(train_set.starts)
    pad = padding(train_set, 256, BATCH)
    cost = dense_mask_cost(train_set, prepared.vocab_size, max(1, round(BATCH / pad["per_packed_row"])), rounds)
    packed_batch = max(1, round(BATCH / pad["per_packed_row"]))
    padded = trained(tmp / f"{task}-padded", data, tmp / "cache", epochs, BATCH, False, threads)
    packed = trained(tmp / f"{task}-packed", data, tmp / "cache", epochs, packed_batch, True, threads)
    gain = packed["tokens_per_second"] / padded["tokens_per_second"]
    return {"set": name, "conversations": count, "mean_tokens": float(lengths.mean()), "max_tokens": int(lengths.max()),
            **pad, "mask_ms": cost, "packed_batch": packed_batch, "padded": padded, "packed": packed,
            "gain": gain, "share_of_ideal": gain / pad["ideal_gain"]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=float, default=8)
    p.add_argument("--count", type=int, default=3000, help="conversations of each set (a tenth held out)")
    p.add_argument("--quick", action="store_true", help="a few conversations of one set, one epoch: a smoke test")
    p.add_argument("--contexts-only", action="store_true", help="only the long contexts (4.)")
    p.add_argument("--block", choices=BLOCKS, default="tiny", help="the long contexts' block (4.): tiny.yaml's or Qwen3's")
    p.add_argument("--threads", type=int, help=argparse.SUPPRESS)
    p.add_argument("--context-child", nargs=5, help=argparse.SUPPRESS)
    p.add_argument("--out", help="JSON results (default bench/results/packing.json)")
    args = p.parse_args()
    if args.context_child:
        torch.set_num_threads(args.threads)
        context, way, rounds, result, block = args.context_child
        return long_context(int(context), way, int(rounds), result, block)
    if args.quick:
        args.count, args.epochs = 120, 1
    threads = 1 if args.quick else 2  # (two on an idle box; a smoke test keeps its pace beside other work on one)
    torch.set_num_threads(threads)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, (task, turns) in list(SETS.items())[:0 if args.contexts_only else 1 if args.quick else None]:
            rows.append(measure_set(name, task, turns, args.count, args.epochs, Path(tmp), 2 if args.quick else 10,
                                    threads))
        contexts = long_contexts((256, 512) if args.quick else CONTEXTS, 1 if args.quick else 3, threads, Path(tmp),
                                 args.block)
    print(table(["context", "way", "peak MB", "ms a step (forward, backward)", "tokens/s"],
                [[r["context"], WAYS[r["way"]], r["peak_mb"], r["ms"], r["tokens_per_second"]] for r in contexts]))
    if not rows:
        path = save("packing-contexts" if args.block == "tiny" else f"packing-contexts-{args.block}",
                    {"machine": machine(threads), "block": args.block, "contexts": contexts}, args.out)
        print(f"saved {path}")
        return
    print(table(["set", "real tokens a conversation (mean, max)", "padding share", "ideal gain", "per packed row",
                 "mask ms / causal ms"],
                [[r["set"], f"{r['mean_tokens']:.1f}, {r['max_tokens']}", f"{r['padding_share']:.1%}",
                  f"{r['ideal_gain']:.2f}x", f"{r['per_packed_row']:.1f}",
                  f"{r['mask_ms']['block-diagonal mask']:.0f} / {r['mask_ms']['causal only']:.0f}"] for r in rows]))
    print(table(["set", "rows a step", "iterations", "real tokens", "seconds", "real tokens/s", "exact match"],
                [[f"{r['set']}, {kind}", BATCH if kind == "padded" else r["packed_batch"], r[kind]["iterations"],
                  f"{r[kind]['tokens']:,}", r[kind]["seconds"], f"{r[kind]['tokens_per_second']:,.0f}",
                  f"{r[kind]['exact_match']:.1%}"] for r in rows for kind in ("padded", "packed")]))
    for r in rows:
        print(f"{r['set']}: packed {r['gain']:.2f}x the padded real tokens/s, of an ideal {r['ideal_gain']:.2f}x"
              + f" ({r['share_of_ideal']:.0%} of it)")
    path = save("packing", {"machine": machine(threads), "epochs": args.epochs, "results": rows, "contexts": contexts},
                args.out)
    print(f"saved {path}")


if __name__ == "__main__":
    main()
