"""What one forward pass computed, piece by piece: model.trace(idx) hands it back, so a
learner (and the explorer, --explain and the attention maps) can follow a token through
the whole model with the model's own numbers.

Each block fills its LayerTrace as it runs; nothing is computed twice. With pre-LN (GPT-2):
    ln_1 = LN(residual_in); attn = concat(heads) W_O + b_O; mid = residual_in + attn
    ln_2 = LN(mid); mlp = mlp_hidden W_2 + b_2; residual_out = mid + mlp
With post-LN (the paper) the norms come after each residual:
    ln_1 = LN(residual_in + attn); ln_2 = LN(ln_1 + mlp) = residual_out
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class LayerTrace:
    """One block's pieces (B batch rows, T new tokens, S keys with the cached ones, C width,
    H heads, H_kv key/value heads, d_k head size, F the feed-forward width)."""

    residual_in: torch.Tensor = None  # [B, T, C] the stream entering the block
    ln_1: torch.Tensor = None  # [B, T, C] the first norm's output
    q: torch.Tensor = None  # [B, H, T, d_k] the queries (rotated, with RoPE)
    k: torch.Tensor = None  # [B, H_kv, S, d_k] the keys (rotated, with RoPE)
    v: torch.Tensor = None  # [B, H_kv, S, d_k] the values
    weights: torch.Tensor = None  # [B, H, T, S] softmax(q kᵀ / √d_k), masked; each row sums to 1
    heads: torch.Tensor = None  # [B, H, T, d_k] each head's output, weights @ v (0 for a head switched off)
    attn: torch.Tensor = None  # [B, T, C] the heads concatenated and mixed by W_O: what attention adds
    ln_2: torch.Tensor = None  # [B, T, C] the second norm's output
    mlp_hidden: torch.Tensor = None  # [B, T, F] the feed-forward network's hidden layer, after the activation
    mlp: torch.Tensor = None  # [B, T, C] the feed-forward network's output
    residual_out: torch.Tensor = None  # [B, T, C] the stream leaving the block


@dataclass
class Trace:
    """The whole pass: the embedding's pieces, every block's LayerTrace, the final norm
    and the logits.

    token:    [B, T, C] wte[idx], the token embedding
    position: [B, T, C] the position vectors added to it (learned or sinusoidal), or None
              with RoPE (position enters q and k instead)
    layers:   one LayerTrace per block; layers[0].residual_in = token + position
    ln_f:     [B, T, C] the final norm of the last residual_out (the LM head's input)
    logits:   [B, T, vocab_size] what the LM head makes of ln_f
    loss:     [] the mean cross-entropy, when the pass was given targets
    """

    layers: list[LayerTrace] = field(default_factory=list)
    token: torch.Tensor = None
    position: torch.Tensor | None = None
    ln_f: torch.Tensor = None
    logits: torch.Tensor = None
    loss: torch.Tensor | None = None

    @classmethod
    def empty(cls, n_layer: int) -> "Trace":
        """A trace for the forward pass to fill."""
        return cls([LayerTrace() for _ in range(n_layer)])

    def stacked(self, name: str) -> torch.Tensor:
        return torch.stack([getattr(layer, name) for layer in self.layers])

    # every layer's attention, stacked [n_layer, B, H, ...]: the five steps' inputs and results
    q = property(lambda self: self.stacked("q"))
    k = property(lambda self: self.stacked("k"))
    v = property(lambda self: self.stacked("v"))
    weights = property(lambda self: self.stacked("weights"))
    heads = property(lambda self: self.stacked("heads"))
