"""Attention: the five-step function, multi-head self-attention and the KV cache.

Read top to bottom: `scaled_dot_product_attention` is the whole idea in one function;
`MultiHeadAttention` wraps it in learned projections W_Q, W_K, W_V, W_O; `KVCache`
keeps the keys and values of past tokens so generation does not recompute them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from .config import GPTConfig
from .positional import apply_rotary
from .trace import LayerTrace


def scaled_dot_product_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention(Q, K, V) = softmax(Q Kᵀ / √d_k) V, written out as five steps.

    query [..., T, d_k], key [..., S, d_k], value [..., S, d_v]; any leading dims
    (batch, heads). mask: bool or 0/1, broadcastable to [..., T, S], True/1 = may
    attend (the convention of torch's F.scaled_dot_product_attention and of Hugging
    Face's attention_mask). A query row with nothing allowed gets zero weights and a
    zero output, not NaN. Returns (output [..., T, d_v], weights [..., T, S]).
    """
    d_k = query.size(-1)
    # 1. similarity: one score per (query, key) pair. (T × d_k) @ (d_k × S) = T × S
    scores = query @ key.transpose(-2, -1)  # [..., T, S]
    # 2. scale: dot products of d_k-dim vectors grow like √d_k; dividing keeps their
    #    variance near 1 so the softmax does not saturate and gradients do not vanish
    scores = scores / math.sqrt(d_k)  # [..., T, S]
    # 3. mask: forbidden pairs get -inf, so softmax gives them weight exactly 0
    if mask is not None:
        allowed = mask if mask.dtype == torch.bool else mask != 0
        scores = scores.masked_fill(~allowed, float("-inf"))  # [..., T, S]
    # 4. softmax over the keys: each query's weights are positive and sum to 1
    weights = torch.softmax(scores, dim=-1)  # [..., T, S]
    if mask is not None:
        # a row whose keys are all forbidden is softmax(-inf, ..., -inf) = NaN;
        # it has nothing to attend to, so its weights are 0 instead
        weights = weights.masked_fill(~allowed, 0.0)  # [..., T, S]
    if dropout_p > 0.0:
        weights = F.dropout(weights, p=dropout_p)  # [..., T, S], training only
    # 5. weighted sum: each output is a mix of the values, weighted by attention
    output = weights @ value  # [..., T, d_v]
    return output, weights


def same_sequence(position_ids: torch.Tensor) -> torch.Tensor:
    """Packed rows' position ids [B, T] (0 where a sequence starts) -> [B, 1, T, T]: True where
    the query's token and the key's are of one sequence (the block-diagonal part of its mask)."""
    sequence = (position_ids == 0).long().cumsum(dim=-1)  # [B, T]: which sequence each token is of
    return sequence[:, None, :, None] == sequence[:, None, None, :]


@dataclass(frozen=True)
class Sequences:
    """Packed rows (several sequences one after another in a row, each from position 0): where
    each sequence of each row starts and ends, so that attention runs each one alone, causal,
    through torch's fused kernel, on views of the row (no copy), and never holds a [T, T]
    mask: memory linear in the context (bench/packing.py measures it, and the time, against
    the dense block-diagonal mask; grouping the sequences into a few padded calls instead
    was slower on a CPU where they are uneven)."""

    position_ids: torch.Tensor  # [B, T], 0 where a sequence starts
    bounds: tuple[tuple[tuple[int, int], ...], ...]  # bounds[b]: (start, end) of each sequence of row b

    @staticmethod
    def of(position_ids: torch.Tensor) -> Sequences:
        """From position ids [B, T] (0 where a sequence starts)."""
        T = position_ids.size(1)
        starts = [[i for i, p in enumerate(row) if p == 0] or [0] for row in position_ids.tolist()]
        return Sequences(position_ids, tuple(tuple(zip(row, row[1:] + [T])) for row in starts))

    def mask(self) -> torch.Tensor:
        """The same as a dense mask [B, 1, T, T] (True = may attend): causal within each
        sequence, nothing across (the five-step path, which hands back every weight)."""
        T = self.position_ids.size(1)
        order = torch.arange(T, device=self.position_ids.device)
        return (order[None, :] <= order[:, None]) & same_sequence(self.position_ids)  # [T, T] & [B, 1, T, T]

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float) -> torch.Tensor:
        """Each sequence's causal attention alone: q, k, v [B, H, T, d_k] -> [B, H, T, d_k]."""
        rows = [torch.cat([F.scaled_dot_product_attention(q[b:b + 1, :, s:e], k[b:b + 1, :, s:e], v[b:b + 1, :, s:e],
                                                          dropout_p=dropout_p, is_causal=True)  # [1, H, e - s, d_k]
                           for s, e in bounds], dim=2) for b, bounds in enumerate(self.bounds)]
        return torch.cat(rows)  # [B, H, T, d_k]


class KVCache:
    """Keys and values of the tokens seen so far, for every layer, preallocated.

    k, v: [n_layer, B, n_kv_head, max_len, d_k]: with grouped-query attention it holds
    n_kv_head heads, not n_head, and so is n_head / n_kv_head times smaller. Each forward
    writes its new keys and values in place at positions [length, length + T), so decoding
    one token costs O(length) attention instead of recomputing the whole prefix, and no
    tensor is re-allocated.
    """

    def __init__(self, config: GPTConfig, batch_size: int, max_len: int,
                 device: torch.device | str, dtype: torch.dtype):
        shape = (config.n_layer, batch_size, config.n_kv_head, max_len, config.head_size)
        self.k = torch.empty(shape, device=device, dtype=dtype)  # only [:length] is ever read
        self.v = torch.empty(shape, device=device, dtype=dtype)
        self.max_len = max_len
        self.length = 0  # tokens stored; the GPT advances it after all layers wrote

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store k, v [B, H_kv, T, d_k] for `layer`; return all keys and values so far."""
        end = self.length + k.size(2)
        if end > self.max_len:
            raise ValueError(f"KV cache holds {self.max_len} tokens; cannot store {end}")
        self.k[layer, :, :, self.length:end] = k
        self.v[layer, :, :, self.length:end] = v
        return self.k[layer, :, :, :end], self.v[layer, :, :, :end]  # [B, H_kv, end, d_k]

    def reset(self) -> None:
        self.length = 0


class MultiHeadAttention(nn.Module):
    """MultiHead(X) = Concat(head_1, …, head_H) W_O, head_i = Attention(X W_Q,i, X W_K,i, X W_V,i).

    Self-attention: queries, keys and values all come from the same sequence X.
    W_Q, W_K, W_V are fused into one Linear (c_attn, GPT-2's name); splitting its
    output into H heads of d_k = n_embd / H lets each head attend in its own subspace (a model
    may set d_k itself, head_dim: W_O then maps the H · d_k wide concatenation back to n_embd).
    With grouped-query attention (n_kv_head < n_head) W_K and W_V make only n_kv_head
    heads, and each group of n_head / n_kv_head query heads shares one (Llama 2 and 3).
    attn_impl 'explicit' runs the five-step function above; 'sdpa' runs torch's fused
    kernel (flash attention on GPUs, where it can). Both compute the same thing; a traced
    call (a `record` to fill, GPT.trace) always takes the five steps, to hand back their weights.
    """

    def __init__(self, config: GPTConfig, layer: int):
        super().__init__()
        self.layer = layer
        self.n_head, self.n_kv_head, self.d_k = config.n_head, config.n_kv_head, config.head_size
        self.explicit = config.attn_impl == "explicit"
        self.dropout = config.dropout
        kv = 2 * config.n_kv_head * config.head_size
        self.c_attn = nn.Linear(config.n_embd, config.heads_width + kv, bias=config.qkv_bias)  # W_Q, W_K, W_V
        self.c_proj = nn.Linear(config.heads_width, config.n_embd, bias=config.bias)  # W_O
        # QK-norm (Qwen3): each head's q and k scaled to a root mean square of 1 (times a learned
        # gain), so no weight can grow a score without bound and saturate the softmax
        self.q_norm = nn.RMSNorm(config.head_size, eps=config.norm_eps) if config.qk_norm else None
        self.k_norm = nn.RMSNorm(config.head_size, eps=config.norm_eps) if config.qk_norm else None
        self.resid_dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None,
                rope: tuple[torch.Tensor, torch.Tensor] | None = None, cache: KVCache | None = None,
                record: LayerTrace | None = None) -> torch.Tensor:
        """x [B, T, C] -> [B, T, C]. mask [B, 1, T, S] (True = may attend), Sequences (packed
        rows: each sequence attends alone), or None for plain causal attention over x itself.
        rope: (cos, sin) for rotary positions. cache: past keys and values. record: the layer's
        trace (GPT.trace), to fill with q, k, v and the weights (then the five steps run,
        whatever attn_impl is)."""
        B, T, C = x.shape
        H, H_kv, d_k = self.n_head, self.n_kv_head, self.d_k
        # X W_Q, X W_K, X W_V side by side, then each split into heads (H d_k = C unless head_dim):
        # [B, T, H d_k + 2 H_kv d_k] -> q [B, T, H, d_k], k and v [B, T, H_kv, d_k] -> [B, heads, T, d_k]
        q, k, v = self.c_attn(x).split([H * d_k, H_kv * d_k, H_kv * d_k], dim=-1)
        q = q.view(B, T, H, d_k).transpose(1, 2)  # [B, H, T, d_k]
        k = k.view(B, T, H_kv, d_k).transpose(1, 2)  # [B, H_kv, T, d_k]
        v = v.view(B, T, H_kv, d_k).transpose(1, 2)  # [B, H_kv, T, d_k]
        if self.q_norm is not None:
            # QK-norm: each head's d_k numbers on their own, in the gains' precision (under autocast
            # q and k arrive in bfloat16; the norm's sums want float32, as Qwen3 takes them)
            dtype = self.q_norm.weight.dtype
            q, k = self.q_norm(q.to(dtype)).to(v.dtype), self.k_norm(k.to(dtype)).to(v.dtype)
        if rope is not None:
            q, k = apply_rotary(q, *rope), apply_rotary(k, *rope)
        if cache is not None:
            k, v = cache.write(self.layer, k, v)  # [B, H_kv, S, d_k], S = past + T
        if record is not None:
            record.q = q
            record.k = k
            record.v = v
        if H_kv != H:  # each key/value head serves H / H_kv query heads: [B, H_kv, S, d_k] -> [B, H, S, d_k]
            k, v = k.repeat_interleave(H // H_kv, dim=1), v.repeat_interleave(H // H_kv, dim=1)
        causal = mask is None and T > 1  # a lone new token may see every cached key
        dropout_p = self.dropout if self.training else 0.0

        weights = None
        if isinstance(mask, Sequences) and (self.explicit or record is not None):
            mask = mask.mask()  # (the five steps hand back every weight: the dense mask)
        if isinstance(mask, Sequences):
            y = mask.attend(q, k, v, dropout_p)  # [B, H, T, d_k]
        elif self.explicit or record is not None:
            if causal:
                mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()  # [T, T]
            y, weights = scaled_dot_product_attention(q, k, v, mask, dropout_p)  # [B, H, T, d_k]
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p,
                                               is_causal=causal)  # [B, H, T, d_k]
        if record is not None:
            record.weights = weights
        # merge heads: [B, H, T, d_k] -> [B, T, H, d_k] -> [B, T, H d_k]
        y = y.transpose(1, 2).contiguous().view(B, T, H * d_k)
        return self.resid_dropout(self.c_proj(y))  # W_O
