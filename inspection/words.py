"""The words of the model's pieces and of the five steps of attention, in English and
Chinese (words.json, following docs/glossary.md): --explain, the explorer and the docs'
figures all name them from this one table. words.json also holds --explain's lines
("explain"), built from those words; the page's sentences are the page's own
(explorer/page/strings.json), built from the same words, which the page is given."""

from __future__ import annotations

import functools
import json
from pathlib import Path

@functools.cache
def word_table() -> dict[str, dict]:
    """{"en": {"steps": {...}, "pieces": {...}, "positions": {...}, "norms": {...}, "explain": {...}}, "zh": {...}}"""
    return json.loads((Path(__file__).resolve().parent / "words.json").read_text(encoding="utf-8"))


def words(lang: str) -> dict:
    return word_table()[lang]
