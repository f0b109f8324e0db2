"""train.checkpointing (gradient checkpointing): memory traded for time.

In training, each block's activations are dropped after its forward and computed again in
the backward: one more forward of each block, and far fewer tensors kept for the backward.
torch.utils.checkpoint replays the forward's random state, dropout's included, so the
gradients are those of the plain pass; where no gradient is taken (evaluation,
generation) a block just runs.
"""

from __future__ import annotations

import functools

import torch.utils.checkpoint

from model import GPT


def recompute_in_backward(model: GPT) -> None:
    """Run each block of `model` under torch.utils.checkpoint from now on (the model's code
    is unchanged: each block's own forward is what checkpoint runs, and recomputes)."""
    for block in model.transformer.h:
        block.forward = functools.partial(torch.utils.checkpoint.checkpoint, block.forward, use_reentrant=False)
