"""A prompt typed by a user, as token ids: the one rule of generate.py and explore.py; and
several prompts as one left-padded batch."""

from __future__ import annotations

import sys

import torch

from cli.program import UserError
from data.tokenizer import encode_or_start, unknown_characters


def encode_prompt(tokenizer, prompt: str, max_tokens: int, limit: str = "block_size", say: bool = True) -> list[int]:
    """The prompt's token ids, its last max_tokens of them (saying so on stderr, unless the
    caller says it in its own words: say=False). A character the tokenizer never saw is
    refused, naming it; an empty prompt starts after <|endoftext|> or a newline."""
    unknown = unknown_characters(tokenizer, prompt)
    if unknown:
        shown = " ".join(repr(c) for c in unknown[:10])
        raise UserError(f"the prompt has characters this model never saw in training: {shown}; "
                        "remove or replace them")
    ids = encode_or_start(tokenizer, prompt)
    if len(ids) > max_tokens and say:
        print(f"note: the prompt has {len(ids)} tokens; keeping the last {max_tokens} ({limit})", file=sys.stderr)
    return ids[-max_tokens:]


def left_padded(prompts: list[list[int]], device) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Prompts of token ids as one batch: idx [B, T], padded on the left so that every
    prompt ends where generation starts, and attention_mask [B, T] (1: a real token; None
    where all prompts are equally long)."""
    width = max(len(p) for p in prompts)
    idx = torch.zeros(len(prompts), width, dtype=torch.long)
    mask = torch.zeros(len(prompts), width, dtype=torch.long)
    for row, p in enumerate(prompts):
        idx[row, width - len(p):] = torch.tensor(p, dtype=torch.long)
        mask[row, width - len(p):] = 1
    same = all(len(p) == width for p in prompts)
    return idx.to(device), None if same else mask.to(device)
