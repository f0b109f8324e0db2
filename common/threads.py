"""How the programs share the CPU with other work: torch's thread count, one rule for every
program, and OpenMP's wait policy left as OpenMP has it unless the user sets it.

Measured with python -m bench.load on a 2-core machine (docs/performance.md, "On a busy
machine"): beside one busy process, torch's two threads made a training step 2.6 times as
slow and batch-1 decoding 4.2 times, because a thread that waits spins for a while and
fights the other process for the cores. Decoding and the explorer's small forward passes
run as fast on one thread on a quiet machine, and far faster on a busy one, so they use
one. A training step runs 1.6 times as fast on two threads when the machine is quiet and
faster on one when it is not, so evaluation, and training under a time budget, watch their
own pace and take the count that is faster now (AdaptiveThreads). (A thread count changes
the order of some sums, and so the last bits of the weights: a run of a fixed length keeps
one count, so that a resumed run ends bit-identical to one never stopped; a run fitted to
a time budget depends on the machine's speed anyway.) OpenMP's PASSIVE policy (sleep at once) helped
two threads beside a busy process but cost a quiet training step 24% and two-thread
decoding 2.2 times, so it is not set; a user's OMP_WAIT_POLICY is OpenMP's to read.

The thread count, highest first: the program's --threads N (train.py: train.threads), the
user's OMP_NUM_THREADS (torchrun sets 1 for each worker), then the default for the kind
of work (DEFAULT_THREADS; "adapt": one per core, and one while that is slower).
"""

from __future__ import annotations

import os
import time
from typing import Callable

DEFAULT_THREADS = {"train": "adapt", "evaluate": "adapt", "generate": 1, "explore": 1, "export": 1}


def thread_help(work: str) -> str:
    default = DEFAULT_THREADS[work]
    return ("torch's CPU threads (default: $OMP_NUM_THREADS if set, else " +
            ("one per core, or one while the machine is so busy that one is faster)" if default == "adapt"
             else f"{default})"))


def use_threads(work: str, requested: int | None = None) -> bool:
    """Set torch's intra-op threads for `work` by the rule above; True where the count is
    the default's to adapt (then AdaptiveThreads may change it)."""
    import torch

    if requested is not None:
        torch.set_num_threads(requested)
        return False
    if os.environ.get("OMP_NUM_THREADS"):
        return False  # (torch took it when it loaded)
    default = DEFAULT_THREADS[work]
    torch.set_num_threads(os.cpu_count() or 1 if default == "adapt" else default)
    return default == "adapt" and (os.cpu_count() or 1) > 1


class AdaptiveThreads:
    """Between one thread per core and one thread, the count that does the work faster now.

    The caller says now and then how many units (iterations, batches) it has done; each
    stretch between two updates is timed on the count it ran on. Now and then the other
    count is tried for a stretch and the faster kept: soon after the start, then after
    twice as many stretches each time the count in use wins again (up to LONGEST), and at
    once when a stretch runs SLOWER times as slow as the one before it on the same count
    (another program took the cores, or left them). Time the caller spends on other things
    (evaluations) is left out with pause()."""

    SLOWER = 1.3
    FIRST = 2  # stretches before the first try
    LONGEST = 32  # stretches between tries, at most

    def __init__(self, enabled: bool, clock: Callable[[], float] = time.perf_counter):
        import torch

        self.torch = torch
        self.many = torch.get_num_threads()
        self.enabled = enabled and self.many > 1
        self.clock = clock
        self.pace: dict[int, float] = {}  # seconds per unit, the last stretch on each count
        self.mark = clock()
        self.done: int | None = None  # units done at the last update (None: none yet)
        self.trying: int | None = None  # the count the stretch now running tries, if any
        self.interval = self.FIRST
        self.countdown = self.FIRST

    def pause(self) -> None:
        """What comes until the next update is not the work's (an evaluation, a checkpoint)."""
        self.mark = self.clock()

    def update(self, done: int) -> None:
        """`done` units of the work are done so far (a running count); the stretch since
        the last update decides."""
        now = self.clock()
        units = done - (self.done if self.done is not None else done)
        self.done = done
        if not self.enabled or units <= 0:
            self.mark = now
            return
        current = self.torch.get_num_threads()
        other = 1 if current == self.many else self.many
        pace = (now - self.mark) / units
        before = self.pace.get(current)
        self.pace[current] = pace
        if self.trying is not None:  # this stretch tried `current` against `other`
            self.trying = None
            kept = other if self.pace[other] < pace else current
            self.torch.set_num_threads(kept)
            self.interval = self.FIRST if kept == current else min(2 * self.interval, self.LONGEST)
            self.countdown = self.interval
        else:
            self.countdown -= 1
            if self.countdown <= 0 or (before is not None and pace > self.SLOWER * before):
                self.torch.set_num_threads(other)
                self.trying = other
        self.mark = self.clock()
