"""GPTConfig: every number and choice that defines a model, checked when it is made."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

# The string options and the values each one allows.
CHOICES = {
    "pos_encoding": ("sinusoidal", "learned", "rope"),
    "attn_impl": ("explicit", "sdpa"),
    "norm": ("layernorm", "rmsnorm"),
    "norm_position": ("pre", "post"),
    "activation": ("gelu", "gelu_tanh"),
}

# Fields a saved config.json must always name; the others have defaults.
REQUIRED = ("vocab_size", "block_size", "n_layer", "n_head", "n_embd")


@dataclass
class GPTConfig:
    """The model's hyperparameters. Field names follow nanoGPT (and so GPT-2).

    vocab_size:    number of token ids the embedding and the LM head know
    block_size:    longest context the model attends over (T at most)
    n_layer:       number of Transformer blocks
    n_head:        attention heads per block (H); head size d_k = n_embd / n_head
    n_embd:        width of the residual stream (d_model)
    dropout:       dropout on attention weights, residual branches and embeddings
    bias:          biases in Linear layers and LayerNorm (GPT-2 has them)
    pos_encoding:  sinusoidal (the paper), learned (GPT-2) or rope (rotary)
    attn_impl:     explicit (the five steps, written out) or sdpa (torch's fused kernel)
    norm:          layernorm or rmsnorm
    norm_position: pre (x + f(norm(x)), GPT-2) or post (norm(x + f(x)), the paper)
    activation:    gelu (exact) or gelu_tanh (GPT-2's tanh approximation)
    rope_base:     base of the rotary frequencies (10000 in RoFormer and Llama)
    """

    vocab_size: int = 65
    block_size: int = 256
    n_layer: int = 6
    n_head: int = 6
    n_embd: int = 384
    dropout: float = 0.0
    bias: bool = True
    pos_encoding: str = "learned"
    attn_impl: str = "sdpa"
    norm: str = "layernorm"
    norm_position: str = "pre"
    activation: str = "gelu"
    rope_base: float = 10000.0

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.type == "int" and (isinstance(value, bool) or not isinstance(value, int)):
                raise ValueError(f"{f.name}={value!r}: must be an integer")
            if f.type == "float":
                if isinstance(value, bool) or not isinstance(value, (int, float)):
                    raise ValueError(f"{f.name}={value!r}: must be a number")
                setattr(self, f.name, float(value))
            if f.type == "bool" and not isinstance(value, bool):
                raise ValueError(f"{f.name}={value!r}: must be true or false")
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)}: must be at least 1")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout={self.dropout}: must be in [0, 1)")
        if self.rope_base <= 0:
            raise ValueError(f"rope_base={self.rope_base}: must be positive")
        for name, allowed in CHOICES.items():
            if getattr(self, name) not in allowed:
                raise ValueError(
                    f"{name}={getattr(self, name)!r}: must be one of {', '.join(allowed)}"
                )
        if self.n_embd % self.n_head:
            raise ValueError(
                f"n_embd={self.n_embd} is not divisible by n_head={self.n_head}: "
                "each head gets n_embd / n_head dimensions"
            )
        if self.pos_encoding == "rope" and self.head_size % 2:
            raise ValueError(
                f"pos_encoding='rope' needs an even head size, got n_embd / n_head = {self.head_size}"
            )
        if self.pos_encoding == "sinusoidal" and self.n_embd % 2:
            raise ValueError(f"pos_encoding='sinusoidal' needs an even n_embd, got {self.n_embd}")

    @property
    def head_size(self) -> int:
        return self.n_embd // self.n_head

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "GPTConfig":
        """Build from a dict (a config.json); unknown or missing fields are errors."""
        if not isinstance(d, dict):
            raise ValueError(f"expected a mapping of config fields, got {type(d).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown config field(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        missing = [name for name in REQUIRED if name not in d]
        if missing:
            raise ValueError(f"missing config field(s) {', '.join(missing)}")
        return cls(**d)
