"""The explorer's data and page/ (template, scripts, styles, strings) -> one HTML file that
needs nothing else: no network, no other file; it opens from file:// as it is."""

from __future__ import annotations

import json
import re
from pathlib import Path

from inspection.words import word_table

from .data import MAX_TOKENS, to_json

PAGE = Path(__file__).resolve().parent / "page"
SCRIPTS = ("numbers.js", "tokenizer.js", "model.js", "data.js", "sources.js", "patching.js",  # the arithmetic, the
           # tokenizer, the model, its data, where a score and a logit come from, patching
           "page.js", "view.js", "timeline.js", "overview.js", "attention.js", "output.js", "circuit.js",  # the page and
           # its panels
           "explorer.js")  # each is one namespace, and uses only those before it


def strings() -> dict[str, dict[str, str]]:
    """The page's words: {"en": {key: text}, "zh": {key: text}} (page/strings.json)."""
    return json.loads((PAGE / "strings.json").read_text(encoding="utf-8"))


def render(data: dict | None, lang: str = "en", server: bool = False, prompt: str = "",
           counterpart: str | None = None, model: dict | None = None, why_not: dict | None = None,
           max_tokens: int = MAX_TOKENS) -> str:
    """The page for `data` (None: an empty page, in server mode, waiting for a prompt).
    counterpart: the file name of the same page for the other model (trained, or at
    initialisation), written beside this one. model: what the page needs to run the model
    on any text typed into it (data.page_model), or why_not, why it cannot; max_tokens: the
    last tokens of a typed text it shows (at most block_size)."""
    if model is not None and data is not None:  # W_Q, W_K, W_V travel once, among the model's weights
        data = {**data, "layers": [{**layer, "c_attn": None} for layer in data["layers"]]}
    parts = {
        "STYLE": (PAGE / "explorer.css").read_text(encoding="utf-8"),
        "SCRIPT": "\n".join((PAGE / name).read_text(encoding="utf-8") for name in SCRIPTS),
        "STRINGS": to_json({**strings(), "words": {lang: {kind: names for kind, names in table.items() if kind != "explain"}
                                                   for lang, table in word_table().items()}}),
        "SETTINGS": to_json({"lang": lang, "server": server, "prompt": prompt, "counterpart": counterpart,
                             "why_not": why_not, "max_tokens": max_tokens}),
        "DATA": to_json(data) if data is not None else "null",
        "MODEL": to_json(model) if model is not None else "null",
    }
    for name in ("STYLE", "SCRIPT"):
        if "</" in parts[name]:
            raise ValueError(f"explorer/page: the {name.lower()} must not contain '</' (it would end its tag)")
    template = (PAGE / "template.html").read_text(encoding="utf-8")
    # one pass, so that nothing inserted is searched for markers again
    return re.sub(r"/\*(STYLE|SCRIPT|STRINGS|SETTINGS|DATA|MODEL)\*/", lambda m: parts[m.group(1)], template)
