"""Every program shares the CPU by one rule (machine/threads.py): torch's thread count from
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
# threads), and prints what it left; then, where asked, runs it again with --threads 3 (one
# process: torch's import is most of a run's time).
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
left = {{"code": code, "policy_when_torch_loaded": seen.get("policy"), "threads": torch.get_num_threads()}}
if {chosen!r}:
    {program}.main({args!r} + ["--threads", "3"])
    left["threads_chosen"] = torch.get_num_threads()
print(json.dumps(left))
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
# (evaluate.py's adapting count starts on one thread before its checkpoint is read; train.py's
# when the trainer is built, after the checks these runs fail)
DEFAULT = {"train": os.cpu_count(), "evaluate": 1, "generate": 1, "explore": 1, "export": 1}


def run(program: str, args: list[str], chosen: bool = False, **env: str) -> dict:
    environment = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS")} | env
    script = SCRIPT.format(root=str(ROOT), program=program, args=args, chosen=chosen)
    out = subprocess.run([sys.executable, "-c", script],
                         cwd=ROOT, env=environment, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.splitlines()[-1])


@pytest.mark.parametrize("program", list(ARGS))
def test_each_program_sets_the_policy_before_torch_and_its_threads(program):
    assert run(program, ARGS[program], chosen=True) == {"code": 2, "policy_when_torch_loaded": None,
                                                        "threads": DEFAULT[program], "threads_chosen": 3}


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
    """Two threads, 1 s an iteration, one 1.6 s; beside a busy neighbour two take 3 s and one
    2 s. The work starts on one thread (the cheaper mistake) and tries two after a stretch.
    A try of the other count ends after one iteration when it is clearly slower, and comes
    ever more rarely while the count in use keeps winning, and never so soon that the losing
    tries would cost more than 5% of the time: a quiet run of 1,000 iterations spends under
    1% of its time on one thread, a busy one within 5% on two.
    When the neighbour comes, a stretch ends as soon as it is overdue and one thread is tried
    at once. Time given to other work (pause) does not count, and a count the user chose is
    never changed."""
    import torch

    from machine.threads import AdaptiveThreads

    monkeypatch.setattr(torch, "get_num_threads", lambda: threads[0])
    monkeypatch.setattr(torch, "set_num_threads", lambda n: threads.__setitem__(0, n))
    threads, clock, done = [2], Clock(), [0]
    adapt = AdaptiveThreads(True, clock)
    assert threads[0] == 1

    def run(seconds_per_iteration: dict, iterations: int) -> list[int]:
        used = []
        for _ in range(iterations):
            used.append(threads[0])
            clock.now += seconds_per_iteration[threads[0]]
            done[0] += 1
            adapt.update(done[0])
        return used

    quiet, busy = {2: 1.0, 1: 1.6}, {2: 3.0, 1: 2.0}
    assert run(quiet, 1) == [1]  # (the first update only starts the count)
    ran = run(quiet, 1000)
    assert ran.index(2) == 10 and ran[10:13] == [2, 2, 2]  # the first try: two threads, kept
    tries = [i for i, n in enumerate(ran) if n == 1 and i > 13]
    gaps = [b - a for a, b in zip(tries, tries[1:])]
    assert 4 <= len(tries) <= 6 and all(b >= 2 * a - 1 for a, b in zip(gaps, gaps[1:]))  # ever rarer
    assert adapt.lost == pytest.approx(len(tries) * 1.6) and adapt.lost < 0.01 * sum(quiet[n] for n in ran)
    clock.now += 500  # an evaluation on either count
    adapt.pause()
    assert run(quiet, 1) == [2]
    lost = adapt.lost
    ran = run(busy, 200)
    assert ran.count(1) >= 180 and ran.index(1) <= 6  # the neighbour came: one thread, within half a stretch
    tried = [i for i, n in enumerate(ran) if n == 2 and i > ran.index(1)]
    assert tried and adapt.lost - lost == pytest.approx(3.0 * len(tried))
    assert adapt.lost - lost <= 0.05 * sum(busy[n] for n in ran)
    ran = run(quiet, 200)
    assert ran.count(2) >= 60 and ran[-1] == 2  # it went: two again, at the next try (one thread barely feels it)
    fixed = AdaptiveThreads(False, clock)
    for n in (10, 20, 30):
        clock.now += 100 * n
        fixed.update(n)
    assert threads[0] == 2


def test_a_run_of_fixed_length_chooses_once_and_keeps_its_choice(monkeypatch):
    """once: the first try decides, for good (the count is saved with the run's state: a
    resumed run takes it as `chosen` and never tries)."""
    import torch

    from machine.threads import AdaptiveThreads

    monkeypatch.setattr(torch, "get_num_threads", lambda: threads[0])
    monkeypatch.setattr(torch, "set_num_threads", lambda n: threads.__setitem__(0, n))
    threads, clock = [2], Clock()
    once = AdaptiveThreads(True, clock, once=True)
    pace = {2: 3.0, 1: 2.0}  # a busy start: one thread is faster
    for n in range(1, 40):
        clock.now += pace[threads[0]]
        once.update(n)
    assert once.chosen == 1 and threads[0] == 1 and not once.enabled
    pace = {2: 1.0, 1: 1.6}  # the neighbour left: the choice stands (the run stays bit-identical on resume)
    for n in range(40, 400):
        clock.now += pace[threads[0]]
        once.update(n)
    assert threads[0] == 1
    threads[0] = 2
    resumed = AdaptiveThreads(True, clock, once=True)
    resumed.keep(1)
    assert threads[0] == 1 and not resumed.enabled and resumed.chosen == 1


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="one core: there is no other thread count to adapt to")
def test_only_a_run_fitted_to_a_time_budget_adapts_its_threads(micro, monkeypatch):
    """A count the user chose (--threads, OMP_NUM_THREADS) is never changed; otherwise a run
    fitted to a time budget follows the machine, and a run of fixed length chooses once."""
    import torch

    from conftest import make_trainer

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)  # (the user's would come first)
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)  # (this process's count stays)
    monkeypatch.setattr(torch, "get_num_threads", lambda: os.cpu_count() or 1)
    unset = [o for o in micro() if not o.startswith("train.threads")] + ["train.threads=0"]
    fixed = make_trainer(unset).threads
    assert fixed.enabled is True and fixed.once is True
    budgeted = make_trainer([*unset, "train.max_minutes=1"]).threads
    assert budgeted.enabled is True and budgeted.once is False
    assert make_trainer([*unset[:-1], "train.threads=1", "train.max_minutes=1"]).threads.enabled is False
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert make_trainer(unset).threads.enabled is False


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="one core: there is no other thread count to choose")
def test_the_count_a_run_of_fixed_length_chose_is_saved_and_resumed(micro, monkeypatch, tmp_path):
    """The choice goes into the run's state; a resumed run takes it and never tries again,
    so that the rest of the run sums in the same order as the run never stopped."""
    import torch

    import train
    from runs.folder import RunDir
    from conftest import make_trainer
    from training.state import TrainerState

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    unset = [o for o in micro("train.max_iters=30", "train.checkpoint_interval=15") if not o.startswith("train.threads")]
    assert train.main(["--config", str(ROOT / "configs" / "tiny.yaml"), *unset, "train.threads=0"]) == 0
    state = TrainerState.from_dict(RunDir(tmp_path / "run").load_state(), "run")
    assert state.threads in (1, os.cpu_count())
    before = torch.get_num_threads()
    resumed = make_trainer([*unset, "train.threads=0", "train.max_iters=40"])
    assert resumed.threads.chosen == state.threads == torch.get_num_threads() and not resumed.threads.enabled
    torch.set_num_threads(before)
