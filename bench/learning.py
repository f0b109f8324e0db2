"""Learning per minute: validation loss reached in 1, 2, 5 and 10 minutes of wall time.

Each budget is its own run of train.py with configs/tiny.yaml (so the learning-rate
schedule ends when the budget does), with max_iters set from the step time measured
here first. The wall time reported is the whole command's, data preparation included
(token files are built once, before the timed runs, as a user's first run would).
Corpora: the built-in Shakespeare and the classic tiny Shakespeare file, used only to
compare with nanoGPT's published figures.

    python -m bench.learning [--quick] [--minutes 1 2 5 10] [--classic PATH/tinyshakespeare.txt]
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
    parser.add_argument("--minutes", type=float, nargs="+", default=[1, 2, 5, 10])
    parser.add_argument("--classic", type=Path, help="also run on this file: the classic tiny Shakespeare")
    parser.add_argument("--out", help="JSON path (default bench/results/learning.json)")
    args = parser.parse_args()
    extra = ["model.n_layer=1", "model.n_embd=32", "model.n_head=2", "model.block_size=32",
             "train.eval_iters=2"] if args.quick else []
    minutes = [0.1] if args.quick else args.minutes
    corpora = {"built-in Shakespeare": "shakespeare"}
    if args.classic is not None and not args.quick:
        if not args.classic.is_file():
            raise SystemExit(f"--classic {args.classic} does not exist")
        corpora["tiny Shakespeare file"] = str(args.classic)

    rows, results = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for n, (corpus, source) in enumerate(corpora.items()):
            common = [f"data.source={source}", f"data.cache_dir={tmp}/cache", *extra]
            runs = f"{tmp}/corpus-{n}"  # run directories of one corpus; another's would not resume
            # calibrate: the time of 100 extra iterations (data already prepared by the first run)
            short, _ = run_train([*common, f"out_dir={runs}/cal1", "train.max_iters=20", "train.eval_interval=1000"])
            long, _ = run_train([*common, f"out_dir={runs}/cal2", "train.max_iters=120", "train.eval_interval=1000"])
            per_iter = max((long - short) / 100, 1e-4)
            overhead = short - 20 * per_iter
            for budget in minutes:
                # evaluations (every 250 iterations) cost about 3% of the steps
                iters = max(20, int((budget * 60 - overhead) / per_iter / 1.03))
                wall, out = run_train([*common, f"out_dir={runs}/run-{budget}", f"train.max_iters={iters}",
                                       f"train.eval_interval={min(250, iters)}"])
                val = float(re.search(r"val loss ([\d.]+)", out).group(1))
                rows.append([corpus, budget, iters, wall, val])
                results.append({"corpus": corpus, "budget_minutes": budget, "iters": iters,
                                "wall_seconds": wall, "val_loss": val})
                print(f"{corpus}, {budget} min: {iters} iterations, {wall:.0f} s, val loss {val:.4f}", flush=True)
                path = save("learning", {"machine": machine(2), "results": results}, args.out)  # so far
    print("\nconfigs/tiny.yaml, 2 threads, bf16 autocast where the CPU has it; wall time of the whole command\n")
    print(table(["corpus", "budget (min)", "iterations", "wall (s)", "val loss"], rows))
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
