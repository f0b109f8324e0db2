"""Choosing the next token from the model's scores: greedy, temperature, top-k, top-p."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Sampling:
    """How each next token is picked from the logits of the last position.

    temperature: the logits are divided by it before the softmax; 0 is greedy (always
                 the likeliest token), below 1 sharpens the distribution, above 1 flattens it
    top_k:       keep only the k likeliest tokens (None: all)
    top_p:       then keep the smallest set of likeliest tokens whose probability
                 reaches top_p, "nucleus sampling" (None or 1: all)
    suppress_tokens: ids that are never picked, whatever their score (greedy too), e.g.
                 a char tokenizer's <unk>, which stands for no character at all; the
                 tokenizer's owner knows them (data.tokenizer.suppressed_ids)
    """

    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    suppress_tokens: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature={self.temperature}: must be 0 (greedy) or more")
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"top_k={self.top_k}: must be 1 or more (or unset)")
        if self.top_p is not None and not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p={self.top_p}: must be in (0, 1] (or unset)")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def allowed_logits(logits: torch.Tensor, sampling: Sampling) -> torch.Tensor:
    """logits [B, V] as float32, with the suppressed tokens at -inf (probability 0)."""
    logits = logits.float()
    if sampling.suppress_tokens:
        logits = logits.index_fill(-1, torch.tensor(sampling.suppress_tokens, device=logits.device), float("-inf"))
    return logits


def next_token_probabilities(logits: torch.Tensor, sampling: Sampling) -> torch.Tensor:
    """The distribution [B, V] the next token is drawn from, for logits [B, V]:
    softmax(logits / temperature) over the tokens not suppressed, cut to the top_k tokens,
    then to the top_p nucleus of what is left, and renormalised. Greedy puts all the mass
    on the likeliest token."""
    logits = allowed_logits(logits, sampling)
    if sampling.greedy:
        return torch.zeros_like(logits).scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
    logits = logits / sampling.temperature
    if sampling.top_k is not None and sampling.top_k < logits.size(-1):
        kth = torch.topk(logits, sampling.top_k, dim=-1).values[:, -1:]  # [B, 1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if sampling.top_p is not None and sampling.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)  # [B, V]
        probs = torch.softmax(sorted_logits, dim=-1)
        # drop a token when the tokens ranked above it already reach top_p
        drop = probs.cumsum(dim=-1) - probs >= sampling.top_p
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.empty_like(logits).scatter_(-1, order, sorted_logits)
    return torch.softmax(logits, dim=-1)  # [B, V]


def sample_next(logits: torch.Tensor, sampling: Sampling, generator: torch.Generator | None = None) -> torch.Tensor:
    """Pick one token per row of logits [B, V]; returns [B]."""
    if sampling.greedy:
        return allowed_logits(logits, sampling).argmax(dim=-1)
    probs = next_token_probabilities(logits, sampling)
    return torch.multinomial(probs, num_samples=1, generator=generator).squeeze(-1)
