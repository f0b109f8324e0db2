"""Positional encodings against their closed forms, and RoPE's relative-position property."""

import math

import pytest
import torch

from model import GPT, GPTConfig
from model.attention import MultiHeadAttention
from model.positional import RotaryEmbedding, SinusoidalPositionalEncoding, apply_rotary
from model.trace import LayerTrace


@pytest.mark.parametrize("d", [6, 16])
def test_sinusoidal_equals_the_papers_closed_form(d):
    pe = SinusoidalPositionalEncoding(d)(torch.tensor([[0, 1, 7, 100, 4000]]))[0]  # [5, d]
    for row, pos in enumerate((0, 1, 7, 100, 4000)):
        for i in range(d // 2):
            angle = pos / 10000 ** (2 * i / d)
            assert pe[row, 2 * i].item() == pytest.approx(math.sin(angle), abs=2e-4)
            assert pe[row, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=2e-4)


def test_sinusoidal_model_adds_the_encoding_to_the_embeddings():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=20, block_size=16, n_layer=1, n_head=2, n_embd=8, pos_encoding="sinusoidal"))
    seen = []
    model.transformer.drop.register_forward_hook(lambda m, args, out: seen.append(args[0]))
    idx = torch.tensor([[3, 1, 4, 1, 5]])
    model(idx)
    angles = [[pos / 10000 ** (2 * i / 8) for i in range(4)] for pos in range(5)]
    pe = torch.tensor([[f(a) for a in row for f in (math.sin, math.cos)] for row in angles])  # [T, C]
    torch.testing.assert_close(seen[0][0], model.transformer.wte.weight[idx[0]] + pe, atol=1e-5, rtol=0)


def rotate_by_formula(x: torch.Tensor, pos: int, base: float = 10000.0) -> torch.Tensor:
    """RoPE written from its formula (docs/attention.md), one pair at a time: dimension i
    pairs with i + d/2 and the pair turns by the angle pos · θ_i, θ_i = base^(-2i/d)."""
    d = x.size(-1)
    out = torch.empty_like(x)
    for i in range(d // 2):
        theta = base ** (-2 * i / d)
        c, s = math.cos(pos * theta), math.sin(pos * theta)
        a, b = x[..., i], x[..., i + d // 2]
        out[..., i] = a * c - b * s
        out[..., i + d // 2] = a * s + b * c
    return out


def test_rope_pair_layout_matches_the_formula():
    d = 8
    x = torch.randn(2, 3, 5, d, dtype=torch.float64)  # [B, H, T, d_k]
    positions = torch.tensor([[0, 1, 2, 9, 30]])
    cos, sin = RotaryEmbedding(d, base=500.0)(positions)  # [1, 1, T, d_k]
    rotated = apply_rotary(x, cos, sin)
    for t, pos in enumerate(positions[0].tolist()):
        expected = rotate_by_formula(x[:, :, t], pos, base=500.0)
        torch.testing.assert_close(rotated[:, :, t], expected, atol=1e-6, rtol=0)


def scores(q, k, m, n, rope):
    """q·k after rotating q to position m and k to position n."""
    cos, sin = rope(torch.tensor([[m, n]]))
    return (apply_rotary(q, cos[..., :1, :], sin[..., :1, :]) * apply_rotary(k, cos[..., 1:, :], sin[..., 1:, :])).sum()


def test_rope_score_depends_on_the_signed_offset_only():
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 1, 1, 16, generator=g), torch.randn(1, 1, 1, 16, generator=g)
    rope = RotaryEmbedding(16)
    base = scores(q, k, 5, 2, rope)
    for shift in (1, 7, 40):
        assert scores(q, k, 5 + shift, 2 + shift, rope).item() == pytest.approx(base.item(), abs=1e-4)
    assert abs(scores(q, k, 5, 4, rope) - base) > 1e-2  # another offset, another score
    assert abs(scores(q, k, 2, 5, rope) - base) > 1e-2  # -3 is not +3


def attention_weights(attn: MultiHeadAttention, x: torch.Tensor, positions: torch.Tensor | None):
    rope = None if positions is None else RotaryEmbedding(attn.c_attn.in_features // attn.n_head)(positions)
    with torch.no_grad():
        record = LayerTrace()
        attn(x, rope=rope, record=record)
    return record.weights


def test_multihead_attention_rotates_queries_and_keys():
    """Shifting every position by s leaves the weights unchanged only if q and k are
    both rotated; and the rotation must change the weights at all."""
    torch.manual_seed(0)
    attn = MultiHeadAttention(GPTConfig(vocab_size=10, block_size=64, n_layer=1, n_head=2, n_embd=16,
                                        pos_encoding="rope", attn_impl="explicit"), layer=0).eval()
    x = torch.randn(1, 6, 16) * 3
    at_zero = attention_weights(attn, x, torch.arange(6)[None])
    shifted = attention_weights(attn, x, torch.arange(6)[None] + 11)
    torch.testing.assert_close(shifted, at_zero, atol=1e-5, rtol=0)
    assert (attention_weights(attn, x, None) - at_zero).abs().max() > 1e-2


def test_rope_model_attends_with_rotated_queries_and_keys():
    """Layer 0's attention weights of a rope GPT equal softmax(R_m q · R_n k / √d_k)
    computed here from its own projections and the formula."""
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=20, block_size=16, n_layer=1, n_head=2, n_embd=8, pos_encoding="rope",
                       attn_impl="sdpa", rope_base=500.0)
    model = GPT(config).eval()
    with torch.no_grad():
        for p in model.parameters():  # larger weights than at init, so the rotation matters
            p.normal_(0, 1)
    idx = torch.tensor([[3, 1, 4, 1, 5, 9, 2]])
    T, d = idx.size(1), config.head_size
    with torch.no_grad():
        weights = model.trace(idx).weights
        x = model.transformer.h[0].ln_1(model.transformer.wte(idx))  # [1, T, C]
        q, k, _ = model.transformer.h[0].attn.c_attn(x).split(config.n_embd, dim=-1)
    q = q.view(1, T, 2, d).transpose(1, 2)  # [1, H, T, d_k]
    k = k.view(1, T, 2, d).transpose(1, 2)
    q = torch.stack([rotate_by_formula(q[:, :, t], t, base=500.0) for t in range(T)], dim=2)
    k = torch.stack([rotate_by_formula(k[:, :, t], t, base=500.0) for t in range(T)], dim=2)
    logits = (q @ k.transpose(-2, -1) / math.sqrt(d)).masked_fill(~torch.ones(T, T).tril().bool(), float("-inf"))
    torch.testing.assert_close(weights[0], torch.softmax(logits, dim=-1), atol=1e-5, rtol=0)
