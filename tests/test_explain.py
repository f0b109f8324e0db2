"""The --explain shape trace and the attention maps (TensorBoard and PNG)."""

import json
import re
import struct
import zlib

import pytest
import torch

import explore
import generate
import train
from conftest import ROOT
from model import GPT, GPTConfig
from inspection.attention_maps import attention_maps, heatmap_grid, png_bytes
from inspection.shapes import parameter_groups, report, symbolic_sizes, trace

STEPS = ["token embedding", "Q, K, V projections", "split into heads", "1. similarity Q Kᵀ",
         "2. scale by 1/√d_k", "3. causal mask", "4. softmax", "dropout", "5. weighted sum", "merge heads",
         "output projection W_O", "residual connection: x + attention", "feed-forward network, layer 1", "GELU",
         "feed-forward network, layer 2", "residual connection: x + feed-forward network", "blocks 1 … 2", "LM head",
         "loss"]


def evaluate_symbolic(symbolic: str, sizes: dict[str, int]) -> tuple[int, ...]:
    """'[B, H, T, T]' -> (32, 4, 128, 128) for the given sizes."""
    names = [s.strip() for s in symbolic.strip("[]").split(",") if s.strip()]
    return tuple(int(n) if n.isdigit() else sizes[n] for n in names)


def small_model(**overrides) -> GPT:
    """A 3-layer model to trace (the `micro` fixture is a training run's overrides)."""
    torch.manual_seed(0)
    return GPT(GPTConfig(**{"vocab_size": 37, "block_size": 16, "n_layer": 3, "n_head": 2, "n_embd": 24,
                            **overrides}))


@pytest.mark.parametrize("norm_position", ["pre", "post"])
@pytest.mark.parametrize("pos_encoding", ["sinusoidal", "learned", "rope"])
def test_trace_shapes_match_the_config(pos_encoding, norm_position):
    model = small_model(pos_encoding=pos_encoding, norm_position=norm_position, dropout=0.1, attn_impl="sdpa")
    idx = torch.randint(0, 37, (5, 11))
    rows = trace(model, idx, idx)
    sizes = symbolic_sizes(model, idx)
    for row in rows:
        assert row.shape == evaluate_symbolic(row.symbolic, sizes), row
    steps = [row.step for row in rows]
    position = [i for i, s in enumerate(steps) if s.startswith("token embedding")]
    for wanted in STEPS:  # every step, in this order
        found = [i for i, s in enumerate(steps) if wanted in s and i >= position[-1]]
        assert found, f"{wanted} missing from {steps}"
        position.append(found[0])
    assert ("rotate q and k (rope)" in steps) == (pos_encoding == "rope")
    assert ("embedding + position" in steps) == (pos_encoding != "rope")
    norms = [s for s in steps if s.startswith("LayerNorm")]
    assert norms == (["LayerNorm (before attention)", "LayerNorm (before feed-forward)"] if norm_position == "pre"
                     else ["LayerNorm (after attention + residual)", "LayerNorm (after feed-forward + residual)"])
    assert any(s.startswith("final") for s in steps) == (norm_position == "pre")
    # the symbolic shapes are not trivially equal: T, C and d_k differ here
    assert dict(zip(steps, (r.shape for r in rows)))["1. similarity Q Kᵀ"] == (5, 2, 11, 11)
    assert [b.attn.explicit for b in model.transformer.h] == [False] * 3  # the model is left as it was
    rms = trace(small_model(norm="rmsnorm"), idx, idx)
    assert [r.step for r in rms if "RMSNorm" in r.step] == ["RMSNorm (before attention)",
                                                           "RMSNorm (before feed-forward)", "final RMSNorm (ln_f)"]
    assert parameter_groups(model)[-1] == ("total", sum(n for _, n in parameter_groups(model)[:-1]))


def test_explain_prints_the_table_and_trains_nothing(tmp_path, micro, capsys):
    assert train.main(["--config", str(ROOT / "configs" / "tiny.yaml"), *micro("model.pos_encoding=rope"),
                       "--explain"]) == 0
    assert not (tmp_path / "run").exists()
    text = capsys.readouterr().out
    assert "B=8, T=32, C=32, H=2, d_k=16" in text
    assert re.search(r"\n1\. similarity Q Kᵀ +\[8, 2, 32, 32\] +\[B, H, T, T\] ", text)
    assert "\n2. scale by 1/√d_k = 1/√16 = 0.250  " in text
    assert "\nFLOPs per token (context 32): 0.06 M forward, 0.18 M for a training step (3 × forward)\n" in text
    assert ("\nKV cache: 2 × 2 layers × 32 = 128 values per token = 0.5 KiB in float32; 0.02 MiB per sequence at "
            "block_size 32\n") in text
    assert re.search(r"Kept for the backward pass, measured \(CPU, float32, one batch\): sdpa path [\d.]+ MiB, of which "
                     r"\[B, H, T, T\] weights 0\.0 MiB; explicit path [\d.]+ MiB, of which \[B, H, T, T\] weights "
                     r"0\.2 MiB \(2 layers; a \[B, H, T, T\] tensor holds B·H·T² = 16,384 values\)", text), text
    before, after = map(float, re.search(r"std (0\.\d+) → (0\.\d+): no growth with d_k", text).groups())
    assert after == pytest.approx(before / 4, abs=0.001)  # 1/√16 of the unscaled spread
    assert " 7,936 future keys get −inf" in text and "row sums 1.000000 … 1.000000" in text  # 8·2·32·31/2
    # a table: every row's shape and symbolic shape start in their header's column, after two spaces
    table = text.split("\n\n")[1].splitlines()
    columns = [table[0].index("shape"), table[0].index("symbolic")]
    assert table[0].startswith("step ") and table[1].startswith("-" * (columns[0] - 2) + "  -")
    for line in table[2:]:
        assert all(line[c] == "[" and line[c - 2:c] == "  " for c in columns), line


@pytest.mark.parametrize("settings", [{"n_kv_head": 1, "mlp": "swiglu", "tie_embeddings": False, "norm": "rmsnorm"},
                                      {"n_kv_head": 2, "ffn_hidden": 40}])
def test_the_trace_follows_the_modern_block(settings):
    model = small_model(pos_encoding="rope", n_head=4, n_embd=32, **settings)
    idx = torch.randint(0, 37, (3, 9))
    rows = {r.step: r for r in trace(model, idx, idx)}
    kv_values = 2 * 3 * model.config.n_kv_head * 8  # a key and a value of H_kv·d_k numbers in each of 3 layers
    assert f"KV cache: 2 × 3 layers × {kv_values // 6} = {kv_values} values per token" in report(model, idx, idx, torch.float32)
    sizes = symbolic_sizes(model, idx)
    assert all(r.shape == evaluate_symbolic(r.symbolic, sizes) for r in rows.values())
    kv = model.config.n_kv_head
    split = rows["split into heads (k, v: H_kv)"]
    assert split.shape == (3, kv, 9, 8) and f"k, v: {kv}, each shared by {4 // kv} query heads" in split.meaning
    assert rows["Q, K, V projections (c_attn)"].shape == (3, 9, 32 + 2 * kv * 8)
    if settings.get("mlp") == "swiglu":
        assert rows["SiLU(gate) ⊙ up"].shape == (3, 9, 96) and "feed-forward network, the gate (W_gate)" in rows
        assert "LM head" in rows and "LM head (its own matrix)" in dict(parameter_groups(model))
        assert rows["feed-forward network, the gate (W_gate)"].meaning == "widen to F = 96: what SiLU turns into a gate"
    else:
        assert rows["feed-forward network, layer 1 (W_1)"].shape == (3, 9, 40) and "widen to F = 40" in rows[
            "feed-forward network, layer 1 (W_1)"].meaning
        assert "LM head (tied to wte)" in rows and "LM head" not in rows
    assert parameter_groups(model)[-1] == ("total", sum(n for _, n in parameter_groups(model)[:-1]))


def test_the_trace_shows_qk_norm_and_heads_of_their_own_size():
    """Qwen3's attention: heads 12 wide in a stream of 32 (the merged heads 48, not C) and
    QK-norm between the split and the rotation."""
    model = small_model(pos_encoding="rope", n_head=4, n_embd=32, head_dim=12, qk_norm=True, norm="rmsnorm")
    idx = torch.randint(0, 37, (3, 9))
    rows = trace(model, idx, idx)
    sizes = symbolic_sizes(model, idx)
    assert all(r.shape == evaluate_symbolic(r.symbolic, sizes) for r in rows)
    steps = [r.step for r in rows]
    assert steps.index("split into heads") < steps.index("QK-norm (q_norm, k_norm)") < steps.index("rotate q and k (rope)")
    by_step = {r.step: r for r in rows}
    assert by_step["merge heads"].shape == (3, 9, 48) and by_step["merge heads"].symbolic == "[B, T, H·d_k]"
    assert by_step["split into heads"].meaning == "q, k, v each; H × d_k = 4 × 12 = 48 (head_dim), not C"
    assert "H·d_k" not in report(model, idx, idx, torch.float32).splitlines()[0]


@pytest.mark.parametrize("activation, name", [("gelu", "GELU"), ("gelu_tanh", "GELU TANH")])
def test_the_trace_names_the_activation(activation, name):
    idx = torch.randint(0, 37, (2, 5))
    assert name in [r.step for r in trace(small_model(activation=activation), idx, idx)]


@pytest.mark.parametrize("lang, many, one", [("en", "3 blocks in all", "the only block"), ("zh", "共 3 个块", "唯一的一个块")])
def test_the_trace_says_how_many_blocks_follow_block_0(lang, many, one):
    idx = torch.randint(0, 37, (2, 5))
    assert trace(small_model(), idx, idx, lang)[-4].meaning == many
    assert trace(small_model(n_layer=1), idx, idx, lang)[-4].meaning == one


@pytest.mark.parametrize("impl", ["sdpa", "explicit"])
def test_the_report_lines_up_at_a_size_where_the_columns_differ(impl):
    """At B=16, T=128, C=128 the shapes ([16, 4, 128, 128]) are wider than the symbolic
    shapes: each column keeps its own width. Parameter lines are 63 columns; the memory
    figures are MiB (2²⁰ bytes) and a path keeps at least its attention weights."""
    from inspection.shapes import explain_words

    model = small_model(block_size=128, n_layer=2, n_head=4, n_embd=128, attn_impl=impl)
    idx = torch.randint(0, 37, (16, 128))
    text = report(model, idx, idx, torch.float32)
    assert "C=128, H=4, d_k=32" in text.splitlines()[0] and "3C=" not in text and "QKV=" not in text
    table = text.split("\n\n")[1].splitlines()
    columns = [table[0].index("shape"), table[0].index("symbolic"), table[0].index("meaning")]
    for line in table[2:]:
        assert [line[c - 2:c + 1] for c in columns[:2]] == ["  ["] * 2 and line[columns[2] - 2:columns[2]] == "  ", line
    parameters = text.split("\n\n")[2].splitlines()[1:]
    assert parameters and all(len(line) == 63 and line[50] == " " for line in parameters), parameters
    kept = re.findall(r"(\w+) path ([\d.]+) MiB, of which \[B, H, T, T\] weights ([\d.]+) MiB", text)
    assert {name for name, _, _ in kept} == {"sdpa", "explicit"} if impl == "sdpa" else {"explicit"}
    explicit = [(float(total), float(weights)) for name, total, weights in kept if name == "explicit"][0]
    assert explicit[0] >= explicit[1] >= 2 * 16 * 4 * 128 * 128 * 4 / 2**20  # 2 layers of [16, 4, 128, 128] floats
    assert (explain_words("en")["sdpa"] in text) == (impl == "sdpa")


@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_memory_kept_for_the_backward_pass_is_measured(dropout):
    """The explicit path keeps the attention weights of every layer ([B, H, T, T], at least
    one per layer); the fused kernel on the CPU keeps none (without dropout; with it,
    PyTorch takes its math path)."""
    from inspection.shapes import saved_for_backward

    idx = torch.randint(0, 37, (4, 16))
    B, T, L, H = 4, 16, 3, 2
    explicit_total, explicit_weights = saved_for_backward(small_model(attn_impl="explicit", dropout=dropout), idx, idx,
                                                          torch.float32)
    sdpa_total, sdpa_weights = saved_for_backward(small_model(attn_impl="sdpa", dropout=dropout), idx, idx, torch.float32)
    assert explicit_weights >= L * B * H * T * T * 4
    assert (sdpa_weights == 0) == (dropout == 0.0) and sdpa_total < explicit_total
    assert explicit_total > explicit_weights > 0


def test_attention_maps_are_causal_distributions_for_either_impl():
    for impl in ("explicit", "sdpa"):
        model = small_model(attn_impl=impl)
        maps = attention_maps(model, torch.randint(0, 37, (1, 9)))
        assert maps.shape == (3, 2, 9, 9)
        torch.testing.assert_close(maps.sum(-1), torch.ones(3, 2, 9))
        assert (maps.triu(diagonal=1) == 0).all()
        assert all(b.attn.explicit == (impl == "explicit") for b in model.transformer.h)


def read_png(data: bytes) -> tuple[int, int, bytes]:
    """A minimal PNG reader, independent of the writer: checks every chunk's CRC."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, chunks = 8, {}
    while pos < len(data):
        (length,), kind = struct.unpack(">I", data[pos:pos + 4]), data[pos + 4:pos + 8]
        body = data[pos + 8:pos + 8 + length]
        assert struct.unpack(">I", data[pos + 8 + length:pos + 12 + length])[0] == zlib.crc32(kind + body)
        chunks[kind] = chunks.get(kind, b"") + body
        pos += 12 + length
    # PNG's rules for this image kind: 8-bit RGB, compression 0, filter method 0, no interlace;
    # an empty IEND
    width, height, depth, colour, compression, filtering, interlace = struct.unpack(">IIBBBBB", chunks[b"IHDR"])
    assert (depth, colour, compression, filtering, interlace) == (8, 2, 0, 0, 0) and chunks[b"IEND"] == b""
    pixels = zlib.decompress(chunks[b"IDAT"])
    assert len(pixels) == height * (1 + 3 * width)
    return width, height, pixels


def test_png_round_trip():
    maps = torch.tensor([[[[1.0, 0.0], [0.5, 0.5]]]])  # one 2 × 2 map
    image = heatmap_grid(maps, gap=0)
    assert image.shape == (96, 96, 3)  # scaled up to ~96 pixels
    width, height, pixels = read_png(png_bytes(image))
    assert (width, height) == (96, 96)
    first_row = pixels[1:1 + 3 * width]
    assert first_row[:3] == bytes([253, 231, 37]) and first_row[-3:] == bytes([68, 1, 84])  # weight 1, weight 0


def test_generate_show_attention_writes_a_png_and_explore_reads_a_sample(tmp_path, capsys, monkeypatch):
    from data.tokenizer import train_tokenizer

    text = "ROMEO:\nBut soft, what light through yonder window breaks?\n"
    tokenizer = train_tokenizer("char", [text], 0)
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=tokenizer.get_vocab_size(), block_size=80, n_layer=2, n_head=3, n_embd=24))
    model.save_pretrained(tmp_path)
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    path = tmp_path / "maps.png"
    assert generate.main(["--checkpoint", str(tmp_path), "--prompt", "ROMEO:", "--max-new-tokens", "4",
                          "--seed", "0", "--show-attention", str(path)]) == 0
    width, height, _ = read_png(path.read_bytes())
    cell = 10 * 10  # 10 tokens, each scaled up 10× to reach 96 pixels
    assert (width, height) == (3 * (cell + 2) + 2, 2 * (cell + 2) + 2)  # 3 heads across, 2 layers down
    assert capsys.readouterr().err.endswith(
        f"wrote {path}: attention of 10 tokens, 2 layers (rows) × 3 heads (columns); "
        "row i = query token i, column j = key token j\n")
    # the explorer's page of a sample is explore.py's: --prompt-file takes the text generate.py wrote
    monkeypatch.delenv("LC_ALL", raising=False)
    monkeypatch.delenv("LC_MESSAGES", raising=False)
    monkeypatch.setenv("LANG", "zh_CN.UTF-8")
    sample, page = tmp_path / "sample.txt", tmp_path / "explorer.html"
    sample.write_text((text * 2)[:70], encoding="utf-8")  # 70 tokens: the page shows the last 64
    assert explore.main(["--checkpoint", str(tmp_path), "--prompt-file", str(sample), "--out", str(page)]) == 0
    html = page.read_text(encoding="utf-8")
    data = json.loads(re.search(r'id="explorer-data">(.*?)</script>', html).group(1))
    settings = json.loads(re.search(r'id="explorer-settings">(.*?)</script>', html).group(1))
    assert len(data["tokens"]) == 64 and data["truncated"] == 6 and settings["lang"] == "zh"
    assert "".join(t["text"] for t in data["tokens"]) == (text * 2)[6:70]
    assert len(data["layers"]) == 2 and len(data["layers"][0]["heads"]) == 3
    assert explore.main(["--checkpoint", str(tmp_path), "--prompt-file", str(tmp_path / "none.txt")]) == 2
    assert explore.main(["--checkpoint", str(tmp_path), "--prompt", "A", "--prompt-file", str(sample)]) == 2


def test_a_rewritten_attention_step_keeps_every_row(monkeypatch):
    """The trace finds steps by where tensors are made, not by which operations made them:
    the attention function written another way (scale by a product, mask with where)
    still gives every row."""
    import math

    import model.attention

    def rewritten(query, key, value, mask=None, dropout_p=0.0):
        scores = torch.einsum("...td,...sd->...ts", query, key) * (1 / math.sqrt(query.size(-1)))
        if mask is not None:
            scores = torch.where(mask.bool(), scores, torch.tensor(float("-inf")))
        weights = torch.nn.functional.dropout(scores.softmax(-1), p=dropout_p)
        return torch.einsum("...ts,...sd->...td", weights, value), weights

    model_ = small_model(pos_encoding="rope", dropout=0.1)
    idx = torch.randint(0, 37, (2, 9))
    expected = [(r.step, r.shape) for r in trace(model_, idx, idx)]
    monkeypatch.setattr(model.attention, "scaled_dot_product_attention", rewritten)
    assert [(r.step, r.shape) for r in trace(model_, idx, idx)] == expected
    assert any("2. scale" in step for step, _ in expected) and len(expected) == 24


def test_explain_in_chinese(micro, monkeypatch, capsys):
    def explain(*extra: str) -> str:
        assert train.main(["--config", str(ROOT / "configs" / "tiny.yaml"), *micro(), "--explain", *extra]) == 0
        return capsys.readouterr().out

    by_flag = explain("--lang", "zh")
    monkeypatch.setenv("LANG", "zh_CN.UTF-8")
    for name in ("LC_ALL", "LC_MESSAGES"):
        monkeypatch.delenv(name, raising=False)
    by_locale = explain()
    for out in (by_flag, by_locale):
        assert "每对（query, key）一个分数" in out and "one score per" not in out
        assert re.search(r"1\. 相似度 Q Kᵀ\s+\[8, 2, 32, 32\]", out)  # the same trace, every step in Chinese
        assert not re.search(r"^(split|merge|residual|blocks|feed-forward|LM head|token embedding)", out, re.M)
        assert "残差连接：x + 注意力" in out and "前馈网络第 1 层" in out  # the pieces' names: inspection/words.json
        assert "参数：" in out and "KV 缓存：2 × 2 层 × 32 = 每个 token 128 个数" in out
    assert "one score per (query, key) pair" in explain("--lang", "en")


@pytest.mark.parametrize("env, expected", [
    ({"LANG": "zh_CN.UTF-8"}, "zh"), ({"LANG": "zh_TW.UTF-8"}, "zh"), ({"LANG": "en_US.UTF-8"}, "en"), ({}, "en"),
    ({"LC_ALL": "en_GB.UTF-8", "LANG": "zh_CN.UTF-8"}, "en"),  # LC_ALL wins over LANG
    ({"LC_MESSAGES": "zh_CN.UTF-8", "LANG": "en_US.UTF-8"}, "zh"),  # LC_MESSAGES too
    ({"LC_ALL": "", "LANG": "zh_CN.UTF-8"}, "zh"),  # an empty variable is skipped
])
def test_the_default_language_follows_the_locale(monkeypatch, env, expected):
    from cli.program import locale_language

    for name in ("LC_ALL", "LC_MESSAGES", "LANG"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert locale_language() == expected


def test_heatmap_cells_sit_in_their_row_and_column_with_white_gaps():
    maps = torch.tensor([[1.0, 0.0], [0.0, 1.0]])[:, :, None, None].expand(2, 2, 2, 2)  # [rows, cols, T, T]
    image = heatmap_grid(maps, gap=2)  # cells of 96 pixels
    assert image.shape == (2 * 98 + 2, 2 * 98 + 2, 3)
    for r in range(2):
        for c in range(2):
            top, left = 2 + 98 * r, 2 + 98 * c
            colour = [253, 231, 37] if maps[r, c, 0, 0] == 1 else [68, 1, 84]  # weight 1, weight 0
            assert image[top, left].tolist() == image[top + 95, left + 95].tolist() == colour, (r, c)
            assert image[top - 1, left].tolist() == image[top, left - 1].tolist() == [255, 255, 255]


def test_ctrl_c_ends_a_program_with_one_line_and_code_130(capsys):
    from types import SimpleNamespace

    from cli.program import run_main

    def interrupted(args):
        raise KeyboardInterrupt

    assert run_main(lambda argv: SimpleNamespace(debug=False), interrupted, [], {}) == 130
    assert capsys.readouterr().err == "\ninterrupted\n"
