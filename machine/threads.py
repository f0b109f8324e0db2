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
the order of some sums, and so the last bits of the weights: a run of a fixed length
chooses its count once, at its start, and keeps it, resumes included, so that a resumed run
ends bit-identical to one never stopped; two fresh runs may choose differently, and then
differ in the last bits. A run fitted to a time budget depends on the machine's speed anyway.) OpenMP's PASSIVE policy (sleep at once) helped
two threads beside a busy process but cost a quiet training step 24% and two-thread
decoding 2.2 times, so it is not set; a user's OMP_WAIT_POLICY is OpenMP's to read.

The thread count, highest first: the program's --threads N (train.py: train.threads), the
user's OMP_NUM_THREADS (torchrun sets 1 for each worker), then the default for the kind
of work (DEFAULT_THREADS; "adapt": one thread or one per core, whichever is faster now,
starting on one: AdaptiveThreads).
"""

from __future__ import annotations

import math
import os
import time
from typing import Callable

DEFAULT_THREADS = {"train": "adapt", "evaluate": "adapt", "generate": 1, "explore": 1, "export": 1}


def thread_help(work: str) -> str:
    default = DEFAULT_THREADS[work]
    return ("torch's CPU threads (default: $OMP_NUM_THREADS if set, else " +
            ("one per core, or one while the machine is so busy that one is faster)" if default == "adapt"
             else f"{default})"))


def adaptable(work: str, requested: int | None = None) -> bool:
    """Whether the thread count of `work` is the default's to adapt (AdaptiveThreads): the
    user asked for no count (--threads, OMP_NUM_THREADS), the default adapts, and there is
    more than one core."""
    if requested is not None or os.environ.get("OMP_NUM_THREADS"):
        return False
    return DEFAULT_THREADS[work] == "adapt" and (os.cpu_count() or 1) > 1


def set_threads(work: str, requested: int | None = None) -> None:
    """Set torch's intra-op threads for `work` by the rule above."""
    import torch

    if requested is not None:
        torch.set_num_threads(requested)
    elif not os.environ.get("OMP_NUM_THREADS"):  # (else torch took it when it loaded)
        default = DEFAULT_THREADS[work]
        torch.set_num_threads(os.cpu_count() or 1 if default == "adapt" else default)


class AdaptiveThreads:
    """Between one thread per core and one thread, the count that does the work faster now.

    The caller says after each unit of work (an iteration, a few batches) how many units it
    has done so far. The work starts on one thread: beside a busy program two threads ran a
    training step up to 25 times as slow as one (bench/load.py), while on a quiet machine
    one is 1.6 times as slow as two, so one is the cheaper mistake. The units run in
    stretches of STRETCH, each timed on the count it ran on (a stretch that has already
    taken SLOWER times what the count's stretch took when it was chosen ends at once). Now
    and then the other count is tried: its first unit is timed, and if it ran SLOWER times
    as slow as the count in use, the try ends at once (a clearly slower count costs one
    unit); else TRY units are timed and the faster count kept. The first try comes after
    FIRST units; each time the count in use wins again, the next comes twice as late (up to
    LONGEST units), and at least as late as keeps every losing try's cost, the next one's
    included, within TRY_SHARE of the work's time: the more it loses, the rarer it is
    tried. When a stretch says the machine changed in a way that favours the other count
    (on one thread per core, SLOWER times as slow as when it was chosen: another program
    took the cores; on one thread, SLOWER times as fast: one left them), the next try comes
    at once. Time the caller spends on other things (an evaluation) is left out with pause().

    once: choose at the first try and keep that count (a run of fixed length: its resume
    stays bit-identical with `chosen`, saved with the run's state, and given back to `keep`)."""

    STRETCH = 10
    SLOWER = 1.3
    TRY = 3
    FIRST = 10
    LONGEST = 1280
    TRY_SHARE = 0.05

    def __init__(self, enabled: bool, clock: Callable[[], float] = time.perf_counter, once: bool = False):
        import torch

        self.torch = torch
        self.many = torch.get_num_threads()
        self.enabled = enabled and self.many > 1
        if self.enabled:
            torch.set_num_threads(1)  # (the cheaper mistake, above)
        self.once = once
        self.chosen: int | None = None
        self.clock = clock
        self.pace: dict[int, float] = {}  # seconds per unit, the last stretch on each count
        self.reference: float | None = None  # the pace of the count in use when it was last chosen
        self.mark = clock()
        self.done: int | None = None  # units done at the last update (None: none yet)
        self.stretch = [0, 0.0]  # units and seconds of the stretch being timed
        self.trying: list[float] | None = None  # seconds per unit of the other count, while it is tried
        self.interval = self.FIRST
        self.countdown = self.FIRST
        self.lost = 0.0  # seconds spent on a count that lost its try
        self.elapsed = 0.0  # seconds of the work timed so far (pauses left out)

    def keep(self, chosen: int) -> None:
        """Use the count a run chose before (`chosen`, from its saved state) from now on."""
        self.torch.set_num_threads(chosen)
        self.chosen = chosen
        self.enabled = False

    def pause(self) -> None:
        """What comes until the next update is not the work's (an evaluation, a checkpoint)."""
        self.mark = self.clock()

    def update(self, done: int) -> None:
        """`done` units of the work are done so far (a running count)."""
        now = self.clock()
        units = done - (self.done if self.done is not None else done)
        seconds = now - self.mark
        self.done = done
        self.mark = now
        if not self.enabled or units <= 0:
            return
        self.elapsed += seconds
        current = self.torch.get_num_threads()
        other = 1 if current == self.many else self.many
        if self.trying is not None:
            self.end_of_try(current, other, seconds / units)
            return
        self.stretch = [self.stretch[0] + units, self.stretch[1] + seconds]
        overdue = self.reference is not None and self.stretch[1] > self.SLOWER * self.STRETCH * self.reference
        if self.stretch[0] >= self.STRETCH or overdue:
            pace = self.stretch[1] / self.stretch[0]
            self.pace[current] = pace
            self.stretch = [0, 0.0]
            if self.reference is None:
                self.reference = pace
            elif self.favours_the_other(current, pace):
                self.interval = self.FIRST
                self.countdown = 0
        self.countdown -= units
        if self.countdown <= 0 and current in self.pace:
            self.torch.set_num_threads(other)
            self.trying = []

    def favours_the_other(self, current: int, pace: float) -> bool:
        """Whether a stretch's pace says the machine changed since `current` was chosen in a
        way that may make the other count the faster: more contention on many threads, or
        less on one."""
        if current == self.many:
            return pace > self.SLOWER * self.reference
        return pace < self.reference / self.SLOWER

    def end_of_try(self, tried: int, before: int, pace: float) -> None:
        """One more unit on the count being tried; end the try where it is clearly slower, or
        after TRY units, keeping the faster count."""
        self.trying.append(pace)
        clearly_slower = pace > self.SLOWER * self.pace[before]
        if not clearly_slower and len(self.trying) < self.TRY:
            return
        faster = not clearly_slower and sorted(self.trying)[len(self.trying) // 2] < self.pace[before]
        if faster:
            self.pace[tried] = sorted(self.trying)[len(self.trying) // 2]
            self.interval = self.FIRST
        else:
            spent = sum(self.trying)  # (a unit per update)
            self.lost += spent
            self.torch.set_num_threads(before)
            # the next try, if it loses as much, keeps every loss within TRY_SHARE of the work's time
            share = math.ceil(((self.lost + spent) / self.TRY_SHARE - self.elapsed) / self.pace[before])
            self.interval = max(min(2 * self.interval, self.LONGEST), share)
        self.countdown = self.interval
        self.trying = None
        self.stretch = [0, 0.0]
        self.reference = self.pace[self.torch.get_num_threads()]
        if self.once:
            self.chosen = self.torch.get_num_threads()
            self.enabled = False
