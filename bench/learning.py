"""Learning per minute: the validation loss configs/tiny.yaml reaches in a given wall time,
AdamW and Muon side by side.

Each (corpus, budget, optimizer) is its own run of train.py with train.max_minutes set to
the budget, so the learning-rate schedule ends when the budget does; the wall time
reported is the whole command's. Token files are built once, before the timed runs, as a
user's first run would. Corpora: the built-in Shakespeare and, with --classic, the classic
tiny Shakespeare file, to compare with nanoGPT's published figures.

    python -m bench.learning [--quick] [--minutes 5 10] [--optimizers adamw muon] [--classic FILE]
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import ROOT, machine, save, table


def run_train(overrides: list[str]) -> tuple[float, str]:
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "train.py", "--config", "configs/tiny.yaml", *overrides],
                         cwd=ROOT, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"train.py failed:\n{out.stderr[-2000:]}")
    return time.perf_counter() - start, out.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a micro model for a few seconds (a test runs this)")
    parser.add_argument("--minutes", type=float, nargs="+", default=[5, 10])
    parser.add_argument("--optimizers", nargs="+", default=["adamw", "muon"], choices=["adamw", "muon"])
    parser.add_argument("--classic", type=Path, help="also run on this file: the classic tiny Shakespeare")
    parser.add_argument("--out", help="JSON path (default bench/results/learning.json)")
    args = parser.parse_args()
    extra = ["model.n_layer=1", "model.n_embd=32", "model.n_head=2", "model.block_size=32",
             "train.eval_iters=2", "train.batch_size=4"] if args.quick else []
    minutes = [0.1] if args.quick else args.minutes
    corpora = {"built-in Shakespeare": "shakespeare"}
    if args.classic is not None and not args.quick:
        if not args.classic.is_file():
            raise SystemExit(f"--classic {args.classic} does not exist")
        corpora["tiny Shakespeare file"] = str(args.classic.resolve())

    rows, results = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for corpus, source in corpora.items():
            common = [f"data.source={source}", f"data.cache_dir={tmp}/cache", "train.max_iters=1000000000",
                      "--fresh", *extra]
            run_train([*common, f"out_dir={tmp}/prepare", "train.max_iters=1"])  # token files, untimed
            for budget in minutes:
                for optimizer in args.optimizers:
                    run_dir = f"{tmp}/{len(results)}"
                    wall, out = run_train([*common, f"out_dir={run_dir}", f"train.max_minutes={budget}",
                                           f"train.optimizer={optimizer}"])
                    done = re.search(r"done: (\d+) iterations .*val loss ([\d.]+)", out)
                    iters, val = int(done.group(1)), float(done.group(2))
                    rows.append([corpus, budget, optimizer, iters, wall, val])
                    results.append({"corpus": corpus, "budget_minutes": budget, "optimizer": optimizer,
                                    "iters": iters, "wall_seconds": wall, "val_loss": val})
                    print(f"{corpus}, {budget} min, {optimizer}: {iters} iterations, {wall:.0f} s, "
                          f"val loss {val:.4f}", flush=True)
                    path = save("learning", {"machine": machine(2), "results": results}, args.out)  # so far
    print("\nconfigs/tiny.yaml with train.max_minutes = the budget; wall time of the whole command\n")
    print(table(["corpus", "budget (min)", "optimizer", "iterations", "wall (s)", "val loss"], rows))
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
