"""The programs beside other work: each workload's time on a quiet machine and beside one and
two busy processes, for each thread count and OpenMP wait policy.

Workloads, for tiny.yaml's model shape (vocabulary 512, float32): one training step
(forward, backward, AdamW; 32 windows of 64 tokens), decoding 64 tokens with the KV cache
for one prompt and for a batch of 8, and evaluate.py's forward pass (16 windows of 64
tokens, no gradients). Each setting runs in a process of its own, since OpenMP reads its
wait policy once, when torch loads: ACTIVE (spin while waiting: OpenMP's default, what
every program had before common/threads.py) or PASSIVE (sleep), with 1 or 2 threads. The
busy processes are pure-Python loops this benchmark starts before a measurement and stops
after it. Each time is the median of the repetitions that fit in --seconds.

    python -m bench.load [--seconds 3] [--busy 0 1 2] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from bench.common import ROOT, machine, save, table

WORKLOADS = ("train", "decode 1", "decode 8", "evaluate")
BUSY = "import time\nend = time.time() + 600\nwhile time.time() < end: pass"  # stops itself, whatever happens


def worker(workload: str, seconds: float) -> float:
    """The median milliseconds of one repetition of `workload`, in this process."""
    import statistics

    import torch

    from model import GPT, GPTConfig

    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=512, block_size=64, n_layer=4, n_head=4, n_kv_head=2, n_embd=128,
                          pos_encoding="rope"))
    batch = torch.randint(512, (32, 64))
    if workload == "train":
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

        def once():
            _, loss = model(batch, batch)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    elif workload.startswith("decode"):
        prompts = batch[:int(workload.split()[1]), :8]

        def once():
            model.generate(prompts, 64, temperature=0)
    else:
        def once():
            with torch.no_grad():
                model.eval()(batch[:16], batch[:16])

    once()  # warm up
    times, end = [], time.perf_counter() + seconds
    while time.perf_counter() < end or len(times) < 3:
        start = time.perf_counter()
        once()
        times.append(1000 * (time.perf_counter() - start))
    return statistics.median(times)


def measure(workload: str, threads: int, policy: str, busy: int, seconds: float) -> float:
    """One setting, in a fresh process, beside `busy` busy processes."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "OMP_WAIT_POLICY": policy, "PYTHONPATH": str(ROOT)}
    others = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(busy)]
    try:
        out = subprocess.run([sys.executable, "-m", "bench.load", "--worker", workload, "--seconds", str(seconds)],
                             cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        if out.returncode != 0:
            raise SystemExit(out.stderr[-2000:])
        return json.loads(out.stdout)["ms"]
    finally:
        for other in others:
            other.kill()
            other.wait()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=3.0, help="measuring time of each setting")
    p.add_argument("--busy", type=int, nargs="+", default=[0, 1, 2], help="busy processes beside it")
    p.add_argument("--quick", action="store_true", help="quiet only, one workload, short (a test runs this)")
    p.add_argument("--worker", choices=WORKLOADS, help=argparse.SUPPRESS)
    p.add_argument("--out", help="JSON results (default bench/results/load.json)")
    args = p.parse_args()
    if args.worker:
        print(json.dumps({"ms": worker(args.worker, args.seconds)}))
        return
    workloads, busy, seconds = (WORKLOADS[1:2], [0], 0.2) if args.quick else (WORKLOADS, args.busy, args.seconds)
    results, rows = [], []
    for workload in workloads:
        for policy in ("ACTIVE", "PASSIVE"):
            for threads in (1, 2):
                times = {n: measure(workload, threads, policy, n, seconds) for n in busy}
                results.append({"workload": workload, "policy": policy, "threads": threads,
                                "ms": {str(n): t for n, t in times.items()}})
                rows.append([workload, policy, threads, *times.values(),
                             *(f"{times[n] / times[busy[0]]:.2f}" for n in busy[1:])])
                print(" | ".join(map(str, rows[-1])), flush=True)
    headers = ["workload", "OMP_WAIT_POLICY", "threads", *(f"ms, {n} busy" for n in busy),
               *(f"{n} busy / {busy[0]}" for n in busy[1:])]
    print(table(headers, rows))
    path = save("load", {"machine": machine(0), "results": results}, args.out)
    print(f"saved {path}")


if __name__ == "__main__":
    main()
