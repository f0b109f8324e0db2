"""The run's clock, and train.max_minutes: how many iterations fit in a time budget.

The clock counts the whole run, data preparation and evaluations included, across
resumes: each checkpoint records the seconds its run had used (state_dict). With a
budget, the pace is measured while the run trains: a first estimate after MEASURED timed
iterations (SETTLING left out before them: the first ones are slower), then again at every
read of the losses, from the pace since the last one (another program may start or stop
using the cores). What an evaluation and its checkpoint cost is estimated from a few of the
evaluation's own batches, scaled (the trainer measures them: `expect_overhead`), until the
first real one is timed, so that no evaluation is forced early in the run. Each time,
`stop_iteration` turns what is left of the budget into the iteration to stop at.

Where the run ends follows every estimate, both ways; the trainer shortens the learning
rate's warm-up only once the estimates agree (`settled`), so that no first guess on a busy
start cuts it for good. The budget also keeps the best pace it measured and how long the
machine ran slower than that (`report`): what the run got against what this machine can do.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, NamedTuple

from .schedule import Anchor, Ramp, Schedule

MEASURED = 10  # timed iterations of the first estimate
SETTLING = 2  # iterations left out before them: the first ones are slower
SMOOTHING = 0.5  # the weight of the latest pace in the pace used (the rest: the pace before)
AGREEING = 3  # estimates whose ends agree within AGREEMENT of each other: the pace has settled
AGREEMENT = 0.2
BUSY = 1.5  # a stretch this many times as slow as the best pace measured: the machine was busy
WARMUP_SHARE = 0.1  # a run fitted shorter than its warm-up allows: the share of the rest spent warming up


def stop_iteration(it: int, seconds_left: float, seconds_per_iteration: float, cap: int) -> int:
    """The iteration to train to: `it` and as many more as fit in `seconds_left` at
    `seconds_per_iteration` (at least one more), but never past `cap` (the configured
    max_iters, an upper bound)."""
    more = int(max(0.0, seconds_left) / max(seconds_per_iteration, 1e-6))
    return min(it + max(1, more), cap)


class Mark(NamedTuple):
    """Where the pace is measured from."""

    time: float
    iteration: int
    overhead: float  # the evaluations' seconds up to then (left out of the pace)


class TimeBudget:
    """The seconds the run has used, and with `minutes`, the iteration that fits them:
    `max_iters`, at most `cap` (train.max_iters). The budget owns max_iters: `fit` proposes
    where to stop, and the trainer, once every process agrees, calls `stop_at`."""

    def __init__(self, minutes: float | None, cap: int, eval_interval: int, clock: Callable[[], float],
                 seconds_before: float = 0.0):
        self.minutes = minutes
        self.cap = cap
        self.eval_interval = eval_interval
        self.clock = clock
        self.started = clock() - seconds_before  # (seconds_before: this process's set-up, counted in the run)
        self.earlier = 0.0  # the seconds earlier processes of the run used, up to their checkpoint
        self.max_iters = cap
        self.first_timed: int | None = None  # the first timed iteration of this process
        self.mark: Mark | None = None
        self.pace: float | None = None  # seconds per iteration, evaluations left out (smoothed)
        self.overhead: float | None = None  # seconds of an evaluation with its checkpoint: estimated, then measured
        self.overhead_measured = False
        self.overhead_total = 0.0  # seconds of all of them, in this process
        self.estimates: list[int] = []  # the iterations each fit proposed, in this process
        self.stretches: list[tuple[float, float]] = []  # (seconds, seconds per iteration) between two fits

    def seconds_used(self) -> float:
        """Wall time of the whole run so far."""
        return self.earlier + self.clock() - self.started

    def state_dict(self) -> dict:
        return {"seconds": self.seconds_used(), "max_iters": self.max_iters, "minutes": self.minutes}

    def load_state_dict(self, state: dict, it: int) -> None:
        """A run resumed at iteration `it`: its seconds count on. A run with nothing left to
        train stays finished: it reached the cap, or its time is spent, or it ended where
        its fitted max_iters said and the budget was not raised since. Under the same
        budget the fitted length stands until the pace is measured again."""
        self.earlier = state["seconds"]
        if self.minutes is None:
            return
        same_budget = state["minutes"] is not None and self.minutes <= state["minutes"]
        if it >= self.cap or state["seconds"] >= self.minutes * 60 or (same_budget and it >= state["max_iters"]):
            self.max_iters = it
        elif same_budget:
            self.max_iters = min(state["max_iters"], self.cap)

    def begin(self, it: int) -> None:
        """The loop starts at iteration `it`; the timed iterations come after SETTLING ones."""
        self.first_timed = it + SETTLING

    def step_done(self, it: int) -> None:
        """Called after every iteration: the pace is measured from the first timed one on (a
        run of fixed length's too, for what `report` says of a busy machine)."""
        if it == self.first_timed:
            self.mark = Mark(self.clock(), it, self.overhead_total)

    def needs_overhead(self, it: int) -> bool:
        """Whether the first estimate waits for an estimate of the evaluation (expect_overhead)."""
        return (self.minutes is not None and self.overhead is None and self.mark is not None
                and it - self.mark.iteration >= MEASURED)

    def expect_overhead(self, seconds: float) -> None:
        """An evaluation and its checkpoint should take about `seconds` (until one is timed)."""
        if not self.overhead_measured:
            self.overhead = seconds

    def spent_on_evaluation(self, seconds: float) -> None:
        """An evaluation and its checkpoint took `seconds`: time that is not training's pace."""
        self.overhead = seconds
        self.overhead_measured = True
        self.overhead_total += seconds

    def stop_at(self, it: int) -> None:
        """Train to iteration `it` (what `fit` proposed, agreed on by every process)."""
        self.max_iters = it

    def fit(self, it: int) -> int | None:
        """The iteration to stop at, from the pace since the last fit (smoothed) and what an
        evaluation costs; None while there is no estimate yet, and always without a budget
        (whose pace is still measured, for `report`)."""
        if self.mark is None or it >= self.max_iters:
            return None  # (at max_iters the run has ended: its last evaluation is done)
        if (self.minutes is not None and self.overhead is None) or it - self.mark.iteration < (MEASURED if self.pace
                                                                                             is None else 1):
            return None
        now = self.clock()
        seconds = now - self.mark.time - (self.overhead_total - self.mark.overhead)
        pace = seconds / (it - self.mark.iteration)
        self.stretches.append((seconds, pace))
        self.pace = pace if self.pace is None else SMOOTHING * pace + (1 - SMOOTHING) * self.pace
        self.mark = Mark(now, it, self.overhead_total)
        if self.minutes is None:
            return None
        per_iteration = self.pace + self.overhead / self.eval_interval
        left = self.minutes * 60 - self.seconds_used() - self.overhead  # kept for the last evaluation
        target = stop_iteration(it, left, per_iteration, self.cap)
        self.estimates.append(target)
        return target

    def settled(self) -> bool:
        """Whether the last AGREEING estimates agree within AGREEMENT of each other: the pace
        has settled enough to act on for good (the warm-up's length)."""
        last = self.estimates[-AGREEING:]
        return len(last) == AGREEING and max(last) <= (1 + AGREEMENT) * min(last)

    def report(self) -> dict | None:
        """What the run got against this machine at its best: the best pace it measured
        (seconds per iteration, evaluations left out), the iterations of its timed
        stretches and those the same time would have reached at that pace, and the share
        of that time the machine ran at least BUSY times as slow (another program on the
        cores). None before any fit."""
        if not self.stretches:
            return None
        best = min(pace for _, pace in self.stretches)
        training = sum(seconds for seconds, _ in self.stretches)
        busy = sum(seconds for seconds, pace in self.stretches if pace >= BUSY * best)
        return {"best_pace": best, "timed_iterations": round(sum(seconds / pace for seconds, pace in self.stretches)),
                "at_best_pace": round(training / best), "busy_share": busy / training if training > 0 else 0.0,
                "training_seconds": training, "evaluation_seconds": self.overhead_total, "budget": self.minutes is not None}


def refitted(schedule: Schedule, it: int, decay_iters: int, shorten: bool = True) -> Schedule:
    """`schedule` with its decay ending at decay_iters instead, going on from iteration `it`
    (a time budget's refit, a finished run given a larger max_iters): the rest of the curve is
    stretched from where it stands, its progress going on from its value at `it` (the anchor)
    to 1 at decay_iters, so the rate never jumps; a run continued after its end stays at the
    floor. In the warm-up nothing has decayed yet: the new length counts from the start; and
    with `shorten` (allowed once the pace has settled), a warm-up that would take more than
    WARMUP_SHARE of what is left of the run is shortened to that share (shortened_warmup)."""
    if decay_iters == schedule.decay_iters:
        return schedule
    if it < schedule.warmup:
        if shorten:
            schedule = shortened_warmup(schedule, it, decay_iters)
    elif it > schedule.warmup:
        schedule = dataclasses.replace(schedule, anchor=Anchor(it, schedule.progress(it), schedule.cooldown_start()))
    return dataclasses.replace(schedule, decay_iters=decay_iters)


def shortened_warmup(schedule: Schedule, it: int, decay_iters: int) -> Schedule:
    """At iteration `it` of the warm-up, a run that now ends at decay_iters (a busy machine
    under a time budget): the rest of the warm-up takes at most WARMUP_SHARE of what is left
    of the run (at least one iteration), rising from where the rate stands to the peak
    (`ramp`), so that no run ends still warming up. It only ever gets shorter."""
    end = it + max(1, round(WARMUP_SHARE * (decay_iters - it)))
    if end >= schedule.warmup:
        return schedule
    return dataclasses.replace(schedule, ramp=Ramp(it, schedule(it)), warmup=end)
