"""The Transformer block: attention and a feed-forward network, each wrapped in a
residual connection and a normalisation."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from .attention import KVCache, MultiHeadAttention
from .config import GPTConfig
from .trace import LayerTrace


def make_norm(config: GPTConfig) -> nn.Module:
    """LayerNorm(x) = γ (x - mean) / √(var + ε) + β, or RMSNorm(x) = γ x / √(mean(x²) + ε)."""
    if config.norm == "rmsnorm":
        return nn.RMSNorm(config.n_embd, eps=config.norm_eps)
    return nn.LayerNorm(config.n_embd, eps=config.norm_eps, bias=config.bias)


class FeedForward(nn.Module):
    """FFN(x) = GELU(x W_1 + b_1) W_2 + b_2, applied to each position on its own.

    Width F = ffn_hidden, 4 × n_embd as in the paper and GPT-2. Attention mixes
    information across positions; this network then transforms each position's vector.
    """

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, config.ffn_hidden, bias=config.bias)  # W_1
        self.gelu = nn.GELU(approximate="tanh" if config.activation == "gelu_tanh" else "none")
        self.c_proj = nn.Linear(config.ffn_hidden, config.n_embd, bias=config.bias)  # W_2
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.gelu(self.c_fc(x))  # [B, T, F]
        return self.dropout(self.c_proj(hidden))  # [B, T, C]


class SwiGLU(nn.Module):
    """FFN(x) = (SiLU(x W_gate) ⊙ x W_up) W_2, applied to each position on its own (Shazeer,
    "GLU Variants Improve Transformer"; Llama's feed-forward network).

    Two matrices read x: one, through SiLU(z) = z σ(z), becomes a gate that scales, unit
    by unit, what the other computes. With three matrices instead of two, a hidden width
    F of 8/3 × n_embd costs what the 4× GELU network costs.
    """

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.c_gate = nn.Linear(config.n_embd, config.ffn_hidden, bias=config.bias)  # W_gate
        self.c_fc = nn.Linear(config.n_embd, config.ffn_hidden, bias=config.bias)  # W_up
        self.c_proj = nn.Linear(config.ffn_hidden, config.n_embd, bias=config.bias)  # W_2 (W_down)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = F.silu(self.c_gate(x)) * self.c_fc(x)  # [B, T, F]
        return self.dropout(self.c_proj(hidden))  # [B, T, C]


class Block(nn.Module):
    """Pre-LN (GPT-2):   x = x + Attn(Norm(x));  x = x + FFN(Norm(x))
    Post-LN (paper):    x = Norm(x + Attn(x));  x = Norm(x + FFN(x))

    The residual path lets gradients flow straight through deep stacks; pre-LN keeps
    that path free of normalisation and trains more stably without warmup tricks. An
    attention-only model (mlp="none", the one Elhage et al. study) has the first half alone.
    """

    def __init__(self, config: GPTConfig, layer: int):
        super().__init__()
        self.pre_norm = config.norm_position == "pre"
        self.ln_1 = make_norm(config)
        self.attn = MultiHeadAttention(config, layer)
        feed_forward = {"gelu": FeedForward, "swiglu": SwiGLU}.get(config.mlp)
        self.ln_2 = make_norm(config) if feed_forward else None
        self.mlp = feed_forward(config) if feed_forward else None

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None,
                rope: tuple[torch.Tensor, torch.Tensor] | None = None, cache: KVCache | None = None,
                record: LayerTrace | None = None) -> torch.Tensor:
        """x [B, T, C] -> [B, T, C]. mask, rope and cache are attention's; record: the layer's
        trace, which attention fills with its insides (GPT.trace hooks the rest)."""
        if self.pre_norm:
            x = x + self.attn(self.ln_1(x), mask, rope, cache, record)
            if self.mlp is not None:  # (an attention-only model has none)
                x = x + self.mlp(self.ln_2(x))
        else:
            x = self.ln_1(x + self.attn(x, mask, rope, cache, record))
            if self.mlp is not None:
                x = self.ln_2(x + self.mlp(x))
        return x
