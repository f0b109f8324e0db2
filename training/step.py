"""One training iteration, top to bottom. A learner who wants to know what training does
reads this file and model/: everything else in training/ happens now and then around it
(trainer.py: reading the losses, evaluating, saving, the time budget).

    1. the learning rate of this iteration (warm-up, then decay: schedule.py)
    2. forward and backward over grad_accum micro-batches (the loss: jobs/objective.py's
       next-token cross-entropy, or the job's own: jobs/dpo.py for preference pairs)
    3. the gradients' norm clipped
    4. the optimizer step, the gradients cleared
    5. the average of the weights follows the weights (train.ema)

nanoGPT's loop does the same in the same order; what is added here is what a longer run
needs and says why on the line that does it.
"""

from __future__ import annotations

import math
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Callable, ContextManager

import torch

from jobs.objective import NextToken
from machine.device import autocast
from model import GPT

from .average import WeightAverage
from .schedule import Schedule, set_rates


@dataclass(frozen=True)
class StepSetup:
    """What every iteration of a run uses, the same from its first to its last: built once by
    the Trainer (the learning rate's schedule, which a time budget may refit, is handed to
    each step apart)."""

    model: GPT  # the weights that train
    # () -> a batch of the job's sampler: x, y [B, T] (token ids, the next token of each, -100
    # where not scored) and the position ids of packed rows [B, T] (each conversation's from 0),
    # or None; preference pairs: x, y [B, 2, T] and the pairs' indices
    next_batch: Callable[[], tuple]
    optimizers: list[torch.optim.Optimizer]
    grad_accum: int = 1  # micro-batches a step
    grad_clip: float = 1.0  # the gradients' largest norm (0: no clipping)
    device: torch.device = torch.device("cpu")
    dtype: torch.dtype = torch.float32  # autocast's (float32: none)
    # what is called for the loss: the model itself (None), or it compiled and/or wrapped in
    # DistributedDataParallel (which averages the gradients over the processes)
    forward: torch.nn.Module | None = None
    # under DDP, its no_sync: the micro-batches before the last keep their gradients to
    # themselves (one exchange a step, not one a micro-batch)
    no_sync: Callable[[], ContextManager] = nullcontext
    scaler: torch.amp.GradScaler | None = None  # float16's loss scaling (None, or disabled: float32, bfloat16)
    average: WeightAverage | None = None  # train.ema's average of the weights, moved after each step
    # (forward, batch, device) -> (the micro-batch's loss, other figures of it): jobs/objective.py
    objective: Callable = field(default_factory=NextToken)


@dataclass
class StepResult:
    """What one iteration hands back. The loss and the norm stay on the device: reading a
    number from a GPU waits for all the work queued before it, so the trainer reads many
    steps' values together, now and then (evaluation.StepLosses)."""

    lr: float  # AdamW's learning rate at this iteration (Muon's follows the same curve from its own peak)
    loss: torch.Tensor  # the objective's mean over the whole batch (the cross-entropy), a scalar
    grad_norm: torch.Tensor  # the gradients' norm before clipping
    figures: dict[str, torch.Tensor] = field(default_factory=dict)  # the objective's others (DPO's rewards), means


def train_step(it: int, schedule: Schedule, setup: StepSetup) -> StepResult:
    """Iteration `it` (0-based: the steps taken before it) of the run `setup` describes, at
    the learning rate `schedule` gives it."""
    model, optimizers, grad_accum, device = setup.model, setup.optimizers, setup.grad_accum, setup.device
    forward = setup.forward if setup.forward is not None else model
    scaler = setup.scaler if setup.scaler is not None else torch.amp.GradScaler(device.type, enabled=False)

    # 1. the learning rate of this iteration: a warm-up, then a decay
    set_rates(optimizers, schedule, it)

    # 2. forward and backward, over grad_accum micro-batches: each loss is divided by
    #    grad_accum, so the gradients add up to those of the mean over the whole batch
    loss = torch.zeros((), device=device)
    figures: dict[str, torch.Tensor] = {}
    for micro in range(grad_accum):
        batch = setup.next_batch()  # windows of text, conversations, or preference pairs
        # under DDP the processes average their gradients at the last micro-batch only
        last = micro == grad_accum - 1
        with nullcontext() if last else setup.no_sync():
            with autocast(device, setup.dtype):
                # the batch to the device, through the model: the mean cross-entropy of its next
                # tokens (a scalar), or the job's own loss (jobs/objective.py)
                micro_loss, micro_figures = setup.objective(forward, batch, device)
            scaler.scale(micro_loss / grad_accum).backward()
        loss += micro_loss.detach() / grad_accum
        for name, value in micro_figures.items():
            figures[name] = figures.get(name, 0) + value / grad_accum

    # 3. clip the gradients' norm to grad_clip (float16: the scaler's factor undone first)
    for optimizer in optimizers:
        scaler.unscale_(optimizer)
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), setup.grad_clip or math.inf)

    # 4. the optimizer step, then the gradients cleared for the next one
    for optimizer in optimizers:
        scaler.step(optimizer)  # (float16: skipped where the gradients overflowed)
        optimizer.zero_grad(set_to_none=True)
    scaler.update()

    # 5. the average of the weights follows the weights (train.ema)
    if setup.average is not None:
        setup.average.update(model, it)
    return StepResult(lr=optimizers[-1].param_groups[0]["lr"], loss=loss, grad_norm=grad_norm, figures=figures)
