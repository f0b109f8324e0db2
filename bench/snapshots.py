"""What watching the model form costs a run: each snapshot (the weights written into the
run folder, training/snapshots.py) and each measurement of the heads (their attention
maps and scores for TensorBoard, Evaluator.log_heads), against the training loop's own
iteration, for tiny.yaml's model on this machine.

For a run of --iterations N (default 1,737: the quick start's on an idle 2-core machine),
the snapshots are the steps the run keeps and the heads are measured at those and at
every evaluation; the share is their time over N iterations' time. Medians of --rounds.

    python -m bench.snapshots [--iterations 1737] [--rounds 5] [--quick]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import statistics
import tempfile
from pathlib import Path

import torch

from bench.common import ROOT, machine, save, table, timed
from runs.folder import RunDir
from bench.learning import quick_corpus
from training.config import load_config
from training.logger import RunLogger
from training.preparation import prepare_run
from training.snapshots import spacing
from training.trainer import Trainer


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--iterations", type=int, default=1737, help="the run's length")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=20, help="iterations per timed round of the loop")
    p.add_argument("--quick", action="store_true", help="one play as the corpus, one short round (a test runs this)")
    p.add_argument("--out", help="JSON results (default bench/results/snapshots.json)")
    args = p.parse_args()
    rounds, steps = (1, 2) if args.quick else (args.rounds, args.steps)
    with tempfile.TemporaryDirectory() as tmp:
        source = [f"data.source={quick_corpus(tmp)}"] if args.quick else []
        cfg = load_config(ROOT / "configs" / "tiny.yaml", [*source, f"data.cache_dir={tmp}/cache", f"out_dir={tmp}/run",
                                                          "train.max_minutes=null", "train.eval_windows=1",
                                                          "train.sample_tokens=0"])
        trainer = Trainer(prepare_run(cfg), torch.device("cpu"), torch.float32)
        trainer.run_dir.path.mkdir(parents=True)

        def advance() -> None:  # `steps` iterations of the loop (which ends them with a small evaluation)
            trainer.budget.stop_at(trainer.iteration + steps)
            with contextlib.redirect_stdout(io.StringIO()):
                trainer.fit()

        advance()  # (the first steps allocate the optimizers' state)
        iteration = statistics.median(timed(advance) / steps for _ in range(rounds))
        with RunLogger(RunDir(Path(tmp) / "events"), True, 0, 1, 1) as log:
            heads = statistics.median(timed(lambda: trainer.evaluator.log_heads(log, 0, trainer.eval_model))
                                      for _ in range(rounds))
        snapshot = statistics.median(timed(trainer.save_snapshot) for _ in range(rounds))
        size = trainer.run_dir.snapshot_path(trainer.iteration).stat().st_size
    n = args.iterations
    snapshots = trainer.snapshots
    taken = [step for step in range(n + 1) if snapshots.due(step, n)]  # each written once (the grid thins as it goes)
    kept = [step for step in taken if step in (0, n) or step % spacing(n, snapshots.every, snapshots.limit) == 0]
    measured = len(taken) + n // cfg.train.eval_interval
    share = (len(taken) * snapshot + measured * heads) / (n * iteration)
    result = {"iterations": n, "iteration_ms": 1000 * iteration, "snapshot_ms": 1000 * snapshot,
              "heads_ms": 1000 * heads, "snapshots": len(kept), "snapshots_taken": len(taken),
              "head_measurements": measured, "snapshot_mb": size / 1e6, "disk_mb": len(kept) * size / 1e6,
              "share_of_training": share}
    print(table(["iterations", "iteration (ms)", "snapshot (ms)", "heads measured (ms)", "snapshots taken / kept",
                 "head measurements", "disk (MB)", "share of the run's time"],
                [[n, result["iteration_ms"], result["snapshot_ms"], result["heads_ms"], f"{len(taken)} / {len(kept)}",
                  measured, result["disk_mb"], f"{share:.2%}"]]))
    path = save("snapshots", {"machine": machine(torch.get_num_threads()), "results": [result]}, args.out)
    print(f"saved {path}")


if __name__ == "__main__":
    main()
