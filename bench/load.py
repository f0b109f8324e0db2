"""The programs beside other work: each workload's time on a quiet machine and beside busy
processes, for each thread count and OpenMP wait policy.

Workloads, for tiny.yaml's model shape (vocabulary 512, float32): one training step
(forward, backward, AdamW; 32 windows of 64 tokens), decoding 64 tokens with the KV cache
for one prompt and for a batch of 8, and evaluate.py's forward pass (16 windows of 64
tokens, no gradients). Each setting runs in a process of its own that imports nothing of
the project but model/ (OpenMP reads its wait policy once, when torch loads): OpenMP's
default policy (what every program had before machine/threads.py: spin a while, then
sleep) or PASSIVE (sleep at once), with 1 or 2 threads. The busy processes are pure-Python
loops this benchmark starts before a measurement and stops after it. The settings take
turns in --rounds rounds (a noisy machine slows them alike); each figure is the median
over the rounds of each run's median repetition.

    python -m bench.load [--seconds 2] [--rounds 3] [--busy 0 1] [--quick]

--quickstart runs tiny.yaml's quick start (train.py, with --minutes of budget) quiet, beside
a second training process of 2 threads (the learner's case: tiny.yaml's model, forward,
backward and AdamW in a loop) and beside one busy Python loop, each with the thread count
left to adapt and fixed at 1 and at 2; and a run of fixed length (60 iterations) quiet and
beside the training process. For each: the iterations reached, the validation loss, the
seconds the whole run took, and the parts of it (data and start, evaluations, tries of the
other thread count, training), from the run's summary.json.

    python -m bench.load --quickstart [--minutes 1.5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from bench.common import ROOT, machine, save, table

WORKLOADS = ("train", "decode 1", "decode 8", "evaluate")
SETTINGS = [("default", 2), ("PASSIVE", 2), ("default", 1), ("PASSIVE", 1)]  # (wait policy, threads); the first: before
BUSY = "import time\nend = time.time() + 600\nwhile time.time() < end: pass"  # stops itself, whatever happens
WORKER = """
import json, statistics, sys, time
sys.path.insert(0, {root!r})
import torch
from model import GPT, GPTConfig

workload, seconds = {workload!r}, {seconds!r}
torch.manual_seed(0)
model = GPT(GPTConfig(vocab_size=512, block_size=64, n_layer=4, n_head=4, n_kv_head=2, n_embd=128, pos_encoding="rope"))
batch = torch.randint(512, (32, 64))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

def once():
    if workload == "train":
        _, loss = model(batch, batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    elif workload.startswith("decode"):
        model.generate(batch[:int(workload.split()[1]), :8], 64, temperature=0)
    else:
        with torch.no_grad():
            model.eval()(batch[:16], batch[:16])

once()
times, end = [], time.perf_counter() + seconds
while time.perf_counter() < end or len(times) < 3:
    start = time.perf_counter()
    once()
    times.append(1000 * (time.perf_counter() - start))
print(json.dumps({{"ms": statistics.median(times)}}))
"""


def measure(workload: str, policy: str, threads: int, busy: int, seconds: float) -> float:
    """The median milliseconds of one repetition of `workload`, in a fresh process, beside
    `busy` busy processes."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS", "GOMP_SPINCOUNT")}
    env["OMP_NUM_THREADS"] = str(threads)
    if policy != "default":
        env["OMP_WAIT_POLICY"] = policy
    others = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(busy)]
    try:
        code = WORKER.format(root=str(ROOT), workload=workload, seconds=seconds)
        out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        if out.returncode != 0:
            raise SystemExit(out.stderr[-2000:])
        return json.loads(out.stdout)["ms"]
    finally:
        for other in others:
            other.kill()
            other.wait()


NEIGHBOUR = WORKER.split("once()\ntimes")[0] + "\nwhile True:\n    once()\n"  # a training loop, until killed


def quick_start(threads: str, neighbour: str | None, minutes: float | None, out_dir: str,
                iterations: int = 60) -> dict:
    """One run of tiny.yaml (threads: "adapt", "1" or "2"), beside `neighbour` ("torch":
    a 2-thread training loop; "busy": a Python loop; None: quiet); its summary.json's
    figures and its wall time."""
    import time

    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY")}
    budget = [f"train.max_minutes={minutes}", "train.max_iters=100000"] if minutes else \
        ["train.max_minutes=null", f"train.max_iters={iterations}"]
    command = [sys.executable, "train.py", "--config", "configs/tiny.yaml", f"out_dir={out_dir}", *budget, "--fresh"]
    if threads != "adapt":
        command.append(f"train.threads={threads}")
    others = []
    if neighbour == "torch":
        code = NEIGHBOUR.format(root=str(ROOT), workload="train", seconds=0)
        others.append(subprocess.Popen([sys.executable, "-c", code], env={**env, "OMP_NUM_THREADS": "2"}))
    elif neighbour == "busy":
        others.append(subprocess.Popen([sys.executable, "-c", BUSY]))
    try:
        time.sleep(1.0 if others else 0.0)  # (the neighbour under way first)
        started = time.perf_counter()
        done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=3600)
        wall = time.perf_counter() - started
    finally:
        for other in others:
            other.kill()
            other.wait()
    if done.returncode != 0:
        raise SystemExit(done.stderr[-2000:])
    summary = json.loads((Path(out_dir) / "summary.json").read_text())
    pace = summary.get("pace") or {}
    return {"threads": threads, "neighbour": neighbour or "quiet", "minutes": minutes, "iterations": summary["iteration"],
            "val_loss": summary["val_loss"], "wall_seconds": wall, "run_seconds": summary["seconds"],
            "training_seconds": pace.get("training_seconds"), "evaluation_seconds": pace.get("evaluation_seconds"),
            "tried_seconds": summary["threads"]["tried_seconds"], "threads_at_end": summary["threads"]["count"],
            "best_pace": pace.get("best_pace"), "busy_share": pace.get("busy_share")}


def quick_starts(minutes: float, out: str | None) -> None:
    """--quickstart: the table of the docs (docs/performance.md, "On a busy machine")."""
    import tempfile

    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for neighbour in (None, "torch", "busy"):
            for threads in ("adapt", "1", "2"):
                results.append(quick_start(threads, neighbour, minutes, f"{tmp}/run"))
                print(json.dumps(results[-1]), flush=True)
        for neighbour in (None, "torch"):
            results.append(quick_start("adapt", neighbour, None, f"{tmp}/run"))
            print(json.dumps(results[-1]), flush=True)
    rows = [[r["neighbour"], r["threads"], r["minutes"] or "60 iterations", r["iterations"], r["val_loss"],
             r["run_seconds"], r["evaluation_seconds"], r["tried_seconds"], r["training_seconds"], r["threads_at_end"]]
            for r in results]
    print(table(["beside", "threads", "budget (min)", "iterations", "val loss", "run (s)", "evaluations (s)",
                 "tries of the other count (s)", "training (s)", "threads at the end"], rows))
    path = save("load_quickstart", {"machine": machine(0), "results": results}, out)
    print(f"saved {path}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=2.0, help="measuring time of each run")
    p.add_argument("--rounds", type=int, default=3, help="turns of all the settings")
    p.add_argument("--busy", type=int, nargs="+", default=[0, 1], help="busy processes beside it")
    p.add_argument("--quick", action="store_true", help="quiet only, one workload, short (a test runs this)")
    p.add_argument("--out", help="JSON results (default bench/results/load.json)")
    p.add_argument("--quickstart", action="store_true", help="tiny.yaml's quick start beside other work (above)")
    p.add_argument("--minutes", type=float, default=1.5, help="--quickstart's budget")
    args = p.parse_args()
    if args.quickstart:
        quick_starts(args.minutes, args.out)
        return
    workloads, busy, seconds, rounds = (WORKLOADS[1:2], [0], 0.2, 1) if args.quick else \
        (WORKLOADS, args.busy, args.seconds, args.rounds)
    results, rows = [], []
    for workload in workloads:
        for n in busy:
            runs = {setting: [] for setting in SETTINGS}
            for _ in range(rounds):
                for setting in SETTINGS:
                    runs[setting].append(measure(workload, *setting, n, seconds))
            for (policy, threads), times in runs.items():
                results.append({"workload": workload, "busy": n, "policy": policy, "threads": threads,
                                "ms": statistics.median(times), "runs": times})
    before = {(r["workload"], r["busy"]): r["ms"] for r in results if (r["policy"], r["threads"]) == SETTINGS[0]}
    quiet = {(r["workload"], r["policy"], r["threads"]): r["ms"] for r in results if r["busy"] == busy[0]}
    for r in results:
        rows.append([r["workload"], r["busy"], r["policy"], r["threads"], r["ms"],
                     f"{r['ms'] / before[r['workload'], r['busy']]:.2f}",
                     f"{r['ms'] / quiet[r['workload'], r['policy'], r['threads']]:.2f}"])
    print(table(["workload", "busy processes", "OMP_WAIT_POLICY", "threads", "ms (median)",
                 "/ before (default, 2 threads)", f"/ itself with {busy[0]} busy"], rows))
    path = save("load", {"machine": machine(0), "results": results}, args.out)
    print(f"saved {path}")


if __name__ == "__main__":
    main()
