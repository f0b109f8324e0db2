"""Shared by the benchmarks: alternating timed runs, medians, markdown tables, JSON."""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Callable

import torch

ROOT = Path(__file__).resolve().parent.parent

RESULTS = ROOT / "bench" / "results"


def machine(threads: int) -> dict:
    return {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(), "threads": threads,
            "torch": torch.__version__, "python": platform.python_version(),
            "date": time.strftime("%Y-%m-%d")}


def alternate(candidates: dict[str, Callable[[], float]], rounds: int) -> dict[str, float]:
    """Run each candidate once per round, in turn (A, B, A, B, ...), so that a busy
    neighbour slows all of them alike; each returns a measurement; report medians."""
    samples: dict[str, list[float]] = {name: [] for name in candidates}
    for _ in range(rounds):
        for name, run in candidates.items():
            samples[name].append(run())
    return {name: statistics.median(values) for name, values in samples.items()}


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def table(headers: list[str], rows: list[list]) -> str:
    def fmt(v):
        if isinstance(v, float):
            return f"{v:,.4g}" if abs(v) < 10 else f"{v:,.0f}"
        return str(v)

    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def save(name: str, payload: dict, out: str | None) -> Path:
    path = Path(out) if out else RESULTS / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2) + "\n")
    return path
