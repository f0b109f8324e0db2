"""train.max_minutes: how many iterations fit in a time budget.

The budget covers the whole run, data preparation and evaluations included, across
resumes: each checkpoint records the seconds its run had used. The pace is measured
twice: a first estimate from MEASURED timed iterations and one evaluation with its
checkpoint, then, at every evaluation, the wall time per iteration since that estimate
(the first evaluation on a cold GPU can take several times as long as the later ones,
and a machine's speed may change). Each time `stop_iteration` turns what is left of the
budget into the iteration to stop at.
"""

from __future__ import annotations

from typing import Callable

MEASURED = 10  # timed iterations of the first estimate
SETTLING = 2  # iterations left out before them: the first ones are slower


def stop_iteration(it: int, seconds_left: float, seconds_per_iteration: float, cap: int) -> int:
    """The iteration to train to: `it` and as many more as fit in `seconds_left` at
    `seconds_per_iteration` (at least one more), but never past `cap` (the configured
    max_iters, an upper bound)."""
    more = int(max(0.0, seconds_left) / seconds_per_iteration)
    return min(it + max(1, more), cap)


def finished(state: dict, cap: int, minutes: float, seconds_before: float) -> bool:
    """Whether a checkpoint's run has nothing left to train under the budget: it reached
    `cap`, or its time is spent, or it ended where its fitted max_iters said and the
    budget was not raised since. (A checkpoint saved before the first fit records no
    max_iters: it is finished only at `cap`.)"""
    ended = state["iter"] >= state.get("max_iters", cap)
    same_budget = minutes <= state.get("max_minutes", minutes)
    return state["iter"] >= cap or seconds_before >= minutes * 60 or (ended and same_budget)


class TimeBudget:
    """The pace of one process, measured against what is left of the run's budget;
    `used()` is the wall time of the whole run so far (the trainer's seconds_used)."""

    def __init__(self, minutes: float, used: Callable[[], float], clock: Callable[[], float]):
        self.seconds, self.used, self.clock = minutes * 60, used, clock
        self.first_at: int | None = None  # the first timed iteration
        self.first_clock = 0.0
        self.mark: tuple[float, int] | None = None  # (time, iteration) of the first estimate

    def begin(self, it: int) -> None:
        """The loop starts at iteration `it`; the timed iterations come after SETTLING ones."""
        self.first_at = it + SETTLING

    def first_estimate_due(self, it: int) -> bool:
        """Called after each iteration: True once, when the timed iterations are done."""
        if it == self.first_at:
            self.first_clock = self.clock()
        return self.mark is None and self.first_at is not None and it == self.first_at + MEASURED

    def step_seconds(self) -> float:
        """Seconds per iteration over the timed iterations."""
        return (self.clock() - self.first_clock) / MEASURED

    def first_estimate(self, it: int, step_seconds: float, overhead: float, eval_interval: int, cap: int) -> int:
        """The iteration to stop at from the timed steps and what one evaluation with its
        checkpoint cost (`overhead`: shared by eval_interval iterations, and kept for the
        last evaluation)."""
        self.mark = (self.clock(), it)
        per_iteration = step_seconds + overhead / eval_interval
        return stop_iteration(it, self.seconds - self.used() - overhead, per_iteration, cap)

    def refit(self, it: int, eval_seconds: float, cap: int) -> int | None:
        """At an evaluation: the iteration to stop at from the pace since the first
        estimate (evaluations and checkpoints included); None before that estimate."""
        if self.mark is None or it <= self.mark[1]:
            return None
        clock, at = self.mark
        per_iteration = (self.clock() - clock) / (it - at)
        return stop_iteration(it, self.seconds - self.used() - eval_seconds, per_iteration, cap)
