"""Train a GPT: python train.py --config configs/tiny.yaml [section.key=value ...] [--fresh] [--explain]

Config → data → model → loop (evaluations, TensorBoard, checkpoints); the loop itself is
training/trainer.py. Re-running the same command resumes from out_dir; --fresh starts
over. Under torchrun each process trains on its own batches with DistributedDataParallel.
--explain prints the shapes of one traced forward pass of the configured model and
exits without training.

Exit codes: 0 done, 1 training failed (non-finite loss, full disk), 2 bad input,
130/143 stopped by SIGINT/SIGTERM after saving a checkpoint.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

from cli.program import OneLineParser, UserError, locale_language, positive, run_main
from machine.device import resolve_device, resolve_dtype
from runs.folder import RunDir
from data.shared import DataError
from training.config import load_config
from training.distributed import JoinError, join_process_group
from training.preparation import prepare_run
from training.signals import terminated_as_interrupt
from training.trainer import Trainer, TrainingError


def train(args) -> int:
    cfg = load_config(args.config, [*args.overrides, *([f"train.threads={args.threads}"] if args.threads else [])])
    device = resolve_device(cfg.train.device)
    dtype = resolve_dtype(cfg.train.dtype, device, training=True)
    if args.explain:
        print(explain(prepare_run(cfg, use_out_dir=False), dtype, args.lang or locale_language()))
        return 0
    if args.fresh and int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0")) > 0:
        raise UserError("--fresh under torchrun --max-restarts would start the run over at every restart; "
                        f"start over by deleting the run's {RunDir.STATE}, or set out_dir=PATH, without --fresh")
    dist = join_process_group(device.type)
    if dist.enabled and device.type == "cuda":
        device = torch.device("cuda", dist.local_rank)  # one GPU per process
    run_dir = RunDir(cfg.out_dir)
    made_here = not run_dir.path.exists()  # (a refused run removes the folder it made)
    lock = run_dir.lock()

    def claim() -> None:
        """out_dir writable and ours alone (the main process writes it)."""
        if dist.is_main:
            run_dir.check_writable()
            if not lock.acquire():
                raise UserError(f"out_dir {run_dir} is in use by another training run (pid {lock.holder()}); "
                                "wait for it to finish or set out_dir=PATH")

    try:
        with terminated_as_interrupt():  # (the loop takes SIGTERM over: training/signals.py's StopRequest)
            trainer = Trainer(prepare_run(cfg, dist, args.fresh, claim), device, dtype, dist)
        return trainer.fit()
    finally:
        lock.release()
        if made_here and dist.is_main:
            run_dir.remove_if_unused()
        dist.close()


def explain(run, dtype: torch.dtype, lang: str) -> str:
    """The shape report of the run's model, at its initialisation, on one batch of its
    training data (inspection/shapes.py). Nothing is trained or written."""
    from data.batches import fixed_windows
    from inspection.shapes import report
    from model import GPT

    seed = run.config.train.seed
    x, y = fixed_windows(run.data.train, run.model_config.block_size, run.config.train.batch_size, seed, "train")
    return report(GPT.initialised(run.model_config, seed), x, y, dtype, lang)


def parse_args(argv):
    parser = OneLineParser(prog="train.py", description=__doc__.split("\n\n")[0],
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="YAML run config, e.g. configs/tiny.yaml")
    parser.add_argument("overrides", nargs="*", metavar="section.key=value",
                        help="override config values, typed as YAML: train.max_iters=100 out_dir=out/exp")
    parser.add_argument("--fresh", action="store_true", help="start over, ignoring a checkpoint in out_dir")
    parser.add_argument("--explain", action="store_true",
                        help="print the shapes of one traced forward pass of this model, then exit")
    parser.add_argument("--lang", choices=["en", "zh"], help="language of --explain (default: from the locale)")
    parser.add_argument("--threads", type=positive, help="torch's CPU threads, as train.threads=N (default: "
                        "train.threads; unset, $OMP_NUM_THREADS if set, else one per core, or under "
                        "train.max_minutes one while the machine is so busy that one is faster)")
    parser.add_argument("--debug", action="store_true", help="show full tracebacks")
    return parser.parse_intermixed_args(argv)


def main(argv=None) -> int:
    return run_main(parse_args, train, argv, {UserError: 2, DataError: 2, TrainingError: 1, JoinError: 1})


if __name__ == "__main__":
    sys.exit(main())
