"""The model's trace (model.trace) is the forward pass itself, piece by piece;
a head mask switches heads off in the model's own pass."""

import pytest
import torch

from model import GPT, GPTConfig


def traced(pos_encoding="rope", norm_position="pre", attn_impl="sdpa", seed=0):
    torch.manual_seed(seed)
    model = GPT(GPTConfig(vocab_size=40, block_size=16, n_layer=3, n_head=4, n_embd=32, pos_encoding=pos_encoding,
                          norm_position=norm_position, attn_impl=attn_impl)).eval()
    for p in model.parameters():  # larger than at init, so that every piece matters
        p.data.normal_(0, 0.3)
    return model


@pytest.mark.parametrize("pos_encoding", ["rope", "learned", "sinusoidal"])
def test_the_pieces_add_up_to_the_stream_and_the_logits(pos_encoding):
    model = traced(pos_encoding)
    idx = torch.randint(0, 40, (2, 11))
    with torch.no_grad():
        trace = model.trace(idx)
        logits = trace.logits
        plain, _ = model(idx)
    assert torch.equal(logits, plain) or torch.allclose(logits, plain, atol=1e-5)  # (sdpa vs the five steps)
    start = trace.token if trace.position is None else trace.token + trace.position
    assert (trace.position is None) == (pos_encoding == "rope")
    torch.testing.assert_close(trace.layers[0].residual_in, start, atol=0, rtol=0)
    torch.testing.assert_close(trace.token, model.transformer.wte(idx), atol=0, rtol=0)
    for layer, block in zip(trace.layers, model.transformer.h):
        mid = layer.residual_in + layer.attn
        torch.testing.assert_close(layer.ln_1, block.ln_1(layer.residual_in), atol=1e-6, rtol=0)
        torch.testing.assert_close(layer.ln_2, block.ln_2(mid), atol=1e-6, rtol=0)
        torch.testing.assert_close(mid + layer.mlp, layer.residual_out, atol=1e-5, rtol=0)
        torch.testing.assert_close(block.mlp.c_proj(layer.mlp_hidden), layer.mlp, atol=1e-5, rtol=0)
        assert layer.mlp_hidden.shape == (2, 11, 128)
    for before, after in zip(trace.layers, trace.layers[1:]):
        assert torch.equal(before.residual_out, after.residual_in)
    torch.testing.assert_close(model.transformer.ln_f(trace.layers[-1].residual_out), trace.ln_f, atol=0, rtol=0)
    torch.testing.assert_close(model.lm_head(trace.ln_f), logits, atol=0, rtol=0)


def test_post_ln_blocks_normalise_after_each_residual():
    model = traced("learned", "post")
    idx = torch.randint(0, 40, (1, 9))
    with torch.no_grad():
        trace = model.trace(idx)
    for layer, block in zip(trace.layers, model.transformer.h):
        torch.testing.assert_close(layer.ln_1, block.ln_1(layer.residual_in + layer.attn), atol=1e-6, rtol=0)
        torch.testing.assert_close(layer.ln_2, block.ln_2(layer.ln_1 + layer.mlp), atol=1e-6, rtol=0)
        assert torch.equal(layer.ln_2, layer.residual_out)


@pytest.mark.parametrize("attn_impl", ["sdpa", "explicit"])
def test_a_head_mask_of_ones_changes_nothing_bit_for_bit(attn_impl):
    model = traced(attn_impl=attn_impl)
    idx = torch.randint(0, 40, (3, 13))
    with torch.no_grad():
        plain = model.trace(idx).logits
        masked = model.trace(idx, head_mask=torch.ones(3, 4)).logits
        per_row = model.trace(idx, head_mask=torch.ones(3, 3, 4)).logits
    assert torch.equal(plain, masked) and torch.equal(plain, per_row)


@pytest.mark.parametrize("layer, head", [(0, 0), (1, 2), (2, 3)])
def test_switching_a_head_off_is_zeroing_its_output_before_w_o(layer, head):
    """The model's head_mask against a hook (the test's own) that zeroes the head's d_k
    slice of W_O's input; one batch row per ablation, as the explorer runs them."""
    model = traced()
    idx = torch.randint(0, 40, (1, 12))
    d_k = 8

    def zero_head(module, args):
        x = args[0].clone()
        x[..., head * d_k:(head + 1) * d_k] = 0
        return (x,)

    handle = model.transformer.h[layer].attn.c_proj.register_forward_pre_hook(zero_head)
    with torch.no_grad():
        expected, _ = model(idx)
    handle.remove()
    mask = torch.ones(2, 3, 4)
    mask[1, layer, head] = 0  # row 0: the model as it is; row 1: that head off
    with torch.no_grad():
        trace = model.trace(idx.expand(2, -1), head_mask=mask)
        logits = trace.logits
        plain, _ = model(idx)
    torch.testing.assert_close(logits[1:], expected, atol=1e-6, rtol=0)
    torch.testing.assert_close(logits[:1], plain, atol=1e-6, rtol=0)
    assert not torch.allclose(logits[1], logits[0])
    assert (trace.layers[layer].heads[1, head] == 0).all()
