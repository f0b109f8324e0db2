"""The attention explorer in a real browser (Debian's Chromium through Playwright): from
file:// with the network blocked, and served by explore.py --serve on 127.0.0.1.

Without Chromium these tests skip, saying how to install it; under CI=true a missing
browser is a failure. A screenshot of each page goes to $TEST_ARTIFACTS (default
out/test-artifacts)."""

import http.client
import json
import math
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

import explore
from conftest import ROOT
from explorer.page import strings
from model import Sampling
from model.sampling import next_token_probabilities
from test_explorer import HOSTILE, embedded, make_run

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
                    "你好，hello")}
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


def test_the_file_page_loads_nothing_and_shows_the_five_steps(pages, open_page):
    path, data = pages["char"]
    page = open_page(path.as_uri())
    page.page.wait_for_selector("#steps tbody tr")
    page.page.click('.token[data-index="5"]')
    page.page.click('canvas.thumb[data-layer="1"][data-head="1"]')
    page.page.click('#steps td[data-step="1"][data-key="3"]')
    head = data["layers"][1]["heads"][1]
    q, k, v = (torch.tensor(head[n], dtype=torch.float64) for n in ("q", "k", "v"))
    T, dk = k.shape
    assert "layer 1, head 1" in page.text("#steps-title") and "query 5" in page.text("#steps-title")
    scores = k @ q[5]  # step 1: q·k for every key
    assert page.values('#steps td[data-step="1"]') == pytest.approx(scores.tolist(), abs=1e-5)
    assert page.values('#steps td[data-step="2"]') == pytest.approx((scores / math.sqrt(dk)).tolist(), abs=1e-5)
    masked = page.values('#steps td[data-step="3"]')
    assert all(x == -math.inf for x in masked[6:]) and masked[:6] == pytest.approx((scores / math.sqrt(dk))[:6].tolist())
    weights = page.values('#steps td[data-step="4"]')  # the page's softmax against the model's weights
    assert weights == pytest.approx([0.0 if w is None else w for w in head["weights"][5]], abs=1e-5)
    assert f"{sum(weights):.6f}" in page.text("#weights-sum")
    assert page.values("#terms li") == pytest.approx((q[5] * k[3]).tolist(), abs=1e-6)  # the clicked score's terms
    assert float(page.page.get_attribute("#terms .sum", "data-value")) == pytest.approx(scores[3].item(), abs=1e-5)
    output = json.loads(page.page.get_attribute("#output .vector", "data-values"))
    assert output == pytest.approx(head["output"][5], abs=1e-5)
    assert f"1/√{dk} = {1 / math.sqrt(dk):.6f}" in page.text("#step-2") and "the causal mask" in page.text("#step-3")
    assert "after the rotation" in page.text("#position-note")
    assert page.requests == [] and page.errors == []
    page.page.keyboard.press("Escape")  # unlocked: hovering previews another token
    page.page.hover('.token[data-index="2"]')
    assert "query 2" in page.text("#steps-title")
    page.screenshot("explorer-file.png")


def test_every_label_switches_to_chinese_and_back(pages, open_page):
    table = strings()
    page = open_page(pages["char"][0].as_uri())
    page.page.click("#lang")
    labels = page.page.eval_on_selector_all("[data-i18n]", "nodes => nodes.map(n => [n.dataset.i18n, n.textContent])")
    assert labels and all(text == table["zh"][key] for key, text in labels)
    assert page.page.evaluate("document.documentElement.lang") == "zh-CN"
    english = {text for key, text in table["en"].items() if text != table["zh"][key]}
    shown = page.page.eval_on_selector_all("body *", "nodes => nodes.map(n => n.childNodes.length === 1 ? n.textContent : '')")
    assert not english & set(shown)
    for selector, word in (("#steps-title", "五个步骤"), ("#step-2", "缩放"), ("#step-3", "因果掩码"),
                           ("#block-lines", "残差连接"), ("#map-title", "注意力权重")):
        assert word in page.text(selector)
    page.screenshot("explorer-zh.png")
    page.page.click("#lang")
    assert all(page.text(f'[data-i18n="{key}"]') == table["en"][key] for key in ("title", "headsTitle"))
    assert page.errors == []


def test_chinese_renders_without_replacement_characters(pages, open_page):
    for name in ("chinese", "bpe"):
        page = open_page(pages[name][0].as_uri())
        body = page.page.inner_text("body")
        assert "\ufffd" not in body and page.errors == []
    assert "今" in open_page(pages["chinese"][0].as_uri()).text("#tokens")
    tokens = page.text("#tokens")  # byte-level BPE: pieces of 你 and 好 as bytes, with the character
    assert "⟨" in tokens and ("→ 你" in tokens or "→ 好" in tokens)


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
    expected = next_token_probabilities(torch.tensor([prediction["logits"]]), sampling)[0]
    ids = [int(i) for i in page.page.eval_on_selector_all("#prediction tr[data-id]", "rows => rows.map(r => r.dataset.id)")]
    assert len(ids) == 20 and page.values("#prediction td.probability") == pytest.approx(expected[ids].tolist(), abs=1e-5)
    assert prediction["suppressed"] and page.text("#suppressed").startswith("Never generated: <unk>")


def test_a_hostile_prompt_runs_nothing(pages, open_page):
    page = open_page(pages["hostile"][0].as_uri())
    page.page.wait_for_selector("#tokens .token")
    pieces = page.page.eval_on_selector_all("#tokens .piece", "nodes => nodes.map(n => n.textContent)")
    assert "".join(pieces) == HOSTILE and page.dialogs == [] and page.errors == []
    assert page.page.evaluate("document.scripts.length") == 4


# ---- explore.py --serve --------------------------------------------------------------

def start_server(run: Path) -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen([sys.executable, str(ROOT / "explore.py"), "--serve", "--port", "0", "--checkpoint",
                             str(run), "--prompt", "ROMEO:", "--lang", "en"], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    match = re.search(r"http://127\.0\.0\.1:(\d+)/", line)
    assert match, line + proc.stderr.read()
    return proc, int(match.group(1))


@pytest.fixture(scope="module")
def served_run(tmp_path_factory):
    return make_run(tmp_path_factory.mktemp("served") / "run")


@pytest.fixture
def server(served_run):
    proc, port = start_server(served_run)
    yield proc, port
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def request(port: int, method: str, path: str, body: bytes | None = None, host: str | None = None):
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    headers = {"Host": host or f"127.0.0.1:{port}"}
    if body is not None:
        headers["Content-Type"] = "application/json"
    connection.request(method, path, body=body, headers=headers)
    response = connection.getresponse()
    answer = response.status, dict(response.getheaders()), response.read()
    connection.close()
    return answer


def api(port: int, path: str, payload) -> tuple[int, dict]:
    status, _, body = request(port, "POST", path, json.dumps(payload).encode())
    return status, json.loads(body)


def test_the_server_answers_its_api_and_refuses_the_rest(server):
    _, port = server
    status, headers, body = request(port, "GET", "/")
    assert status == 200 and headers["Content-Type"].startswith("text/html") and b"explorer-data" in body
    assert not any(h.lower().startswith("access-control") for h in headers)  # no CORS
    status, answer = api(port, "/api/explore", {"prompt": "But soft"})
    assert status == 200 and "".join(t["text"] for t in answer["data"]["tokens"]) == "But soft"
    status, answer = api(port, "/api/next", {"ids": answer["ids"], "temperature": 0})
    assert status == 200 and answer["prompt"].startswith("But soft") and len(answer["ids"]) == 9
    refused = [
        (request(port, "GET", "/", host="evil.example:80"), 421, "answers only to"),
        (request(port, "GET", "/tokenizer.json"), 404, "nothing at"),
        (request(port, "GET", "/../model.safetensors"), 404, "nothing at"),
        (request(port, "POST", "/api/run", b"{}"), 404, "no API"),
        (request(port, "PUT", "/", b"{}"), 405, "not supported"),
        (request(port, "POST", "/api/explore", b"{not json"), 400, "not JSON"),
        (request(port, "POST", "/api/explore", b'{"prompt": "\xff\xfe"}'), 400, "not UTF-8"),
        (request(port, "POST", "/api/explore", json.dumps({"prompt": "x" * 10_001}).encode()), 413, "at most 10,000"),
        (request(port, "POST", "/api/explore", b" " * (64 * 1024 + 1)), 413, "at most 65,536"),
        (request(port, "POST", "/api/explore", json.dumps({"prompt": "Zebra"}).encode()), 400, "never saw"),
        (request(port, "POST", "/api/explore", json.dumps({"prompt": ""}).encode()), 400, "empty"),
        (request(port, "POST", "/api/next", json.dumps({"ids": [10**6]}).encode()), 400, "token ids"),
        (request(port, "POST", "/api/next", json.dumps({"prompt": "R", "top_k": 0}).encode()), 400, "top_k"),
    ]
    for (status, _, body), expected, reason in refused:
        assert status == expected and reason in json.loads(body)["error"], body
    assert request(port, "GET", "/")[0] == 200  # still serving


def test_concurrent_requests_are_all_answered(server):
    _, port = server
    results = []
    threads = [threading.Thread(target=lambda i=i: results.append(api(port, "/api/next", {"prompt": "ROMEO:",
                                                                                          "temperature": 1.0})[0]))
               for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert results == [200] * 8


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
    page.page.click("#continue")
    expect(page.page.locator("#tokens .token")).to_have_count(11, timeout=30_000)
    expect(page.page.locator("#continue")).to_be_enabled()
    assert page.page.input_value("#prompt").startswith("But soft") and len(page.page.input_value("#prompt")) == 11
    assert page.requests == [] and page.errors == []
    page.screenshot("explorer-served.png")


def test_ctrl_c_stops_the_server(server):
    proc, port = server
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=20) == 0
    assert "stopped" in proc.stderr.read()
