"""A lost worker under torchrun --max-restarts: how often the run recovers, and how fast.

Each trial trains a micro model with two processes under `torchrun --standalone
--nproc-per-node=2 --max-restarts=2`, kills one worker with SIGKILL once the checkpoint
of iteration 20 is on disk, and waits: torchrun restarts both workers, which resume from
the checkpoint. A trial recovers if the run then ends by itself (exit 0) within the time
limit with weights equal to those of the same run never interrupted. Linux only (it
finds the workers as the launcher's child processes).

    python -m bench.elastic [--trials 20] [--quick] [--out JSON]
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import load_file

from bench.common import ROOT, machine, save, table
from runs.folder import RunDir

MICRO = ["data.tokenizer=char", "model.n_layer=2", "model.n_head=2", "model.n_embd=32", "model.block_size=32", "train.batch_size=4",
         "train.max_iters=60", "train.eval_interval=10", "train.eval_iters=2", "train.checkpoint_interval=10",
         "train.sample_tokens=0", "train.dtype=float32", "train.threads=1", "train.max_minutes=null"]


def launch(out_dir: Path, overrides: list[str]) -> subprocess.Popen:
    shutil.rmtree(out_dir, ignore_errors=True)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
               "--max-restarts=2", "train.py", "--config", "configs/tiny.yaml", *MICRO, *overrides,
               f"out_dir={out_dir}"]
    log = open(f"{out_dir}.log", "w")
    return subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})


def checkpoint_iteration(out_dir: Path) -> int:
    try:
        return torch.load(out_dir / RunDir.STATE, weights_only=True)["iteration"]
    except (OSError, RuntimeError, EOFError):  # not written yet, or being replaced right now
        return 0


def trial(out_dir: Path, overrides: list[str], kill_after: int | None = 20, limit: float = 120) -> dict:
    """One run; with kill_after, SIGKILL one worker once that iteration's checkpoint exists.
    Returns the exit code ("hang" past `limit` seconds after the kill) and the seconds the
    run took to end after the kill."""
    agent = launch(out_dir, overrides)
    killed = None
    while kill_after and killed is None and agent.poll() is None:
        if checkpoint_iteration(out_dir) >= kill_after:
            workers = subprocess.run(["pgrep", "-P", str(agent.pid)], capture_output=True, text=True).stdout.split()
            if workers:
                os.kill(int(workers[-1]), signal.SIGKILL)
                killed = time.monotonic()
        time.sleep(0.1)
    try:
        code = agent.wait(timeout=limit)
    except subprocess.TimeoutExpired:  # the workers have sessions of their own: kill them by name first
        for worker in subprocess.run(["pgrep", "-P", str(agent.pid)], capture_output=True, text=True).stdout.split():
            os.kill(int(worker), signal.SIGKILL)
        os.killpg(agent.pid, signal.SIGKILL)
        agent.wait()
        code = "hang"
    return {"exit": code, "killed": killed is not None,
            "seconds_after_kill": time.monotonic() - killed if killed else None}


def same_weights(a: Path, b: Path) -> bool:
    wa, wb = load_file(str(a / RunDir.WEIGHTS)), load_file(str(b / RunDir.WEIGHTS))
    return wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--corpus", default="shakespeare", help="data.source (default: the built-in corpus)")
    parser.add_argument("--quick", action="store_true", help="1 trial (a test runs this; tests/test_distributed.py runs 5)")
    parser.add_argument("--out", help="JSON path (default bench/results/elastic.json)")
    args = parser.parse_args()
    trials = 1 if args.quick else args.trials
    with tempfile.TemporaryDirectory() as tmp:
        overrides = [f"data.source={args.corpus}", f"data.cache_dir={tmp}/cache"]
        straight = trial(Path(tmp) / "straight", overrides, kill_after=None)
        if straight["exit"] != 0:
            raise SystemExit("the uninterrupted run failed:\n" + Path(f"{tmp}/straight.log").read_text()[-3000:])
        results = []
        for i in range(trials):
            r = trial(Path(tmp) / f"{i}", overrides)
            r["identical"] = r["exit"] == 0 and same_weights(Path(tmp) / "straight", Path(tmp) / f"{i}")
            results.append(r)
            print(f"trial {i + 1}: exit {r['exit']}, ended {r['seconds_after_kill']:.0f} s after the kill, "
                  f"weights {'identical' if r['identical'] else 'DIFFERENT'}", flush=True)
    recovered = [r for r in results if r["identical"]]
    slowest = max((r["seconds_after_kill"] for r in results), default=0.0)
    print("\ntorchrun --standalone --nproc-per-node=2 --max-restarts=2, one worker SIGKILLed after iteration 20\n")
    print(table(["trials", "recovered, bit-identical", "hangs", "slowest end after the kill (s)"],
                [[trials, len(recovered), sum(r["exit"] == "hang" for r in results), slowest]]))
    path = save("elastic", {"machine": machine(1), "results": results}, args.out)
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
