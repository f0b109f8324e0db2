"""The GGUF export (export.py --out FILE.gguf, interop/gguf.py): what llama.cpp reads.

Without llama.cpp (CI): the file's tensors and keys read back with the gguf library, the
llama rows checked against llama.cpp's rotation written out here, and the vocabulary and
merges replayed by GPT-2's BPE algorithm (tokenizers') against our tokenizer. With
llama.cpp's Python binding installed (pip install llama-cpp-python): its logits, token by
token through its KV cache, equal ours, and it tokenizes as we do.
"""

import math

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

import export
import train
from runs.folder import RunDir
from interop.gguf import write_gguf
from conftest import ROOT
from data.tokenizer import train_bpe, train_char
from model import GPT, GPTConfig
from model.positional import RotaryEmbedding, apply_rotary

gguf = pytest.importorskip("gguf")

TEXT = "ROMEO:\nWhat light through yonder window breaks? ’Tis the east — é!"
KINDS = {  # the four architectures, with what each holds that the others do not
    "gpt2": dict(pos_encoding="learned", n_kv_head=2),
    "gptneox": dict(pos_encoding="rope", bias=False, rope_base=500.0),
    "llama": dict(pos_encoding="rope", norm="rmsnorm", mlp="swiglu", bias=False, n_kv_head=2,
                  tie_embeddings=False, norm_eps=1e-6),
    "qwen3": dict(pos_encoding="rope", norm="rmsnorm", mlp="swiglu", bias=False, n_kv_head=2, qk_norm=True,
                  head_dim=12, norm_eps=1e-6, rope_base=1e6),
}


def tokenizer_of(kind: str) -> Tokenizer:
    pieces = [TEXT * 3, "But soft, what light?\n"]
    return train_char(pieces) if kind == "char" else train_bpe(pieces, 300)


def gguf_of(tmp_path, arch: str, tokenizer_kind: str = "bpe"):
    """A random model of arch (its biases and norms moved off their initial values, so a
    missing or misplaced one shows) written as GGUF; (model, tokenizer, reader)."""
    tokenizer = tokenizer_of(tokenizer_kind)
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=tokenizer.get_vocab_size(), block_size=64, n_layer=2, n_head=4, n_embd=32,
                       **KINDS[arch])
    model = GPT(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.1)
    path = tmp_path / f"{arch}.gguf"
    assert write_gguf(path, config, model.state_dict(), tokenizer, "test") == arch
    return model, tokenizer, gguf.GGUFReader(path)


def tensors(reader) -> dict[str, torch.Tensor]:
    """GGUF's tensors in PyTorch's [out, in] order (GGUF lists dimensions innermost first)."""
    return {t.name: torch.from_numpy(t.data.copy()).reshape(tuple(reversed(t.shape.tolist()))) for t in reader.tensors}


def field(reader, key: str):
    return reader.fields[key].contents()


@pytest.mark.parametrize("arch", KINDS)
def test_every_parameter_is_in_the_file_under_llama_cpps_name(tmp_path, arch):
    model, _, reader = gguf_of(tmp_path, arch)
    c, got = model.config, tensors(reader)
    sd = model.state_dict()
    assert torch.equal(got["token_embd.weight"], sd["transformer.wte.weight"])
    assert torch.equal(got["output_norm.weight"], sd["transformer.ln_f.weight"])
    assert torch.equal(got["blk.1.attn_output.weight"], sd["transformer.h.1.attn.c_proj.weight"])
    assert torch.equal(got["blk.1.ffn_down.weight"], sd["transformer.h.1.mlp.c_proj.weight"])
    assert torch.equal(got["blk.0.ffn_norm.weight"], sd["transformer.h.0.ln_2.weight"])
    kv = c.n_kv_head * c.head_size
    if arch in ("llama", "qwen3"):  # q, k and v apart
        assert ("output.weight" in got) == (arch == "llama")  # llama's untied; qwen3's tied: token_embd again
        if arch == "llama":
            assert torch.equal(got["output.weight"], sd["lm_head.weight"])
        assert torch.equal(got["blk.0.attn_v.weight"], sd["transformer.h.0.attn.c_attn.weight"][-kv:])
        assert torch.equal(got["blk.0.ffn_gate.weight"], sd["transformer.h.0.mlp.c_gate.weight"])
        assert not any(name.endswith(".bias") for name in got)
    else:  # fused q, k, v rows as ours; every bias, zeros where the model has none
        assert torch.equal(got["blk.0.attn_qkv.weight"], sd["transformer.h.0.attn.c_attn.weight"])
        assert got["blk.0.attn_qkv.bias"].shape == (c.n_embd + 2 * kv,)
        assert ("output.weight" in got) == (arch == "gptneox")  # gptneox requires it; tied: wte again
    if arch == "gpt2":
        assert torch.equal(got["position_embd.weight"], sd["transformer.wpe.weight"])
        assert torch.equal(got["blk.0.attn_qkv.bias"], sd["transformer.h.0.attn.c_attn.bias"])
    assert field(reader, "general.architecture") == arch
    assert field(reader, f"{arch}.context_length") == 64 and field(reader, f"{arch}.block_count") == 2
    assert field(reader, f"{arch}.attention.head_count_kv") == c.n_kv_head
    assert field(reader, f"{arch}.feed_forward_length") == c.ffn_hidden
    eps = f"{arch}.attention.layer_norm_{'rms_' if arch in ('llama', 'qwen3') else ''}epsilon"
    assert math.isclose(field(reader, eps), c.norm_eps, rel_tol=1e-6)
    if arch == "gptneox":
        assert field(reader, "gptneox.use_parallel_residual") is False
        assert field(reader, "gptneox.rope.freq_base") == 500.0
        assert field(reader, "gptneox.rope.dimension_count") == c.head_size
    if arch == "qwen3":  # QK-norm's gains, heads of 12 in a stream of 32, q's rows as they are (rotate_half)
        assert torch.equal(got["blk.1.attn_k_norm.weight"], sd["transformer.h.1.attn.k_norm.weight"])
        assert torch.equal(got["blk.0.attn_q.weight"], sd["transformer.h.0.attn.c_attn.weight"][:4 * 12])
        assert field(reader, "qwen3.attention.key_length") == field(reader, "qwen3.attention.value_length") == 12
        assert field(reader, "qwen3.rope.freq_base") == 1e6


def llama_cpp_rotation(x: torch.Tensor, positions: torch.Tensor, base: float) -> torch.Tensor:
    """llama.cpp's rope for its llama architecture (GGML's "normal" mode): dimensions 2i and
    2i+1 of each head rotate together by position · base^(-2i/d). x: [T, H, d]."""
    d = x.size(-1)
    angle = positions[:, None, None] * base ** (-torch.arange(0, d, 2) / d)  # [T, 1, d/2]
    even, odd = x[..., 0::2], x[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = even * angle.cos() - odd * angle.sin()
    out[..., 1::2] = even * angle.sin() + odd * angle.cos()
    return out


def test_the_llama_rows_give_our_attention_scores_under_llama_cpps_rotation(tmp_path):
    model, _, reader = gguf_of(tmp_path, "llama")
    c, got = model.config, tensors(reader)
    x = torch.randn(10, c.n_embd)  # 10 positions of one layer's normed input
    positions = torch.arange(10.0)
    q, k, _ = (x @ model.state_dict()["transformer.h.0.attn.c_attn.weight"].T).split(
        [c.n_embd, c.n_kv_head * c.head_size, c.n_kv_head * c.head_size], -1)
    cos, sin = RotaryEmbedding(c.head_size, c.rope_base)(positions[None])  # [1, 1, T, d]
    ours = [apply_rotary(t.view(10, -1, c.head_size).transpose(0, 1), cos, sin)[0] for t in (q, k)]  # [H, T, d]
    theirs = [llama_cpp_rotation((x @ got[f"blk.0.attn_{p}.weight"].T).view(10, -1, c.head_size), positions,
                                 c.rope_base).transpose(0, 1) for p in "qk"]
    group = c.n_head // c.n_kv_head
    scores = lambda q, k: q @ k.repeat_interleave(group, 0).transpose(-2, -1)  # [H, T, T]
    torch.testing.assert_close(scores(*theirs), scores(*ours), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kind", ["bpe", "char"])
def test_the_vocabulary_and_merges_tokenize_as_ours_by_gpt2s_algorithm(tmp_path, kind):
    """llama.cpp's "gpt2" tokenizer is GPT-2's: its regex, its byte letters, its merges.
    tokenizers' BPE, built from the file's tokens and merges alone, must encode as ours,
    characters of two and three UTF-8 bytes (é, ’, —) included."""
    _, tokenizer, reader = gguf_of(tmp_path, "gpt2", kind)
    assert field(reader, "tokenizer.ggml.model") == "gpt2" and field(reader, "tokenizer.ggml.pre") == "gpt-2"
    tokens, merges = field(reader, "tokenizer.ggml.tokens"), field(reader, "tokenizer.ggml.merges")
    vocab = {t: i for i, t in enumerate(tokens)}
    for part in (p for m in merges for p in m.split(" ")):  # the bytes of a character: symbols that are
        vocab.setdefault(part, len(vocab))  # no token (llama.cpp merges them all the same; tokenizers needs ids)
    replay = Tokenizer(models.BPE(vocab, [tuple(m.split(" ")) for m in merges]))
    replay.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    replay.decoder = decoders.ByteLevel()
    for text in (TEXT, "soft, what light?\n\n", "  east  "):
        assert replay.encode(text).ids == tokenizer.encode(text).ids
        assert replay.decode(replay.encode(text).ids) == text
    types = field(reader, "tokenizer.ggml.token_type")
    if kind == "char":
        assert types[tokenizer.token_to_id("<unk>")] == gguf.TokenType.UNKNOWN
        assert sum(t == gguf.TokenType.UNKNOWN for t in types) == 1  # every other character is a token
        assert field(reader, "tokenizer.ggml.unknown_token_id") == tokenizer.token_to_id("<unk>")
    else:
        eot = tokenizer.token_to_id("<|endoftext|>")
        assert types[eot] == gguf.TokenType.CONTROL and field(reader, "tokenizer.ggml.eos_token_id") == eot
    assert field(reader, "tokenizer.ggml.add_bos_token") is False


def test_export_writes_a_gguf_and_refuses_what_it_cannot_write(tmp_path, micro, capsys):
    assert train.main(["--config", str(ROOT / "configs" / "tiny.yaml"), *micro("train.max_iters=2")]) == 0
    run, out = tmp_path / "run", tmp_path / "tiny.gguf"
    assert export.main(["--checkpoint", str(run), "--out", str(out)]) == 0
    assert "llama.cpp's gptneox architecture" in capsys.readouterr().out
    before = out.read_bytes()
    assert export.main(["--checkpoint", str(run), "--out", str(out)]) == 2  # never overwritten
    assert "already exists" in capsys.readouterr().err and out.read_bytes() == before
    assert export.main(["--checkpoint", str(run), "--out", str(tmp_path / "no" / "x.gguf")]) == 2
    assert "does not exist" in capsys.readouterr().err
    model, tokenizer = RunDir(run).load_model()
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()  # as a brought-in (SentencePiece-style) tokenizer
    with pytest.raises(ValueError, match="convert_hf_to_gguf.py"):
        write_gguf(tmp_path / "other.gguf", model.config, model.state_dict(), tokenizer, "x")
    assert not list(tmp_path.glob("other.gguf*"))  # nothing half-written left behind


@pytest.mark.parametrize("gguf_type", ["f16", "q8_0"])
def test_export_writes_float16_and_q8_0_matrices_and_float32_vectors(tmp_path, micro, capsys, gguf_type):
    """export.py --gguf-type: every matrix in the chosen type (Q8_0: blocks of 32 along a
    row; a row of another length in float16), every norm and bias in float32, and the
    embedding read back within the type's rounding of ours."""
    from gguf.quants import dequantize

    assert train.main(["--config", str(ROOT / "configs" / "tiny.yaml"), *micro("train.max_iters=2")]) == 0
    out = tmp_path / f"tiny.{gguf_type}.gguf"
    assert export.main(["--checkpoint", str(tmp_path / "run"), "--out", str(out), "--gguf-type", gguf_type]) == 0
    assert {"f16": "float16 matrices", "q8_0": "Q8_0 matrices"}[gguf_type] in capsys.readouterr().out
    reader = gguf.GGUFReader(out)
    assert field(reader, "general.file_type") == {"f16": 1, "q8_0": 7}[gguf_type]
    model, _ = RunDir(tmp_path / "run").load_model()
    wanted = {"f16": gguf.GGMLQuantizationType.F16, "q8_0": gguf.GGMLQuantizationType.Q8_0}[gguf_type]
    for t in reader.tensors:
        shape = tuple(reversed(t.shape.tolist()))
        if len(shape) == 1:
            assert t.tensor_type == gguf.GGMLQuantizationType.F32, t.name
        else:
            expected = wanted if gguf_type == "f16" or shape[-1] % 32 == 0 else gguf.GGMLQuantizationType.F16
            assert t.tensor_type == expected, t.name
    back = {t.name: torch.from_numpy(dequantize(t.data, t.tensor_type).reshape(tuple(reversed(t.shape.tolist()))).copy())
            for t in reader.tensors}
    wte = model.state_dict()["transformer.wte.weight"]
    step = wte.abs().max() / 127 if gguf_type == "q8_0" else wte.abs().max() * 2 ** -10
    assert (back["token_embd.weight"] - wte).abs().max() <= step
    assert model.config.n_embd % 32 == 0 and reader.tensors[0].tensor_type in (wanted, gguf.GGMLQuantizationType.F32)
    with pytest.raises(SystemExit):
        export.parse_args(["--checkpoint", "x", "--out", "y.gguf", "--gguf-type", "q4_k"])
    assert export.main(["--checkpoint", str(tmp_path / "run"), "--out", str(tmp_path / "hf"), "--gguf-type", "f16"]) == 2
    assert "--gguf-type f16 is for a FILE.gguf" in capsys.readouterr().err


def test_a_configuration_gguf_cannot_hold_is_refused_in_one_line(tmp_path, micro, capsys):
    assert train.main(["--config", str(ROOT / "configs" / "tiny.yaml"),
                       *micro("train.max_iters=2", "model.pos_encoding=sinusoidal")]) == 0
    assert export.main(["--checkpoint", str(tmp_path / "run"), "--out", str(tmp_path / "s.gguf")]) == 2
    err = capsys.readouterr().err
    assert "pos_encoding=sinusoidal" in err and err.count("\n") == 1 and not (tmp_path / "s.gguf").exists()


def test_without_the_gguf_package_the_error_says_what_to_install(tmp_path, micro, capsys, monkeypatch):
    assert train.main(["--config", str(ROOT / "configs" / "tiny.yaml"), *micro("train.max_iters=2")]) == 0
    monkeypatch.setitem(__import__("sys").modules, "gguf", None)  # import gguf now raises ImportError
    assert export.main(["--checkpoint", str(tmp_path / "run"), "--out", str(tmp_path / "t.gguf")]) == 2
    assert "pip install gguf" in capsys.readouterr().err


@pytest.mark.parametrize("arch,tokenizer_kind", [("gpt2", "char"), ("gptneox", "bpe"), ("llama", "bpe"),
                                                  ("llama", "char"), ("qwen3", "bpe")])
def test_llama_cpp_computes_our_logits_token_by_token(tmp_path, arch, tokenizer_kind):
    """The real thing, where llama.cpp's Python binding is installed (it builds llama.cpp
    from source: pip install llama-cpp-python; not in CI, which has no minutes for that)."""
    llama_cpp = pytest.importorskip("llama_cpp")
    model, tokenizer, _ = gguf_of(tmp_path, arch, tokenizer_kind)
    llm = llama_cpp.Llama(str(tmp_path / f"{arch}.gguf"), n_ctx=64, logits_all=True, verbose=False)
    ids = tokenizer.encode(TEXT).ids[:64]
    assert llm.tokenize(TEXT.encode(), add_bos=False, special=False)[:64] == ids
    assert llm.detokenize(ids).decode() == tokenizer.decode(ids)
    for token in ids:  # one at a time: llama.cpp's KV cache at every step
        llm.eval([token])
    with torch.no_grad():
        ours = model(torch.tensor([ids]))[0][0]
    theirs = torch.from_numpy(llm.scores[: len(ids)].copy())
    # llama.cpp's GELU is the tanh approximation (ours: exact erf) and it sums in its own order
    torch.testing.assert_close(theirs, ours, atol={"llama": 1e-4, "qwen3": 2e-4}.get(arch, 2e-3), rtol=0)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
@pytest.mark.parametrize("gguf_type, tolerance", [("f16", 1e-3), ("q8_0", 3e-2)])
def test_llama_cpp_computes_our_logits_from_float16_and_q8_0_and_qwen2(tmp_path, arch, gguf_type, tolerance):
    """Where llama.cpp is installed: its logits from the float16 and Q8_0 files, and from
    llama.cpp's qwen2 architecture (biases on q, k, v alone). Measured on this machine
    (llama-cpp-python 0.3.36, logits of std 0.16): f16 2.9e-4 (llama) and 3.3e-4 (qwen2),
    q8_0 9.0e-3 and 6.7e-3; qwen2 in float32 1.0e-4; qwen3 (QK-norm, heads of 12 in 32; 2026-12-07,
    AMD EPYC, logits of std 0.17) 9.8e-5 in float32, 3.0e-4 in f16, 7.2e-3 in Q8_0."""
    llama_cpp = pytest.importorskip("llama_cpp")
    tokenizer = tokenizer_of("bpe")
    torch.manual_seed(0)
    settings = KINDS["qwen3"] if arch == "qwen3" else {**KINDS["llama"], **({"qkv_bias": True} if arch == "qwen2" else {})}
    config = GPTConfig(vocab_size=tokenizer.get_vocab_size(), block_size=64, n_layer=2, n_head=4, n_embd=64, **settings)
    model = GPT(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.1)
    path = tmp_path / f"{arch}.{gguf_type}.gguf"
    assert write_gguf(path, config, model.state_dict(), tokenizer, "test", gguf_type) == arch
    llm = llama_cpp.Llama(str(path), n_ctx=64, logits_all=True, verbose=False)
    ids = tokenizer.encode(TEXT).ids[:64]
    for token in ids:
        llm.eval([token])
    with torch.no_grad():
        ours = model(torch.tensor([ids]))[0][0]
    torch.testing.assert_close(torch.from_numpy(llm.scores[: len(ids)].copy()), ours, atol=tolerance, rtol=0)

