"""The Transformer block: attention and a feed-forward network, each wrapped in a
residual connection and a normalisation."""

from __future__ import annotations

import torch
import torch.nn as nn

from .attention import AttentionTrace, KVCache, MultiHeadAttention
from .config import GPTConfig


def make_norm(config: GPTConfig) -> nn.Module:
    """LayerNorm(x) = γ (x - mean) / √(var + ε) + β, or RMSNorm(x) = γ x / √(mean(x²) + ε)."""
    if config.norm == "rmsnorm":
        return nn.RMSNorm(config.n_embd, eps=1e-5)
    return nn.LayerNorm(config.n_embd, eps=1e-5, bias=config.bias)


class FeedForward(nn.Module):
    """FFN(x) = GELU(x W_1 + b_1) W_2 + b_2, applied to each position on its own.

    Width 4 × n_embd as in the paper and GPT-2. Attention mixes information across
    positions; this network then transforms each position's vector.
    """

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)  # W_1
        self.gelu = nn.GELU(approximate="tanh" if config.activation == "gelu_tanh" else "none")
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)  # W_2
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))  # [B, T, C]


class Block(nn.Module):
    """Pre-LN (GPT-2):   x = x + Attn(Norm(x));  x = x + FFN(Norm(x))
    Post-LN (paper):    x = Norm(x + Attn(x));  x = Norm(x + FFN(x))

    The residual path lets gradients flow straight through deep stacks; pre-LN keeps
    that path free of normalisation and trains more stably without warmup tricks.
    """

    def __init__(self, config: GPTConfig, layer: int):
        super().__init__()
        self.pre_norm = config.norm_position == "pre"
        self.ln_1 = make_norm(config)
        self.attn = MultiHeadAttention(config, layer)
        self.ln_2 = make_norm(config)
        self.mlp = FeedForward(config)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None,
                rope: tuple[torch.Tensor, torch.Tensor] | None = None, cache: KVCache | None = None,
                return_attention: bool = False) -> tuple[torch.Tensor, AttentionTrace | None]:
        """x [B, T, C] -> (x [B, T, C], the attention's AttentionTrace if asked)."""
        if self.pre_norm:
            attended, trace = self.attn(self.ln_1(x), mask, rope, cache, return_attention)
            x = x + attended
            x = x + self.mlp(self.ln_2(x))
        else:
            attended, trace = self.attn(x, mask, rope, cache, return_attention)
            x = self.ln_1(x + attended)
            x = self.ln_2(x + self.mlp(x))
        return x, trace
