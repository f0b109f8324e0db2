"""The run's state, trainer_state.pt, as one value: what a resume needs to go on exactly
where the saved run stopped. Each piece of the loop reads and writes its own field
(through its state_dict and load_state_dict, as torch's modules and optimizers do);
Trainer.resume loads it, checks it and applies it, in that order, in one place.

The file holds plain containers and tensors only, so that it loads with
torch.load(weights_only=True) (runs/folder.py): nothing in it is ever executed.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

from cli.program import UserError

FORMAT = 3  # this layout; 2 (before the run's state was a type) holds the same fields and loads too


@dataclass
class TrainerState:
    iteration: int  # optimizer steps taken
    model: dict[str, torch.Tensor]  # the trained weights (with LoRA: the adapters' and new tokens' rows alone)
    optimizers: list[dict]  # each optimizer's state_dict (moments, step counts, settings)
    schedule: dict  # schedule.Schedule: where the decay ends, where a refit anchored it, a shortened warm-up
    budget: dict  # budget.TimeBudget: the seconds used, the fitted max_iters
    average: dict | None  # average.WeightAverage: the averaged weights (train.ema), or None
    ranks: list[dict]  # each process's batch sampler and random generators, in rank order
    grad_accum: int  # micro-batches per step (a resume with another process count may change it)
    best_val_loss: float  # the lowest validation loss so far (train.keep_best compares with it)
    tokens_seen: int  # training tokens so far, across resumes
    losses: dict  # evaluation.StepLosses: the first step's loss
    identity: dict  # the model and data settings a resume must match (preparation.PreparedRun)
    threads: int | None = None  # the thread count a run of fixed length chose (machine/threads.py), kept on resume

    def to_dict(self) -> dict:
        """What torch.save writes: the fields as a plain dict, with the layout's number."""
        return {"format": FORMAT, **{f.name: getattr(self, f.name) for f in dataclasses.fields(self)}}

    @classmethod
    def from_dict(cls, raw: Any, where: str) -> "TrainerState":
        """The state saved in `where`; one of an earlier layout is read where it can be, and
        refused in one line where it cannot."""
        if not isinstance(raw, dict) or raw.get("format") not in (2, FORMAT):
            raise UserError(f"{where} was written by an earlier version of this project and cannot be resumed "
                            "(its model still generates and exports); add --fresh to start over, or set out_dir=PATH")
        names = {f.name for f in dataclasses.fields(cls)}
        missing = {f.name for f in dataclasses.fields(cls)
                   if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING} - set(raw)
        if missing:
            raise UserError(f"{where} lacks {', '.join(sorted(missing))}: it is damaged; add --fresh to start over, "
                            "or set out_dir=PATH")
        return cls(**{k: v for k, v in raw.items() if k in names})
