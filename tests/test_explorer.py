"""The attention explorer without a browser: its data are the model's own numbers, the
page needs nothing else, no prompt can break out of it, and bad input is one line."""

import json
import re
from html.parser import HTMLParser

import pytest
import torch

import explore
import model.attention
from conftest import ROOT
from data.tokenizer import train_tokenizer
from explorer.data import page_data, token_views
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


@pytest.mark.parametrize("pos_encoding", ["rope", "learned"])
def test_the_data_are_the_models_own_numbers(tmp_path, pos_encoding):
    """Checked against separate forward passes that hand nothing back: an sdpa pass (each
    layer's heads, concatenated and put through W_O, give its attention output) and an
    explicit pass (its five-step weights)."""
    gpt = GPT.from_pretrained(make_run(tmp_path, pos_encoding=pos_encoding, attn_impl="sdpa")).eval()
    tokenizer = train_tokenizer("char", [TEXT], 0)
    ids = tokenizer.encode("ROMEO:\nBut soft, what").ids
    data = page_data(gpt, tokenizer, ids)
    outputs, weights = [], []
    hooks = [b.attn.register_forward_hook(lambda m, a, out: outputs.append(out[0])) for b in gpt.transformer.h]
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
        heads = data["layers"][layer]["heads"]
        merged = torch.tensor([head["output"] for head in heads]).transpose(0, 1).reshape(T, C)  # [T, H·d_k]
        with torch.no_grad():
            torch.testing.assert_close(block.attn.c_proj(merged), outputs[layer], atol=1e-5, rtol=0)
        for h, head in enumerate(heads):
            w = torch.tensor([[0.0 if x is None else x for x in row] for row in head["weights"]])
            torch.testing.assert_close(w, weights[layer][h], atol=1e-6, rtol=0)
            torch.testing.assert_close(w.sum(-1), torch.ones(T), atol=1e-5, rtol=0)
            q, k = torch.tensor(head["q"]), torch.tensor(head["k"])  # what the page computes steps 1-4 from
            scores = (q @ k.T / gpt.config.head_size ** 0.5).masked_fill(torch.ones(T, T).triu(1).bool(), -torch.inf)
            torch.testing.assert_close(torch.softmax(scores, -1), w, atol=1e-5, rtol=0)
            torch.testing.assert_close(w @ torch.tensor(head["v"]), torch.tensor(head["output"]), atol=1e-5, rtol=0)
            assert all((x is None) == (j > i) for i, row in enumerate(head["weights"]) for j, x in enumerate(row))
            assert len(head["q"]) == len(head["k"]) == len(head["v"]) == T and len(head["q"][0]) == gpt.config.head_size
    torch.testing.assert_close(torch.tensor(data["prediction"]["logits"]), logits[0, -1], atol=1e-5, rtol=1e-6)
    assert [t["id"] for t in data["tokens"]] == ids and data["version"] == 1
    assert data["config"]["head_size"] == C // gpt.config.n_head


def test_the_page_needs_nothing_else_and_fits_the_size_budget(tmp_path):
    """tiny.yaml's model with 64 tokens: at most 3 MB, no address, no external script,
    style, font or image."""
    import yaml

    from data import shakespeare

    text = "\n".join(shakespeare.markdown_to_speeches(next(iter(shakespeare.play_files())).read_text()))
    tokenizer = train_tokenizer("char", [text], 0)
    settings = yaml.safe_load((ROOT / "configs" / "tiny.yaml").read_text())["model"]
    gpt = GPT(GPTConfig(vocab_size=tokenizer.get_vocab_size(), **settings)).eval()
    html = render(page_data(gpt, tokenizer, tokenizer.encode(text[1000:1064]).ids))
    assert len(embedded(html)["tokens"]) == 64
    assert len(html.encode()) <= 3_000_000
    assert not re.search(r"https?://", html) and "//cdn" not in html
    tags = Tags()
    tags.feed(html)
    assert tags.scripts == ["application/json"] * 3 + [None]  # data, and the one inline script
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
    assert html.count("<script") == 4 and html.count("</script>") == 4  # ours, none from the prompt
    assert "".join(t["text"] for t in embedded(html)["tokens"]) == HOSTILE
    assert not re.search(r"\.(inner|outer)HTML\s*[+]?=|insertAdjacentHTML|document\.write|eval\(", html)


def test_explore_writes_the_page(run, tmp_path, capsys):
    out = tmp_path / "page.html"
    assert explore.main(["--checkpoint", str(run), "--prompt", "ROMEO:\nBut soft", "--out", str(out),
                         "--max-tokens", "8", "--lang", "zh"]) == 0
    captured = capsys.readouterr()
    assert f"wrote {out}" in captured.out and "keeping the last 8 (--max-tokens)" in captured.err
    html = out.read_text(encoding="utf-8")
    data = embedded(html)
    assert "".join(t["text"] for t in data["tokens"]) == "But soft" and data["truncated"] == 7
    assert '"lang":"zh"' in html


@pytest.mark.parametrize("args, message", [
    (["--prompt", ""], "the prompt is empty"),
    (["--prompt", "Zebra €"], "characters this model never saw in training: 'Z' '€'"),
    (["--prompt", "R", "--out", "{tmp}/missing/page.html"], "does not exist; create it first"),
    (["--prompt", "R", "--out", "{tmp}"], "is a folder"),
    (["--prompt", "R", "--out", "{tmp}/page.txt"], "must end in .html"),
    (["--prompt", "R", "--max-tokens", "0"], "--max-tokens=0: must be at least 1"),
    ([], "give --prompt TEXT"),
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
    placeholders = {key: set(re.findall(r"\{\w+\}", text)) for key, text in table["en"].items()}
    assert all(set(re.findall(r"\{\w+\}", table["zh"][key])) == names for key, names in placeholders.items())
    script = (ROOT / "explorer" / "page" / "explorer.js").read_text() + (ROOT / "explorer" / "page" / "template.html").read_text()
    called = set(re.findall(r'\bt\("(\w+)"', script)) | set(re.findall(r'data-i18n="(\w+)"', script))
    assert called <= table["en"].keys()  # no label without its strings
    assert table["en"].keys() <= set(re.findall(r'"(\w+)"', script))  # no string that nothing shows
