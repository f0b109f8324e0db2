"""GPTConfig: every number and choice that defines a model, checked when it is made."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

# The string options and the values each one allows.
CHOICES = {
    "pos_encoding": ("sinusoidal", "learned", "rope"),
    "attn_impl": ("explicit", "sdpa"),
    "norm": ("layernorm", "rmsnorm"),
    "norm_position": ("pre", "post"),
    "activation": ("gelu", "gelu_tanh"),
    "mlp": ("gelu", "swiglu", "none"),
}

# Fields a saved config.json must always name; the others have defaults.
REQUIRED = ("vocab_size", "block_size", "n_layer", "n_head", "n_embd")


@dataclass
class GPTConfig:
    """The model's hyperparameters. Field names follow nanoGPT (and so GPT-2).

    vocab_size:    number of token ids the embedding and the LM head know
    block_size:    longest context the model attends over (T at most)
    n_layer:       number of Transformer blocks
    n_head:        attention heads per block (H); head size d_k = n_embd / n_head (or head_dim)
    n_embd:        width of the residual stream (d_model)
    dropout:       dropout on attention weights, residual branches and embeddings
    bias:          biases in Linear layers and LayerNorm (GPT-2 has them)
    pos_encoding:  sinusoidal (the paper), learned (GPT-2) or rope (rotary)
    attn_impl:     explicit (the five steps, written out) or sdpa (torch's fused kernel)
    norm:          layernorm or rmsnorm
    norm_position: pre (x + f(norm(x)), GPT-2) or post (norm(x + f(x)), the paper)
    activation:    gelu (exact) or gelu_tanh (GPT-2's tanh approximation), for mlp=gelu
    rope_base:     base of the rotary frequencies (10000 in RoFormer and Llama)
    n_kv_head:     key/value heads (grouped-query attention: each group of n_head / n_kv_head
                   query heads shares one); None: n_head (multi-head), 1: multi-query
    mlp:           gelu (act(x W_1) W_2, GPT-2) or swiglu ((SiLU(x W_gate) ⊙ x W_up) W_2, Llama),
                   or none: no feed-forward network, an attention-only model (Elhage et al.'s)
    ffn_hidden:    the feed-forward network's hidden width (transformers' intermediate_size);
                   None: 4 × n_embd for gelu, and for swiglu 8/3 × n_embd rounded up to a
                   multiple of 32, the width that keeps the 4× GELU network's parameter count;
                   0 with mlp none
    norm_eps:      the ε of every LayerNorm or RMSNorm
    tie_embeddings: the LM head shares the token embedding's matrix (GPT-2); false: its own
    rope_scaling:  None, or Llama 3's stretch of the slow rotary frequencies for contexts
                   longer than it was trained on (transformers' rope_type "llama3"), e.g.
                   {"factor": 8, "low_freq_factor": 1, "high_freq_factor": 4,
                    "original_max_position_embeddings": 8192}: positional.RotaryEmbedding
    qkv_bias:      biases on W_Q, W_K, W_V alone (Qwen2) where bias is false; None: as bias
    head_dim:      the head size d_k where it is not n_embd / n_head (Qwen3: 128 for 16 heads in
                   a stream of 1024): the heads side by side are then n_head × head_dim wide,
                   and W_O maps that width back to n_embd; None: n_embd / n_head
    qk_norm:       each head's q and k through an RMSNorm of their own (learned gain, over d_k)
                   before the rotation (Qwen3's QK-norm): the scores stay bounded whatever the
                   size of W_Q and W_K
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
    n_kv_head: int | None = None
    mlp: str = "gelu"
    ffn_hidden: int | None = None
    norm_eps: float = 1e-5
    tie_embeddings: bool = True
    rope_scaling: dict | None = None
    qkv_bias: bool | None = None
    head_dim: int | None = None
    qk_norm: bool = False

    def __post_init__(self) -> None:
        for name, value in checked_types(type(self), dataclasses.asdict(self)).items():
            setattr(self, name, value)
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)}: must be at least 1")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout={self.dropout}: must be in [0, 1)")
        if self.rope_base <= 0:
            raise ValueError(f"rope_base={self.rope_base}: must be positive")
        if not 0 < self.norm_eps < 1:
            raise ValueError(f"norm_eps={self.norm_eps}: must be between 0 and 1, e.g. 1e-5")
        if self.n_kv_head is None:
            self.n_kv_head = self.n_head
        if self.qkv_bias is None:
            self.qkv_bias = self.bias
        if self.n_kv_head < 1 or self.n_head % self.n_kv_head:
            raise ValueError(f"n_kv_head={self.n_kv_head}: must divide n_head={self.n_head} "
                             "(each key/value head serves n_head / n_kv_head query heads)")
        if self.ffn_hidden is None:
            self.ffn_hidden = {"gelu": 4 * self.n_embd, "none": 0}.get(self.mlp, math.ceil(8 * self.n_embd / 3 / 32) * 32)
        if self.mlp == "none" and self.ffn_hidden:
            raise ValueError(f"ffn_hidden={self.ffn_hidden} with mlp=none: an attention-only model has no feed-forward "
                             "network; remove ffn_hidden, or choose mlp gelu or swiglu")
        if self.ffn_hidden < 1 and self.mlp != "none":
            raise ValueError(f"ffn_hidden={self.ffn_hidden}: must be at least 1 (or unset)")
        for name, allowed in CHOICES.items():
            if getattr(self, name) not in allowed:
                raise ValueError(
                    f"{name}={getattr(self, name)!r}: must be one of {', '.join(allowed)}"
                )
        if self.head_dim is not None and self.head_dim < 1:
            raise ValueError(f"head_dim={self.head_dim}: must be at least 1 (or unset: n_embd / n_head)")
        if self.head_dim is None and self.n_embd % self.n_head:
            raise ValueError(
                f"n_embd={self.n_embd} is not divisible by n_head={self.n_head}: "
                "each head gets n_embd / n_head dimensions (or set head_dim)"
            )
        if self.pos_encoding == "rope" and self.head_size % 2:
            raise ValueError(
                f"pos_encoding='rope' needs an even head size, got {self.head_size}"
            )
        if self.rope_scaling is not None:
            if self.pos_encoding != "rope":
                raise ValueError(f"rope_scaling stretches rotary positions; pos_encoding={self.pos_encoding!r} has none")
            check_rope_scaling(self.rope_scaling)
        if self.pos_encoding == "sinusoidal" and self.n_embd % 2:
            raise ValueError(f"pos_encoding='sinusoidal' needs an even n_embd, got {self.n_embd}")

    @property
    def head_size(self) -> int:
        """d_k, each head's width."""
        return self.head_dim or self.n_embd // self.n_head

    @property
    def heads_width(self) -> int:
        """H · d_k, the width of every head's q (and output) side by side: n_embd unless head_dim
        says otherwise."""
        return self.n_head * self.head_size

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


ROPE_SCALING = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


def check_rope_scaling(scaling: dict) -> None:
    if set(scaling) != set(ROPE_SCALING):
        raise ValueError(f"rope_scaling={scaling!r}: must have exactly the keys {', '.join(ROPE_SCALING)} "
                         "(Llama 3's, transformers' rope_type llama3)")
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in scaling.values()):
        raise ValueError(f"rope_scaling={scaling!r}: its values must be positive numbers")
    if scaling["high_freq_factor"] <= scaling["low_freq_factor"]:
        raise ValueError(f"rope_scaling={scaling!r}: high_freq_factor must be above low_freq_factor")


def checked_types(cls: type, values: dict[str, Any]) -> dict[str, Any]:
    """`values` for the fields of dataclass `cls`, each checked against its annotation
    ('int', 'float', 'str | None', 'list[str]', ...): a whole number is accepted for a float (and
    converted), and so is a string that reads as one (YAML reads 3e-4 as a string).
    Raises ValueError 'name=value: must be ...' for the first wrong one. Used for every
    config: GPTConfig here, and each section of a YAML run config in training/config.py."""
    annotations = {f.name: f.type for f in dataclasses.fields(cls)}
    names = {"int": "an integer", "float": "a number", "bool": "true or false", "str": "a string", "dict": "a mapping",
             "list[str]": "a list of strings, e.g. [a, b]", "list": "a list, e.g. [a, b]"}
    checked = {}
    for name, value in values.items():
        kinds = [k.strip() for k in annotations[name].split("|")]
        if value is None and "None" in kinds:
            checked[name] = None
            continue
        kind = kinds[0]
        if kind == "float" and isinstance(value, str):
            try:
                value = float(value)
            except ValueError:
                pass
        ok = {
            "int": isinstance(value, int) and not isinstance(value, bool),
            "float": isinstance(value, (int, float)) and not isinstance(value, bool),
            "bool": isinstance(value, bool),
            "str": isinstance(value, str),
            "dict": isinstance(value, dict),
            "list[str]": isinstance(value, list) and all(isinstance(v, str) for v in value),
            "list": isinstance(value, list),
        }[kind]
        if not ok:
            raise ValueError(f"{name}={value!r}: must be {names[kind]}")
        checked[name] = float(value) if kind == "float" else value
    return checked
