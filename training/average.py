"""train.ema: an exponential moving average of the weights, the model that is evaluated,
sampled and saved for generate.py; it sits lower in the valley than the last step's weights.

After each optimizer step, average ← d · average + (1 − d) · weights. The average starts
at the initial weights, and a fixed d would keep d^n of them after n steps (0.99^100 ≈
37%): a short run would save a model worse than the one it trained. So d warms up with
the number of updates n, d = min(ema, (1 + n) / (10 + n)), as common implementations do:
the first updates move the average most of the way to the weights (d = 0.1, 0.18, ...),
and d reaches ema after (10·ema − 1) / (1 − ema) updates (890 for 0.99).
"""

from __future__ import annotations

import copy

import torch

from model import GPT


def decay_after(ema: float, updates: int) -> float:
    """The decay of the average's next update, after `updates` earlier ones."""
    return min(ema, (1 + updates) / (10 + updates))


class WeightAverage:
    """The average of a model's weights; `model` is a copy of it that holds the average.
    Weights that do not train (a model with LoRA adapters: all but the adapters') are not
    copied but shared: their average is themselves, and the state holds the others only."""

    def __init__(self, model: GPT, ema: float):
        """An average that starts at model's weights."""
        self.ema = ema
        frozen = {id(p): p for p in model.parameters() if not p.requires_grad}
        self.trained = None if not frozen else [name for name, p in model.named_parameters() if p.requires_grad]
        self.model = copy.deepcopy(model, memo=frozen).requires_grad_(False)

    @torch.no_grad()
    def update(self, model: GPT, updates: int) -> None:
        """Move the average towards model's weights, after `updates` earlier updates."""
        decay = decay_after(self.ema, updates)
        for average, weight in zip(self.model.parameters(), model.parameters()):
            if average is not weight:  # (a shared, frozen weight is its own average)
                average.lerp_(weight, 1.0 - decay)

    def state_dict(self) -> dict:
        state = self.model.state_dict()
        return state if self.trained is None else {name: state[name] for name in self.trained}

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state, strict=self.trained is None)
