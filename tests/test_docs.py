"""The READMEs and the docs: every relative link resolves, the two languages link to each
other, the Python snippets run, and the front page stays short."""

import re
import subprocess
import sys

import pytest
import yaml

from common.checkpoint import DEFAULT_RUN
from conftest import ROOT

DOCS = ["README.md", "README.zh-CN.md", "docs/attention.md", "docs/attention.zh-CN.md", "docs/performance.md",
        "docs/performance.zh-CN.md", "docs/usage.md", "docs/usage.zh-CN.md", "docs/explorer.md",
        "docs/explorer.zh-CN.md"]


@pytest.mark.parametrize("name", DOCS)
def test_doc_links_resolve(name):
    path = ROOT / name
    text = path.read_text(encoding="utf-8")
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    assert links
    for link in links:
        if link.startswith(("http://", "https://", "#")):
            continue
        target = (path.parent / link.split("#")[0]).resolve()
        assert target.exists(), f"{name} links to {link}, which does not exist"


def test_each_english_page_links_to_its_chinese_twin_and_back():
    for english in DOCS[::2]:
        chinese = english.replace(".md", ".zh-CN.md")
        assert f"({chinese.split('/')[-1]})" in (ROOT / english).read_text()
        assert f"({english.split('/')[-1]})" in (ROOT / chinese).read_text(encoding="utf-8")
    for page in ("attention", "usage", "performance", "explorer"):
        assert f"(docs/{page}.md)" in (ROOT / "README.md").read_text()
        assert f"(docs/{page}.zh-CN.md)" in (ROOT / "README.zh-CN.md").read_text(encoding="utf-8")


@pytest.mark.parametrize("name", ["docs/attention.md", "docs/attention.zh-CN.md"])
def test_python_snippets_run(name):
    snippets = re.findall(r"```python\n(.*?)```", (ROOT / name).read_text(encoding="utf-8"), re.S)
    assert snippets
    for code in snippets:
        result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr[-2000:]


def test_rope_snippet_prints_what_it_says():
    code = re.findall(r"```python\n(.*?)```", (ROOT / "docs/attention.md").read_text(), re.S)[0]
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120).stdout
    a, b, c = (float(v) for v in out.split())
    assert abs(a - b) < 1e-4 and abs(a - c) > 1e-3


@pytest.mark.parametrize("name", ["README.md", "README.zh-CN.md"])
def test_front_page_is_short(name):
    # the session that split it found 29,851 characters; the measurements live in docs/performance
    assert len((ROOT / name).read_text(encoding="utf-8")) < 12_000


def test_generate_default_is_where_tiny_trains():
    assert yaml.safe_load((ROOT / "configs" / "tiny.yaml").read_text())["out_dir"] == str(DEFAULT_RUN)
