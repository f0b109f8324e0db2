"""The GPT model: causality, padding, the KV cache, training, saving, and HF parity."""

import json

import pytest
import torch

import model.gpt as model_gpt
from model import GPT, GPTConfig, Sampling
from model.sampling import next_token_probabilities, sample_next

ENCODINGS = ["learned", "sinusoidal", "rope"]


def tiny(seed=0, **overrides):
    torch.manual_seed(seed)
    settings = dict(vocab_size=50, block_size=16, n_layer=2, n_head=2, n_embd=32)
    settings.update(overrides)
    return GPT(GPTConfig(**settings)).eval()


def train_briefly(model: GPT, steps: int = 100) -> GPT:
    """Fit a repeating sequence of 24 distinct tokens, so that the logits are confident
    and depend on the context (a random-init model's barely react to anything)."""
    period = torch.randperm(50, generator=torch.Generator().manual_seed(1))[:24]
    stream = period.repeat(20)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model.train()
    for step in range(steps):
        starts = torch.randint(0, len(stream) - 17, (8,), generator=torch.Generator().manual_seed(step))
        batch = torch.stack([stream[s:s + 17] for s in starts])
        _, loss = model(batch[:, :-1], batch[:, 1:])
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


@pytest.fixture(scope="module")
def trained():
    """{positional encoding: a briefly trained tiny model}."""
    return {pos: train_briefly(tiny(pos_encoding=pos)) for pos in ENCODINGS}


def test_briefly_trained_models_learned_the_sequence(trained):
    # (sinusoidal learns it too, but several times more slowly: its unit-size sin/cos
    # swamp token embeddings initialised at std 0.02)
    period = torch.randperm(50, generator=torch.Generator().manual_seed(1))[:24]
    for pos in ("learned", "rope"):
        logits, _ = trained[pos](period[None, :12])
        assert torch.equal(logits[0, 3:].argmax(-1), period[4:13])


def test_forward_shapes_and_ignored_targets():
    model = tiny()
    idx = torch.randint(0, 50, (3, 7))
    logits, loss = model(idx)
    assert logits.shape == (3, 7, 50) and loss is None
    targets = torch.randint(0, 50, (3, 7))
    _, full = model(idx, targets)
    ignored = targets.clone()
    ignored[:, :3] = -100
    _, partial = model(idx, ignored)
    expected = torch.nn.functional.cross_entropy(logits[:, 3:].flatten(0, 1), targets[:, 3:].flatten())
    torch.testing.assert_close(partial, expected)
    assert not torch.isclose(full, partial)


def test_too_long_input_is_an_error():
    with pytest.raises(ValueError, match="sequence of 17 tokens is longer than block_size=16"):
        tiny()(torch.zeros(1, 17, dtype=torch.long))
    with pytest.raises(ValueError, match=r"attention_mask must have shape \(2, 5\), got \(2, 4\)"):
        tiny()(torch.zeros(2, 5, dtype=torch.long), attention_mask=torch.ones(2, 4))
    from model.attention import KVCache

    model = tiny()
    with pytest.raises(ValueError, match="KV cache holds 4 tokens; cannot store 5"):
        model(torch.zeros(1, 5, dtype=torch.long), kv_cache=KVCache(model.config, 1, 4, "cpu", torch.float32))


@pytest.mark.parametrize("pos", ENCODINGS)
@pytest.mark.parametrize("impl", ["explicit", "sdpa"])
def test_causality(pos, impl):
    model = tiny(pos_encoding=pos, attn_impl=impl)
    idx = torch.randint(0, 50, (2, 12))
    changed = idx.clone()
    changed[:, 6:] = torch.randint(0, 50, (2, 6))
    a, _ = model(idx)
    b, _ = model(changed)
    torch.testing.assert_close(a[:, :6], b[:, :6], atol=0, rtol=0)
    assert not torch.allclose(a[:, 6:], b[:, 6:])


def left_pad(prompts, pad=0):
    width = max(len(p) for p in prompts)
    idx = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros(len(prompts), width, dtype=torch.long)
    for row, p in enumerate(prompts):
        idx[row, width - len(p):] = torch.tensor(p)
        mask[row, width - len(p):] = 1
    return idx, mask


@pytest.mark.parametrize("pos", ENCODINGS)
@pytest.mark.parametrize("impl", ["explicit", "sdpa"])
def test_left_padded_batch_matches_each_prompt_alone(pos, impl, trained, monkeypatch):
    model = tiny(pos_encoding=pos, attn_impl=impl)
    model.load_state_dict(trained[pos].state_dict())
    prompts = [[5, 6, 7, 8, 9, 10], [11, 12], [13, 14, 15, 16]]
    idx, mask = left_pad(prompts)
    logits, _ = model(idx, attention_mask=mask)
    assert not logits.isnan().any()
    for row, p in enumerate(prompts):
        alone, _ = model(torch.tensor([p]))
        torch.testing.assert_close(logits[row, -len(p):], alone[0], atol=1e-5, rtol=0)
    # generation past block_size too: windows slide over the padding
    batched, batched_logits = generate_recording_logits(model, idx, 30, monkeypatch, temperature=0,
                                                        attention_mask=mask)
    for row, p in enumerate(prompts):
        alone, alone_logits = generate_recording_logits(model, torch.tensor([p]), 30, monkeypatch, temperature=0)
        torch.testing.assert_close(batched_logits[:, row], alone_logits[:, 0], atol=1e-5, rtol=0)
        assert batched[row, -30:].tolist() == alone[0, -30:].tolist()


def generate_recording_logits(model, idx, n, monkeypatch, temperature=1.0, **kwargs):
    """model.generate, also returning the logits each step sampled from [n, B, V]."""
    seen = []

    def recording(logits, sampling, generator=None):
        seen.append(logits.clone())
        return sample_next(logits, sampling, generator)

    monkeypatch.setattr(model_gpt, "sample_next", recording)
    out = model.generate(idx, n, temperature=temperature, generator=torch.Generator().manual_seed(0), **kwargs)
    monkeypatch.undo()
    return out, torch.stack(seen)


@pytest.mark.parametrize("pos", ENCODINGS)
def test_cache_gives_the_same_logits_past_block_size(pos, trained, monkeypatch):
    model = trained[pos]
    idx = torch.randint(0, 50, (2, 5), generator=torch.Generator().manual_seed(2))
    n = 3 * model.config.block_size
    cached, cached_logits = generate_recording_logits(model, idx, n, monkeypatch, use_cache=True)
    uncached, uncached_logits = generate_recording_logits(model, idx, n, monkeypatch, use_cache=False)
    assert cached.shape == (2, 5 + n) and cached_logits.shape == (n, 2, 50)
    torch.testing.assert_close(cached_logits, uncached_logits, atol=1e-5, rtol=0)
    assert torch.equal(cached, uncached)


@pytest.mark.parametrize("pos", ENCODINGS)
def test_cached_logits_match_uncached(pos):
    from model.attention import KVCache

    model = tiny(pos_encoding=pos)
    idx = torch.randint(0, 50, (2, 12))
    full, _ = model(idx)
    cache = KVCache(model.config, 2, model.config.block_size, "cpu", torch.float32)
    prefill, _ = model(idx[:, :4], kv_cache=cache)
    steps = [prefill, model(idx[:, 4:7], kv_cache=cache)[0]]  # a chunk of 3 after the prefill
    for t in range(7, 12):
        step, _ = model(idx[:, t:t + 1], kv_cache=cache)
        steps.append(step)
    assert cache.length == 12
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=0)


def test_generation_with_the_cache_runs_one_token_per_step(monkeypatch):
    model = tiny()
    lengths = []
    real = GPT.forward
    monkeypatch.setattr(GPT, "forward", lambda self, idx, *a, **k: lengths.append(idx.size(1)) or real(self, idx, *a, **k))
    model.generate(torch.randint(0, 50, (2, 5)), 20)  # the cache is on by default
    # the prompt once, then one token per step until the window is full (16); from then on
    # the window slides by one each step and is run afresh (see GPT.generate_tokens)
    assert lengths == [5] + [1] * 11 + [16] * 8


@pytest.mark.parametrize("pos", ENCODINGS)
def test_bfloat16_generation_with_the_cache(pos, trained, monkeypatch):
    model = tiny(pos_encoding=pos)
    model.load_state_dict(trained[pos].state_dict())
    model = model.to(torch.bfloat16)
    idx = torch.randint(0, 50, (2, 5), generator=torch.Generator().manual_seed(3))
    cached, cached_logits = generate_recording_logits(model, idx, 40, monkeypatch, temperature=0)
    uncached, uncached_logits = generate_recording_logits(model, idx, 40, monkeypatch, temperature=0,
                                                          use_cache=False)
    assert cached_logits.dtype == torch.bfloat16
    torch.testing.assert_close(cached_logits.float(), uncached_logits.float(), atol=0.1, rtol=0.02)
    assert (cached == uncached).float().mean() > 0.9  # bf16 rounding may flip a rare near-tie


def test_cache_writes_in_place():
    from model.attention import KVCache

    model = tiny()
    cache = KVCache(model.config, 1, 16, "cpu", torch.float32)
    storage = cache.k.data_ptr()
    model(torch.tensor([[1, 2, 3]]), kv_cache=cache)
    model(torch.tensor([[4]]), kv_cache=cache)
    assert cache.k.data_ptr() == storage and cache.length == 4
    t = model.transformer
    with torch.no_grad():
        x = t.wte(torch.tensor([[4]])) + t.wpe(torch.tensor([[3]]))  # token 4 at position 3
        key = t.h[0].attn.c_attn(t.h[0].ln_1(x))[..., 32:64]  # layer 0's W_K part: [1, 1, C]
    torch.testing.assert_close(cache.k[0, :, :, 3:4], key.view(1, 1, 2, 16).transpose(1, 2))


def test_sampling_controls():
    logits = torch.tensor([[1.0, 3.0, 2.0, 0.5], [4.0, 0.0, 1.0, 3.9]])
    greedy = logits.argmax(-1)
    assert torch.equal(sample_next(logits, Sampling(temperature=0)), greedy)
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        assert torch.equal(sample_next(logits, Sampling(1.0, top_k=1), generator=g), greedy)
        assert torch.equal(sample_next(logits, Sampling(1.0, top_p=0.01), generator=g), greedy)
        two = sample_next(logits, Sampling(5.0, top_k=2), generator=g)
        assert two[0] in (1, 2) and two[1] in (0, 3)
    model = tiny()
    idx = torch.randint(0, 50, (2, 3))
    a = model.generate(idx, 20, generator=torch.Generator().manual_seed(1))
    b = model.generate(idx, 20, generator=torch.Generator().manual_seed(1))
    c = model.generate(idx, 20, generator=torch.Generator().manual_seed(2))
    assert torch.equal(a, b) and not torch.equal(a, c)
    for bad in (dict(temperature=-1), dict(top_k=0), dict(top_p=0.0), dict(top_p=1.5)):
        with pytest.raises(ValueError, match=next(iter(bad))):
            model.generate(idx, 5, **bad)


# log-probabilities of [0.5, 0.3, 0.15, 0.05]: the nucleus of each top_p is known exactly
NUCLEUS = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()


@pytest.mark.parametrize("temperature", [0.5, 1.0, 2.5])
def test_temperature_divides_the_logits(temperature):
    logits = torch.tensor([[1.0, 3.0, 2.0, -0.5], [4.0, 0.0, 1.0, 3.9]])
    probs = next_token_probabilities(logits, Sampling(temperature))
    torch.testing.assert_close(probs, torch.softmax(logits / temperature, dim=-1))


@pytest.mark.parametrize("top_p, kept", [(0.4, 1), (0.7, 2), (0.85, 3), (0.97, 4), (1.0, 4)])
def test_top_p_keeps_the_smallest_set_that_reaches_p(top_p, kept):
    probs = next_token_probabilities(NUCLEUS, Sampling(1.0, top_p=top_p))[0]
    expected = torch.tensor([0.5, 0.3, 0.15, 0.05])[:kept]
    torch.testing.assert_close(probs[:kept], expected / expected.sum())
    assert (probs[kept:] == 0).all()


def test_top_p_boundary_and_greedy_per_row():
    # exactly representable: [0.5, 0.25, 0.25]; 0.5 + 0.25 reaches top_p = 0.75 exactly
    probs = next_token_probabilities(torch.tensor([[2.0, 1.0, 1.0]]).log(), Sampling(1.0, top_p=0.75))[0]
    torch.testing.assert_close(probs, torch.tensor([2 / 3, 1 / 3, 0.0]))
    logits = torch.tensor([[0.1, 0.3, 0.2], [0.9, 0.0, 0.5]])
    assert next_token_probabilities(logits, Sampling(0.0)).tolist() == [[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]]
    assert sample_next(logits, Sampling(0.0)).tolist() == [1, 0]


def test_top_k_then_top_p_on_what_is_left():
    # top_k=3 leaves [0.5, 0.3, 0.15] / 0.95; top_p 0.8 of that needs 0.526 + 0.316
    probs = next_token_probabilities(NUCLEUS, Sampling(1.0, top_k=3, top_p=0.8))[0]
    torch.testing.assert_close(probs, torch.tensor([0.625, 0.375, 0.0, 0.0]))
    probs = next_token_probabilities(NUCLEUS, Sampling(1.0, top_k=2))[0]
    torch.testing.assert_close(probs, torch.tensor([0.625, 0.375, 0.0, 0.0]))
    greedy = next_token_probabilities(NUCLEUS, Sampling(0.0))[0]
    assert greedy.tolist() == [1.0, 0.0, 0.0, 0.0]


def test_suppressed_tokens_get_probability_zero():
    logits = torch.tensor([[1.0, 3.0, 2.0, 0.5], [4.0, 0.0, 1.0, 3.9]])
    for sampling in (Sampling(0.0, suppress_tokens=(1, 0)), Sampling(1.0, suppress_tokens=(1, 0)),
                     Sampling(2.0, top_k=1, suppress_tokens=(1, 0)), Sampling(1.0, top_p=0.3, suppress_tokens=(1, 0))):
        probs = next_token_probabilities(logits, sampling)
        assert (probs[:, :2] == 0).all() and torch.allclose(probs.sum(-1), torch.ones(2))
        assert sample_next(logits, sampling, torch.Generator().manual_seed(0)).tolist() in ([2, 3], [3, 2], [2, 2], [3, 3])
    assert sample_next(logits, Sampling(0.0, suppress_tokens=(1, 0))).tolist() == [2, 3]  # greedy: the best allowed
    probs = next_token_probabilities(logits, Sampling(1.0, suppress_tokens=(1,)))
    torch.testing.assert_close(probs[:, [0, 2, 3]], torch.softmax(logits[:, [0, 2, 3]], dim=-1))
    model = tiny()
    idx = torch.randint(0, 50, (2, 3))
    out = model.generate(idx, 30, temperature=5.0, suppress_tokens=range(1, 50), generator=torch.Generator().manual_seed(0))
    assert (out[:, 3:] == 0).all()  # of 50 tokens, only id 0 is allowed


def test_samples_follow_the_sampling_distribution():
    logits = torch.tensor([[1.0, 3.0, 2.0, 0.5]]).expand(20000, 4)
    sampling = Sampling(temperature=1.5, top_k=3)
    draws = sample_next(logits, sampling, torch.Generator().manual_seed(0))
    frequencies = torch.bincount(draws, minlength=4).float() / len(draws)
    torch.testing.assert_close(frequencies, next_token_probabilities(logits[:1], sampling)[0], atol=0.015, rtol=0)


def test_generation_runs_without_dropout(monkeypatch):
    with_dropout, without = tiny(dropout=0.5).train(), tiny(dropout=0.0)
    idx = torch.randint(0, 50, (2, 4), generator=torch.Generator().manual_seed(0))
    _, noisy = generate_recording_logits(with_dropout, idx, 10, monkeypatch)
    _, clean = generate_recording_logits(without, idx, 10, monkeypatch)
    torch.testing.assert_close(noisy, clean, atol=1e-6, rtol=0)
    assert with_dropout.training  # and put back in training mode afterwards


def test_generate_restores_training_mode():
    model = tiny(dropout=0.1).train()
    model.generate(torch.tensor([[1]]), 3)
    assert model.training


@pytest.mark.parametrize("settings", [
    dict(norm_position="pre"), dict(norm_position="post"), dict(norm="rmsnorm", bias=False),
    dict(attn_impl="explicit", pos_encoding="rope"),
])
def test_loss_falls_on_a_fixed_batch(settings):
    model = tiny(**settings).train()
    idx = torch.randint(0, 50, (4, 16), generator=torch.Generator().manual_seed(0))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(30):
        _, loss = model(idx[:, :-1], idx[:, 1:])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]


def test_overfits_one_batch_and_learns_nothing_it_may_not_see():
    """The same training twice: on one fixed batch the model learns it by heart; on a fresh
    batch of uniform random tokens each step, the next token is never in its past, so no
    causal model can do better than chance (ln 50 = 3.91 nats). A mask that lets a query see
    the future passes the first half and fails the second (its loss falls towards 0)."""
    generator = torch.Generator().manual_seed(0)
    for fresh in (False, True):
        torch.manual_seed(0)
        model = tiny(n_layer=2, n_embd=64, n_head=4).train()
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3 if fresh else 1e-2)
        idx = torch.randint(0, 50, (2, 16), generator=generator)
        for _ in range(300 if fresh else 150):
            if fresh:  # (a leaking mask reaches 0.3 here)
                idx = torch.randint(0, 50, (8, 16), generator=generator)
            _, loss = model(idx[:, :-1], idx[:, 1:])
            opt.zero_grad()
            loss.backward()
            opt.step()
        if fresh:
            assert loss.item() > 3.5  # chance is 3.91; what it may not see, it cannot learn
        else:
            assert loss.item() < 0.05


def test_initialisation_and_tying():
    model = tiny(n_layer=4)
    assert model.lm_head.weight is model.transformer.wte.weight
    projections = torch.cat([p.flatten() for n, p in model.named_parameters() if n.endswith("c_proj.weight")])
    assert projections.std().item() == pytest.approx(0.02 / (2 * 4) ** 0.5, rel=0.03)  # 20,480 values
    assert abs(model.transformer.h[0].attn.c_attn.weight.std().item() - 0.02) < 0.002
    every = sum(p.numel() for _, p in model.named_parameters(remove_duplicate=False))  # the tied matrix twice
    assert model.num_parameters() == every - model.lm_head.weight.numel()


@pytest.mark.parametrize("settings, count", [
    # C=32, 2 layers, V=50, T=16. Per layer: W_Q,W_K,W_V 32·96 + 96, W_O 32·32 + 32, W_1 32·128 + 128,
    # W_2 128·32 + 32, two LayerNorms 2·(32 + 32): 12,288 + 288 + 128; the tied embedding 50·32; ln_f 64
    (dict(pos_encoding="rope"), 2 * 12_704 + 1_600 + 64),
    (dict(pos_encoding="learned"), 2 * 12_704 + 1_600 + 64 + 16 * 32),  # and 16 positions
    (dict(pos_encoding="rope", norm_position="post"), 2 * 12_704 + 1_600),  # no final norm after post-LN
    (dict(pos_encoding="rope", bias=False), 2 * (12_288 + 64) + 1_600 + 32),  # no biases, norms without β
    (dict(pos_encoding="rope", norm="rmsnorm", bias=False), 2 * (12_288 + 64) + 1_600 + 32),
])
def test_parameter_count_equals_a_hand_count(settings, count):
    model = tiny(**settings)
    assert model.num_parameters() == count
    if not model.config.bias:
        assert not [name for name, _ in model.named_parameters() if name.endswith("bias")]


def test_flops_per_token_equals_a_hand_count():
    # C=32, 2 layers, V=50, T=16. Matmul weights per layer: W_Q,W_K,W_V 32×96, W_O 32×32,
    # W_1 32×128, W_2 128×32 = 12,288; two layers 24,576; LM head 50×32 = 1,600.
    # Forward: 2 × 26,176 + attention 2 · 2 · T · C per layer = 4 · 2 · 16 · 32 = 4,096.
    model = tiny()
    assert model.flops_per_token(16, training=False) == 2 * 26_176 + 4_096 == 56_448
    assert model.flops_per_token(16) == 3 * 56_448
    assert model.flops_per_token() == 3 * 56_448  # block_size is 16


def test_save_and_load_round_trip(tmp_path):
    for pos in ENCODINGS:
        model = tiny(pos_encoding=pos, norm="rmsnorm")
        model.save_pretrained(tmp_path / pos)
        loaded = GPT.from_pretrained(tmp_path / pos)
        assert loaded.config == model.config
        idx = torch.randint(0, 50, (2, 9))
        assert torch.equal(model(idx)[0], loaded.eval()(idx)[0])
        assert loaded.lm_head.weight is loaded.transformer.wte.weight
        assert sorted(p.name for p in (tmp_path / pos).iterdir()) == ["config.json", "model.safetensors"]


def header(data: bytes) -> dict:
    size = int.from_bytes(data[:8], "little")
    return json.loads(data[8:8 + size])


def test_the_same_weights_give_the_same_file_bytes(monkeypatch):
    """safetensors writes its metadata from a hash map, in an order that changes from
    process to process; here it is made to write the reverse order every time, and the
    file still has its keys sorted, and so the same bytes as before."""
    import safetensors.torch

    model = tiny()
    before = model.pretrained_files()["model.safetensors"]
    metadata = header(before)["__metadata__"]
    assert list(metadata) == sorted(metadata) == ["format", "transformer.wte.weight"]
    real_save = safetensors.torch.save

    def reversed_save(tensors, metadata=None):
        data = real_save(tensors, metadata=metadata)
        size = int.from_bytes(data[:8], "little")
        h = header(data)
        h["__metadata__"] = dict(reversed(sorted(h["__metadata__"].items())))
        text = json.dumps(h, separators=(",", ":")).encode()
        return data[:8] + text.ljust(size) + data[8 + size:]

    monkeypatch.setattr(safetensors.torch, "save", reversed_save)
    assert list(header(reversed_save({"x": torch.zeros(1)}, metadata))["__metadata__"]) != sorted(metadata)
    after = model.pretrained_files()["model.safetensors"]
    assert after == before
    assert safetensors.torch.load(after).keys() == safetensors.torch.load(before).keys()


def test_load_errors_are_clear(tmp_path):
    tiny().save_pretrained(tmp_path)
    weights = (tmp_path / "model.safetensors").read_bytes()
    (tmp_path / "model.safetensors").write_bytes(weights[: len(weights) // 2])
    with pytest.raises(ValueError, match="not a valid safetensors"):
        GPT.from_pretrained(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"\x80\x04not safetensors at all")
    with pytest.raises(ValueError, match="not a valid safetensors"):
        GPT.from_pretrained(tmp_path)
    from safetensors.torch import load_file, save_file

    (tmp_path / "model.safetensors").write_bytes(weights)
    tensors = load_file(tmp_path / "model.safetensors")
    del tensors["transformer.ln_f.bias"]
    save_file(tensors, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match='does not match .*Missing key.*"transformer.ln_f.bias"'):
        GPT.from_pretrained(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(weights)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "n_embd": 64}))
    with pytest.raises(ValueError, match="does not match"):
        GPT.from_pretrained(tmp_path)
    del config["n_layer"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="missing config field.*n_layer"):
        GPT.from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        GPT.from_pretrained(tmp_path)
    (tmp_path / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match="config.json"):
        GPT.from_pretrained(tmp_path)


def test_save_pretrained_keeps_the_old_file_if_writing_fails(tmp_path, monkeypatch):
    import errno
    import os

    old, new = tiny(seed=0), tiny(seed=1)
    old.save_pretrained(tmp_path)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}

    def full_disk(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full_disk)
    with pytest.raises(OSError, match="No space left"):
        new.save_pretrained(tmp_path)
    monkeypatch.undo()
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before  # no .tmp left either
    torch.testing.assert_close(GPT.from_pretrained(tmp_path).lm_head.weight, old.lm_head.weight)


def test_save_pretrained_survives_a_kill_while_writing_the_weights(tmp_path):
    """A child process saves new weights over old ones and is SIGKILLed inside the
    write of model.safetensors: the old file must still load, unchanged."""
    import subprocess
    import sys

    from conftest import ROOT

    tiny(seed=0).save_pretrained(tmp_path)
    before = (tmp_path / "model.safetensors").read_bytes()
    child = f"""
import os, signal, sys
sys.path.insert(0, {str(ROOT)!r})
import torch
from model import GPT, GPTConfig
real_fsync = os.fsync
def fsync(fd):
    if os.readlink(f"/proc/self/fd/{{fd}}").split("/")[-1].startswith("model.safetensors.tmp"):
        os.kill(os.getpid(), signal.SIGKILL)
    real_fsync(fd)
os.fsync = fsync
torch.manual_seed(1)
GPT(GPTConfig(vocab_size=50, block_size=16, n_layer=2, n_head=2, n_embd=32)).save_pretrained({str(tmp_path)!r})
"""
    result = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=60)
    assert result.returncode == -9, result.stderr
    assert (tmp_path / "model.safetensors").read_bytes() == before
    GPT.from_pretrained(tmp_path)


def test_dropout_is_off_in_eval_mode_everywhere():
    model = tiny(dropout=0.5)  # embeddings, attention weights, residual branches
    reference = tiny(dropout=0.0)
    idx = torch.randint(0, 50, (2, 12))
    with torch.no_grad():
        assert torch.equal(model(idx)[0], model(idx)[0])
        torch.testing.assert_close(model(idx)[0], reference(idx)[0], atol=1e-6, rtol=0)
        model.train()
        assert not torch.allclose(model(idx)[0], model(idx)[0])


@pytest.mark.parametrize("settings, message", [
    (dict(n_embd=30, n_head=4), "n_embd=30 is not divisible by n_head=4"),
    (dict(block_size=0), "block_size=0: must be at least 1"),
    (dict(pos_encoding="alibi"), "pos_encoding='alibi': must be one of sinusoidal, learned, rope"),
    (dict(attn_impl="flash"), "attn_impl='flash': must be one of explicit, sdpa"),
    (dict(norm_position="middle"), "norm_position='middle'"),
    (dict(n_embd=36, n_head=12, pos_encoding="rope"), "even head size"),
    (dict(dropout=1.0), "dropout=1.0"),
    (dict(n_layer=2.5), "n_layer=2.5: must be an integer"),
    (dict(bias="yes"), "bias='yes': must be true or false"),
])
def test_config_validation_messages(settings, message):
    base = dict(vocab_size=50, block_size=16, n_layer=2, n_head=2, n_embd=32)
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        GPTConfig(**{**base, **settings})


def test_config_from_dict_rejects_unknown_fields():
    with pytest.raises(ValueError, match="unknown config field.*n_embed"):
        GPTConfig.from_dict(dict(vocab_size=5, block_size=4, n_layer=1, n_head=1, n_embd=8, n_embed=8))


@pytest.mark.parametrize("impl", ["sdpa", "explicit"])
def test_logits_equal_hugging_face_gpt2(impl):
    transformers = pytest.importorskip("transformers")
    model = tiny(n_layer=3, n_head=4, n_embd=64, block_size=32, vocab_size=97,
                 pos_encoding="learned", activation="gelu_tanh", bias=True, attn_impl=impl)
    hf_config = transformers.GPT2Config(
        vocab_size=97, n_positions=32, n_embd=64, n_layer=3, n_head=4,
        activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
        layer_norm_epsilon=1e-5)
    hf = transformers.GPT2LMHeadModel(hf_config).eval()
    ours = model.state_dict()
    conv1d = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
    mapped = {k: v.t() if k.endswith(conv1d) else v for k, v in ours.items()}
    missing, unexpected = hf.load_state_dict(mapped, strict=False)
    assert not unexpected and all(k.endswith(("attn.bias", "attn.masked_bias")) for k in missing)
    idx = torch.randint(0, 97, (2, 32))
    with torch.no_grad():
        torch.testing.assert_close(model(idx)[0], hf(idx).logits, atol=1e-4, rtol=0)


def test_gradient_checkpointing_recomputes_each_block_and_gives_the_same_gradients(monkeypatch):
    """train.checkpointing (training/recompute.py): each block runs again in the backward, its
    activations not kept (far fewer tensors saved for the backward), and the gradients are
    those of the plain pass, dropout's random masks included."""
    from model.block import Block
    from training.recompute import recompute_in_backward

    forward = Block.forward
    calls = [0]

    def counted(self, *args, **kwargs):
        calls[0] += 1
        return forward(self, *args, **kwargs)

    monkeypatch.setattr(Block, "forward", counted)
    grads, runs, saved = [], [], []
    idx = torch.randint(0, 50, (2, 16), generator=torch.Generator().manual_seed(1))
    for checkpointing in (False, True):
        model = tiny(dropout=0.1).train()
        if checkpointing:
            recompute_in_backward(model)
        calls[0], kept = 0, [0]
        torch.manual_seed(2)
        with torch.autograd.graph.saved_tensors_hooks(lambda t: (kept.__setitem__(0, kept[0] + 1), t)[1], lambda t: t):
            loss = model(idx, idx)[1]
        loss.backward()
        grads.append({name: p.grad for name, p in model.named_parameters()})
        runs.append(calls[0])
        saved.append(kept[0])
    assert runs == [model.config.n_layer, 2 * model.config.n_layer]
    assert saved[1] < saved[0] / 2
    for name, grad in grads[0].items():
        torch.testing.assert_close(grads[1][name], grad, atol=1e-6, rtol=0)
    calls[0] = 0
    with torch.no_grad():  # (nothing is recomputed where nothing is learnt)
        model(idx)
    assert calls[0] == model.config.n_layer
