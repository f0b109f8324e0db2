"""Every program shares the CPU by one rule (common/threads.py): torch's thread count from
--threads, else the user's OMP_NUM_THREADS, else the default measured for the program's
kind of work; OpenMP's wait policy is the user's or OpenMP's own. Each case runs in a
fresh process, where torch has not loaded yet; AdaptiveThreads runs on a clock of its own."""

import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT

# Records the wait policy at the moment torch is first imported, runs the program's main
# with ARGS (its input is missing, so it stops with exit 2 right after choosing its
# threads), and prints what it left.
SCRIPT = """
import importlib.abc, json, os, sys
sys.path.insert(0, {root!r})
seen = {{}}

class Watch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "torch" and "policy" not in seen:
            seen["policy"] = os.environ.get("OMP_WAIT_POLICY")
        return None

sys.meta_path.insert(0, Watch())
import {program}
code = {program}.main({args!r})
import torch
print(json.dumps({{"code": code, "policy_when_torch_loaded": seen.get("policy"), "threads": torch.get_num_threads()}}))
"""

MISSING = str(ROOT / "no-such-run")
ARGS = {
    "train": ["--config", str(ROOT / "configs" / "tiny.yaml"), f"data.source={MISSING}.txt", "train.threads=0",
              f"out_dir={MISSING}"],
    "generate": ["--checkpoint", MISSING, "--prompt", "A"],
    "evaluate": ["--checkpoint", MISSING, "--split", "val"],
    "explore": ["--checkpoint", MISSING, "--prompt", "A", "--out", f"{MISSING}.html"],
    "export": ["--checkpoint", MISSING, "--out", f"{MISSING}-hf"],
}
DEFAULT = {"train": os.cpu_count(), "evaluate": os.cpu_count(), "generate": 1, "explore": 1, "export": 1}


def run(program: str, args: list[str], **env: str) -> dict:
    environment = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS")} | env
    out = subprocess.run([sys.executable, "-c", SCRIPT.format(root=str(ROOT), program=program, args=args)],
                         cwd=ROOT, env=environment, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.splitlines()[-1])


@pytest.mark.parametrize("program", list(ARGS))
def test_each_program_sets_the_policy_before_torch_and_its_threads(program):
    default = run(program, ARGS[program])
    assert default == {"code": 2, "policy_when_torch_loaded": None, "threads": DEFAULT[program]}
    chosen = run(program, [*ARGS[program], "--threads", "3"])
    assert chosen["threads"] == 3


def test_the_users_environment_comes_before_the_defaults():
    """torchrun sets OMP_NUM_THREADS=1 for each worker; a user may want OpenMP to spin."""
    assert run("generate", ARGS["generate"], OMP_NUM_THREADS="2", OMP_WAIT_POLICY="ACTIVE") == \
        {"code": 2, "policy_when_torch_loaded": "ACTIVE", "threads": 2}
    assert run("train", ARGS["train"], OMP_NUM_THREADS="1")["threads"] == 1
    assert run("train", [*ARGS["train"][:-2], "train.threads=2", ARGS["train"][-1]], OMP_NUM_THREADS="1")["threads"] == 2


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_training_takes_one_thread_while_another_program_makes_it_faster(monkeypatch):
    """Two threads, 1 s an iteration, one 1.6 s; beside a busy neighbour two take 3 s and
    one 2 s. Each phase of 100 stretches runs mostly on the faster count: the tries of the
    other one grow rarer while the count in use keeps winning, and come at once when the
    pace changes. Time given to other work (pause) does not count, and a count the user
    chose is never changed."""
    import torch

    from common.threads import AdaptiveThreads

    monkeypatch.setattr(torch, "get_num_threads", lambda: threads[0])
    monkeypatch.setattr(torch, "set_num_threads", lambda n: threads.__setitem__(0, n))
    threads, clock, done = [2], Clock(), [0]
    adapt = AdaptiveThreads(True, clock)

    def stretch(seconds_per_iteration: dict, iterations: int = 10) -> int:
        used = threads[0]
        clock.now += iterations * seconds_per_iteration[used]
        done[0] += iterations
        adapt.update(done[0])
        return used

    quiet, busy = {2: 1.0, 1: 1.6}, {2: 3.0, 1: 2.0}
    stretch(quiet)  # (the first update only starts the count)
    ran = [stretch(quiet) for _ in range(100)]
    assert ran.count(2) >= 92 and ran[:3] == [2, 2, 1]  # one thread tried soon, then ever more rarely
    clock.now += 500  # an evaluation on either count
    adapt.pause()
    assert stretch(quiet) == 2 and threads[0] == 2
    ran = [stretch(busy) for _ in range(100)]
    assert ran.count(1) >= 90 and ran[:3] == [2, 1, 1]  # the neighbour came: one thread at once
    ran = [stretch(quiet) for _ in range(100)]
    assert ran.count(2) >= 90 and ran[-1] == 2  # it went: two again
    fixed = AdaptiveThreads(False, clock)
    for n in (10, 20, 30):
        clock.now += 100 * n
        fixed.update(n)
    assert threads[0] == 2


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="one core: there is no other thread count to adapt to")
def test_only_a_run_fitted_to_a_time_budget_adapts_its_threads(micro, monkeypatch):
    """A thread count changes the last bits of sums, so a run of fixed length keeps one
    (a resume stays bit-identical); one fitted to a time budget depends on the machine."""
    import torch

    from conftest import make_trainer

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)  # (the user's would come first)
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)  # (this process's count stays)
    monkeypatch.setattr(torch, "get_num_threads", lambda: os.cpu_count() or 1)
    unset = [o for o in micro() if not o.startswith("train.threads")] + ["train.threads=0"]
    assert make_trainer(unset).threads.enabled is False
    assert make_trainer([*unset, "train.max_minutes=1"]).threads.enabled is True
    assert make_trainer([*unset[:-1], "train.threads=1", "train.max_minutes=1"]).threads.enabled is False
