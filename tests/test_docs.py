"""The READMEs and the code tour: every relative link resolves, and the two languages link to each other."""

import re

import pytest

from conftest import ROOT

DOCS = ["README.md", "README.zh-CN.md", "docs/attention.md", "docs/attention.zh-CN.md"]


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


def test_the_readmes_link_to_each_other():
    english, chinese = (ROOT / "README.md").read_text(), (ROOT / "README.zh-CN.md").read_text()
    assert "(README.zh-CN.md)" in english and "(README.md)" in chinese
    assert "(docs/attention.md)" in english and "(docs/attention.zh-CN.md)" in chinese
