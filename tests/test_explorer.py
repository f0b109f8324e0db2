"""The attention explorer without a browser: its data are the model's own numbers, the
page needs nothing else, no prompt can break out of it, and bad input is one line."""

import json
import re
from html.parser import HTMLParser

import numpy as np
import pytest
import torch

import explore
import explorer.data
import model.attention
from conftest import ROOT
from data.tokenizer import train_tokenizer
from data.token_text import readable_decode, token_views
from explorer.data import decoded, page_data
from explorer.page import render, strings
from model import GPT, GPTConfig

TEXT = "ROMEO:\nBut soft, what light through yonder window breaks?\n</script><script>alert(1)</script>\n"
HOSTILE = "</script><script>alert(1)</script>"


def make_run(path, text=TEXT, kind="char", vocab_size=300, **config):
    """A run directory with a char (or BPE) tokenizer and random weights, larger than at
    initialisation so that every head attends differently."""
    tokenizer = train_tokenizer(kind, [text], vocab_size)
    torch.manual_seed(0)
    settings = dict(block_size=64, n_layer=2, n_head=2, n_embd=32, pos_encoding="rope") | config
    gpt = GPT(GPTConfig(vocab_size=tokenizer.get_vocab_size(), **settings))
    for p in gpt.parameters():
        p.data.normal_(0, 0.3)
    path.mkdir(parents=True, exist_ok=True)
    gpt.save_pretrained(path)
    tokenizer.save(str(path / "tokenizer.json"))
    return path


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return make_run(tmp_path_factory.mktemp("explorer") / "run")


def embedded(html: str) -> dict:
    match = re.search(r'<script type="application/json" id="explorer-data">(.*?)</script>', html, re.S)
    return json.loads(match.group(1))


def embedded_model(html: str) -> dict | None:
    """What a page carries to run the model itself (explorer.data.page_model), or None."""
    match = re.search(r'<script type="application/json" id="explorer-model">(.*?)</script>', html, re.S)
    return json.loads(match.group(1))


def page_array(a: dict) -> np.ndarray:
    """An array of the page's data: base64 (as explorer/data.py writes it) or its numbers
    as a list (as the page's data.js makes them, read back from the browser)."""
    return np.asarray(a["data"], dtype=np.float32).reshape(a["shape"]) if "data" in a else decoded(a)


def assert_same_page_data(a, b, path="data", skip=(), atol=2e-4, rtol=1e-3, row_rtol=0.0):
    """Two makings of the explorer's data: every array and number within atol + rtol·|b|,
    the rest equal, the keys in skip left out. row_rtol adds that share of the largest |b|
    of each array's row (its last axis): a value that a sum of large terms left small
    carries the rounding of those terms, which float32 makes on each CPU in its own way
    (a residual stream entry of -0.0497 in a row reaching 33 differed by 5.8e-5)."""
    if isinstance(b, dict) and ("base64" in b or "data" in b):
        ours, theirs = page_array(a).astype(np.float64), page_array(b).astype(np.float64)
        assert ours.shape == theirs.shape, path
        finite = np.where(np.isfinite(theirs), np.abs(theirs), 0.0)
        row = finite.max(axis=-1, keepdims=True) if theirs.ndim else finite
        with np.errstate(invalid="ignore"):  # (-inf against -inf: equal)
            off = np.where(ours == theirs, 0.0, np.abs(ours - theirs))
        np.testing.assert_array_less(np.nan_to_num(off, nan=np.inf), atol + rtol * finite + row_rtol * row + 1e-30,
                                     err_msg=path)
    elif isinstance(b, dict):
        assert a.keys() == b.keys(), path
        for key in b.keys() - set(skip):
            assert_same_page_data(a[key], b[key], f"{path}.{key}", skip, atol, rtol, row_rtol)
    elif isinstance(b, list) and b and not isinstance(b[0], str):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same_page_data(x, y, f"{path}[{i}]", skip, atol, rtol, row_rtol)
    elif isinstance(b, float):
        assert a == pytest.approx(b, abs=atol, rel=rtol), path
    else:
        assert a == b, path


def as_tensor(a) -> torch.Tensor:
    return torch.from_numpy(decoded(a).copy())


@pytest.mark.parametrize("pos_encoding", ["rope", "learned", "sinusoidal"])
def test_the_data_are_the_models_own_numbers(tmp_path, pos_encoding):
    """Checked against separate forward passes that hand nothing back: an sdpa pass (each
    layer's heads, concatenated and put through W_O, give its attention output; hooks see
    each block's input and output) and an explicit pass (its five-step weights)."""
    gpt = GPT.from_pretrained(make_run(tmp_path, pos_encoding=pos_encoding, attn_impl="sdpa")).eval()
    tokenizer = train_tokenizer("char", [TEXT], 0)
    ids = tokenizer.encode("ROMEO:\nBut soft, what").ids
    data = page_data(gpt, tokenizer, ids)
    outputs, blocks, weights = [], [], []
    hooks = [b.attn.register_forward_hook(lambda m, a, out: outputs.append(out[0])) for b in gpt.transformer.h]
    hooks += [b.register_forward_hook(lambda m, a, out: blocks.append((a[0][0], out[0]))) for b in gpt.transformer.h]
    with torch.no_grad():
        logits, _ = gpt(torch.tensor([ids]))
    for h in hooks:
        h.remove()
    explicit = GPT(GPTConfig(**{**gpt.config.to_dict(), "attn_impl": "explicit"})).eval()
    explicit.load_state_dict(gpt.state_dict())
    real = model.attention.scaled_dot_product_attention
    with pytest.MonkeyPatch.context() as mp, torch.no_grad():
        mp.setattr(model.attention, "scaled_dot_product_attention",
                   lambda *a, **k: (lambda r: weights.append(r[1][0]) or r)(real(*a, **k)))
        explicit(torch.tensor([ids]))
    T, C = len(ids), gpt.config.n_embd
    for layer, block in enumerate(gpt.transformer.h):
        stored = data["layers"][layer]
        heads = stored["heads"]
        merged = torch.stack([as_tensor(head["output"]) for head in heads]).transpose(0, 1).reshape(T, C)  # [T, H·d_k]
        with torch.no_grad():
            torch.testing.assert_close(block.attn.c_proj(merged), outputs[layer], atol=1e-5, rtol=0)
        torch.testing.assert_close(as_tensor(stored["attn"]), outputs[layer], atol=1e-5, rtol=0)
        torch.testing.assert_close(as_tensor(stored["residual_in"]), blocks[layer][0], atol=1e-5, rtol=0)
        out = stored["residual_out"] or data["layers"][layer + 1]["residual_in"]  # left out but for the last
        torch.testing.assert_close(as_tensor(out), blocks[layer][1], atol=1e-5, rtol=0)
        mid = as_tensor(stored["residual_in"]) + as_tensor(stored["attn"])
        torch.testing.assert_close(mid + as_tensor(stored["mlp"]), as_tensor(out), atol=1e-5, rtol=0)
        for h, head in enumerate(heads):
            w = as_tensor(head["weights"])
            torch.testing.assert_close(w, weights[layer][h], atol=1e-6, rtol=0)
            q, k = as_tensor(head["q"]), as_tensor(head["k"])  # what the page computes steps 1-4 from
            scores = (q @ k.T / gpt.config.head_size ** 0.5).masked_fill(torch.ones(T, T).triu(1).bool(), -torch.inf)
            torch.testing.assert_close(torch.softmax(scores, -1), w, atol=1e-5, rtol=0)
            torch.testing.assert_close(w @ as_tensor(head["v"]), as_tensor(head["output"]), atol=1e-5, rtol=0)
            assert q.shape == (T, gpt.config.head_size)
    last = data["layers"][-1]
    with torch.no_grad():
        torch.testing.assert_close(gpt.lm_head(gpt.transformer.ln_f(as_tensor(last["residual_out"]))), logits[0],
                                   atol=1e-5, rtol=0)
        torch.testing.assert_close(gpt.lm_head(as_tensor(data["ln_f"])), logits[0], atol=1e-5, rtol=0)
    torch.testing.assert_close(as_tensor(data["prediction"]["logits"]), logits[0, -1], atol=1e-5, rtol=1e-6)
    token = as_tensor(data["embedding"]["token"])
    torch.testing.assert_close(token, gpt.transformer.wte.weight[ids].detach(), atol=0, rtol=0)
    start = token if pos_encoding == "rope" else token + as_tensor(data["embedding"]["position"])
    assert (data["embedding"]["position"] is None) == (pos_encoding == "rope")
    torch.testing.assert_close(start, as_tensor(data["layers"][0]["residual_in"]), atol=1e-6, rtol=0)
    lens = torch.softmax(logits[0].float(), -1).topk(5)
    assert last["lens"]["ids"] == lens.indices.tolist()  # the last layer's lens is the model's own prediction
    torch.testing.assert_close(torch.tensor(last["lens"]["probs"]), lens.values, atol=1e-6, rtol=0)
    assert [t["id"] for t in data["tokens"]] == ids and data["version"] == 3 and data["model"] == "trained"
    assert data["config"]["head_size"] == C // gpt.config.n_head


def test_the_largest_hidden_units_and_every_layers_lens(run):
    gpt = GPT.from_pretrained(run).eval()
    tokenizer = train_tokenizer("char", [TEXT], 0)
    ids = tokenizer.encode("But soft, what light").ids
    data = page_data(gpt, tokenizer, ids)
    with torch.no_grad():
        trace = gpt.trace(torch.tensor([ids]))
    for stored, layer in zip(data["layers"], trace.layers):
        hidden = layer.mlp_hidden[0]  # [T, 4C]
        best = hidden.abs().topk(8, dim=-1).indices
        assert stored["mlp_top"]["ids"] == best.tolist() and stored["mlp_top"]["width"] == 4 * gpt.config.n_embd
        torch.testing.assert_close(torch.tensor(stored["mlp_top"]["values"]), hidden.gather(-1, best), atol=1e-6, rtol=0)
        with torch.no_grad():
            lens = torch.softmax(gpt.lm_head(gpt.transformer.ln_f(layer.residual_out[0])), -1).topk(5)
        assert stored["lens"]["ids"] == lens.indices.tolist()
        c_attn = gpt.transformer.h[0 if stored is data["layers"][0] else 1].attn.c_attn
        weight = as_tensor(stored["c_attn"]["weight"])  # W_Q, W_K, W_V for q's sum of products
        assert torch.equal(weight, c_attn.weight.detach()) and torch.equal(as_tensor(stored["c_attn"]["bias"]),
                                                                           c_attn.bias.detach())


def test_projection_weights_over_the_budget_are_left_out(run, monkeypatch):
    """A model whose W_Q, W_K, W_V are too many numbers for the page leaves them out, and
    says so (the page then shows q, k, v without their sums of products)."""
    import explorer.data

    gpt = GPT.from_pretrained(run).eval()
    tokenizer = train_tokenizer("char", [TEXT], 0)
    monkeypatch.setattr(explorer.data, "MAX_WEIGHT_VALUES", 3 * 32 * 32 * 2 - 1)  # one value short
    data = page_data(gpt, tokenizer, tokenizer.encode("But soft").ids)
    assert data["left_out"] == ["c_attn"] and all(layer["c_attn"] is None for layer in data["layers"])
    assert all(layer["heads"][0]["q"] is not None for layer in data["layers"])
    monkeypatch.setattr(explorer.data, "MAX_WEIGHT_VALUES", 3 * 32 * 32 * 2)  # exactly enough
    assert page_data(gpt, tokenizer, tokenizer.encode("But soft").ids)["left_out"] == []


def test_a_large_models_heads_switched_off_keep_their_top_tokens_only(run, monkeypatch):
    import explorer.data

    gpt = GPT.from_pretrained(run).eval()
    ids = train_tokenizer("char", [TEXT], 0).encode("But soft").ids
    monkeypatch.setattr(explorer.data, "MAX_ABLATION_LOGITS", gpt.config.n_layer * gpt.config.n_head * gpt.config.vocab_size - 1)
    heads = [head for layer in explorer.data.ablated(gpt, ids) for head in layer]
    assert all(head["logits"] is None and len(head["ids"]) == 20 for head in heads)


def test_a_head_switched_off_is_the_models_pass_with_that_head_zeroed(run):
    """The ablated distributions against the test's own hook, which zeroes the head's
    d_k slice of W_O's input; the KL divergence from the model's distribution, and the
    head that moves the prediction most."""
    gpt = GPT.from_pretrained(run).eval()
    tokenizer = train_tokenizer("char", [TEXT], 0)
    ids = tokenizer.encode("But soft, what light").ids
    ablation = page_data(gpt, tokenizer, ids)["ablation"]
    d_k = gpt.config.head_size
    with torch.no_grad():
        p = torch.softmax(gpt(torch.tensor([ids]))[0][0, -1], -1)
    for layer in range(gpt.config.n_layer):
        for head in range(gpt.config.n_head):
            def zero(module, args, head=head):
                x = args[0].clone()
                x[..., head * d_k:(head + 1) * d_k] = 0
                return (x,)

            handle = gpt.transformer.h[layer].attn.c_proj.register_forward_pre_hook(zero)
            with torch.no_grad():
                q = torch.softmax(gpt(torch.tensor([ids]))[0][0, -1], -1)
            handle.remove()
            stored = ablation[layer][head]
            assert stored["ids"] == q.topk(20).indices.tolist()
            assert stored["probs"] == pytest.approx(q.topk(20).values.tolist(), abs=1e-6)
            assert stored["kl"] == pytest.approx((p * (p / q).log()).sum().item(), abs=1e-5)
            assert stored["kl"] > 0
            torch.testing.assert_close(torch.softmax(torch.from_numpy(decoded(stored["logits"]).copy()), -1), q,
                                       atol=1e-6, rtol=0)  # the page samples from these


def test_the_model_at_initialisation_is_the_one_training_started_from(tmp_path, micro):
    """explore.py re-creates it from the run's seed (GPT.initialised, as the trainer builds
    it), parameter for parameter; the global random state is left alone."""
    from conftest import make_trainer
    from explorer.data import initial_model

    trainer = make_trainer(micro("train.seed=4321"))
    started = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    before = torch.get_rng_state()
    again = initial_model(trainer.model, 4321)
    assert torch.equal(torch.get_rng_state(), before)
    assert all(torch.equal(p, started[name]) for name, p in again.named_parameters())
    other = initial_model(trainer.model, 1)
    assert not torch.equal(other.transformer.wte.weight, started["transformer.wte.weight"])


def test_the_page_needs_nothing_else_and_fits_the_size_budget(tmp_path):
    """tiny.yaml's model with 64 tokens: at most 4 MB, no address, no external script,
    style, font or image; the big arrays in the base64 form."""
    import yaml

    from data import shakespeare

    text = "\n".join(shakespeare.markdown_to_speeches(next(iter(shakespeare.play_files())).read_text()))
    tokenizer = train_tokenizer("char", [text], 0)
    settings = yaml.safe_load((ROOT / "configs" / "tiny.yaml").read_text())["model"]
    gpt = GPT(GPTConfig(vocab_size=tokenizer.get_vocab_size(), **settings)).eval()
    html = render(page_data(gpt, tokenizer, tokenizer.encode(text[1000:1064]).ids))
    assert len(embedded(html)["tokens"]) == 64
    assert len(html.encode()) <= 4_000_000
    data = embedded(html)
    assert data["layers"][0]["residual_in"]["dtype"] == "float32" and data["layers"][0]["residual_out"] is None
    assert data["layers"][-1]["residual_out"]["shape"] == [64, 128] and data["left_out"] == []
    addresses = html.replace('"http://www.w3.org/2000/svg"', "")  # SVG's namespace: a name, never loaded
    assert not re.search(r"https?://", addresses) and "//cdn" not in html
    tags = Tags()
    tags.feed(html)
    assert tags.scripts == ["application/json"] * 4 + [None]  # data, strings, settings, model; one inline script
    assert tags.external == []


class Tags(HTMLParser):
    """The page's script tags (their type) and any tag that would load something."""

    def __init__(self):
        super().__init__()
        self.scripts, self.external = [], []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "script":
            self.scripts.append(attrs.get("type"))
        if attrs.get("src") or attrs.get("href") or tag in ("link", "iframe", "object", "embed", "img"):
            self.external.append(tag)


def test_a_hostile_prompt_stays_text(run):
    gpt = GPT.from_pretrained(run).eval()
    tokenizer = train_tokenizer("char", [TEXT], 0)
    html = render(page_data(gpt, tokenizer, tokenizer.encode(HOSTILE).ids))
    assert html.count("<script") == 5 and html.count("</script>") == 5  # ours, none from the prompt
    assert "".join(t["text"] for t in embedded(html)["tokens"]) == HOSTILE
    assert not re.search(r"\.(inner|outer)HTML\s*[+]?=|insertAdjacentHTML|document\.write|eval\(", html)


def test_explore_writes_the_page(run, tmp_path, capsys):
    out = tmp_path / "page.html"
    assert explore.main(["--checkpoint", str(run), "--prompt", "ROMEO:\nBut soft", "--out", str(out),
                         "--max-tokens", "8", "--lang", "zh"]) == 0
    captured = capsys.readouterr()
    assert f"已写出 {out}" in captured.out and "注意：提示词有 15 个 token；页面只显示最后 8 个（--max-tokens）" in captured.err
    html = out.read_text(encoding="utf-8")
    data = embedded(html)
    assert "".join(t["text"] for t in data["tokens"]) == "But soft" and data["truncated"] == 7
    assert '"lang":"zh"' in html
    assert explore.main(["--checkpoint", str(run), "--prompt", "But soft" * 10, "--out", str(out),
                         "--max-tokens", "100", "--lang", "en"]) == 0  # 80 tokens: more than block_size (64)
    assert "note: the prompt has 80 tokens; the page shows the last 64 (block_size)" in capsys.readouterr().err


def test_explore_writes_the_page_of_the_model_at_initialisation_beside_it(tmp_path, capsys):
    """With the run's config.yaml (its seed), a second page shows the same prompt through
    the model at initialisation; each page names the other. A run that started from other
    weights (train.init_from) has no initial model of its own: one page, and a note why."""
    run = make_run(tmp_path / "run")
    (run / "config.yaml").write_text("train:\n  seed: 7\n  init_from: null\n")
    out = tmp_path / "page.HTM"  # (.htm, in any case, is an HTML file too)
    assert explore.main(["--checkpoint", str(run), "--prompt", "ROMEO:\nBut soft", "--out", str(out),
                         "--lang", "zh"]) == 0
    printed = capsys.readouterr().out
    assert f"已写出 {out}（{out.stat().st_size / 1e6:.2f} MB）" in printed
    assert f"已写出 {tmp_path / 'page.init.HTM'}（{(tmp_path / 'page.init.HTM').stat().st_size / 1e6:.2f} MB）" in printed
    trained, init = embedded(out.read_text()), embedded((tmp_path / "page.init.HTM").read_text())
    assert (trained["model"], init["model"]) == ("trained", "init") and trained["tokens"] == init["tokens"]
    assert '"counterpart":"page.init.HTM"' in out.read_text() and '"counterpart":"page.HTM"' in (tmp_path / "page.init.HTM").read_text()
    assert '"lang":"zh"' in out.read_text() and '"lang":"zh"' in (tmp_path / "page.init.HTM").read_text()
    from explorer.data import initial_model

    expected = initial_model(GPT.from_pretrained(run), 7)
    torch.testing.assert_close(as_tensor(init["embedding"]["token"]), expected.transformer.wte.weight[
        [t["id"] for t in init["tokens"]]].detach(), atol=0, rtol=0)
    (run / "config.yaml").write_text("train:\n  seed: 7\n  init_from: gpt2\n")
    (tmp_path / "page.init.HTM").unlink()
    assert explore.main(["--checkpoint", str(run), "--prompt", "ROMEO:", "--out", str(out), "--lang", "en"]) == 0
    assert "note: no page of the model at initialisation. This run started from another model (gpt2)" in \
        capsys.readouterr().err
    assert not (tmp_path / "page.init.HTM").exists() and '"counterpart":null' in out.read_text()
    # under --lang zh, what explore.py prints is Chinese too (paths and numbers aside)
    assert explore.main(["--checkpoint", str(run), "--prompt", "ROMEO:", "--out", str(out), "--lang", "zh"]) == 0
    printed = capsys.readouterr()
    assert printed.out.startswith(f"已写出 {out}") and "这次训练是从另一个模型（gpt2）开始的" in printed.err
    assert not re.search(r"[A-Za-z]{2,}[ ,]+[A-Za-z]{2,}[ ,]+[A-Za-z]{2,}", printed.out + printed.err)


@pytest.mark.parametrize("args, message", [
    (["--prompt", ""], 'the prompt is empty; give some text, e.g. --prompt "ROMEO:"'),
    (["--prompt", "Zebra €"], "characters this model never saw in training: 'Z' '€'"),
    (["--prompt", "R", "--out", "{tmp}/missing/page.html"], "does not exist; create it first"),
    (["--prompt", "R", "--out", "{tmp}"], "is a folder"),
    (["--prompt", "R", "--out", "{tmp}/page.txt"], "must end in .html"),
    (["--prompt", "R", "--max-tokens", "0"], "--max-tokens=0: must be at least 1 (see python explore.py --help)"),
    ([], "has no validation text to show; give --prompt TEXT"),
])
def test_bad_input_is_one_line_and_writes_nothing(run, tmp_path, capsys, args, message):
    (tmp_path / "page.html").write_text("an earlier page")
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    assert explore.main(["--checkpoint", str(run), "--out", str(tmp_path / "page.html"), *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and "Traceback" not in err
    assert (tmp_path / "page.html").read_text() == "an earlier page"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["page.html"]


def test_missing_checkpoint_names_the_train_command(tmp_path, capsys):
    assert explore.main(["--checkpoint", str(tmp_path / "nothing"), "--prompt", "R"]) == 2
    assert "python train.py --config configs/tiny.yaml" in capsys.readouterr().err


def test_bpe_pieces_of_a_character_show_their_bytes_and_the_character():
    tokenizer = train_tokenizer("bpe", ["hello world " * 20], 260)  # too few merges for 你 or 好
    ids = tokenizer.encode("你好 a").ids
    views = token_views(tokenizer, ids)
    partial = [v for v in views if "bytes" in v]
    assert partial and all(v["joined"] in ("你", "好") for v in partial)
    assert {v["bytes"] for v in partial} >= {"e4", "bd", "a0"}  # 你 = e4 bd a0
    assert "".join(v["text"] for v in views if "bytes" not in v) == " a"


def test_every_string_exists_in_both_languages():
    table = strings()
    assert table["en"].keys() == table["zh"].keys()
    def names(text: str) -> set[str]:
        return set(re.findall(r"\{(\w+)\}", text))

    assert all(names(table["zh"][key]) == names(text) for key, text in table["en"].items())
    # one numbering: the code's indices, as labels, in both languages (层 0 / layer 0), never an ordinal from 1
    assert table["zh"]["layerHead"] == "层 {layer}、头 {head}" and table["en"]["layerHead"] == "layer {layer}, head {head}"
    assert not [key for key, text in table["zh"].items() if re.search(r"第 \{(query|key|layer|head|position|next|kv|first|last|i)\}", text)]
    page = ROOT / "explorer" / "page"
    script = "".join(path.read_text() for path in sorted(page.glob("*.js"))) + (page / "template.html").read_text()
    called = set(re.findall(r'\bt\("(\w+)"', script)) | set(re.findall(r'data-i18n="(\w+)"', script))
    assert called <= table["en"].keys()  # no label without its strings
    made = re.findall(r"\bt\(`(\w*)\$\{\w+(?:\.\w+)?\}(\w*)`", script)  # t(`cut_${cut}`): a family of keys
    assert ("cut_", "") in made and ("", "Row") in made
    shown = set(re.findall(r'"(\w+)"', script))
    unused = [key for key in table["en"] if key not in shown and key.removesuffix("_one") not in shown
              and not any(key.startswith(prefix) and key.endswith(suffix) for prefix, suffix in made)]
    assert unused == []  # no string that nothing shows


def test_byte_level_pieces_map_to_their_bytes_as_gpt2s_table_does():
    """The 256 characters are those of tokenizers' ByteLevel alphabet; the printable bytes
    stand for themselves and the others move to 256 and up in order (byte 0 is 'Ā')."""
    from tokenizers.pre_tokenizers import ByteLevel

    from data.token_text import byte_alphabet

    table = byte_alphabet()
    assert set(table) == set(ByteLevel.alphabet()) and sorted(table.values()) == list(range(256))
    assert (table["A"], table["ÿ"], table["Ā"], table["Ġ"]) == (65, 255, 0, 32)  # Ġ: the space


def test_character_spans_follow_utf8_and_mark_broken_bytes():
    from data.token_text import char_spans

    data = "aé你🙂".encode() + b"\xff" + "你".encode()[:2] + b"z"
    assert char_spans(data) == [(0, 1, "a"), (1, 3, "é"), (3, 6, "你"), (6, 10, "🙂"), (10, 11, None),
                                (11, 12, None), (12, 13, None), (13, 14, "z")]


def test_what_cannot_be_drawn_is_shown_as_its_bytes_by_one_rule():
    """A token cut out of a character at the start of a text, a sample that ends inside a
    character, a control character and an invisible one: each shown as its bytes, ⟨..⟩,
    never as U+FFFD or as itself."""
    from data.token_text import readable, readable_decode

    tokenizer = train_tokenizer("bpe", ["hello world " * 20], 260)  # too few merges for 你
    ids = tokenizer.encode("你好\x03\u200b!").ids
    assert tokenizer.decode(ids[1:]).startswith("\ufffd")  # what the page and the samples showed
    assert token_views(tokenizer, ids[1:])[0] == {"id": ids[1], "text": "⟨bd⟩", "bytes": "bd", "joined": ""}
    assert readable_decode(tokenizer, ids[1:]) == "⟨bd a0⟩好⟨03⟩⟨e2 80 8b⟩!"
    assert readable_decode(tokenizer, ids[:4]) == "你⟨e5⟩"  # a sample cut inside 好 (e5 a5 bd)
    assert readable("a\tb\nc\rd\x7f\x85") == "a\tb\nc⟨0d⟩d⟨7f⟩⟨c2 85⟩"


def test_a_token_id_the_tokenizer_lacks_has_no_bytes(run):
    from data.tokenizer import load_tokenizer
    from data.token_text import token_bytes

    bpe = train_tokenizer("bpe", ["hello world " * 20], 260)
    assert token_bytes(bpe, 10**6) is None and token_bytes(bpe, bpe.token_to_id("Ġ")) == b" "
    assert token_bytes(load_tokenizer(run / "tokenizer.json"), 3) is None  # a char tokenizer's piece


def test_a_page_is_a_file_page_unless_told_otherwise(run):
    gpt = GPT.from_pretrained(run).eval()
    tokenizer = train_tokenizer("char", [TEXT], 0)
    data = page_data(gpt, tokenizer, tokenizer.encode("But").ids)
    assert '"server":false' in render(data) and '"server":true' in render(data, server=True)
    assert '"lang":"en"' in render(data)


def test_a_one_token_page_says_token_not_tokens(tmp_path, capsys):
    run = make_run(tmp_path / "run")
    assert explore.main(["--checkpoint", str(run), "--prompt", "R", "--out", str(tmp_path / "p.html"), "--lang", "en"]) == 0
    assert "MB): 1 token, " in capsys.readouterr().out


def test_explore_parses_its_options(monkeypatch, tmp_path):
    monkeypatch.setattr(explore, "DEFAULT_RUN", tmp_path / "default-run")
    args = explore.parse_args(["--serve", "--port", "0", "--lang", "en"])
    assert (args.serve, args.port, args.lang, args.checkpoint, args.prompt) == (True, 0, "en", tmp_path / "default-run", None)
    assert explore.parse_args(["--prompt", "R"]).serve is False


def test_explore_serve_hands_the_server_the_run_and_its_initial_model(tmp_path, monkeypatch):
    """--serve: the server gets the trained model, the port, the language, the prompt ("" when
    none is given), the token limit, a way to make the model at initialisation, and the
    run's facts (none for a folder without a summary.json)."""
    import explorer.server

    run = make_run(tmp_path / "run")
    (run / "config.yaml").write_text("train:\n  seed: 7\n")
    handed = {}
    monkeypatch.setattr(explorer.server, "serve", lambda *args: handed.setdefault("args", args) and 0)
    assert explore.main(["--serve", "--checkpoint", str(run), "--port", "0", "--lang", "zh", "--max-tokens", "9"]) == 0
    model, tokenizer, port, lang, prompt, max_tokens, make_initial, run_facts, timeline, snapshots = handed["args"]
    assert (port, lang, prompt, max_tokens, model.training, run_facts) == (0, "zh", "", 9, False, None)  # (no summary)
    assert timeline is None and snapshots == {}  # (no snapshots)
    init_model, why = make_initial()
    from explorer.data import initial_model

    assert why is None and torch.equal(init_model.lm_head.weight, initial_model(model, 7).lm_head.weight)
    assert not torch.equal(init_model.lm_head.weight, model.lm_head.weight)


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory, corpus):
    """A micro run trained for 20 iterations, with its snapshots (0, 4, 8, 12, 16, 20)."""
    import train

    tmp = tmp_path_factory.mktemp("timeline")
    overrides = [f"data.source={corpus}", f"data.cache_dir={tmp / 'cache'}", f"out_dir={tmp / 'run'}",
                 "data.tokenizer=char", "model.n_layer=2", "model.n_head=2", "model.n_embd=32", "model.block_size=32",
                 "train.batch_size=8", "train.max_iters=20", "train.eval_interval=10", "train.eval_iters=2",
                 "train.warmup_iters=5", "train.sample_tokens=0", "train.dtype=float32", "train.threads=1",
                 "train.max_minutes=null", "train.ema=0", "train.snapshots=16", "train.snapshot_every=4"]
    assert train.main(["--config", str(ROOT / "configs" / "tiny.yaml"), *overrides]) == 0
    return tmp / "run"


def test_the_timeline_is_the_models_own_numbers_at_each_snapshot(trained_run, tmp_path, monkeypatch):
    """A model too large for its page to carry every snapshot (here: the limit set to 0):
    every number the timeline shows for a step is the forward pass of that step's snapshot:
    the attention maps, the prediction, each token's loss, the sample (one seed for every
    step), the head scores, and the loss on the run's own evaluation windows."""
    from runs.folder import RunDir
    from data.batches import fixed_windows
    from jobs.text_data import validation_tokens
    from inspection.circuits import composition_scores, copying_scores
    from inspection.head_scores import head_scores, induction_probe

    monkeypatch.setattr(explorer.data, "MAX_SNAPSHOT_BYTES", 0)
    out = tmp_path / "page.html"
    assert explore.main(["--checkpoint", str(trained_run), "--prompt", "MACBETH:\nSo foul", "--out", str(out)]) == 0
    data = embedded(out.read_text(encoding="utf-8"))
    timeline = data["timeline"]
    run = RunDir(trained_run)
    assert timeline["steps"] == list(run.snapshot_paths()) == [0, 4, 8, 12, 16, 20] and timeline["weights"] is None
    model, tokenizer = run.load_model()
    ids = [token["id"] for token in data["tokens"]]
    maps = as_tensor(timeline["maps"]).float()  # [steps, n_layer, H, T, T]
    val, _, _ = validation_tokens(run.data_config(), tokenizer, tmp_path)
    x, y = fixed_windows(val, 32, 16, 1337, "val")  # the run's: eval_iters 2 × batch 8, train.seed
    assert timeline["loss_windows"] == 16 and timeline["loss_is_runs"]
    for s in (0, 3, 5):
        snapshot = run.load_snapshot(timeline["steps"][s], GPT.from_pretrained(trained_run)).eval()
        with torch.no_grad():
            trace = snapshot.trace(torch.tensor([ids]))
            loss = GPT.loss(snapshot(x)[0], y).item()
            sample = snapshot.generate(torch.tensor([ids]), 60, temperature=0.8, generator=torch.Generator().manual_seed(0),
                                       suppress_tokens=(tokenizer.token_to_id("<unk>"),))
        torch.testing.assert_close(maps[s], trace.weights[:, 0].half().float(), atol=0, rtol=0)  # (float16 in the page)
        probs = torch.softmax(trace.logits[0, -1], -1)
        probs[tokenizer.token_to_id("<unk>")] = 0  # never generated (data.tokenizer.suppressed_ids)
        assert timeline["prediction"][s]["ids"] == probs.topk(20).indices.tolist()
        each = torch.nn.functional.cross_entropy(trace.logits[0, :-1], torch.tensor(ids[1:]), reduction="none")
        assert timeline["losses"][s] == pytest.approx(each.tolist(), abs=1e-5)
        assert timeline["loss"][s] == pytest.approx(loss, abs=1e-5)
        assert timeline["samples"][s] == readable_decode(tokenizer, sample[0, len(ids):].tolist())
        scores = head_scores(snapshot, torch.from_numpy(val[:32].astype("int64"))[None],
                             induction_probe(tokenizer, model.config.vocab_size, 32))
        for kind in ("current_token", "previous_token", "induction"):
            torch.testing.assert_close(torch.tensor(timeline["scores"][kind][s]), scores[kind], atol=1e-6, rtol=0)
        for kind, values in composition_scores(snapshot).items():
            torch.testing.assert_close(as_tensor(timeline["composition"][kind])[s].float(), values.half().float())
        assert timeline["copying"][s] == copying_scores(snapshot).tolist()
        with torch.no_grad():
            by_position = GPT.loss(snapshot(x)[0], y, reduction="none").mean(0)  # [T]: each position's, over the windows
        torch.testing.assert_close(as_tensor(timeline["position_loss"])[s].float(), by_position.half().float())
        assert timeline["in_context"][s] == pytest.approx(by_position[16:].mean().item() - by_position[1:4].mean().item(),
                                                          abs=1e-5)  # (T = 32: the second half less positions 1 to 3)
    assert timeline["copies"] is None  # (not the lesson's text)
    assert timeline["loss"][-1] == pytest.approx(run.summary()["val_loss"], rel=1e-6)  # one figure: the run's
    trained = data["layers"][1]["heads"][0]["weights"]  # the last snapshot is the trained model
    torch.testing.assert_close(maps[-1, 1, 0], as_tensor(trained).half().float(), atol=0, rtol=0)


def test_a_small_model_s_page_carries_every_snapshot_s_weights(trained_run, tmp_path):
    """Where they fit, the snapshots' weights travel in the page, in float16 (the last one's
    are the page's own model), with the run's loss and the head scores at each step and
    what even attention scores; no precomputed maps."""
    from runs.folder import RunDir

    out = tmp_path / "page.html"
    assert explore.main(["--checkpoint", str(trained_run), "--prompt", "MACBETH:\nSo foul", "--out", str(out)]) == 0
    timeline = embedded(out.read_text(encoding="utf-8"))["timeline"]
    run = RunDir(trained_run)
    assert len(timeline["weights"]) == 6 and timeline["weights"][-1] is None and "maps" not in timeline
    for s in (0, 3):
        snapshot = run.load_snapshot(timeline["steps"][s], GPT.from_pretrained(trained_run)).state_dict()
        carried = timeline["weights"][s]
        assert set(carried) == set(snapshot) - {"lm_head.weight"}  # (tied: the embedding's)
        for name, tensor in snapshot.items():
            if name in carried:
                assert carried[name]["dtype"] == "float16"
                assert np.array_equal(decoded_half(carried[name]), tensor.half().numpy())
    assert timeline["uniform"]["previous_token"] == pytest.approx(sum(1 / (t + 1) for t in range(1, 32)) / 31)
    assert timeline["loss"][-1] == pytest.approx(run.summary()["val_loss"], rel=1e-6)


def decoded_half(a: dict) -> np.ndarray:
    import base64

    return np.frombuffer(base64.b64decode(a["base64"]), dtype="<f2").reshape(a["shape"])


def test_a_run_without_snapshots_has_no_timeline(run, tmp_path):
    out = tmp_path / "page.html"
    assert explore.main(["--checkpoint", str(run), "--prompt", "ROMEO:", "--out", str(out)]) == 0
    assert embedded(out.read_text(encoding="utf-8"))["timeline"] is None


def test_what_a_byte_level_token_reads_as():
    """token_text: the text a byte-level BPE token stands for (a space, not its letter Ġ;
    bytes of no whole character as ⟨..⟩); token_bytes: None for a token outside GPT-2's
    byte letters; token_views: a token holding the end of one character and the start of
    the next is joined with both."""
    from tokenizers import AddedToken

    from data.token_text import BYTES, token_bytes, token_text

    bpe = train_tokenizer("bpe", ["hello world " * 20], 300)
    first = bpe.encode(" hello").ids[0]
    assert bpe.id_to_token(first).startswith("Ġ") and token_text(bpe, first) == bpe.decode([first]).replace("Ġ", " ")
    assert token_text(bpe, first).startswith(" ")
    assert token_text(bpe, bpe.encode("你").ids[0]) == "⟨e4⟩"
    bpe.add_special_tokens([AddedToken("<my token>", special=True)])  # a space: no byte letter
    assert token_bytes(bpe, bpe.token_to_id("<my token>")) is None
    letter = {b: ch for ch, b in BYTES.items()}
    bpe.add_tokens(["".join(letter[b] for b in (0xA9, 0xE4))])  # é = c3 a9, 你 = e4 bd a0: a9 e4 as one token
    ids = [bpe.token_to_id(letter[0xC3]), bpe.token_to_id(letter[0xA9] + letter[0xE4]),
           bpe.token_to_id(letter[0xBD]), bpe.token_to_id(letter[0xA0])]
    views = token_views(bpe, ids)
    assert views[1]["bytes"] == "a9 e4" and views[1]["joined"] == "é你"
