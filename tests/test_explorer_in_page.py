"""The page runs the model itself (explorer/page/model.js, tokenizer.js and data.js), in
Debian's Chromium: its logits against torch's in float64 for every kind of model the
project builds, every panel's data against explore.py's for the same text, its tokenizer
against `tokenizers`, token by token, and what a learner does on the page (type, continue,
switch every head off, run the experiments in every head). The last test breaks the
JavaScript on purpose and checks that these comparisons notice."""

import copy
import json
import math
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from tokenizers import Tokenizer
from tokenizers.pre_tokenizers import ByteLevel

import explore
import explorer.data
import explorer.page
import model.attention
from conftest import ROOT
from data.token_text import readable_decode, token_views
from data.tokenizer import train_tokenizer, unknown_characters
from explorer.data import ablated, decoded, page_data, page_model
from explorer.page import render
from model import GPT, GPTConfig
from test_explorer import HOSTILE, assert_same_page_data, embedded, embedded_model, trained_run  # noqa: F401
from test_explorer_browser import browser, expect, open_page  # noqa: F401 (fixtures)

try:
    from playwright.sync_api import Error as PlaywrightError
except ImportError:  # the browser fixture says what to install
    PlaywrightError = None

TEXT = ("ROMEO:\nBut soft, what light through yonder window breaks?\nIt is the east, and Juliet is the sun.\n"
        "JULIET:\nO Romeo, Romeo! wherefore art thou Romeo? I'll deny thy father, we've said.\n"
        "今天天气很好。明天天气也很好，我们去公园吧！你好，世界。🙂👍🏽 🇫🇷\n") * 2
TINY = yaml.safe_load((ROOT / "configs" / "tiny.yaml").read_text())["model"]
SMALL = dict(block_size=64, n_layer=2, n_head=4, n_embd=64)
# (tokenizer, its vocabulary size, the model): each position encoding, grouped and full
# heads, SwiGLU, RMSNorm, post-LN, tied and untied, GELU's tanh form, biases on q, k, v only,
# QK-norm and heads of their own size
CONFIGS = {
    "tiny": ("bpe", 400, TINY),  # rotary, 4 heads sharing 2 key/value heads, LayerNorm, GELU, tied
    "gpt2": ("char", 0, SMALL | dict(pos_encoding="learned", activation="gelu_tanh")),
    "paper": ("char", 0, SMALL | dict(pos_encoding="sinusoidal", norm_position="post", tie_embeddings=False,
                                      norm_eps=1e-3)),
    "llama": ("bpe", 400, SMALL | dict(pos_encoding="rope", n_kv_head=1, norm="rmsnorm", mlp="swiglu",
                                       tie_embeddings=False, bias=False, qkv_bias=True, norm_eps=1e-6)),
    "qwen3": ("bpe", 400, SMALL | dict(pos_encoding="rope", n_kv_head=2, norm="rmsnorm", mlp="swiglu", bias=False,
                                       qk_norm=True, head_dim=24, norm_eps=1e-6)),  # QK-norm, heads of 24 in 64
    "wider": ("bpe", 400, dict(block_size=64, n_layer=3, n_head=8, n_kv_head=4, n_embd=256, pos_encoding="rope")),
}
TINY_TOLERANCE = 1e-5  # tiny's logits: absolute
RELATIVE_TOLERANCE = 2e-6  # the others': of the largest |logit|


def perturbed(gpt: GPT, seed: int = 0, scale: float = 0.2) -> GPT:
    """The model at initialisation with noise on every weight (norms' gains and biases
    too), so that its logits spread as a trained model's do (about ±10) and every piece
    counts."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in gpt.parameters():
            p.add_(torch.randn(p.shape, generator=generator) * scale)
    return gpt.eval()


def made(name: str):
    kind, vocab_size, settings = CONFIGS[name]
    tokenizer = train_tokenizer(kind, [TEXT], vocab_size)
    torch.manual_seed(0)
    return perturbed(GPT(GPTConfig(vocab_size=tokenizer.get_vocab_size(), **settings))), tokenizer


@pytest.fixture(scope="module")
def models():
    return {name: made(name) for name in CONFIGS}


def runnable(gpt, tokenizer) -> dict:
    block, why_not = page_model(gpt, tokenizer)
    assert why_not is None
    return block


PLAIN = "(o) => JSON.parse(JSON.stringify(o, (key, v) => (ArrayBuffer.isView(v) ? Array.from(v) : v)))"


def write_page(path: Path, gpt, tokenizer, text: str) -> Path:
    ids = tokenizer.encode(text).ids[-gpt.config.block_size:]
    path.write_text(render(page_data(gpt, tokenizer, ids), model=runnable(gpt, tokenizer), prompt=text), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def page_file(models, tmp_path_factory):
    """A page that runs tiny's model; its scripts run any other model handed to them."""
    return write_page(tmp_path_factory.mktemp("in_page") / "tiny.html", *models["tiny"], "ROMEO:")


def js_logits(page, block: dict, ids: list[int], **options) -> torch.Tensor:
    logits = page.page.evaluate("([m, ids, o]) => Array.from(Model.forward(m, ids, o).logits)", [block, ids, options])
    return torch.tensor(logits, dtype=torch.float64).view(len(ids), -1)


def float64_logits(gpt, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return copy.deepcopy(gpt).double()(torch.tensor([ids]))[0][0]


def gap(page, gpt, tokenizer, ids) -> tuple[float, float]:
    """The page's largest distance from torch's float64 logits, and the tolerance."""
    reference = float64_logits(gpt, ids)
    difference = (js_logits(page, runnable(gpt, tokenizer), ids) - reference).abs().max().item()
    tiny = gpt.config.n_embd == TINY["n_embd"] and gpt.config.n_layer == TINY["n_layer"]
    return difference, TINY_TOLERANCE if tiny else RELATIVE_TOLERANCE * reference.abs().max().item()


@pytest.mark.parametrize("name", [*CONFIGS][:-1] + [pytest.param("wider", marks=pytest.mark.slow)])
def test_the_page_computes_torchs_logits_in_float64(name, models, page_file, open_page):
    """Every position's logits, 64 tokens: tiny within 1e-5 of float64 (torch's own float32
    pass is about 3e-5 away), the others within 2e-6 of their largest logit."""
    gpt, tokenizer = models[name]
    page = open_page(page_file.as_uri())
    ids = tokenizer.encode(TEXT).ids[:64]
    assert len(ids) == 64
    difference, tolerance = gap(page, gpt, tokenizer, ids)
    assert difference <= tolerance
    assert float64_logits(gpt, ids).abs().max() > 3  # logits spread as a trained model's do
    assert page.errors == []


@pytest.mark.parametrize("name", ["tiny", pytest.param("llama", marks=pytest.mark.slow), pytest.param("paper", marks=pytest.mark.slow)])
def test_the_pages_kv_cache_continues_as_the_model_does(name, models, page_file, open_page):
    """Greedy continuation in the page (model.js's generate: the prompt once, then one token
    at a time against the cache, the window run afresh once it slides) is GPT.generate's."""
    gpt, tokenizer = models[name]
    page = open_page(page_file.as_uri())
    prompt = tokenizer.encode(TEXT).ids[:50]  # 50 + 24 tokens: the window of 64 slides
    greedy = {"temperature": 0, "topK": None, "topP": None, "suppress": []}
    ours = page.page.evaluate("([m, ids, s]) => Array.from(Model.generate(m, ids, 24, s))", [runnable(gpt, tokenizer), prompt, greedy])
    assert ours == gpt.generate(torch.tensor([prompt]), 24, temperature=0)[0, 50:].tolist()


@pytest.mark.parametrize("which", ["scale", pytest.param("mask", marks=pytest.mark.slow)])
def test_the_experiments_in_every_head_are_the_models_pass_without_them(which, models, page_file, open_page,
                                                                           monkeypatch):
    """Without 1/√d_k, or without the causal mask, in every head: torch's five steps with q
    multiplied by √d_k (the scale undone), or with no mask."""
    gpt, tokenizer = models["tiny"]
    page = open_page(page_file.as_uri())
    ids = tokenizer.encode(TEXT).ids[:40]
    five_steps = model.attention.scaled_dot_product_attention

    def without(query, key, value, mask=None, dropout_p=0.0):
        if which == "scale":
            return five_steps(query * math.sqrt(query.size(-1)), key, value, mask, dropout_p)
        return five_steps(query, key, value, None, dropout_p)

    monkeypatch.setattr(model.attention, "scaled_dot_product_attention", without)
    with torch.no_grad():
        reference = copy.deepcopy(gpt).double().trace(torch.tensor([ids])).logits[0]  # trace: the five steps
    with torch.no_grad():
        float32 = gpt.trace(torch.tensor([ids])).logits[0].double()
    ours = js_logits(page, runnable(gpt, tokenizer), ids, **{which: False})
    # a softmax without the scale saturates and magnifies rounding: no further than torch's float32
    assert (ours - reference).abs().max() <= max(TINY_TOLERANCE, (float32 - reference).abs().max())
    assert (ours - float64_logits(gpt, ids)).abs().max() > 0.1  # the experiment changes what it predicts


def test_erf_is_exact_to_float32(page_file, open_page):
    """JavaScript has no erf; the page's (for exact GELU) is within 2e-8 of the true one,
    and GELU's tanh form is GPT-2's."""
    page = open_page(page_file.as_uri())
    xs = [i / 500 for i in range(-3000, 3001)]
    ours = page.page.evaluate("(xs) => xs.map(Model.erf)", xs)
    assert max(abs(a - math.erf(x)) for a, x in zip(ours, xs)) < 2e-8
    tanh_form = page.page.evaluate("(xs) => xs.map(Model.ACTIVATIONS.gelu_tanh)", xs)
    reference = torch.nn.functional.gelu(torch.tensor(xs, dtype=torch.float64), approximate="tanh")
    assert torch.allclose(torch.tensor(tanh_form, dtype=torch.float64), reference, rtol=0, atol=1e-12)


# ---- the tokenizer --------------------------------------------------------------------------

TEXTS = ["ROMEO:\nBut soft, what light through yonder window breaks?",
         "I'll say't, it's done; we've seen they're HERE, don't you know'd? I'm  ",
         "今天天气很好。你好，世界！",
         "🙂👍🏽 🇫🇷 👨‍👩‍👧 emoji",
         "   spaces   and\n\n\n\ttabs \t\n  at the end   ",
         "control \x00\x07\x1b\x7f characters\x85next\u2028line\ufeffbom\u3000ideographic\u00a0nbsp",
         "numbers 3.14159 and 2026-12-05, 1,000,000! día, señor",
         "\thello \ufeff \x85 hi!\ufeff!? and?\x85!",
         "mixed: Juliet说：“你好 world” 🙂"]


def tokenizer_of(kind: str):
    """A char or byte-level BPE tokenizer trained on TEXTS, or the BPE one with
    add_prefix_space (as RoBERTa's and some GPT-2 files have it)."""
    tokenizer = train_tokenizer(kind.split()[0], ["\n".join(TEXTS) * 3 + TEXT], 1000)
    if kind == "bpe with a prefix space":
        spec = json.loads(tokenizer.to_str())
        spec["pre_tokenizer"]["add_prefix_space"] = True
        tokenizer = Tokenizer.from_str(json.dumps(spec))
    return tokenizer


TOKENIZERS = ["char", "bpe", "bpe with a prefix space"]


def tokenized_in_page(page, tokenizer) -> list[dict]:
    """Each of TEXTS through the page's tokenizer: its pieces (byte-level BPE), its ids,
    the ids decoded, and each token's text."""
    return page.page.evaluate(f"""([spec, texts]) => {{
      const tokenizer = new PageTokenizer(spec);
      return texts.map((text) => {{
        const ids = tokenizer.encode(text);
        const pieces = spec.kind === "bpe" ? tokenizer.pieces(text) : null;
        return ({PLAIN})({{ pieces, ids, decoded: tokenizer.decode(ids), views: tokenizer.views(ids),
          readable: tokenizer.readableDecode(ids), cut: tokenizer.views(ids.slice(1)),
          cut_readable: tokenizer.readableDecode(ids.slice(1)) }});
      }});
    }}""", [explorer.data.page_tokenizer(tokenizer), TEXTS])


def as_tokenizers_does(tokenizer) -> list[dict]:
    cut = tokenizer.pre_tokenizer
    return [{"pieces": [piece for piece, _ in cut.pre_tokenize_str(text)] if isinstance(cut, ByteLevel) else None,
             "ids": ids, "decoded": tokenizer.decode(ids), "views": token_views(tokenizer, ids),
             "readable": readable_decode(tokenizer, ids), "cut": token_views(tokenizer, ids[1:]),
             "cut_readable": readable_decode(tokenizer, ids[1:])}
            for text, ids in ((text, tokenizer.encode(text).ids) for text in TEXTS)]


@pytest.mark.parametrize("kind", TOKENIZERS)
def test_the_pages_tokenizer_is_tokenizers(kind, page_file, open_page):
    """How the text is cut, its ids, the ids decoded and each token's text, for English,
    Chinese, emoji, runs of whitespace and control characters: exactly as `tokenizers`
    does with the run's file; and the text and tokens shown, by data/token_text.py's rule
    (also with the first token cut off, which may leave bytes of no whole character)."""
    tokenizer = tokenizer_of(kind)
    page = open_page(page_file.as_uri())
    assert tokenized_in_page(page, tokenizer) == as_tokenizers_does(tokenizer)
    if kind != "bpe with a prefix space":  # (which decodes with the space it put before)
        assert [tokenizer.decode(tokenizer.encode(text).ids) for text in TEXTS] == TEXTS
    if kind != "char":  # merges at work: fewer tokens than bytes
        assert len(tokenizer.encode(TEXTS[0]).ids) < 0.5 * len(TEXTS[0].encode())


def test_the_page_names_characters_its_tokenizer_never_saw(page_file, open_page):
    tokenizer = train_tokenizer("char", ["abc ROMEO:\n"], 0)
    page = open_page(page_file.as_uri())
    text = "ROMEO: €uro ∞ and é"
    ours = page.page.evaluate("([spec, text]) => new PageTokenizer(spec).unknown(text)",
                              [explorer.data.page_tokenizer(tokenizer), text])
    assert ours == unknown_characters(tokenizer, text)
    assert "€" in ours and "∞" in ours and "R" not in ours and " " not in ours


# ---- the page, as a learner uses it ---------------------------------------------------------


@pytest.fixture(scope="module")
def runs(models, tmp_path_factory):
    """Run folders (weights and tokenizer) of two models, and explore.py's page of each."""
    made_runs = {}
    for name, prompt in (("gpt2", "ROMEO:"), ("tiny", "你好")):
        gpt, tokenizer = models[name]
        run = tmp_path_factory.mktemp(name)
        gpt.save_pretrained(run)
        tokenizer.save(str(run / "tokenizer.json"))
        out = run / "page.html"
        assert explore.main(["--checkpoint", str(run), "--prompt", prompt, "--out", str(out), "--lang", "en"]) == 0
        made_runs[name] = (run, out)
    return made_runs


def typed(page, text: str) -> dict:
    """Type text into the page's box and wait for it to run the model: the page's data."""
    page.page.evaluate("() => { delete document.getElementById('status').dataset.ms; }")
    page.page.fill("#prompt", text)
    page.page.wait_for_selector("#status[data-ms]", state="attached")
    return page.page.evaluate(f"() => ({PLAIN})(Page.data)")


@pytest.mark.parametrize("name, text", [("gpt2", "JULIET:\nO Romeo, Romeo! wherefore art thou Romeo?"),
                                        ("tiny", "今天天气很好。你好，世界！🙂 But soft")])
def test_typing_a_text_shows_what_explore_py_writes_for_it(name, text, models, runs, open_page, tmp_path):
    """Every panel's data for a typed text (English on a char model, Chinese and emoji on a
    byte-level BPE one) is explore.py --prompt's for the same text: the same tokens and
    lens, the same numbers to float32's precision; the panels draw it."""
    run, out = runs[name]
    page = open_page(out.as_uri())
    ours = typed(page, text)
    written = tmp_path / "written.html"
    assert explore.main(["--checkpoint", str(run), "--prompt", text, "--out", str(written), "--lang", "en"]) == 0
    theirs = embedded(written.read_text(encoding="utf-8"))
    shown = {key: theirs[key] for key in theirs if key not in ("ablation", "texts", "timeline", "run")}
    for layer, ours_layer in zip(theirs["layers"], ours["layers"]):  # the file carries W_Q, W_K, W_V once, as weights
        assert layer.pop("c_attn") is None and set(ours_layer.pop("c_attn")) == {"weight", "bias"}
    # within torch's float32 rounding, of each value and of the largest terms its row sums
    assert_same_page_data({key: ours[key] for key in shown}, shown, atol=5e-5, rtol=1e-4, row_rtol=1e-5)
    assert ours["ablation"] is None and ours["texts"] | theirs["texts"] == ours["texts"]  # every token's text
    pieces = page.page.eval_on_selector_all("#tokens .piece", "nodes => nodes.map(n => n.textContent)")
    assert len(pieces) == len(theirs["tokens"]) and page.text("#status").startswith(f"{len(pieces)} tokens through the model, in this page")
    logits = decoded(theirs["prediction"]["logits"])
    likeliest = [i for i in np.argsort(-logits).tolist() if i not in theirs["prediction"]["suppressed"]][:5]
    assert page.page.eval_on_selector_all("#prediction tbody tr", "rows => rows.map(r => Number(r.dataset.id))")[:5] == likeliest
    assert page.errors == [] and page.requests == []


def test_a_hostile_text_typed_into_the_page_stays_text(runs, open_page):
    page = open_page(runs["tiny"][1].as_uri())  # byte-level BPE: it encodes any character
    data = typed(page, HOSTILE + "<img src=x onerror=alert(2)>")
    assert "".join(token["text"] for token in data["tokens"]) == HOSTILE + "<img src=x onerror=alert(2)>"
    assert page.page.evaluate("document.scripts.length") == 5 and page.page.evaluate("document.images.length") == 0
    assert page.dialogs == [] and page.errors == [] and page.requests == []


def test_a_character_the_model_never_saw_is_refused_and_the_panels_stay(runs, open_page):
    page = open_page(runs["gpt2"][1].as_uri())
    before = typed(page, "ROMEO: hello")
    page.page.fill("#prompt", "ROMEO: €")
    expect(page.page.locator("#status")).to_contain_text("€")
    assert "never saw" in page.text("#status")
    assert page.page.evaluate(f"() => ({PLAIN})(Page.data.tokens)") == before["tokens"]


def test_continue_runs_the_model_token_by_token_in_the_page(models, runs, open_page):
    gpt, tokenizer = models["gpt2"]
    page = open_page(runs["gpt2"][1].as_uri())
    typed(page, "ROMEO:\nBut soft")
    page.page.fill("#temperature", "0")
    page.page.fill("#continue-count", "12")
    page.page.click("#continue")
    page.page.wait_for_selector("#status[data-rate]", state="attached")
    prompt = tokenizer.encode("ROMEO:\nBut soft").ids
    expected = gpt.generate(torch.tensor([prompt]), 12, temperature=0)[0].tolist()
    assert page.page.input_value("#prompt") == readable_decode(tokenizer, expected)  # (the rule of data/token_text.py)
    assert float(page.page.get_attribute("#status", "data-rate")) > 0
    assert len(page.page.eval_on_selector_all("#tokens .token", "nodes => nodes")) == len(expected)


def test_every_head_switched_off_on_request_is_explore_pys_ablation(models, runs, open_page):
    gpt, tokenizer = models["gpt2"]
    page = open_page(runs["gpt2"][1].as_uri())
    text = "JULIET:\nO Romeo"
    typed(page, text)
    assert page.page.is_visible("#ablate-all")
    page.page.click("#ablate-all")
    page.page.wait_for_selector("#ablate-all[data-ms]", state="attached")
    ours = page.page.evaluate(f"() => ({PLAIN})(Page.data.ablation)")
    with torch.no_grad():
        theirs = ablated(gpt, tokenizer.encode(text).ids)
    for layer_ours, layer_theirs in zip(ours, theirs, strict=True):
        for head_ours, head_theirs in zip(layer_ours, layer_theirs, strict=True):
            assert head_ours["kl"] == pytest.approx(head_theirs["kl"], rel=1e-4, abs=1e-6)
            assert head_ours["ids"][:5] == head_theirs["ids"][:5]
    drawn = page.page.eval_on_selector_all("#ablation-grid button.ablate", "nodes => nodes.map(n => Number(n.dataset.kl))")
    assert drawn == [head["kl"] for layer in ours for head in layer]  # the grid draws them
    assert not page.page.is_visible("#ablate-all")


def test_a_model_too_large_for_its_page_keeps_the_example_and_says_why(runs, tmp_path, monkeypatch, capsys, open_page):
    run, _ = runs["gpt2"]
    monkeypatch.setattr(explorer.data, "MAX_PAGE_PARAMETERS", 1000)
    out = tmp_path / "page.html"
    assert explore.main(["--checkpoint", str(run), "--prompt", "ROMEO:", "--out", str(out), "--lang", "en"]) == 0
    assert "To type any text, serve it: python explore.py --serve" in capsys.readouterr().err
    html = out.read_text(encoding="utf-8")
    assert embedded_model(html) is None
    page = open_page(out.as_uri())
    page.page.wait_for_selector("#tokens .token")
    assert not page.page.is_visible("#prompt") and "--serve" in page.text("#prompt-note")


def test_a_notebook_shows_the_page_inline_where_typing_works_as_in_the_file(models, runs, open_page, tmp_path):
    """explorer.show's object, as a notebook shows it (its _repr_html_), twice on one page:
    each page in its own iframe, each running its model on what is typed into it."""
    import explorer

    gpt, tokenizer = models["gpt2"]
    run, _ = runs["gpt2"]
    cells = [explorer.show(run, "ROMEO:"), explorer.show(run, "JULIET:", lang="zh", height=600)]
    notebook = tmp_path / "notebook.html"
    notebook.write_text("<!doctype html><meta charset='utf-8'><title>notebook</title><div class='cell'>"
                        + "</div><div class='cell'>".join(cell._repr_html_() for cell in cells) + "</div>", encoding="utf-8")
    page = open_page(notebook.as_uri())
    frames = [page.page.frame_locator(f".cell:nth-child({n}) iframe") for n in (1, 2)]
    for frame, text in zip(frames, ("ROMEO: O Juliet", "JULIET: O")):
        frame.locator("#prompt").fill(text)
        expect(frame.locator("#status")).to_have_attribute("data-ms", re.compile(r"^\d"))
        expect(frame.locator("#tokens .token")).to_have_count(len(tokenizer.encode(text).ids))
    assert [frame.locator("html").get_attribute("lang") for frame in frames] == ["en", "zh-CN"]
    assert page.page.locator("iframe").nth(1).get_attribute("style").count("600px") == 1
    assert page.errors == [] and page.requests == []


# ---- proof that the comparisons above notice a broken forward pass ----------------------------

MUTANTS = {  # file, the line as it is, the line broken
    "no scale": ("numbers.js", "const factor = scale ? 1 / Math.sqrt(dk) : 1;", "const factor = 1;"),
    "scale by d_k": ("numbers.js", "const factor = scale ? 1 / Math.sqrt(dk) : 1;", "const factor = scale ? 1 / dk : 1;"),
    "mask one late": ("numbers.js", "(mask && j > query ? -Infinity : s)", "(mask && j > query + 1 ? -Infinity : s)"),
    "rotation's sign": ("model.js", "out[i] = vector[i] * cos - vector[i + half] * sin;",
                        "out[i] = vector[i] * cos + vector[i + half] * sin;"),
    "norm without ε": ("numbers.js", "divisor: Math.sqrt(spread / x.length + eps)", "divisor: Math.sqrt(spread / x.length)"),
    "norm with torch's default ε": ("model.js", "normStatistics(v, c.norm, c.norm_eps)", "normStatistics(v, c.norm, 1e-5)"),
    "groups": ("model.js", "const g = Math.floor(h / (H / Hkv));", "const g = h % Hkv;"),
    "erf cut short": ("model.js", "if (Math.abs(x) >= 4) return Math.sign(x);", "if (Math.abs(x) >= 2) return Math.sign(x);"),
    "sinusoid order": ("model.js", "pe[t * C + 2 * i] = Math.sin((past + t) * f);", "pe[t * C + 2 * i] = Math.cos((past + t) * f);"),
    "contraction 's": ("tokenizer.js", "`'s|'t|", "`'t|"),
    "spaces before a word": ("tokenizer.js", "|[${WS}]+(?![^${WS}])|", "|"),
    "JavaScript's \\s": ("tokenizer.js", 'const WS = "\\\\p{White_Space}";', 'const WS = "\\\\s";'),
    "the latest merge first": ("tokenizer.js", "(best === null || rank < best)", "(best === null || rank > best)"),
    "byte map": ("tokenizer.js", "(b >= 0xa1 && b <= 0xac)", "(b >= 0xa1 && b <= 0xad)"),
    "byte order mark dropped": ("tokenizer.js", "{ fatal: true, ignoreBOM: true }", "{ fatal: true }"),
    "any space a prefix": ("tokenizer.js", '!text.startsWith(" ")', "!/^\\s/.test(text)"),
}


@pytest.mark.slow
@pytest.mark.parametrize("mutant", MUTANTS)
def test_a_broken_forward_pass_or_tokenizer_is_caught(mutant, models, tmp_path, monkeypatch, open_page):
    """Each of these lines broken in a copy of the page's scripts: the comparison with torch
    (test_the_page_computes_torchs_logits_in_float64) fails for some model, or the one with
    `tokenizers` (test_the_pages_tokenizer_is_tokenizers) for some tokenizer."""
    name, line, broken = MUTANTS[mutant]
    scripts = tmp_path / "page"
    shutil.copytree(explorer.page.PAGE, scripts)
    source = (scripts / name).read_text(encoding="utf-8")
    assert source.count(line) == 1, "the line this mutant breaks has changed: update MUTANTS"
    (scripts / name).write_text(source.replace(line, broken), encoding="utf-8")
    monkeypatch.setattr(explorer.page, "PAGE", scripts)
    page = open_page(write_page(tmp_path / "broken.html", *models["tiny"], "ROMEO:").as_uri())
    if name == "tokenizer.js":
        caught = []
        for tokenizer in map(tokenizer_of, TOKENIZERS):
            try:
                caught.append(tokenized_in_page(page, tokenizer) != as_tokenizers_does(tokenizer))
            except PlaywrightError:  # a tokenizer that throws is caught too
                caught.append(True)
    else:
        caught = []
        for config in CONFIGS:
            gpt, tokenizer = models[config]
            difference, tolerance = gap(page, gpt, tokenizer, tokenizer.encode(TEXT).ids[:64])
            caught.append(not difference <= tolerance)  # NaN counts as caught
    assert any(caught), mutant


def rounded_snapshot(run, step: int) -> GPT:
    """The model of snapshot `step` with its weights rounded to float16, as the page carries them."""
    snapshot = run.load_snapshot(step, GPT.from_pretrained(run.path)).eval()
    with torch.no_grad():
        for p in snapshot.parameters():
            p.copy_(p.half().float())
    return snapshot


def slide(page, index: int) -> dict:
    """Move the timeline's slider to snapshot `index`: the page's data then."""
    page.page.eval_on_selector("#timeline-step", "(slider, s) => { slider.value = String(s); "
                               "slider.dispatchEvent(new Event('input')); }", index)
    return page.page.evaluate(f"() => ({PLAIN})(Page.data)")


SHOWN_AT_A_STEP = ("embedding", "layers", "ln_f", "prediction", "losses", "tokens", "config", "truncated")


def test_the_slider_shows_each_snapshots_model_in_every_panel(trained_run, open_page, tmp_path):
    """Where the page carries every snapshot (a small model), each step's data, for the
    example and for a typed text, is torch's forward pass of that snapshot on the same
    float16 weights: every panel follows the slider, and the last step is the trained model."""
    from runs.folder import RunDir

    run = RunDir(trained_run)
    out = tmp_path / "page.html"
    assert explore.main(["--checkpoint", str(trained_run), "--prompt", "MACBETH:\nSo foul", "--out", str(out)]) == 0
    page = open_page(out.as_uri())
    steps = page.page.evaluate("Page.data.timeline.steps")
    model, tokenizer = run.load_model()
    for index in (0, 2):
        ours = slide(page, index)
        ids = [t["id"] for t in ours["tokens"]]
        theirs = page_data(rounded_snapshot(run, steps[index]), tokenizer, ids)
        assert_same_page_data({key: ours[key] for key in SHOWN_AT_A_STEP}, {key: theirs[key] for key in SHOWN_AT_A_STEP},
                              skip=("c_attn",), atol=5e-5, rtol=1e-4, row_rtol=1e-5)
        assert page.text("#timeline-readout").startswith(f"step {steps[index]} of 20")
    ours = typed(page, "LADY MACBETH:\nThe raven himself is hoarse")  # (still at step 8)
    theirs = page_data(rounded_snapshot(run, steps[2]), tokenizer, [t["id"] for t in ours["tokens"]], ours["truncated"])
    assert_same_page_data({key: ours[key] for key in SHOWN_AT_A_STEP}, {key: theirs[key] for key in SHOWN_AT_A_STEP},
                          skip=("c_attn",), atol=5e-5, rtol=1e-4, row_rtol=1e-5)
    ours = slide(page, len(steps) - 1)  # the last step: the page's own model, float32
    theirs = page_data(model.eval(), tokenizer, [t["id"] for t in ours["tokens"]], ours["truncated"])
    assert_same_page_data({key: ours[key] for key in SHOWN_AT_A_STEP}, {key: theirs[key] for key in SHOWN_AT_A_STEP},
                          skip=("c_attn",), atol=5e-5, rtol=1e-4, row_rtol=1e-5)
    # a thumbnail of the timeline opens its head, at that step, in the panels below
    page.page.click('#timeline-maps canvas[data-layer="1"][data-head="1"]')
    assert page.page.evaluate("[Page.state.layer, Page.state.head]") == [1, 1]
    assert page.text("#map-title") == page.page.evaluate('Page.t("mapTitle", { layer: 1, head: 1 })')
