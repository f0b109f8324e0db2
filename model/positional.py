"""Positional encodings: attention alone cannot tell "猫追狗" from "狗追猫".

Attention without positions is permutation-equivariant: shuffle the tokens and the
outputs are shuffled the same way, each unchanged. (A causal mask already breaks that
symmetry a little: a token sees only those before it.) Word order has to be put in,
either added to the token embeddings (sinusoidal, learned) or turned into a rotation
of the queries and keys (rope).
Every encoding takes explicit positions [B, T], so a left-padded prompt and a
token decoded with the KV cache both get the positions they would have alone.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn


class SinusoidalPositionalEncoding(nn.Module):
    """PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d)).

    The paper's fixed encoding: no parameters, defined for any position.
    """

    def __init__(self, n_embd: int):
        super().__init__()
        inv_freq = 1.0 / (10000.0 ** (torch.arange(0, n_embd, 2).float() / n_embd))  # [C/2]
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, positions: torch.Tensor) -> torch.Tensor:
        angles = positions[..., None].float() * self.inv_freq  # [B, T, C/2]
        # interleave: even dims get sin, odd dims get cos -> [B, T, C/2, 2] -> [B, T, C]
        return torch.stack((angles.sin(), angles.cos()), dim=-1).flatten(-2)


class LearnedPositionalEmbedding(nn.Embedding):
    """PE(pos) = W_pos[pos]: one trained vector per position (GPT-2's wpe), pos < block_size."""

    def __init__(self, block_size: int, n_embd: int):
        super().__init__(block_size, n_embd)


class RotaryEmbedding(nn.Module):
    """RoPE (Su et al., RoFormer): rotate each pair of query/key dims by angle pos · θ_i.

    θ_i = base^(-2i/d_k). Because rotations compose, position enters q_m · k_n only
    through the signed offset m - n, so attention sees relative positions; nothing is
    added to x.
    forward returns (cos, sin) [B, 1, T, d_k] for `apply_rotary` (B may be 1: shared).

    scaling (Llama 3, GPTConfig.rope_scaling): the pairs whose wavelength 2π/θ_i is longer
    than original_max_position_embeddings / low_freq_factor turn `factor` times more
    slowly, those shorter than original / high_freq_factor keep their speed, and those in
    between move smoothly from one to the other: the fast pairs still tell neighbours
    apart, and the slow ones span a context `factor` times longer.
    """

    def __init__(self, head_size: int, base: float = 10000.0, scaling: dict | None = None):
        super().__init__()
        inv_freq = 1.0 / (base ** (torch.arange(0, head_size, 2).float() / head_size))  # [d_k/2]
        if scaling is not None:
            inv_freq = llama3_frequencies(inv_freq, **scaling)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        angles = positions[..., None].float() * self.inv_freq  # [B, T, d_k/2]
        angles = torch.cat((angles, angles), dim=-1)[:, None]  # [B, 1, T, d_k]
        return angles.cos(), angles.sin()


def llama3_frequencies(inv_freq: torch.Tensor, factor: float, low_freq_factor: float, high_freq_factor: float,
                       original_max_position_embeddings: int) -> torch.Tensor:
    """θ_i stretched as Llama 3 does (RotaryEmbedding's docstring says how): [d_k/2] -> [d_k/2]."""
    wavelength = 2 * math.pi / inv_freq
    slow = wavelength > original_max_position_embeddings / low_freq_factor
    fast = wavelength < original_max_position_embeddings / high_freq_factor
    # between the two: a mix of the stretched and the kept frequency, 0 at the slow end, 1 at the fast
    mix = (original_max_position_embeddings / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor)
    between = (1 - mix) * inv_freq / factor + mix * inv_freq
    return torch.where(slow, inv_freq / factor, torch.where(fast, inv_freq, between))


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """[x₁, x₂] -> [−x₂, x₁] over the last dim, split in halves: each pair (x₁ᵢ, x₂ᵢ) turned
    by 90°, the sine part of a rotation."""
    x1, x2 = x.chunk(2, dim=-1)  # 2 × [..., T, d_k/2]
    return torch.cat((-x2, x1), dim=-1)  # [..., T, d_k]


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [..., T, d_k]: x cos + rotate_half(x) sin, so dim i pairs with dim i + d_k/2
    (the GPT-NeoX/Llama layout)."""
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)  # angles were computed in fp32
    return x * cos + rotate_half(x) * sin
