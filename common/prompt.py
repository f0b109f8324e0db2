"""A prompt typed by a user, as token ids: the one rule of generate.py and explore.py."""

from __future__ import annotations

import sys

from data import unknown_characters
from data.tokenizer import encode_or_start

from .cli import UserError


def encode_prompt(tokenizer, prompt: str, max_tokens: int, limit: str = "block_size") -> list[int]:
    """The prompt's token ids, its last max_tokens of them (saying so on stderr). A
    character the tokenizer never saw is refused, naming it; an empty prompt starts after
    <|endoftext|> or a newline."""
    unknown = unknown_characters(tokenizer, prompt)
    if unknown:
        shown = " ".join(repr(c) for c in unknown[:10])
        raise UserError(f"the prompt has characters this model never saw in training: {shown}; "
                        "remove or replace them")
    ids = encode_or_start(tokenizer, prompt)
    if len(ids) > max_tokens:
        print(f"note: the prompt has {len(ids)} tokens; keeping the last {max_tokens} ({limit})", file=sys.stderr)
        ids = ids[-max_tokens:]
    return ids
