"""Peak memory: train.py with tiny.yaml, and data preparation of a generated 200 MB text.

Each job runs in a child process whose peak memory the kernel reports in /proc.

    python -m bench.memory [--quick] [--mb 200]
"""

from __future__ import annotations

import argparse
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import ROOT, machine, save, table


def peak_of(cmd: list[str]) -> tuple[float, float, float]:
    """Run cmd in a fresh process; return (peak RSS in MB, peak anonymous memory in MB,
    wall seconds), read from /proc/<pid>/status every 0.1 s while it runs. The peak RSS
    (the kernel's VmHWM) also counts pages of memory-mapped files (token files, datasets'
    Arrow cache), which the kernel can drop at will; anonymous memory cannot be dropped."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    peak = {"VmHWM:": 0, "RssAnon:": 0}
    status = Path(f"/proc/{proc.pid}/status")
    while proc.poll() is None:
        try:
            for fields in map(str.split, status.read_text().splitlines()):  # "VmHWM:  12345 kB"
                if fields and fields[0] in peak:
                    peak[fields[0]] = max(peak[fields[0]], int(fields[1]))
        except OSError:
            pass
        time.sleep(0.1)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}\n{proc.stderr.read()[-2000:]}")
    return peak["VmHWM:"] / 1024, peak["RssAnon:"] / 1024, wall


def generate_text(path: Path, megabytes: float, seed: int = 0) -> None:
    """Random lines of the built-in Shakespeare until the file reaches the size."""
    from data import shakespeare

    lines = [line for speeches in shakespeare.load_plays().values() for s in speeches
             for line in s.splitlines(keepends=True)]
    rng = random.Random(seed)
    target = int(megabytes * 1e6)
    with open(path, "w", encoding="utf-8") as f:
        written = 0
        while written < target:
            block = "".join(rng.choices(lines, k=10_000))
            f.write(block)
            written += len(block.encode())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1 MB and a 5-iteration run (a test runs this)")
    parser.add_argument("--mb", type=float, default=200.0, help="size of the generated text")
    parser.add_argument("--out", help="JSON path (default bench/results/memory.json)")
    args = parser.parse_args()
    mb = 1.0 if args.quick else args.mb
    iters = 5 if args.quick else 300
    rows, results = [], []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        text = tmp / "generated.txt"
        generate_text(text, mb)
        size_mb = text.stat().st_size / 1e6
        source = [f"data.source={text}"] if args.quick else []  # (--quick: not the 4.8 MB built-in corpus)
        rss, anon, wall = peak_of([sys.executable, "train.py", "--config", "configs/tiny.yaml", *source,
                                   f"out_dir={tmp / 'run'}", f"train.max_iters={iters}", "train.eval_interval=100",
                                   "train.sample_tokens=50", f"data.cache_dir={tmp / 'cache'}"])
        corpus = "the generated text" if args.quick else "the built-in corpus"
        rows.append([f"train.py tiny.yaml on {corpus}, {iters} iterations (data preparation included)", rss, anon,
                     wall, ""])
        results.append({"job": "train tiny", "iters": iters, "peak_rss_mb": rss, "peak_anon_mb": anon,
                        "seconds": wall})
        for tokenizer in ("char", "bpe"):
            code = ("from data.config import DataConfig; from jobs import prepare; "
                    f"prepare(DataConfig({str(text)!r}, {tokenizer!r}, 4096, "
                    f"cache_dir={str(tmp / ('prep-' + tokenizer))!r}), progress=False)")
            rss, anon, wall = peak_of([sys.executable, "-c", code])
            rows.append([f"prepare {size_mb:.0f} MB of text, {tokenizer} tokenizer", rss, anon, wall, size_mb / wall])
            results.append({"job": f"prepare {tokenizer}", "megabytes": size_mb, "peak_rss_mb": rss,
                            "peak_anon_mb": anon, "seconds": wall, "mb_per_sec": size_mb / wall})
    print(table(["job", "peak RSS (MB)", "peak anonymous (MB)", "wall (s)", "MB/s"], rows))
    path = save("memory", {"machine": machine(0), "results": results}, args.out)
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
