"""The READMEs and the docs: every relative link resolves, the two languages link to each
other, the Python snippets run, and the front page stays short."""

import json
import re
import subprocess
import sys

import pytest
import yaml

from runs.folder import DEFAULT_RUN
from conftest import ROOT

DOCS = ["README.md", "README.zh-CN.md", "docs/attention.md", "docs/attention.zh-CN.md", "docs/performance.md",
        "docs/performance.zh-CN.md", "docs/usage.md", "docs/usage.zh-CN.md", "docs/explorer.md",
        "docs/explorer.zh-CN.md", "docs/scaling.md", "docs/scaling.zh-CN.md"]


def anchors(text: str) -> set[str]:
    """The anchors GitHub gives a page's headings: lower case, punctuation dropped (letters,
    digits, CJK, _ and - kept), each space a hyphen."""
    headings = re.findall(r"^#+ (.+)$", re.sub(r"```.*?```", "", text, flags=re.S), flags=re.M)
    return {re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-") for heading in headings}


@pytest.mark.parametrize("name", DOCS)
def test_doc_links_resolve(name):
    """Every relative link names a file that exists, and a #part of it one of its headings."""
    path = ROOT / name
    text = path.read_text(encoding="utf-8")
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    assert links
    for link in links:
        if link.startswith(("http://", "https://")):
            continue
        file, _, part = link.partition("#")
        target = (path.parent / file).resolve() if file else path
        assert target.exists(), f"{name} links to {link}, which does not exist"
        if part and target.suffix == ".md":
            assert part in anchors(target.read_text(encoding="utf-8")), f"{name} links to {link}: no such heading"


def test_each_english_page_links_to_its_chinese_twin_and_back():
    for english in DOCS[::2]:
        chinese = english.replace(".md", ".zh-CN.md")
        assert f"({chinese.split('/')[-1]})" in (ROOT / english).read_text()
        assert f"({english.split('/')[-1]})" in (ROOT / chinese).read_text(encoding="utf-8")
    for page in ("attention", "usage", "performance", "explorer", "scaling"):
        assert f"(docs/{page}.md)" in (ROOT / "README.md").read_text()
        assert f"(docs/{page}.zh-CN.md)" in (ROOT / "README.zh-CN.md").read_text(encoding="utf-8")


@pytest.mark.parametrize("name", ["docs/attention.md", "docs/attention.zh-CN.md"])
def test_python_snippets_run(name):
    snippets = re.findall(r"```python\n(.*?)```", (ROOT / name).read_text(encoding="utf-8"), re.S)
    assert snippets
    for code in snippets:
        result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr[-2000:]


def quoted_lines(text: str) -> list[tuple[str, str]]:
    """(source file, line of code) for each table a doc marks as quoting this project's code
    (`<!-- quoted from FILE: column N -->` above it): each code span of that column that
    holds a statement or a call."""
    quoted = []
    for source, column, table in re.findall(r"<!-- quoted from (\S+): column (\d+) -->\n((?:\|.*\n)+)", text):
        for row in table.splitlines()[2:]:  # (after the header and its rule)
            cell = row.split(" | ")[int(column) - 1]
            quoted += [(source, span) for span in re.findall(r"`([^`]+)`", cell) if "(" in span or "=" in span]
    return quoted


@pytest.mark.parametrize("name", ["docs/attention.md", "docs/attention.zh-CN.md"])
def test_the_docs_quote_this_projects_code_as_it_is(name):
    """The code tour's tables quote model/attention.py; a change there that the tour does
    not follow fails here (the tutorials' code beside it is quoted from them, unchecked)."""
    quoted = quoted_lines((ROOT / name).read_text(encoding="utf-8"))
    assert len(quoted) >= 20
    for source, line in quoted:
        code = " ".join((ROOT / source).read_text(encoding="utf-8").split())
        assert " ".join(line.split()) in code, f"{name} quotes {line!r}, which {source} does not hold"


def test_rope_snippet_prints_what_it_says():
    code = next(c for c in re.findall(r"```python\n(.*?)```", (ROOT / "docs/attention.md").read_text(), re.S)
                if "RotaryEmbedding" in c)
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120).stdout
    a, b, c = (float(v) for v in out.split())
    assert abs(a - b) < 1e-4 and abs(a - c) > 1e-3


def test_generate_default_is_where_tiny_trains():
    assert yaml.safe_load((ROOT / "configs" / "tiny.yaml").read_text())["out_dir"] == str(DEFAULT_RUN)


def test_the_chinese_follows_the_glossary():
    """No Chinese page, --explain string or explorer string uses a word the glossary
    avoids; the explorer and --explain use its terms for the five steps."""
    from explorer.page import strings
    from inspection.words import words

    rows = [line.split("|")[1:4] for line in (ROOT / "docs" / "glossary.md").read_text(encoding="utf-8").splitlines()
            if line.startswith("| ") and not line.startswith("| English")]
    avoided = [word.strip() for _, _, words in rows for word in words.split(",") if word.strip()]
    assert len(rows) >= 20 and avoided
    zh_strings = json.dumps([strings()["zh"], words("zh")], ensure_ascii=False)
    texts = {path.name: path.read_text(encoding="utf-8") for path in [ROOT / "README.zh-CN.md",
                                                                      *(ROOT / "docs").glob("*.zh-CN.md")]}
    texts["strings"] = zh_strings
    for name, text in texts.items():
        assert not [word for word in avoided if word in text], name
    for term in ("注意力权重", "缩放", "掩码", "因果掩码", "块", "残差连接", "前馈网络", "加权求和", "相似度"):
        assert term in zh_strings, term
    for name, text in texts.items():  # one word for a prompt: 提示词; the English only as code (`--prompt`)
        prose = re.sub(r"`[^`\n]*`", "", re.sub(r"```.*?```", "", text, flags=re.S))
        assert not re.findall(r".{0,30}\bprompt\b.{0,30}", prose, flags=re.I), name


def test_the_tutorial_bridge_prints_what_it_says():
    code = next(c for c in re.findall(r"```python\n(.*?)```", (ROOT / "docs/attention.md").read_text(), re.S)
                if "TutorialMHA" in c)
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120).stdout
    shapes, difference = out.splitlines()
    assert shapes == "torch.Size([2, 4, 512]) torch.Size([2, 4, 4])"
    assert float(difference.split(": ")[1]) < 1e-5


def test_the_figures_are_made_by_the_script(tmp_path):
    """docs/make_figures.py draws every picture of the code tour, in both languages, from a
    run directory (here a micro one with random weights); each is well-formed SVG whose
    words are text."""
    import xml.etree.ElementTree as ElementTree

    from data.tokenizer import train_tokenizer
    from model import GPT, GPTConfig

    run = tmp_path / "run"
    tokenizer = train_tokenizer("char", ["ROMEO:\nBut soft, what light through yonder"], 0)
    GPT(GPTConfig(vocab_size=tokenizer.get_vocab_size(), block_size=64, n_layer=1, n_head=2, n_embd=16)).save_pretrained(run)
    tokenizer.save(str(run / "tokenizer.json"))
    result = subprocess.run([sys.executable, str(ROOT / "docs" / "make_figures.py"), "--checkpoint", str(run),
                             "--out", str(tmp_path / "images")], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    names = sorted(p.name for p in (tmp_path / "images").iterdir())
    assert names == sorted(f"{n}{s}.svg" for n in ("qkv", "maps", "causal", "cache") for s in ("", ".zh-CN"))
    for name in names:
        ElementTree.parse(tmp_path / "images" / name)
    assert "因果掩码" in (tmp_path / "images" / "causal.zh-CN.svg").read_text(encoding="utf-8")
    assert "同样 35 个字符上" in (tmp_path / "images" / "maps.zh-CN.svg").read_text(encoding="utf-8")  # (a char model)
    assert "the same 35 characters" in (tmp_path / "images" / "maps.svg").read_text()
    assert re.search(r"^layer 0: q std [\d.]+, k std [\d.]+, scores std [\d.]+ before 1/√d_k and [\d.]+ after",
                     result.stdout, re.M)
    qkv = (tmp_path / "images" / "qkv.svg").read_text()  # the split of model/attention.py, at its widths
    assert "split([C, H_kv·d_k, H_kv·d_k], dim=-1)" in qkv and "[B, T, 16]" in qkv and "permute" not in qkv
    for page in ("docs/attention.md", "docs/attention.zh-CN.md"):  # and the code tour shows them
        text = (ROOT / page).read_text(encoding="utf-8")
        assert all(f"images/{n}" in text for n in ("qkv", "maps", "causal", "cache"))


def test_the_architecture_page_names_every_module_and_only_those():
    """docs/architecture.md's "One line per module": under each folder's heading, exactly the
    modules (or the page's scripts) the folder holds; a module added, renamed or removed
    without the page fails here."""
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    listed: dict[str, set[str]] = {}
    folder = None
    for line in text.splitlines():
        heading = re.match(r"\*\*([a-z_/]+)/\*\*", line)
        if heading:
            folder = heading.group(1)
            listed[folder] = set()
        elif folder and line.startswith("- `"):
            listed[folder].add(re.match(r"- `([\w.]+)`", line).group(1))
        elif line.startswith("**The programs**") or line.startswith("## "):
            folder = None
    for name in ("storage", "cli", "machine", "model", "data", "runs", "lora", "jobs", "inspection", "interop", "training",
                 "explorer"):
        present = {p.name for p in (ROOT / name).glob("*.py") if p.name != "__init__.py"}
        assert listed.get(name) == present, name
    assert listed["explorer/page"] == {p.name for p in (ROOT / "explorer" / "page").glob("*.js")}
    scripts = re.search(r'SCRIPTS = \((.*?)\)  # each is one namespace', (ROOT / "explorer" / "page.py").read_text(),
                        re.S).group(1)
    assert re.findall(r'"(\w+\.js)"', scripts) == [name for name in re.findall(r"^- `(\w+\.js)`", text, re.M)]


def test_what_the_usage_page_says_comes_in_is_what_the_importer_accepts():
    """docs/usage.md's train.init_from: the model types it names are those config_of reads
    (and GPT-NeoX, this project's own exports), what it says is refused is refused, and
    what it says comes in (Llama 3's rope scaling, Qwen2's q/k/v biases) comes in."""
    from interop.hf import Unsupported, config_from_transformers

    text = (ROOT / "docs" / "usage.md").read_text(encoding="utf-8")
    paragraph = text[text.index("**`train.init_from`**"):text.index("**`export.py`**")]
    read = set(re.findall(r'kind == "(\w+)"', (ROOT / "interop" / "hf.py").read_text()))
    assert read == {"gpt2", "gpt_neox", "llama", "qwen2", "qwen3"}
    assert {"gpt2", "llama", "qwen2", "qwen3"} <= set(re.findall(r"`(?:model_type: )?(\w+)`", paragraph))
    llama = {"model_type": "llama", "vocab_size": 50, "hidden_size": 32, "num_attention_heads": 4,
             "num_hidden_layers": 1, "intermediate_size": 64, "max_position_embeddings": 64, "hidden_act": "silu"}
    scaled = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
              "original_max_position_embeddings": 32}
    assert "`llama3` comes in" in paragraph and config_from_transformers({**llama, "rope_scaling": scaled}).rope_scaling
    assert "Qwen2" in paragraph and config_from_transformers({**llama, "model_type": "qwen2"}).qkv_bias
    assert "Qwen3" in paragraph and config_from_transformers({**llama, "model_type": "qwen3", "head_dim": 12}).qk_norm
    assert "model.safetensors.index.json" in paragraph and "Sharded weights" not in paragraph
    refused = {"`linear`": {"rope_scaling": {"rope_type": "linear", "factor": 2.0}},
               "activation other than SiLU": {"hidden_act": "gelu"},
               "biases on the MLP": {"mlp_bias": True},
               "`sliding_window` in a Llama config": {"sliding_window": 16},
               "`use_sliding_window: true` in a Qwen2 or Qwen3 one": {"model_type": "qwen3", "use_sliding_window": True}}
    for said, change in refused.items():
        assert said in paragraph, said
        with pytest.raises(Unsupported):
            config_from_transformers({**llama, **change})
