"""The attention explorer in a real browser (Debian's Chromium through Playwright): from
file:// with the network blocked, and served by explore.py --serve on 127.0.0.1.

Without Chromium these tests skip, saying how to install it; under CI=true a missing
browser is a failure. A screenshot of each page goes to $TEST_ARTIFACTS (default
out/test-artifacts)."""

import json
import math
import os
import re
from pathlib import Path

import pytest
import torch

import explore
from conftest import ROOT
from explorer.page import strings
from model import Sampling
from model.sampling import next_token_probabilities
from explorer.data import decoded
from test_explorer import HOSTILE, embedded, embedded_model, make_run, trained_run  # noqa: F401 (a fixture)
from test_explorer_server import server, served_run  # noqa: F401 (fixtures)

try:
    from playwright.sync_api import expect, sync_playwright
except ImportError:  # the browser fixture says what to install
    expect = sync_playwright = None

CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = Path(os.environ.get("TEST_ARTIFACTS", ROOT / "out" / "test-artifacts"))
CHINESE = "今天天气很好。明天天气也很好，我们去公园吧！\n你好，世界。\n"


@pytest.fixture(scope="module")
def browser():
    missing = None if CHROMIUM.exists() else "no Chromium at /usr/bin/chromium: apt-get install -y chromium"
    if sync_playwright is None:
        missing = "no Playwright: pip install -r requirements-dev.txt"
    if missing:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true and {missing}")
        pytest.skip(missing)
    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        yield chromium
        chromium.close()


class Page:
    """A browser tab that blocks and records every request not for a file:// address, and
    records console errors, page errors and dialogs."""

    def __init__(self, browser, url: str, allow: str = "file:"):
        self.context = browser.new_context(viewport={"width": 1280, "height": 1800})
        self.requests, self.errors, self.dialogs = [], [], []

        def route(r):
            if r.request.url.startswith(allow):
                r.continue_()
            else:
                self.requests.append(r.request.url)
                r.abort()

        self.context.route("**/*", route)
        self.page = self.context.new_page()
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("dialog", lambda d: (self.dialogs.append(d.message), d.dismiss()))
        self.page.goto(url)

    def values(self, selector: str) -> list[float]:
        return [float(v) for v in self.page.eval_on_selector_all(selector, "cells => cells.map(c => c.dataset.value)")]

    def text(self, selector: str) -> str:
        return self.page.text_content(selector)

    def screenshot(self, name: str) -> None:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        self.page.screenshot(path=str(ARTIFACTS / name), full_page=True)

    def close(self) -> None:
        self.context.close()


@pytest.fixture(scope="module")
def pages(tmp_path_factory):
    """Explorer pages written by explore.py: {name: (path, data)}."""
    tmp = tmp_path_factory.mktemp("pages")
    runs = {"char": (make_run(tmp / "char"), "ROMEO:\nBut soft, what light through yonder"),
            "hostile": (make_run(tmp / "char2"), HOSTILE),
            "chinese": (make_run(tmp / "zh", text=CHINESE), "今天天气很好。你好，世界"),
            "bpe": (make_run(tmp / "bpe", text=CHINESE + "hello world\n", kind="bpe", vocab_size=262, pos_encoding="learned"),
                    "你好，hello"),
            # Qwen3's attention: QK-norm, heads of 24 in a stream of 32
            "qwen3": (make_run(tmp / "qwen3", qk_norm=True, head_dim=24, n_kv_head=1, norm="rmsnorm", mlp="swiglu",
                               bias=False), "ROMEO:\nBut soft, what light through yonder")}
    (runs["char"][0] / "config.yaml").write_text("train:\n  seed: 3\n")  # its page of the model at initialisation
    made = {}
    for name, (run, prompt) in runs.items():
        out = tmp / f"{name}.html"
        assert explore.main(["--checkpoint", str(run), "--prompt", prompt, "--out", str(out), "--lang", "en"]) == 0
        made[name] = (out, embedded(out.read_text(encoding="utf-8")))
    return made


@pytest.fixture
def open_page(browser):
    opened = []

    def open_(url: str, **kwargs) -> Page:
        opened.append(Page(browser, url, **kwargs))
        return opened[-1]

    yield open_
    for page in opened:
        page.close()


def array(a) -> list:
    return decoded(a).tolist()


def test_the_file_page_loads_nothing_and_shows_the_five_steps(pages, open_page):
    path, data = pages["char"]
    page = open_page(path.as_uri())
    page.page.wait_for_selector("#steps tbody tr")
    T = len(data["tokens"])
    assert f"query {(T - 1) // 2} " in page.text("#steps-title")  # it opens on the middle token
    page.page.click('.token[data-index="5"]')
    page.page.click('#grid canvas.thumb[data-layer="1"][data-head="1"]')
    page.page.click('#steps td[data-step="1"][data-key="3"]')
    head = data["layers"][1]["heads"][1]
    q, k, v = (torch.tensor(array(head[n]), dtype=torch.float64) for n in ("q", "k", "v"))
    T, dk = k.shape
    assert "layer 1, head 1" in page.text("#steps-title") and "query 5" in page.text("#steps-title")
    scores = k @ q[5]  # step 1: q·k for every key
    assert page.values('#steps td[data-step="1"]') == pytest.approx(scores.tolist(), abs=1e-5)
    assert page.values('#steps td[data-step="2"]') == pytest.approx((scores / math.sqrt(dk)).tolist(), abs=1e-5)
    masked = page.values('#steps td[data-step="3"]')
    assert all(x == -math.inf for x in masked[6:]) and masked[:6] == pytest.approx((scores / math.sqrt(dk))[:6].tolist())
    exps = (scores[:6] / math.sqrt(dk)).exp()  # step 4: e^score of every key it may see, and their sum
    assert page.values('#steps td[data-step="4e"]') == pytest.approx([*exps.tolist(), *[0.0] * (T - 6)], rel=1e-5)
    assert float(page.page.get_attribute("#exps-sum", "data-value")) == pytest.approx(exps.sum().item(), rel=1e-5)
    weights = page.values('#steps td[data-step="4"]')  # the page's softmax against the model's weights
    assert weights == pytest.approx(array(head["weights"])[5], abs=1e-5)
    assert f"{sum(weights):.6f}" in page.text("#weights-sum")
    assert page.values("#terms li") == pytest.approx((q[5] * k[3]).tolist(), abs=1e-6)  # the clicked score's terms
    assert float(page.page.get_attribute("#terms .sum", "data-value")) == pytest.approx(scores[3].item(), abs=1e-5)
    output = json.loads(page.page.get_attribute("#head-output", "data-values"))
    assert output == pytest.approx(array(head["output"])[5], abs=1e-5)
    shown = {n: json.loads(page.page.get_attribute(f'#output [data-name="{n}"]', "data-values")) for n in ("v_j", "w_j v_j")}
    assert shown["v_j"] == pytest.approx(v[3].tolist(), abs=1e-6)  # step 5: the picked key's value, and its share
    assert shown["w_j v_j"] == pytest.approx((weights[3] * v[3]).tolist(), abs=1e-5)
    assert f"1/√{dk} = {1 / math.sqrt(dk):.6f}" in page.text("#step-2") and "the causal mask" in page.text("#step-3")
    assert "the offset between query and key" in page.text("#position-note")  # and what q and k hold:
    assert "swapping two tokens changes it" in page.text("#position-note")  # (2, 5) is not (5, 2)
    assert page.requests == [] and page.errors == [] and page.dialogs == []
    page.page.keyboard.press("Escape")  # unlocked: hovering previews another token
    page.page.hover('.token[data-index="2"]')
    assert "query 2" in page.text("#steps-title")
    page.screenshot("explorer-file.png")


def shown(page, selector: str) -> list[float]:
    return json.loads(page.page.get_attribute(selector, "data-values"))


def test_each_panel_shows_the_models_own_numbers_for_the_picked_token(pages, open_page):
    """From the embedding to the logit lens, for token 5, layer 1, head 1: every vector on
    the page is the embedded one (or, where the page adds two of them, their sum); q before
    the rotation is LN(x) W_Q + b, and turned by RoPE it is the model's q."""
    from model.positional import RotaryEmbedding, apply_rotary

    path, data = pages["char"]
    c = data["config"]
    page = open_page(path.as_uri())
    page.page.click('.token[data-index="5"]')
    page.page.click('#grid canvas.thumb[data-layer="1"][data-head="1"]')
    layer = data["layers"][1]
    assert shown(page, '#embedding [data-name="wte"]') == pytest.approx(array(data["embedding"]["token"])[5], abs=1e-6)
    assert shown(page, '#embedding [data-name="sum"]') == pytest.approx(array(data["layers"][0]["residual_in"])[5], abs=1e-6)
    from safetensors.torch import load_file  # where a learner finds that row: tied, the file holds it as lm_head.weight

    token = data["tokens"][5]["id"]
    assert f"stores it once, as lm_head.weight: row {token} there" in page.text("#embedding")
    stored = load_file(path.parent / "char" / "model.safetensors")
    assert "transformer.wte.weight" not in stored
    assert stored["lm_head.weight"][token].tolist() == pytest.approx(shown(page, '#embedding [data-name="wte"]'), abs=1e-6)
    angle = float(page.page.get_attribute("#rope-angle", "data-value"))
    assert angle == pytest.approx(5.0) and "Position 5 enters in every layer" in page.text("#rope-angle")
    # 2. q, k and v: the model's, and q before the rotation from W_Q
    assert shown(page, '#qkv [data-name="ln_1"]') == pytest.approx(array(layer["ln_1"])[5], abs=1e-6)
    q_model = shown(page, '#qkv [data-name="q-model"]')
    assert q_model == pytest.approx(array(layer["heads"][1]["q"])[5], abs=1e-6)
    before = torch.tensor(shown(page, '#qkv [data-name="q-before"]'))
    cos, sin = RotaryEmbedding(c["head_size"], c["rope_base"])(torch.tensor([[5]]))
    assert apply_rotary(before, cos[0, 0], sin[0, 0])[0].tolist() == pytest.approx(q_model, abs=1e-5)
    assert shown(page, '#qkv [data-name="v-model"]') == pytest.approx(array(layer["heads"][1]["v"])[5], abs=1e-6)
    page.page.click('#qkv [data-which="q"] button.coordinate[data-dim="3"]')
    weights = embedded_model(path.read_text(encoding="utf-8"))["weights"]  # W_Q, W_K, W_V travel there, once
    assert layer["c_attn"] is None
    W, b = (decoded(weights[f"transformer.h.1.attn.c_attn.{name}"]) for name in ("weight", "bias"))
    row = 1 * c["head_size"] + 3  # head 1's coordinate 3 of q
    x = array(layer["ln_1"])[5]
    assert page.values("#projection-terms li") == pytest.approx([xi * w for xi, w in zip(x, W[row])], abs=1e-6)
    total = float(page.page.get_attribute("#projection-terms .sum", "data-value"))
    assert total == pytest.approx(float(x @ W[row] + b[row]), abs=1e-5) == pytest.approx(before[3].item(), abs=1e-5)
    # one notation: what is projected is LN(x) in every panel that names it, and LayerNorm subtracts the mean
    assert page.text("#projection-terms li").startswith("LN(x)[0] · W[0] = ") and "LN(x)[i] · W[i]" in page.text(
        "#projection-terms h3") and "LN(x) W_Q" in page.text("#qkv-note")
    assert page.text("#norm-stats").startswith("LayerNorm subtracted the stream's mean")
    # 4. after attention
    heads = [array(h["output"])[5] for h in layer["heads"]]
    assert shown(page, '#block [data-name="concat"]') == pytest.approx(sum(heads, []), abs=1e-6)
    attn, stream = array(layer["attn"])[5], array(layer["residual_in"])[5]
    assert shown(page, '#block [data-name="attn"]') == pytest.approx(attn, abs=1e-6)
    assert shown(page, '#block [data-name="mid"]') == pytest.approx([a + s for a, s in zip(attn, stream)], abs=1e-5)
    assert shown(page, '#block [data-name="ln_2"]') == pytest.approx(array(layer["ln_2"])[5], abs=1e-6)
    assert shown(page, '#block [data-name="mlp"]') == pytest.approx(array(layer["mlp"])[5], abs=1e-6)
    assert shown(page, '#block [data-name="residual_out"]') == pytest.approx(array(layer["residual_out"])[5], abs=1e-6)
    units = page.page.eval_on_selector_all("#block [data-unit]", "items => items.map(i => Number(i.dataset.unit))")
    assert units == layer["mlp_top"]["ids"][5] and page.values("#block [data-unit]") == pytest.approx(layer["mlp_top"]["values"][5])
    assert shown(page, '#block [data-name="ln_f"]') == pytest.approx(array(data["ln_f"])[5], abs=1e-6)  # (1 is the last)
    bars = page.page.eval_on_selector_all('#norms-chart rect[data-name="attn"]', "r => r.map(b => Number(b.dataset.value))")
    assert bars == pytest.approx([float(torch.tensor(array(l["attn"])[5]).norm()) for l in data["layers"]], rel=1e-5)
    # 5. the logit lens
    for l, stored in enumerate(data["layers"]):
        ids = page.page.eval_on_selector_all(f'#lens tr[data-layer="{l}"] td', "cells => cells.map(c => Number(c.dataset.id))")
        assert ids == stored["lens"]["ids"][5]
    # reading it: labels, lines, and one query across every head
    lines = page.page.eval_on_selector_all('#head-lines line[data-query="5"]', "ls => ls.map(l => [Number(l.dataset.key), Number(l.dataset.value)])")
    weights = array(layer["heads"][1]["weights"])[5]
    assert lines == [[j, pytest.approx(w, abs=1e-6)] for j, w in enumerate(weights[:6]) if w >= 0.01]
    strip = json.loads(page.page.get_attribute('#query-grid canvas[data-layer="0"][data-head="1"]', "data-values"))
    assert strip == pytest.approx(array(data["layers"][0]["heads"][1]["weights"])[5], abs=1e-6)
    assert page.errors == [] and page.requests == []
    for panel in ("embedding", "query", "map", "head-view", "qkv", "steps", "block", "lens", "prediction"):
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.page.locator(f"#{panel}-panel").screenshot(path=str(ARTIFACTS / f"explorer-panel-{panel}.png"))


def test_a_prompt_too_short_for_a_pattern_says_so(pages, open_page):
    """Fewer than 16 tokens make maps too small to show anything: the page says to give a
    longer text (the README's command gives the start of the validation text instead)."""
    said = strings()["en"]["shortText"].format(count=16)
    assert len(pages["bpe"][1]["tokens"]) < 16 <= len(pages["char"][1]["tokens"])
    assert said in open_page(pages["bpe"][0].as_uri()).text("#tokens-note")
    assert said not in open_page(pages["char"][0].as_uri()).text("#tokens-note")


def test_the_experiments_change_what_they_should_and_back(pages, open_page, monkeypatch):
    path, data = pages["char"]
    page = open_page(path.as_uri())
    page.page.click('.token[data-index="4"]')
    head = data["layers"][0]["heads"][0]
    q, k = torch.tensor(array(head["q"]), dtype=torch.float64), torch.tensor(array(head["k"]), dtype=torch.float64)
    scores = k @ q[4]
    own = page.values('#steps td[data-step="4"]')
    page.page.check("#no-scale")  # the softmax of unscaled scores: sharper
    unscaled = torch.softmax(scores.masked_fill(torch.arange(len(scores)) > 4, -math.inf), -1)
    assert page.values('#steps td[data-step="x"]') == pytest.approx(unscaled.tolist(), abs=1e-5)
    assert max(unscaled[:5]) > max(own) and page.values('#steps td[data-step="4"]') == own  # the model's stay
    note = page.text("#experiment-note")  # the scale's own note, not the mask's
    assert f"√d_k = {math.sqrt(len(q[4])):.3f} times larger" in note and "future" not in note
    assert page.text("#output h3:last-of-type") == "The output without 1/√d_k"
    page.page.uncheck("#no-scale")
    page.page.check("#no-mask")  # the future keys get weight
    unmasked = torch.softmax(scores / math.sqrt(len(q[4])), -1)
    assert page.values('#steps td[data-step="x"]') == pytest.approx(unmasked.tolist(), abs=1e-5)
    assert "The future keys now take" in page.text("#experiment-note")
    # the whole text as training scores it, with and without the mask: torch's pass without it
    import model.attention
    from runs.folder import RunDir

    gpt, _ = RunDir(path.parent / "char").load_model()
    ids = torch.tensor([[token["id"] for token in data["tokens"]]])
    five_steps = model.attention.scaled_dot_product_attention
    monkeypatch.setattr(model.attention, "scaled_dot_product_attention",
                        lambda query, key, value, mask=None, dropout_p=0.0: five_steps(query, key, value, None, dropout_p))
    with torch.no_grad():
        unmasked_loss = torch.nn.functional.cross_entropy(gpt.eval().trace(ids).logits[0, :-1], ids[0, 1:]).item()
    loss = page.page.locator("#whole-experiment-loss")
    assert float(loss.get_attribute("data-with")) == pytest.approx(sum(data["losses"]) / len(data["losses"]), abs=1e-5)
    assert float(loss.get_attribute("data-without")) == pytest.approx(unmasked_loss, abs=1e-4)
    assert "with the causal mask" in loss.text_content() and "no key comes after the last query" in loss.text_content()
    page.page.check("#no-scale")
    assert page.text("#output h3:last-of-type") == "The output without 1/√d_k and without the causal mask"
    page.page.uncheck("#no-scale")
    page.page.uncheck("#no-mask")
    assert page.page.eval_on_selector_all('#steps td[data-step="x"]', "c => c.map(x => x.textContent)") == [""] * len(own)
    assert page.page.query_selector("#experiment-output") is None
    assert page.text("#whole-experiment-loss") == ""
    # one head switched off: the model's run without it, beside the model's own
    best = max(((l, h) for l in range(2) for h in range(2)), key=lambda lh: data["ablation"][lh[0]][lh[1]]["kl"])
    assert f"layer {best[0]}, head {best[1]}" in page.text("#ablation-ranking")
    page.page.click(f'.ablate[data-layer="{best[0]}"][data-head="{best[1]}"]')
    off = data["ablation"][best[0]][best[1]]
    rows = page.page.eval_on_selector_all("#prediction tr[data-id]", "r => r.map(x => [Number(x.dataset.id), x.querySelector('.ablated').dataset.value])")
    logits = torch.from_numpy(decoded(off["logits"]).copy())[None]
    probs = next_token_probabilities(logits, Sampling(1.0, None, None, tuple(data["prediction"]["suppressed"])))[0]
    assert rows and all(float(v) == pytest.approx(probs[i].item(), abs=1e-6) for i, v in rows)
    assert f"with layer {best[0]}, head {best[1]} off" in page.text("#ablation-head")
    page.page.click(f'.ablate[data-layer="{best[0]}"][data-head="{best[1]}"]')  # and on again
    assert page.text("#ablation-head") == "" and page.errors == []


def test_tokens_cut_by_top_k_or_top_p_say_so(pages, open_page):
    page = open_page(pages["char"][0].as_uri())
    page.page.fill("#top-k", "3")
    cuts = page.page.eval_on_selector_all("#prediction td.probability", "c => c.map(x => x.dataset.cut)")
    assert cuts[:3] == ["", "", ""] and set(cuts[3:]) == {"topK"} and "0 (cut by top-k)" in page.text("#prediction")
    page.page.fill("#top-k", "")
    page.page.fill("#top-p", "0.05")
    cuts = page.page.eval_on_selector_all("#prediction td.probability", "c => c.map(x => x.dataset.cut)")
    assert cuts[0] == "" and "topP" in cuts and "cut by top-p" in page.text("#prediction")


def test_the_model_switch_shows_the_model_at_initialisation_and_back(pages, open_page):
    path, data = pages["char"]
    init = embedded((path.parent / "char.init.html").read_text(encoding="utf-8"))
    page = open_page(path.as_uri())
    page.page.click('.token[data-index="5"]')
    page.page.click('#grid canvas.thumb[data-layer="1"][data-head="0"]')
    page.page.click("#lang")
    assert page.text("#model-state") == "训练后的模型"
    page.page.click("#model-switch")
    page.page.wait_for_url("**/char.init.html#*")
    assert page.text("#model-state") == "初始化时的模型" and "层 1、头 0" in page.text("#steps-title")  # where it was
    assert page.values('#steps td[data-step="4"]') == pytest.approx(array(init["layers"][1]["heads"][0]["weights"])[5], abs=1e-5)
    assert init["model"] == "init" and init["tokens"] == data["tokens"]
    page.page.click("#model-switch")
    page.page.wait_for_url("**/char.html#*")
    assert page.text("#model-state") == "训练后的模型" and "token 5" in page.text("#steps-title")
    assert page.requests == [] and page.errors == []


def test_a_llama_style_block_shows_its_shared_keys_and_gated_network(tmp_path, open_page):
    """Grouped-query attention (2 query heads on 1 key/value head), SwiGLU, RMSNorm, no
    biases: q before the rotation is still LN(x) W_Q, the head's k is its group's, and the
    page says which heads share it."""
    from model.positional import RotaryEmbedding, apply_rotary

    run = make_run(tmp_path / "llama", n_head=2, n_kv_head=1, mlp="swiglu", norm="rmsnorm", bias=False)
    out = tmp_path / "llama.html"
    assert explore.main(["--checkpoint", str(run), "--prompt", "ROMEO:\nBut soft", "--out", str(out), "--lang", "en"]) == 0
    data = embedded(out.read_text(encoding="utf-8"))
    page = open_page(out.as_uri())
    page.page.click('.token[data-index="4"]')
    page.page.click('#grid canvas.thumb[data-layer="0"][data-head="1"]')
    assert "key/value head 0 of 1, shared by query heads 0 to 1" in page.text("#shared-kv")
    head = data["layers"][0]["heads"][1]
    assert head["k"] == data["layers"][0]["heads"][0]["k"]
    assert "RMSNorm divided the stream by its root mean square" in page.text("#norm-stats")
    before = torch.tensor(shown(page, '#qkv [data-name="k-before"]'))
    cos, sin = RotaryEmbedding(16)(torch.tensor([[4]]))
    assert apply_rotary(before, cos[0, 0], sin[0, 0])[0].tolist() == pytest.approx(array(head["k"])[4], abs=1e-5)
    assert page.values("#block [data-unit]") == pytest.approx(data["layers"][0]["mlp_top"]["values"][4])
    assert page.errors == []


def test_a_post_norm_block_projects_x_itself_and_says_so(tmp_path, open_page):
    """The paper's post-LN block: attention projects the stream x, not LN(x), and every
    panel that writes the projection says x."""
    run = make_run(tmp_path / "post", norm_position="post")
    out = tmp_path / "post.html"
    assert explore.main(["--checkpoint", str(run), "--prompt", "ROMEO:", "--out", str(out), "--lang", "en"]) == 0
    page = open_page(out.as_uri())
    page.page.click('#qkv [data-which="q"] button.coordinate[data-dim="0"]')
    assert page.text("#projection-terms li").startswith("x[0] · W[0] = ") and "x W_Q" in page.text("#qkv-note")
    assert "LN(x)" not in page.text("#qkv-panel") and page.errors == []


def test_every_label_switches_to_chinese_and_back(pages, open_page):
    table = strings()
    page = open_page(pages["char"][0].as_uri())
    page.page.click("#lang")
    labels = page.page.eval_on_selector_all("[data-i18n]", "nodes => nodes.map(n => [n.dataset.i18n, n.textContent])")
    assert labels and all(text == table["zh"][key] for key, text in labels)
    assert page.page.evaluate("document.documentElement.lang") == "zh-CN"
    english = {text for key, text in table["en"].items() if text != table["zh"][key] and re.search("[A-Za-z]", text)}
    english -= set(table["zh"].values())  # (what Chinese says the same way: "token")
    shown = page.page.eval_on_selector_all("body *", "nodes => nodes.map(n => n.childNodes.length === 1 ? n.textContent : '')")
    assert not english & set(shown)
    for selector, word in (("#steps-title", "五个步骤"), ("#step-2", "缩放"), ("#step-3", "因果掩码"),
                           ("#block", "残差连接"), ("#map-title", "注意力权重"), ("#grid", "层 0"), ("#grid", "头 0")):
        assert word in page.text(selector)
    page.screenshot("explorer-zh.png")
    page.page.click("#lang")
    assert all(page.text(f'[data-i18n="{key}"]') == table["en"][key] for key in ("title", "headsTitle"))
    assert page.errors == []


def test_the_chinese_page_uses_chinese_punctuation_and_no_negative_zero(pages, open_page):
    """Every string the script assembles in Chinese (notes joined, lists of heads) keeps
    full-width punctuation, no ASCII comma or colon beside a Chinese character; and no
    number is written "−0.000" in either language."""
    page = open_page(pages["char"][0].as_uri())
    assert page.page.evaluate('Page.t("tokensNote", { count: 1 })').startswith("1 token;")  # not "1 tokens"
    assert page.page.evaluate('Page.t("tokensNote", { count: 2 })').startswith("2 tokens;")
    page.page.click('.token[data-index="6"]')
    page.page.check("#no-scale")
    page.page.check("#no-mask")
    page.page.click('.ablate[data-layer="0"][data-head="1"]')
    for lang in ("en", "zh"):
        body = page.page.inner_text("main")
        assert not re.search(r"−0\.0+(?!\d*[1-9])\b", body), lang
        if lang == "en":
            page.page.click("#lang")
    mixed = re.findall(r"[\u4e00-\u9fff][,;:!?]\s|[,;:!?] [\u4e00-\u9fff]", page.page.inner_text("body"))
    assert mixed == [] and page.errors == []
    listed = page.text("#ablation-ranking").split("其次是")[1].split("。")[0].strip().split("；")  # one mark between heads,
    assert len(listed) == 3 and all(re.fullmatch(r"层 \d+、头 \d+", head) for head in listed)  # another inside one
    assert page.page.evaluate("View.fmt(-0.00001, 4)") == "0.0000" and page.page.evaluate("View.fmt(-0.5, 2)") == "−0.50"


def test_chinese_renders_without_replacement_characters(pages, open_page):
    for name in ("chinese", "bpe"):
        page = open_page(pages[name][0].as_uri())
        body = page.page.inner_text("body")
        assert "\ufffd" not in body and page.errors == []
    assert "今" in open_page(pages["chinese"][0].as_uri()).text("#tokens")
    tokens = page.text("#tokens")  # byte-level BPE: pieces of 你 and 好 as bytes, with the character
    assert "⟨" in tokens and ("→ 你" in tokens or "→ 好" in tokens)
    labels = page.page.eval_on_selector_all("#head-lines text", "nodes => nodes.map(n => n.textContent)")
    assert any("⟨你⟩" in label or "⟨好⟩" in label for label in labels)  # the maps' axes: the character, not bytes
    assert not any(re.search(r"⟨[0-9a-f]{2}", label) for label in labels)


@pytest.mark.parametrize("temperature, top_k, top_p", [("1", "", ""), ("0.7", "5", "0.9"), ("2", "", "0.5"),
                                                       ("0", "", ""), ("1.3", "3", "")])
def test_sampling_controls_follow_model_sampling(pages, open_page, temperature, top_k, top_p):
    path, data = pages["char"]
    page = open_page(path.as_uri())
    for selector, value in (("#temperature", temperature), ("#top-k", top_k), ("#top-p", top_p)):
        page.page.fill(selector, value)
    prediction = data["prediction"]
    sampling = Sampling(float(temperature), int(top_k) if top_k else None, float(top_p) if top_p else None,
                        tuple(prediction["suppressed"]))
    expected = next_token_probabilities(torch.from_numpy(decoded(prediction["logits"]).copy())[None], sampling)[0]
    ids = [int(i) for i in page.page.eval_on_selector_all("#prediction tr[data-id]", "rows => rows.map(r => r.dataset.id)")]
    assert len(ids) == 20 and page.values("#prediction td.probability") == pytest.approx(expected[ids].tolist(), abs=1e-5)
    assert prediction["suppressed"] and page.text("#suppressed").startswith("Never generated: <unk>")
    page.page.click('.ablate[data-layer="1"][data-head="0"]')  # a head off: its column by the same rule
    off = torch.from_numpy(decoded(data["ablation"][1][0]["logits"]).copy())[None]
    expected_off = next_token_probabilities(off, sampling)[0]
    assert page.values("#prediction td.ablated") == pytest.approx(expected_off[ids].tolist(), abs=1e-5)
    assert page.text("#ablation-head") == "with layer 1, head 0 off"


def test_the_page_says_what_the_run_trained_and_warns_when_it_barely_did(micro, tmp_path, open_page):
    import train
    from runs.folder import RunDir

    settings = micro("train.max_iters=4", "train.warmup_iters=100", "train.sample_tokens=0")
    assert train.main(["--config", str(ROOT / "configs" / "tiny.yaml"), *settings]) == 0
    out = tmp_path / "page.html"
    assert explore.main(["--checkpoint", str(tmp_path / "run"), "--prompt", "RO", "--out", str(out), "--lang", "en"]) == 0
    loss = RunDir(tmp_path / "run").summary()["val_loss"]
    page = open_page(out.as_uri())
    assert page.text("#run-line") == (f"Its training: 4 iterations, 1,024 tokens, validation loss {loss:.4f}; the page "
                                      "shows the trained weights.")  # 4 steps of 8 windows of 32 tokens
    assert page.page.is_visible("#run-warning") and page.text("#run-warning").startswith(
        "This model is barely trained: its run stopped inside its learning-rate warm-up, at iteration 4 of 100.")
    page.page.click("#lang")
    assert page.text("#run-warning").startswith("这个模型几乎没有训练：它的训练在学习率预热期间就停了，停在第 4 次迭代（预热共 100 次）。")
    page.page.click("#model-switch")  # the model at initialisation: no run to speak of
    assert page.text("#run-line") == "" and not page.page.is_visible("#run-warning")
    assert page.errors == []
    # a run fitted to a time budget on a busy machine: what it got against its best pace
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    summary["pace"] = {"best_pace": 0.125, "timed_iterations": 300, "at_best_pace": 1200, "busy_share": 0.6}
    (tmp_path / "run" / "summary.json").write_text(json.dumps(summary))
    assert explore.main(["--checkpoint", str(tmp_path / "run"), "--prompt", "RO", "--out", str(out), "--lang", "en"]) == 0
    page = open_page(out.as_uri())
    assert page.text("#run-line").endswith(
        "At the best pace the run measured on its machine (125 ms an iteration), its timed training would have held "
        "1,200 iterations; it held 300. The machine was busy with other work for 60% of the training time, so the run "
        "trained less than the docs' runs.")


def test_a_map_of_the_whole_model_lights_the_panel_being_read(pages, open_page):
    """At the top: token → embedding → [norm → attention → + → norm → FFN → +] × L → final norm →
    head → probabilities, each piece a link to its panel; the pieces of the panel being read
    are lit, and the layer picked is named."""
    page = open_page(pages["char"][0].as_uri())
    pieces = page.page.eval_on_selector_all("#model-map a", "links => links.map(a => [a.textContent, a.dataset.panel])")
    assert [label for label, _ in pieces] == ["token", "embedding", "LayerNorm", "attention", "+", "LayerNorm",
                                             "feed-forward network", "+", "final LayerNorm", "LM head", "probabilities"]
    assert all(page.page.query_selector(f"section#{panel}") for _, panel in pieces)
    assert "× 2 layers (now layer 0)" in page.text("#model-map")
    page.page.click('#grid canvas.thumb[data-layer="1"][data-head="0"]')
    assert "× 2 layers (now layer 1)" in page.text("#model-map")
    page.page.click('#model-map a[data-panel="block-panel"]')  # jump to the block: its four pieces light up
    expect(page.page.locator("#model-map a.current")).to_have_count(4)
    lit = page.page.eval_on_selector_all("#model-map a.current", "links => links.map(a => a.textContent)")
    assert lit == ["+", "LayerNorm", "feed-forward network", "+"]
    page.page.click('#model-map a[data-panel="steps-panel"]')
    expect(page.page.locator("#model-map a.current")).to_have_text(["attention"])
    page.page.click("#lang")
    assert "× 2 层（现在是层 1）" in page.text("#model-map") and page.errors == []


def test_each_panel_states_its_formula_for_this_model(pages, open_page):
    rope = open_page(pages["char"][0].as_uri())
    formula = lambda page, panel: page.text(f'[data-formula="{panel}"]')
    assert formula(rope, "embedding").startswith("x = wte[id];  q, k rotated")  # RoPE: nothing added here
    assert formula(rope, "qkv") == "q = LN(x) W_Q + b_Q;  k = LN(x) W_K + b_K;  v = LN(x) W_V + b_V"
    assert formula(rope, "steps") == "Attention(q, K, V) = softmax(q Kᵀ / √d_k + mask) V"
    assert "FFN(h) = GELU(h W_1 + b_1) W_2 + b_2" in formula(rope, "block")
    learned = open_page(pages["bpe"][0].as_uri())
    assert formula(learned, "embedding") == "x = wte[id] + wpe[position]"


def test_vectors_are_drawn_as_strips_of_colour_with_their_numbers(pages, open_page):
    path, data = pages["char"]
    page = open_page(path.as_uri())
    page.page.click('.token[data-index="5"]')
    wte = array(data["embedding"]["token"])[5]
    cells = page.page.eval_on_selector_all('#embedding [data-strip="wte"] span',
                                           "cells => cells.map(c => [c.title, getComputedStyle(c).backgroundColor])")
    assert len(cells) == len(wte) == data["config"]["n_embd"]
    top, bottom = max(range(len(wte)), key=lambda i: wte[i]), min(range(len(wte)), key=lambda i: wte[i])
    assert cells[top] == [f"[{top}] {wte[top]:.4f}", "rgb(214, 40, 40)"]  # the largest: full red
    assert cells[bottom][1] != "rgb(214, 40, 40)" and cells[bottom][1].startswith("rgb(") and wte[bottom] < 0
    red, green, blue = map(int, re.findall(r"\d+", cells[bottom][1]))
    assert blue > red  # below 0: blue


def test_control_characters_are_drawn_as_visible_signs(pages, open_page):
    """A token of a control character (U+0017 in a logit lens) is drawn as its bytes, as a
    cut character is, in signs every font has (Debian's have no control pictures such as
    ␗); a space, a newline and a tab as ␣ ↵ ⇥."""
    page = open_page(pages["char"][0].as_uri())
    assert page.page.evaluate(r"View.visible('a\u0017b\u007f \n\t\r\u0085\u200b\u202e!')") == \
        "a⟨17⟩b⟨7f⟩␣↵⇥⟨0d⟩⟨c2 85⟩⟨e2 80 8b⟩⟨e2 80 ae⟩!"
    assert not re.search("[\u2400-\u2422\u2424-\u2426]", page.page.inner_text("body"))  # (but ␣, which they have)
    lens = page.page.eval_on_selector_all("#lens .piece", "nodes => nodes.map(n => n.textContent)")
    assert lens and not any(re.search(r"[\x00-\x1f\x7f-\x9f]", piece) for piece in lens)


def test_a_hostile_prompt_runs_nothing(pages, open_page):
    page = open_page(pages["hostile"][0].as_uri())
    page.page.wait_for_selector("#tokens .token")
    pieces = page.page.eval_on_selector_all("#tokens .piece", "nodes => nodes.map(n => n.textContent)")
    assert "".join(pieces) == HOSTILE and page.dialogs == [] and page.errors == []
    assert page.page.evaluate("document.scripts.length") == 5


# ---- explore.py --serve, in the browser (the server itself: tests/test_explorer_server.py) ----

def test_a_typed_prompt_updates_the_page_token_by_token(server, open_page):
    _, port = server
    page = open_page(f"http://127.0.0.1:{port}/", allow=f"http://127.0.0.1:{port}/")
    page.page.wait_for_selector("#tokens .token")
    assert page.page.input_value("#prompt") == "ROMEO:"
    page.page.fill("#prompt", "But soft")
    page.page.click("#show")
    expect(page.page.locator("#tokens .token")).to_have_count(8)
    page.page.fill("#continue-count", "3")
    page.page.fill("#temperature", "0")
    page.page.evaluate("""() => { window.statuses = [];
      new MutationObserver(() => statuses.push(document.getElementById("status").textContent))
        .observe(document.getElementById("status"), { childList: true, characterData: true, subtree: true }); }""")
    page.page.click("#continue")
    expect(page.page.locator("#tokens .token")).to_have_count(11, timeout=30_000)
    expect(page.page.locator("#continue")).to_be_enabled()
    counted = [text for text in page.page.evaluate("statuses") if text.startswith("token")]
    assert counted == ["token 1 of 3…", "token 2 of 3…", "token 3 of 3…"]
    assert page.page.input_value("#prompt").startswith("But soft") and len(page.page.input_value("#prompt")) == 11
    # where a score comes from: the server splits the picked one (the page does not run a served model)
    page.page.click('#grid canvas.thumb[data-layer="1"][data-head="0"]')
    expect(page.page.locator("#sources tbody tr")).not_to_have_count(0)
    total = page.values("#sources-total")[0]
    key = int(re.search(r"key (\d+) ", page.text("#sources-title")).group(1))
    assert total == pytest.approx(page.values(f'#steps tr[data-key="{key}"] td[data-step="2"]')[0], abs=1e-4)
    assert page.requests == [] and page.errors == []
    page.screenshot("explorer-served.png")


def test_the_servers_refusals_are_in_the_pages_language(server, open_page):
    _, port = server
    page = open_page(f"http://127.0.0.1:{port}/", allow=f"http://127.0.0.1:{port}/")
    page.page.wait_for_selector("#tokens .token")
    page.page.click("#lang")
    page.page.fill("#prompt", "Zebra")
    page.page.click("#show")
    expect(page.page.locator("#status")).to_have_text("提示词里有这个模型训练时从未见过的字符：'Z'；请删掉或替换它们。")
    page.page.fill("#prompt", "")
    page.page.click("#show")
    expect(page.page.locator("#status")).to_have_text("提示词是空的；请输入一些文字。")
    page.page.fill("#prompt", "R" * 70_000)  # a request body over the server's 64 KiB
    page.page.click("#show")
    expect(page.page.locator("#status")).to_have_text(re.compile(r"^请求有 \d+ 字节；服务器最多只接受 65536 字节。"))
    page.page.fill("#prompt", "But soft")
    page.page.click("#show")
    expect(page.page.locator("#tokens .token")).to_have_count(8)
    page.page.click("#model-switch")  # served: the server re-creates the model at initialisation
    expect(page.page.locator("#model-state")).to_have_text("初始化时的模型")
    assert [e for e in page.errors if not re.search("status of 4(00|13)", e)] == []  # (Chromium notes each refusal)


@pytest.mark.slow  # (more than ten seconds here)
def test_the_docs_screenshots_are_taken_of_what_was_clicked(pages, browser, tmp_path):
    """python -m explorer.screenshot (the docs' pictures; a process of its own, as Playwright
    allows one sync session a thread): a clip of --height pixels at the page's width, or one
    panel; the clicks and the language change what the picture shows."""
    import struct
    import subprocess
    import sys

    def screenshot(*args: str) -> str:
        result = subprocess.run([sys.executable, "-m", "explorer.screenshot", str(pages["char"][0]), *args],
                                cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr[-2000:]
        return result.stdout

    def size(png: Path) -> tuple[int, int]:
        data = png.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
        return struct.unpack(">II", data[16:24])

    assert f"wrote {tmp_path / 'clip.png'}" in screenshot(str(tmp_path / "clip.png"), "--height", "400")
    assert size(tmp_path / "clip.png") == (1280, 400)
    chosen = ["--panel", "#qkv-panel", "--layer", "1", "--head", "1", "--query", "3", "--coordinate", "0"]
    screenshot(str(tmp_path / "en.png"), *chosen)
    screenshot(str(tmp_path / "zh.png"), *chosen, "--lang", "zh")
    screenshot(str(tmp_path / "other.png"), *chosen[:-2])  # no coordinate expanded
    assert size(tmp_path / "en.png")[0] < 1280  # the panel alone
    assert len({(tmp_path / f"{name}.png").read_bytes() for name in ("en", "zh", "other")}) == 3


@pytest.mark.slow  # (more than ten seconds here)
def test_the_slider_walks_the_model_from_its_initialisation_to_the_end(trained_run, tmp_path, open_page, monkeypatch):
    """The timeline of a model too large for its page to carry every snapshot (the limit set
    to 0) opens at the trained model; Home, the arrow keys and End move through the
    snapshots, and the readout, the prediction, the sample and the charts follow, with the
    numbers of the page's data; in both languages, with no error and no request."""
    import explorer.data

    monkeypatch.setattr(explorer.data, "MAX_SNAPSHOT_BYTES", 0)
    out = tmp_path / "timeline.html"
    assert explore.main(["--checkpoint", str(trained_run), "--prompt", "MACBETH:\nSo foul", "--out", str(out),
                         "--lang", "en"]) == 0
    timeline = embedded(out.read_text(encoding="utf-8"))["timeline"]
    page = open_page(out.as_uri())
    page.page.wait_for_selector("#timeline-prediction tbody tr")
    expect(page.page.locator("#timeline-readout")).to_have_text(
        "step 20 of 20: validation loss (the run's own figure, on its 16 evaluation windows) "
        f"{timeline['loss'][-1]:.4f}")

    def shows(s: int) -> None:
        assert page.values("#timeline-prediction td.num") == pytest.approx(timeline["prediction"][s]["values"], abs=1e-6)
        assert page.text("#timeline-sample").endswith(timeline["samples"][s])
        assert page.text("#timeline-prediction-title").endswith(f"at step {timeline['steps'][s]}")
        dots = dict(page.page.eval_on_selector_all("#timeline-previous_token circle",
                                                    "dots => dots.map(d => [d.dataset.key, Number(d.dataset.value)])"))
        assert dots == pytest.approx({f"{l}.{h}": v for l, layer in enumerate(timeline["scores"]["previous_token"][s])
                                      for h, v in enumerate(layer)}, abs=1e-6)

    shows(5)
    page.page.focus("#timeline-step")
    page.page.keyboard.press("Home")
    expect(page.page.locator("#timeline-readout")).to_contain_text("step 0 of 20")
    shows(0)
    page.page.keyboard.press("ArrowRight")
    page.page.keyboard.press("ArrowRight")
    expect(page.page.locator("#timeline-readout")).to_contain_text("step 8 of 20")
    shows(2)
    assert page.page.locator("canvas.timeline-map").count() == 4  # 2 layers × 2 heads
    for kind in ("previous_token", "induction"):  # the head that scores highest at the end is named
        last, first = timeline["scores"][kind][-1], timeline["scores"][kind][0]
        layer, head = max(((l, h) for l in range(2) for h in range(2)), key=lambda lh: last[lh[0]][lh[1]])
        said = page.text(f'#timeline-best [data-kind="{kind}"]')
        assert f"layer {layer}, head {head}" in said and f"{last[layer][head]:.3f}" in said
        assert said.startswith("Highest" if last[layer][head] > 2 * first[layer][head] else "No head has learnt")
    page.page.click("#lang")
    expect(page.page.locator("#timeline-readout")).to_contain_text("第 8 步（最后一步是 20）")
    assert "归纳得分" in page.text("#timeline-panel")
    page.page.keyboard.press("End")
    assert not page.errors and not page.requests and not page.dialogs
    # the docs' pictures of the timeline: explorer.screenshot --step picks the snapshot
    import subprocess
    import sys

    shots = []
    for step in ("0", "20", "3"):
        shots.append(tmp_path / f"step{step}.png")
        result = subprocess.run([sys.executable, "-m", "explorer.screenshot", str(out), str(shots[-1]), "--step", step,
                                 "--panel", "#timeline-panel"], cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert result.returncode == (1 if step == "3" else 0), result.stderr[-2000:]
    assert "--step 3: the page's snapshots are at steps [0, 4, 8, 12, 16, 20]" in result.stderr
    assert shots[0].read_bytes() != shots[1].read_bytes()


# Three English words in a row: a sentence, where one word ("token", "softmax", "top-k") is a term
ENGLISH = re.compile(r"[A-Za-z][A-Za-z'’-]+(?:[ ,]+[A-Za-z][A-Za-z'’-]+){2,}")
SHOWN = """() => {
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  const texts = [];
  while (walker.nextNode()) {
    if (!["SCRIPT", "STYLE"].includes(walker.currentNode.parentNode.tagName)) texts.push(walker.currentNode.textContent);
  }
  for (const node of document.querySelectorAll("[title], [placeholder], [aria-label]"))
    texts.push(node.title || "", node.placeholder || "", node.getAttribute("aria-label") || "");
  return texts;
}"""


@pytest.mark.slow  # (a run with snapshots, then the page in several states: about ten seconds)
def test_the_chinese_page_shows_no_english_sentence_in_any_state(tmp_path, open_page, monkeypatch):
    """Every string the page can show in Chinese: its words (strings.json), and what the
    scripts assemble on the page of a run trained on Chinese text (so that no sentence comes
    from the model's text) in each state a learner reaches: the timeline at a step, a token
    picked, every experiment on, a head switched off, text typed and continued."""
    import explorer.data
    import train

    table = strings()["zh"]
    assert not [(key, text) for key, text in table.items() if ENGLISH.search(text)]
    text = tmp_path / "zh.txt"
    text.write_text(CHINESE * 200, encoding="utf-8")
    assert train.main(["--config", str(ROOT / "configs" / "tiny.yaml"), f"data.source={text}", "data.tokenizer=char",
                       f"data.cache_dir={tmp_path / 'cache'}", f"out_dir={tmp_path / 'run'}", "model.n_layer=2",
                       "model.n_head=2", "model.n_embd=32", "model.block_size=32", "train.batch_size=8",
                       "train.max_iters=8", "train.eval_interval=4", "train.eval_iters=2", "train.warmup_iters=2",
                       "train.sample_tokens=0", "train.dtype=float32", "train.threads=1", "train.max_minutes=null",
                       "train.snapshots=16", "train.snapshot_every=4"]) == 0
    seen = []
    for carried in (False, True):  # a larger model's page (the example's step tables) and a small one's
        monkeypatch.setattr(explorer.data, "MAX_SNAPSHOT_BYTES", 6e6 if carried else 0)
        out = tmp_path / f"zh-{carried}.html"
        assert explore.main(["--checkpoint", str(tmp_path / "run"), "--prompt", "今天天气很好。明天", "--out", str(out),
                             "--lang", "zh"]) == 0
        page = open_page(out.as_uri())
        page.page.wait_for_selector("#timeline-readout:not(:empty)")
        seen.extend((carried, s) for s in page.page.evaluate(SHOWN) if ENGLISH.search(s))

    def look(state: str) -> None:
        seen.extend((state, s) for s in page.page.evaluate(SHOWN) if ENGLISH.search(s))

    page.page.focus("#timeline-step")
    page.page.keyboard.press("Home")
    look("step 0")
    page.page.keyboard.press("End")
    page.page.click('.token[data-index="3"]')
    page.page.check("#no-scale")
    page.page.check("#no-mask")
    page.page.click('.ablate[data-layer="1"][data-head="0"]')
    look("experiments")
    page.page.fill("#prompt", "你好，世界。今天")
    page.page.wait_for_selector("#status[data-ms]", state="attached")
    page.page.click("#continue")
    expect(page.page.locator("#prompt")).not_to_have_value("你好，世界。今天")
    look("typed and continued")
    assert [(state, ENGLISH.findall(s)) for state, s in seen] == [] and not page.errors


@pytest.mark.parametrize("name", ["char", "bpe", "qwen3"])
def test_where_a_score_comes_from_is_torch_s_split_cell_for_cell(pages, open_page, name):
    """The page splits the picked score (layer 1: the stream's pieces through the norm, W_Q,
    W_K, QK-norm and the rotation) as inspection/circuits.py does on the same weights: every cell and
    the lead over the other keys, to float32's rounding; the cells add up to step 2's score;
    a click on another key in the five steps splits that one's; in both languages."""
    from inspection.circuits import score_sources
    from model import GPT

    path, data = pages[name]
    model = GPT.from_pretrained(path.parent / name).eval()
    ids = [token["id"] for token in data["tokens"]]
    with torch.no_grad():
        trace = model.trace(torch.tensor([ids]))
    page = open_page(path.as_uri())
    page.page.click('#grid canvas.thumb[data-layer="1"][data-head="1"]')
    query = len(ids) - 2
    page.page.click(f'.token[data-index="{query}"]')
    for key in (None, 2):
        if key is not None:
            page.page.click(f'#steps td[data-step="1"][data-key="{key}"]')
        weights = trace.layers[1].weights[0, 1, query, :query + 1]
        picked = int(weights.argmax()) if key is None else key
        expected = score_sources(model, trace, 1, 1, query, picked)
        assert f"key {picked} " in page.text("#sources-title")
        cells = page.values("#sources tbody td[data-key]")
        size = sum(abs(x) for row in expected["contributions"] for x in row)
        assert cells == pytest.approx([x for row in expected["contributions"] for x in row], abs=2e-6 * max(1.0, size))
        total = page.values("#sources-total")[0]
        step_2 = page.values(f'#steps tr[data-key="{picked}"] td[data-step="2"]')[0]
        assert total == pytest.approx(step_2, abs=1e-5 * max(1.0, size)) and total == pytest.approx(expected["score"], abs=1e-4)
        assert page.values('.source-bar[data-side="key"]') == pytest.approx(expected["others"]["key"], abs=1e-4)
        assert page.values('.source-bar[data-side="query"]') == pytest.approx(expected["others"]["query"], abs=1e-4)
    page.page.click("#lang")
    assert "分数从哪里来" in page.text("#sources-title") and not page.errors and not page.requests
    page.screenshot(f"sources-{name}.png")
