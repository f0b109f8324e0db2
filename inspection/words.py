"""The words of the model's pieces and of the five steps of attention, in English and
Chinese (words.json, following docs/glossary.md): --explain, the explorer and the docs'
figures all name them from this one table."""

from __future__ import annotations

import functools
import json
from pathlib import Path

LANGUAGES = ("en", "zh")


@functools.cache
def word_table() -> dict[str, dict]:
    """{"en": {"steps": {...}, "pieces": {...}, "positions": {...}, "norms": {...}}, "zh": {...}}"""
    return json.loads((Path(__file__).resolve().parent / "words.json").read_text(encoding="utf-8"))


def words(lang: str) -> dict:
    return word_table()[lang]
