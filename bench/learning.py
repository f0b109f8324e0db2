"""Learning per FLOP: the validation loss each recipe reaches with a fixed training compute.

A budget of B TFLOPs trains a recipe for B·10¹² / (flops_per_token × tokens per
iteration) iterations, with the learning-rate schedule ending there. flops_per_token is
the model's own (model/gpt.py, the formula train/mfu uses: 6 per matrix weight, the LM
head included, plus 12·n_layer·T·n_embd for attention at context T), so a budget buys
the same training on every machine and the loss it reaches is deterministic for a seed,
a dtype and a thread count. Each run is then scored by evaluate.py --split val (every
validation token once): nats per token, and bits per character, which compares char and
BPE tokenizers on the same text. Wall time and MFU (median of train/mfu) are this
machine's.

A recipe is a config file (or `baseline`: bench/baseline.yaml, the frozen tiny.yaml of
2026-12-01; `tiny`: configs/tiny.yaml) with optional overrides after commas, e.g.
`baseline,train.weight_decay=0.3`. A corpus is `shakespeare` (built in) or a text file.

    python -m bench.learning --tflops 30 60 [--recipes baseline tiny] [--corpus shakespeare FILE]
                             [--threads 2] [--quick] [--out JSON]

--speed measures instead how fast each recipe trains, side by side: its own training loop
(Trainer.fit: forward, backward, its optimizers, its average of the weights) in rounds
that alternate between the recipes in one process, tokens/s and MFU as medians, and each
recipe's MFU as a ratio to the first one's.

--quick trains a micro model on one play (Macbeth), not the whole corpus: a test runs it
so that the script never rots.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from bench.common import ROOT, alternate, machine, save, table, timed
from jobs import prepare
from model import GPT
from training.config import load_config

RECIPES = {"baseline": ROOT / "bench" / "baseline.yaml", "tiny": ROOT / "configs" / "tiny.yaml"}
QUICK = ["model.n_layer=1", "model.n_embd=32", "model.n_head=2", "model.block_size=32", "train.batch_size=4"]
# the budget is the schedule's length: no time limit, one evaluation (at the end), no samples
FIXED = ["train.max_minutes=null", "train.sample_tokens=0", "train.eval_iters=10"]


def recipe_args(recipe: str) -> tuple[Path, list[str]]:
    name, *overrides = recipe.split(",")
    return RECIPES.get(name, Path(name)), overrides


def iterations_for(tflops: float, config: Path, overrides: list[str]) -> tuple[int, float, int]:
    """(iterations, training FLOPs per token, tokens per iteration) of a budget, for the
    model the recipe builds on its corpus (the vocabulary comes from the tokenizer)."""
    cfg = load_config(config, overrides)
    data = prepare(cfg.data, progress=False)
    with torch.device("meta"):  # sizes only: no memory, no initialisation
        model = GPT(cfg.model_with_vocab(data.vocab_size))
    per_token = model.flops_per_token(cfg.model.block_size)
    tokens = cfg.train.batch_size * cfg.train.grad_accum * cfg.model.block_size
    return max(1, round(tflops * 1e12 / (per_token * tokens))), per_token, tokens


def run_script(script: str, args: list[str]) -> str:
    out = subprocess.run([sys.executable, script, *args], cwd=ROOT, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"{script} {' '.join(args)} failed:\n{out.stderr[-2000:]}")
    return out.stdout


def median_mfu(run_dir: str) -> float:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(run_dir, size_guidance={"scalars": 0})
    events.Reload()
    values = [e.value for e in events.Scalars("train/mfu")] if "train/mfu" in events.Tags()["scalars"] else []
    return statistics.median(values) if values else float("nan")


def train_and_score(config: Path, overrides: list[str], iters: int, run_dir: str) -> dict:
    stdout = run_script("train.py", ["--config", str(config), *overrides, f"train.max_iters={iters}",
                              f"train.eval_interval={iters}", f"out_dir={run_dir}", "--fresh"])
    wall = float(re.search(r"done: \d+ iterations in [\d.]+ min \((\d+) s\)", stdout).group(1))
    scores = json.loads(run_script("evaluate.py", ["--checkpoint", run_dir, "--split", "val", "--json"]))
    return {"val_nats_per_token": scores["loss"], "val_bits_per_char": scores["bits_per_char"],
            "val_nats_per_char": scores["bits_per_char"] * math.log(2), "wall_seconds": wall,
            "mfu": median_mfu(run_dir)}


def step_speed(recipes: list[str], common: list[str], tmp: str, rounds: int, steps: int) -> list[dict]:
    """Tokens/s and MFU of each recipe's training loop, alternating rounds; medians. A
    round is `steps` iterations of Trainer.fit (forward, backward, the recipe's optimizers
    and average of the weights), ended as the loop ends a run, by an evaluation and a
    checkpoint, made small here (one validation window, no sample)."""
    from machine.device import measure_peak_flops, resolve_device, resolve_dtype
    from training.preparation import prepare_run
    from training.trainer import Trainer

    def advance(trainer: Trainer, iterations: int) -> None:
        trainer.budget.stop_at(trainer.iteration + iterations)
        with contextlib.redirect_stdout(io.StringIO()):  # (each round prints a run's first and last lines)
            trainer.fit()

    trainers, peaks = {}, {}
    for i, recipe in enumerate(recipes):
        config, overrides = recipe_args(recipe)
        cfg = load_config(config, [*common, *overrides, "train.eval_windows=1", f"out_dir={tmp}/speed-{i}"])
        device = resolve_device(cfg.train.device)
        dtype = resolve_dtype(cfg.train.dtype, device, training=True)
        trainers[recipe] = trainer = Trainer(prepare_run(cfg), device, dtype)
        advance(trainer, 1)  # (the first step allocates the optimizers' state)
        if (device, dtype) not in peaks:  # one peak per dtype, so the MFU ratio is the ratio of FLOP/s
            peaks[device, dtype] = measure_peak_flops(device, dtype, size=512 if steps == 1 else 2048)

    def measure(trainer) -> float:  # tokens per second
        tokens = trainer.settings.batch_size * trainer.grad_accum * trainer.run.model_config.block_size
        return steps * tokens / timed(lambda: advance(trainer, steps))

    medians = alternate({recipe: lambda t=trainer: measure(t) for recipe, trainer in trainers.items()}, rounds)
    results = []
    for recipe, trainer in trainers.items():
        peak = peaks[trainer.device, trainer.dtype]
        mfu = trainer.model.flops_per_token(trainer.run.model_config.block_size) * medians[recipe] / peak
        results.append({"recipe": recipe, "dtype": str(trainer.dtype).removeprefix("torch."),
                        "tokens_per_sec": medians[recipe], "mfu": mfu})
    for r in results:
        r["mfu_ratio"] = r["mfu"] / results[0]["mfu"]
    return results


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tflops", type=float, nargs="+", default=[30, 60], help="training compute budgets")
    parser.add_argument("--recipes", nargs="+", default=["baseline", "tiny"])
    parser.add_argument("--corpus", nargs="+", default=["shakespeare"], help="shakespeare (built in) or a text file")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--speed", action="store_true", help="compare the recipes' training speed, side by side")
    parser.add_argument("--rounds", type=int, default=7, help="--speed: alternating rounds")
    parser.add_argument("--steps", type=int, default=20, help="--speed: training steps per round")
    parser.add_argument("--quick", action="store_true", help="a micro model, a tiny budget (a test runs this)")
    parser.add_argument("--out", help="JSON path (default bench/results/learning.json)")
    args = parser.parse_args()
    for corpus in args.corpus:
        if corpus != "shakespeare" and not Path(corpus).is_file():
            raise SystemExit(f"--corpus {corpus}: no such file (or use shakespeare, the built-in corpus)")
    return args


def scored(corpus: str, recipe: str, tflops: float, common: list[str], out_dir: str) -> dict:
    """Train one recipe for `tflops` of compute and score it; prints its line."""
    config, overrides = recipe_args(recipe)
    overrides = [*common, *overrides]
    iters, per_token, tokens = iterations_for(tflops, config, overrides)
    r = {"corpus": corpus, "recipe": recipe, "tflops": tflops, "iterations": iters,
         "tokens": iters * tokens, "flops_per_token": per_token, "dtype": dtype_of(config, overrides),
         **train_and_score(config, overrides, iters, out_dir)}
    print(f"{corpus}, {tflops:g} TFLOPs, {recipe}: {iters} iterations, "
          f"{r['val_nats_per_char']:.4f} nats/char ({r['val_bits_per_char']:.4f} bits/char), "
          f"{r['wall_seconds']:.0f} s, MFU {r['mfu']:.1%}", flush=True)
    return r


def main() -> None:
    args = arguments()
    budgets = [0.001] if args.quick else args.tflops
    rows, results, path = [], [], None
    with tempfile.TemporaryDirectory() as tmp:
        for corpus in [quick_corpus(tmp)] if args.quick else args.corpus:
            source = corpus if corpus == "shakespeare" else str(Path(corpus).resolve())
            common = [f"data.source={source}", f"data.cache_dir={tmp}/cache", f"train.threads={args.threads}",
                      *FIXED, *(QUICK if args.quick else [])]
            if args.speed or args.quick:
                torch.set_num_threads(args.threads)
                speeds = step_speed(args.recipes, common, tmp, *((1, 1) if args.quick else (args.rounds, args.steps)))
                results += [{"corpus": corpus, **r} for r in speeds]
                print(table(["recipe", "dtype", "tokens/s", "MFU", "MFU / first recipe's"],
                            [[r["recipe"], r["dtype"], r["tokens_per_sec"], f"{r['mfu']:.1%}", f"{r['mfu_ratio']:.3f}"]
                             for r in speeds]), flush=True)
                path = save("learning", {"machine": machine(args.threads), "results": results}, args.out)
                if args.speed:
                    continue
            for tflops in budgets:
                for recipe in args.recipes:
                    r = scored(corpus, recipe, tflops, common, f"{tmp}/{len(results)}")
                    results.append(r)
                    rows.append([corpus, recipe, tflops, r["iterations"], r["tokens"] / 1e6, r["val_nats_per_token"],
                                 r["val_nats_per_char"], r["val_bits_per_char"], r["wall_seconds"], f"{r['mfu']:.1%}"])
                    path = save("learning", {"machine": machine(args.threads), "results": results}, args.out)
    if rows:
        print(f"\nTraining FLOPs = flops_per_token (model/gpt.py) × tokens; scored by evaluate.py --split val; "
              f"{args.threads} threads, dtype {results[-1]['dtype']}\n")
        print(table(["corpus", "recipe", "TFLOPs", "iterations", "tokens (M)", "val nats/token", "val nats/char",
                     "bits/char", "wall (s)", "MFU"], rows))
    print(f"\nwrote {path}")


def quick_corpus(folder: str) -> str:
    """One play of the built-in corpus as a text file (--quick: seconds to prepare, not minutes)."""
    from data import shakespeare

    play = next(p for p in shakespeare.play_files() if p.stem == "macbeth")
    path = Path(folder) / "macbeth.txt"
    path.write_text("\n".join(shakespeare.markdown_to_speeches(play.read_text(encoding="utf-8"))), encoding="utf-8")
    return str(path)


def dtype_of(config: Path, overrides: list[str]) -> str:
    """The training dtype train.py resolves on this machine for the recipe."""
    from machine.device import resolve_device, resolve_dtype

    tc = load_config(config, overrides).train
    return str(resolve_dtype(tc.dtype, resolve_device(tc.device), training=True)).removeprefix("torch.")


if __name__ == "__main__":
    main()
