"""What a training step lowers (training/step.py calls it on each micro-batch): for a text and
for conversations, the cross-entropy of each scored next token; a kind of job may bring its
own (dpo.py: preference pairs), answering the same calls. The job says which (Job.objective),
so the step never asks what kind of job it trains."""

from __future__ import annotations

import torch

from data.batches import IGNORE
from model import GPT, evaluating


class NextToken:
    """The mean cross-entropy of the scored next tokens of a batch (x, y [B, T], and the
    position ids of packed rows, or None): what GPT.forward computes given targets."""

    per_token = True  # the loss is a mean over tokens (its exponential a perplexity)

    def __call__(self, forward, batch, device: torch.device) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """(the loss, a scalar; no other figures) of one micro-batch through `forward` (the model,
        or it compiled and/or wrapped in DistributedDataParallel)."""
        x, y, position_ids = (t.to(device, non_blocking=True) if t is not None else None for t in batch)
        _, loss = forward(x, y, position_ids=position_ids)
        return loss, {}

    @torch.no_grad()
    def evaluate(self, model: GPT, batch, device: torch.device, split: str) -> tuple[dict[str, float], int]:
        """({"loss": the sum of the cross-entropies}, how many targets were scored) over a batch
        of fixed rows (x, y) of `split`, so that batches and processes add up."""
        x, y = (t.to(device) for t in batch[:2])
        with evaluating(model):
            logits, _ = model(x)
        return {"loss": model.loss(logits, y, reduction="sum").item()}, int((y != IGNORE).sum())
