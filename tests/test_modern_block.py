"""The modern block's options: grouped-query attention, the SwiGLU feed-forward network,
norm_eps, an untied LM head, QK-norm and a head size of its own; each is what its equation
says, and every parameter trains in exactly one optimizer group."""


import pytest
import torch
import torch.nn.functional as F

from model import GPT, GPTConfig
from model.attention import KVCache


def model_of(seed=0, **overrides) -> GPT:
    torch.manual_seed(seed)
    settings = dict(vocab_size=50, block_size=16, n_layer=2, n_head=4, n_embd=32, pos_encoding="rope")
    return GPT(GPTConfig(**{**settings, **overrides})).eval()


@pytest.mark.parametrize("n_kv_head", [1, 2])
def test_grouped_query_attention_is_multi_head_attention_with_shared_keys(n_kv_head):
    """A model with n_kv_head key/value heads computes what a multi-head model computes
    whose W_K and W_V repeat each key/value head for its group of query heads."""
    gqa = model_of(n_kv_head=n_kv_head)
    mha = model_of(n_kv_head=4)
    d_k, group = 8, 4 // n_kv_head
    state = {}
    for name, t in gqa.state_dict().items():
        if name.endswith("attn.c_attn.weight") or name.endswith("attn.c_attn.bias"):
            q, k, v = t.split([32, n_kv_head * d_k, n_kv_head * d_k])
            repeat = lambda x: x.reshape(n_kv_head, d_k, *x.shape[1:]).repeat_interleave(group, 0).reshape(32, *x.shape[1:])
            t = torch.cat([q, repeat(k), repeat(v)])
        state[name] = t
    mha.load_state_dict(state)
    idx = torch.randint(0, 50, (2, 12))
    with torch.no_grad():
        torch.testing.assert_close(gqa(idx)[0], mha(idx)[0], atol=1e-5, rtol=0)
        trace = gqa.trace(idx)
    assert trace.layers[0].k.shape == (2, n_kv_head, 12, d_k) and trace.layers[0].q.shape == (2, 4, 12, d_k)
    assert gqa.transformer.h[0].attn.c_attn.weight.shape == (32 + 2 * n_kv_head * d_k, 32)


@pytest.mark.parametrize("attn_impl", ["sdpa", "explicit"])
def test_the_kv_cache_of_grouped_query_attention_is_smaller_and_exact(attn_impl):
    model = model_of(n_kv_head=2, attn_impl=attn_impl)
    cache = KVCache(model.config, 2, 16, "cpu", torch.float32)
    assert cache.k.shape == (2, 2, 2, 16, 8)  # [n_layer, B, n_kv_head, max_len, d_k]: half of 4 heads'
    assert cache.k.numel() * 2 == KVCache(model_of().config, 2, 16, "cpu", torch.float32).k.numel()
    idx = torch.randint(0, 50, (2, 12))
    with torch.no_grad():
        full, _ = model(idx)
        steps = [model(idx[:, :5], kv_cache=cache)[0]] + [model(idx[:, t:t + 1], kv_cache=cache)[0] for t in range(5, 12)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=0)
    greedy = model.generate(idx[:, :3], 30, temperature=0)
    assert torch.equal(greedy, model.generate(idx[:, :3], 30, temperature=0, use_cache=False))


def test_swiglu_is_its_equation_and_as_large_as_the_gelu_network():
    model = model_of(mlp="swiglu")
    mlp = model.transformer.h[0].mlp
    assert model.config.ffn_hidden == 96  # 8/3 × 32 = 85.3, up to a multiple of 32
    assert GPTConfig(n_embd=128, n_head=4, mlp="swiglu").ffn_hidden == 352
    x = torch.randn(3, 5, 32)
    with torch.no_grad():
        expected = (F.silu(x @ mlp.c_gate.weight.T + mlp.c_gate.bias) * (x @ mlp.c_fc.weight.T + mlp.c_fc.bias)) \
            @ mlp.c_proj.weight.T + mlp.c_proj.bias
        torch.testing.assert_close(mlp(x), expected, atol=1e-6, rtol=0)
    wide = sum(p.numel() for p in GPT(GPTConfig(n_embd=128, n_head=4, mlp="swiglu")).transformer.h[0].mlp.parameters())
    gelu = sum(p.numel() for p in GPT(GPTConfig(n_embd=128, n_head=4)).transformer.h[0].mlp.parameters())
    assert abs(wide - gelu) / gelu < 0.04
    assert model_of(mlp="swiglu", ffn_hidden=40).transformer.h[0].mlp.c_fc.out_features == 40


def test_norm_eps_reaches_every_norm():
    model = model_of(norm="rmsnorm", norm_eps=1e-6)
    norms = [m for m in model.modules() if isinstance(m, torch.nn.RMSNorm)]
    assert len(norms) == 5 and all(m.eps == 1e-6 for m in norms)
    with pytest.raises(ValueError, match="norm_eps=0.0: must be between 0 and 1"):
        GPTConfig(norm_eps=0.0)


def test_an_untied_head_has_its_own_matrix_and_is_saved_and_loaded(tmp_path):
    model = model_of(tie_embeddings=False)
    assert model.lm_head.weight is not model.transformer.wte.weight
    assert model.num_parameters() == model_of().num_parameters() + 50 * 32
    model.save_pretrained(tmp_path)
    loaded = GPT.from_pretrained(tmp_path).eval()
    idx = torch.randint(0, 50, (2, 9))
    assert torch.equal(loaded(idx)[0], model(idx)[0]) and loaded.lm_head.weight is not loaded.transformer.wte.weight


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
@pytest.mark.parametrize("settings", [{}, {"tie_embeddings": False}, {"mlp": "swiglu", "n_kv_head": 2, "bias": False},
                                      {"pos_encoding": "learned", "tie_embeddings": False},
                                      {"qk_norm": True, "head_dim": 12, "norm": "rmsnorm"}])
def test_every_parameter_is_in_exactly_one_optimizer_group(optimizer, settings):
    from training.config import TrainConfig
    from training.optim import make_optimizers
    from training.trained import AllWeights

    model = model_of(**settings)
    groups = [g for opt in make_optimizers(AllWeights(model).groups(), TrainConfig(optimizer=optimizer), torch.device("cpu"))
              for g in opt.param_groups]
    held = [id(p) for g in groups for p in g["params"]]
    assert sorted(held) == sorted(id(p) for p in model.parameters()) and len(held) == len(set(held))
    if not settings.get("tie_embeddings", True):  # the untied head is a matrix: decayed, with AdamW
        decayed = [g for g in groups if g["weight_decay"] > 0 and any(p is model.lm_head.weight for p in g["params"])]
        assert decayed


def test_a_bad_group_of_heads_is_refused():
    with pytest.raises(ValueError, match="n_kv_head=3: must divide n_head=4"):
        GPTConfig(n_head=4, n_embd=32, n_kv_head=3)


def test_qk_norm_scales_each_heads_q_and_k_to_unit_rms_times_its_gain_before_the_rotation():
    """Qwen3's QK-norm: q_h ← g_q ⊙ q_h / √(mean(q_h²) + ε), the same for k with g_k, for each
    head's d_k numbers, before rope; the scores then do not grow with W_Q and W_K."""
    model = model_of(qk_norm=True, norm="rmsnorm", norm_eps=1e-6)
    attn = model.transformer.h[0].attn
    with torch.no_grad():
        attn.q_norm.weight.copy_(torch.linspace(0.5, 2.0, 8))
        attn.k_norm.weight.copy_(torch.linspace(2.0, 0.5, 8))
    idx = torch.randint(0, 50, (1, 10))
    with torch.no_grad():
        trace = model.trace(idx)
        x = trace.layers[0].ln_1  # [1, T, C]: what W_Q and W_K read
        q, k, _ = attn.c_attn(x).split([32, 32, 32], dim=-1)
        q, k = (t.view(1, 10, 4, 8).transpose(1, 2) for t in (q, k))  # [1, H, T, d_k]
        q = attn.q_norm.weight * q / (q.pow(2).mean(-1, keepdim=True) + 1e-6).sqrt()
        k = attn.k_norm.weight * k / (k.pow(2).mean(-1, keepdim=True) + 1e-6).sqrt()
        cos, sin = model.rotary(torch.arange(10)[None])
        from model.positional import apply_rotary
        torch.testing.assert_close(trace.layers[0].q, apply_rotary(q, cos, sin), atol=1e-5, rtol=0)
        torch.testing.assert_close(trace.layers[0].k, apply_rotary(k, cos, sin), atol=1e-5, rtol=0)
        before = model(idx)[0]
        attn.c_attn.weight[:64] *= 10  # W_Q and W_K ten times larger: the same q and k
        torch.testing.assert_close(model(idx)[0], before, atol=1e-4, rtol=0)


@pytest.mark.parametrize("attn_impl", ["sdpa", "explicit"])
def test_heads_of_their_own_size_are_exact_with_the_cache_and_cost_what_their_width_says(attn_impl):
    """head_dim: 4 heads of 12 in a stream of 32 (Qwen3's way: the heads side by side are
    48 wide and W_O maps them back to 32); cached decoding equals the whole pass, the five
    steps equal torch's kernel, and the FLOPs count attention at the heads' width."""
    model = model_of(head_dim=12, n_kv_head=2, qk_norm=True, attn_impl=attn_impl)
    attn = model.transformer.h[0].attn
    assert attn.c_attn.weight.shape == (48 + 2 * 2 * 12, 32) and attn.c_proj.weight.shape == (32, 48)
    idx = torch.randint(0, 50, (2, 12))
    cache = KVCache(model.config, 2, 16, "cpu", torch.float32)
    assert cache.k.shape == (2, 2, 2, 16, 12)
    with torch.no_grad():
        full, _ = model(idx)
        steps = [model(idx[:, :5], kv_cache=cache)[0]] + [model(idx[:, t:t + 1], kv_cache=cache)[0] for t in range(5, 12)]
        other = model_of(head_dim=12, n_kv_head=2, qk_norm=True, attn_impl="explicit" if attn_impl == "sdpa" else "sdpa")
        other.load_state_dict(model.state_dict())
        torch.testing.assert_close(other(idx)[0], full, atol=1e-5, rtol=0)
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=0)
    weights = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    assert model.flops_per_token(16, training=False) == 2 * weights + 4 * 2 * 16 * 48
    with pytest.raises(ValueError, match="n_embd=30 is not divisible by n_head=4"):
        GPTConfig(n_head=4, n_embd=30)
    assert GPTConfig(n_head=4, n_embd=30, head_dim=8).head_size == 8  # (any width, with its own head size)
    with pytest.raises(ValueError, match="head_dim=0: must be at least 1"):
        GPTConfig(head_dim=0)
