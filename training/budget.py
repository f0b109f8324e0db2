"""The run's clock, and train.max_minutes: how many iterations fit in a time budget.

The clock counts the whole run, data preparation and evaluations included, across
resumes: each checkpoint records the seconds its run had used (state_dict). With a
budget, the pace is measured while the run trains: a first estimate after MEASURED timed
iterations and one evaluation with its checkpoint (the loop evaluates early for it), then
again at every read of the losses, from the pace since the last one (the first
evaluation on a cold GPU can take several times as long as the later ones, and another
program may start or stop using the cores). Each time, `stop_iteration` turns what is
left of the budget into the iteration to stop at.
"""

from __future__ import annotations

from typing import Callable

MEASURED = 10  # timed iterations of the first estimate
SETTLING = 2  # iterations left out before them: the first ones are slower
SMOOTHING = 0.5  # the weight of the latest pace in the pace used (the rest: the pace before)


def stop_iteration(it: int, seconds_left: float, seconds_per_iteration: float, cap: int) -> int:
    """The iteration to train to: `it` and as many more as fit in `seconds_left` at
    `seconds_per_iteration` (at least one more), but never past `cap` (the configured
    max_iters, an upper bound)."""
    more = int(max(0.0, seconds_left) / max(seconds_per_iteration, 1e-6))
    return min(it + max(1, more), cap)


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
        self.mark: tuple[float, int, float] | None = None  # (time, iteration, overhead so far) the pace is measured from
        self.pace: float | None = None  # seconds per iteration, evaluations left out
        self.overhead: float | None = None  # seconds of the last evaluation with its checkpoint
        self.overhead_total = 0.0  # seconds of all of them, in this process
        self.estimates = 0  # fits made in this process (the first one is said)

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

    def wants_evaluation(self, it: int) -> bool:
        """Called after every iteration: True once, after the first timed iterations, when
        the first estimate needs to know what an evaluation and its checkpoint cost."""
        if self.minutes is None or self.first_timed is None:
            return False
        if it == self.first_timed:
            self.mark = (self.clock(), it, self.overhead_total)
        return self.overhead is None and it == self.first_timed + MEASURED

    def spent_on_evaluation(self, seconds: float) -> None:
        """An evaluation and its checkpoint took `seconds`: time that is not training's pace."""
        self.overhead = seconds
        self.overhead_total += seconds

    def stop_at(self, it: int) -> None:
        """Train to iteration `it` (what `fit` proposed, agreed on by every process)."""
        self.max_iters = it

    def fit(self, it: int) -> int | None:
        """The iteration to stop at, from the pace since the last fit (smoothed) and what an
        evaluation costs; None while there is no estimate yet (or no budget)."""
        if self.minutes is None or self.overhead is None or self.mark is None or it >= self.max_iters:
            return None  # (at max_iters the run has ended: its last evaluation is done)
        at_time, at_it, at_overhead = self.mark
        if it - at_it < (MEASURED if self.pace is None else 1):
            return None
        now = self.clock()
        pace = (now - at_time - (self.overhead_total - at_overhead)) / (it - at_it)
        self.pace = pace if self.pace is None else SMOOTHING * pace + (1 - SMOOTHING) * self.pace
        self.mark = (now, it, self.overhead_total)
        per_iteration = self.pace + self.overhead / self.eval_interval
        left = self.minutes * 60 - self.seconds_used() - self.overhead  # kept for the last evaluation
        self.estimates += 1
        return stop_iteration(it, left, per_iteration, self.cap)
