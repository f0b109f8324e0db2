"""The five-step attention function and multi-head attention, checked against torch."""

import math

import pytest
import torch
import torch.nn.functional as F

from model import GPTConfig
from model.attention import MultiHeadAttention, scaled_dot_product_attention


def qkv(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*shape, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(3)]


MASKS = {
    "none": None,
    "boolean": torch.tensor([[True, False, True, True], [True, True, False, False],
                             [False, True, True, True], [True, True, True, False]]),
    "causal": torch.ones(4, 4, dtype=torch.bool).tril(),
    "zero_one": torch.tensor([[1, 0, 1, 1], [1, 1, 0, 0], [0, 1, 1, 1], [1, 1, 1, 0]]),
}


@pytest.mark.parametrize("name", MASKS)
def test_explicit_matches_torch_values_and_gradients(name):
    mask = MASKS[name]
    q, k, v = qkv(2, 3, 4, 8)
    out, weights = scaled_dot_product_attention(q, k, v, mask)
    torch_mask = None if mask is None else mask.bool()
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=torch_mask)
    torch.testing.assert_close(out, ref, atol=1e-10, rtol=0)
    assert weights.shape == (2, 3, 4, 4)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 3, 4, dtype=torch.float64))

    grad = torch.randn_like(out)
    ours = torch.autograd.grad(out, (q, k, v), grad)
    theirs = torch.autograd.grad(ref, (q, k, v), grad)
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=0)


def test_fully_masked_row_gives_zeros_not_nan():
    q, k, v = qkv(1, 2, 3, 4)
    mask = torch.tensor([[False, False, False], [True, False, False], [True, True, True]])
    out, weights = scaled_dot_product_attention(q, k, v, mask)
    assert not out.isnan().any() and not weights.isnan().any()
    assert (out[..., 0, :] == 0).all() and (weights[..., 0, :] == 0).all()
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
    out.sum().backward()
    assert not any(t.grad.isnan().any() for t in (q, k, v))


def test_mask_broadcasts_over_batch_and_heads():
    q, k, v = qkv(2, 3, 4, 8)
    key_padding = torch.tensor([[1, 1, 1, 0], [0, 1, 1, 1]]).bool()[:, None, None, :]  # [B,1,1,S]
    out, weights = scaled_dot_product_attention(q, k, v, key_padding)
    assert (weights[0, :, :, 3] == 0).all() and (weights[1, :, :, 0] == 0).all()
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=key_padding))


def test_tutorial_softmax_example_with_correct_figures():
    # the first tutorial prints [0.02, 0.12, 0.86]; the true values are these. With d_k = 1
    # the scaled scores of this query against these keys are exactly [2, 5, 8].
    query, key = torch.tensor([[1.0]]), torch.tensor([[2.0], [5.0], [8.0]])
    _, weights = scaled_dot_product_attention(query, key, torch.eye(3))
    torch.testing.assert_close(weights[0], torch.tensor([0.0024, 0.0473, 0.9503]), atol=5e-5, rtol=0)


def test_tutorial_shape_table():
    x = torch.randn(2, 4, 512)  # batch 2, 4 tokens, d_model 512 (Kᵀ: [2, 512, 4])
    out, weights = scaled_dot_product_attention(x, x, x, torch.ones(4, 4, dtype=torch.bool).tril())
    assert weights.shape == (2, 4, 4)  # scores, scaled, masked, softmaxed: one per (query, key)
    assert out.shape == (2, 4, 512)  # same size as the input, new contents


def test_scaling_keeps_scores_unit_variance():
    # unit-variance q, k with d_k = 512: unscaled dot products have variance ≈ 512 and a
    # softmax over them is nearly one-hot. The log of the weights is the scaled score up to
    # a constant per row, so its spread shows what the scaling did.
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 256, 512, generator=g), torch.randn(2, 256, 512, generator=g)
    _, weights = scaled_dot_product_attention(q, k, k)
    scores = weights.log() - weights.log().mean(dim=-1, keepdim=True)  # [2, 256, 256]
    assert 0.8 < scores.var() < 1.2
    assert weights.max() < 0.5  # no weight comes close to 1: the softmax is not saturated
    assert weights.max(dim=-1).values.mean() < 0.1  # far from one-hot over 256 keys


def test_dropout_on_weights_only_when_asked():
    q, k, v = qkv(1, 1, 6, 4)
    out_a, kept = scaled_dot_product_attention(q, k, v, dropout_p=0.0)
    out_b, _ = scaled_dot_product_attention(q, k, v, dropout_p=0.0)
    assert torch.equal(out_a, out_b)
    q, k, v = qkv(1, 8, 64, 4)  # 32,768 weights: the dropped share is close to p
    _, kept = scaled_dot_product_attention(q, k, v)
    torch.manual_seed(0)
    _, dropped = scaled_dot_product_attention(q, k, v, dropout_p=0.2)
    assert (dropped == 0).float().mean().item() == pytest.approx(0.2, abs=0.01)
    survivors = dropped != 0  # the rest are scaled by 1 / (1 - p)
    torch.testing.assert_close(dropped[survivors], kept[survivors] / 0.8)


@pytest.mark.parametrize("impl, calls", [("explicit", 2), ("sdpa", 0)])
def test_attn_impl_chooses_the_five_steps_or_the_fused_kernel(monkeypatch, impl, calls):
    import model.attention
    from model import GPT

    seen = []
    real = model.attention.scaled_dot_product_attention
    monkeypatch.setattr(model.attention, "scaled_dot_product_attention", lambda *a, **k: seen.append(1) or real(*a, **k))
    gpt = GPT(GPTConfig(vocab_size=10, block_size=16, n_layer=2, n_head=2, n_embd=16, attn_impl=impl))
    gpt(torch.randint(0, 10, (1, 5)))
    assert len(seen) == calls  # one call per layer, or none
    gpt.trace(torch.randint(0, 10, (1, 5)))
    assert len(seen) == calls + 2  # attention weights always come from the five steps


def make_attention(impl, seed=0):
    torch.manual_seed(seed)
    cfg = GPTConfig(vocab_size=10, block_size=16, n_layer=1, n_head=4, n_embd=32, attn_impl=impl)
    return MultiHeadAttention(cfg, layer=0)


@pytest.mark.parametrize("padded", [False, True])
def test_multihead_explicit_and_sdpa_agree(padded):
    explicit, sdpa = make_attention("explicit"), make_attention("sdpa")
    assert torch.equal(explicit.c_attn.weight, sdpa.c_attn.weight)
    x = torch.randn(3, 10, 32, requires_grad=True)
    mask = None
    if padded:
        keys = torch.ones(3, 10, dtype=torch.bool)
        keys[1, :4] = False
        mask = torch.ones(10, 10, dtype=torch.bool).tril() & keys[:, None, None, :]
        mask = mask | torch.eye(10, dtype=torch.bool)
    a, b = explicit(x, mask)[0], sdpa(x, mask)[0]
    torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
    grad = torch.randn_like(a)
    ga = torch.autograd.grad(a, [x, *explicit.parameters()], grad)
    gb = torch.autograd.grad(b, [x, *sdpa.parameters()], grad)
    for u, w in zip(ga, gb):
        torch.testing.assert_close(u, w, atol=1e-5, rtol=0)


@pytest.mark.parametrize("impl", ["explicit", "sdpa"])
def test_attention_weights_on_request(impl):
    attn = make_attention(impl)
    x = torch.randn(2, 5, 32)
    from model.trace import LayerTrace

    record = LayerTrace()
    out = attn(x, record=record)
    weights = record.weights
    assert weights.shape == (2, 4, 5, 5)  # [B, H, T, T]
    assert (weights.triu(diagonal=1) == 0).all()  # the causal triangle
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 4, 5))
    torch.testing.assert_close(out, attn(x), atol=1e-6, rtol=0)  # the same output either way
    filled = sorted(name for name, value in vars(record).items() if value is not None)
    assert filled == ["k", "q", "v", "weights"]  # attention's insides; GPT.trace's hooks keep the rest


@pytest.mark.parametrize("impl", ["explicit", "sdpa"])
def test_dropout_is_off_in_eval_mode(impl):
    attn = make_attention(impl)
    attn.dropout = 0.5
    x = torch.randn(2, 7, 32)
    attn.eval()
    with torch.no_grad():
        first, second = attn(x), attn(x)
        attn.dropout = 0.0
        without = attn(x)
    assert torch.equal(first, second)
    torch.testing.assert_close(first, without, atol=1e-6, rtol=0)
    attn.dropout = 0.5
    attn.train()
    with torch.no_grad():
        assert not torch.allclose(attn(x), attn(x))  # and on while training


@pytest.mark.parametrize("pos_encoding", ["rope", "learned"])
def test_attention_trace_hands_back_each_heads_real_numbers(pos_encoding):
    """The trace (model.trace) explains what a plain sdpa forward computed:
    softmax(q kᵀ/√d_k) with the causal mask gives the weights, weights @ v each head's
    output, and the heads concatenated through W_O give the layer's attention output."""
    from model import GPT

    torch.manual_seed(0)
    gpt = GPT(GPTConfig(vocab_size=10, block_size=16, n_layer=2, n_head=2, n_embd=16, attn_impl="sdpa",
                        pos_encoding=pos_encoding)).eval()
    for p in gpt.parameters():  # larger than at init, so that every step matters
        p.data.normal_(0, 0.5)
    idx = torch.randint(0, 10, (2, 7))
    outputs = []
    hooks = [block.attn.register_forward_hook(lambda m, args, out: outputs.append(out)) for block in gpt.transformer.h]
    with torch.no_grad():
        logits, _ = gpt(idx)
        for h in hooks:
            h.remove()
        trace = gpt.trace(idx)
        traced_logits = trace.logits
    torch.testing.assert_close(traced_logits, logits, atol=1e-5, rtol=0)
    assert trace.q.shape == trace.k.shape == trace.v.shape == trace.heads.shape == (2, 2, 2, 7, 8)  # [L, B, H, T, d_k]
    causal = torch.ones(7, 7, dtype=torch.bool).tril()
    scores = (trace.q @ trace.k.transpose(-2, -1) / math.sqrt(8)).masked_fill(~causal, float("-inf"))
    torch.testing.assert_close(trace.weights, torch.softmax(scores, dim=-1), atol=1e-6, rtol=0)
    torch.testing.assert_close(trace.heads, trace.weights @ trace.v, atol=1e-6, rtol=0)
    for layer, block in enumerate(gpt.transformer.h):
        merged = trace.heads[layer].transpose(1, 2).reshape(2, 7, 16)  # [B, T, H·d_k]
        torch.testing.assert_close(block.attn.c_proj(merged), outputs[layer], atol=1e-5, rtol=0)
        torch.testing.assert_close(trace.layers[layer].attn, outputs[layer], atol=1e-5, rtol=0)
