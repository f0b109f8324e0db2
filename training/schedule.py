"""The learning rate at each step: a pure function of the step, as nanoGPT's get_lr.

    factor(it) = (it + 1) / (warmup + 1)                    during the warm-up
               = floor + ½ (1 + cos(π p)) (1 − floor)        cosine decay, p from 0 to 1
               = 1, then a straight line down to floor        wsd: the last `cooldown` share
               = floor                                         from decay_iters on

with p = (it − warmup) / (decay_iters − warmup), the decay's progress. Every group's rate
is its peak times the factor (`set_rates`); Muon's momentum rises over a warm-up of its own.

A Schedule is a value: nothing in it changes as the run goes. Where a run's length changes
in its middle (train.max_minutes fits it to the machine's pace, a finished run is given more
iterations), training/budget.py's `refitted` makes a new Schedule that goes on from where the
rate stands: from `ramp` (a warm-up shortened to fit a short run) and `anchor` (a decay that
changed its end), both None in a schedule that was never refitted.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import NamedTuple

import torch

from .config import TrainConfig


class Anchor(NamedTuple):
    """Where a decay that changed its end goes on from."""

    iteration: int
    progress: float  # the decay's progress there, from 0 (end of the warm-up) to 1
    cooldown_start: float  # wsd: the progress at which its straight line down begins


class Ramp(NamedTuple):
    """Where a warm-up rises from."""

    iteration: int  # -1: before the first iteration
    factor: float


@dataclass(frozen=True)
class Schedule:
    """The learning-rate factor (and Muon's momentum) at each iteration: `schedule(it)`."""

    warmup: int  # iterations of the linear warm-up
    decay_iters: int  # where the decay reaches the floor
    floor: float  # min_lr / lr
    shape: str = "cosine"  # cosine, or wsd (warmup-stable-decay)
    cooldown: float = 0.4  # wsd: the share of decay_iters spent going down
    momentum_warmup: int = 0  # Muon's momentum rises from 0.85 over these iterations
    momentum_peak: float = 0.95
    ramp: Ramp = Ramp(-1, 0.0)  # where the warm-up rises from: 0 before iteration 0, so iteration 0 is one step up
    anchor: Anchor | None = None  # where a changed decay goes on from (training/budget.py: refitted)

    @classmethod
    def of(cls, cfg: TrainConfig, max_iters: int) -> "Schedule":
        """The run config's schedule, for a run of max_iters iterations."""
        return cls(cfg.warmup_iters, cfg.lr_decay_iters or max_iters, cfg.min_lr / cfg.lr, cfg.lr_schedule,
                   cfg.cooldown, cfg.muon_momentum_warmup, cfg.muon_momentum)

    def __call__(self, it: int) -> float:
        """The factor of the peak learning rate at iteration it."""
        if it < self.warmup:  # a straight line up from the ramp's start to 1 at the end of the warm-up
            start = self.ramp
            return start.factor + (1.0 - start.factor) * (it - start.iteration) / (self.warmup - start.iteration)
        p = self.progress(it)
        if self.shape == "wsd":
            start = self.cooldown_start()
            down = (p - start) / (1.0 - start) if p > start else 0.0
            return 1.0 - down * (1.0 - self.floor)
        return self.floor + 0.5 * (1.0 + math.cos(math.pi * p)) * (1.0 - self.floor)

    def progress(self, it: int) -> float:
        """The decay's progress at iteration it: 0 at the end of the warm-up, 1 at decay_iters
        (after a refit, from the anchor's progress on)."""
        if it >= self.decay_iters:
            return 1.0
        if self.anchor is None:
            return max(0.0, (it - self.warmup) / max(1, self.decay_iters - self.warmup))
        at = self.anchor
        return at.progress + (1.0 - at.progress) * max(0, it - at.iteration) / (self.decay_iters - at.iteration)

    def cooldown_start(self) -> float:
        """wsd: the progress at which the straight line down begins."""
        if self.anchor is not None:
            return self.anchor.cooldown_start
        start = max(self.warmup, self.decay_iters - round(self.cooldown * self.decay_iters))
        return (start - self.warmup) / max(1, self.decay_iters - self.warmup)

    def momentum(self, it: int) -> float:
        """Muon's momentum at iteration it: from 0.85 up to its peak over momentum_warmup
        iterations (as in the modded-nanogpt speedruns), then constant."""
        if it >= self.momentum_warmup:
            return self.momentum_peak
        return 0.85 + (self.momentum_peak - 0.85) * it / self.momentum_warmup

    def state_dict(self) -> dict:
        """What a refit changed, for the run's state (training/state.py)."""
        return {"decay_iters": self.decay_iters, "anchor": None if self.anchor is None else list(self.anchor),
                "warmup": self.warmup, "ramp_start": list(self.ramp)}

    def loaded(self, state: dict) -> "Schedule":
        """This schedule as a saved run had refitted it: its decay's end and anchor, and a
        warm-up it shortened (a warm-up it did not shorten is the config's, as it is now)."""
        anchor = state["anchor"]
        ramp = state.get("ramp_start")
        shortened = ramp is not None and ramp[0] >= 0
        return dataclasses.replace(
            self, decay_iters=state["decay_iters"],
            anchor=None if anchor is None else Anchor(int(anchor[0]), float(anchor[1]), float(anchor[2])),
            warmup=state["warmup"] if shortened else self.warmup,
            ramp=Ramp(int(ramp[0]), float(ramp[1])) if shortened else self.ramp)


def set_rates(optimizers: list[torch.optim.Optimizer], schedule: Schedule, it: int) -> float:
    """Set every group's learning rate (its peak, initial_lr, times the schedule's factor) and
    Muon's momentum for iteration `it`; returns the factor."""
    factor = schedule(it)
    for optimizer in optimizers:
        for group in optimizer.param_groups:
            group["lr"] = group["initial_lr"] * factor
            if "momentum" in group:  # Muon's
                group["momentum"] = schedule.momentum(it)
    return factor
