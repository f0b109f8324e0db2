"""A prepared corpus, as the trainer asks things of it: one type for each kind of corpus.

    TextData          a text's token files: random windows to train on, fixed windows to
                      score, a loss in bits per character of the text
    ConversationData  conversations' token files (one source, or a mixture of them): epochs
                      of conversations (packed several a row, or one), the assistant's tokens
                      alone scored, the chat template that rendered them

Both are TokenFiles and answer the same questions (its sampler, its evaluation rows,
whether its context fits, its bits per character, a prompt to try the model with), each
in its own way, so that no caller asks which kind it holds. data/prepare.py makes them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer

from .batches import (BatchSampler, ConversationSampler, Conversations, answered, check_length, fixed_conversations,
                      fixed_windows, longer_than)
from .conversations import Skipped
from .shared import DataError
from .tokenizer import suggest_prompt


@dataclass
class TokenFiles:
    """A prepared corpus (data/prepare.py's layout): the tokenizer, each split's tokens
    (memory-mapped) and meta.json's counts. built: made by this call of prepare (not found
    from an earlier run). Its kinds answer the questions below each in their own way."""

    directory: Path
    tokenizer: Tokenizer
    train: np.ndarray  # memmap of token ids
    val: np.ndarray
    meta: dict
    built: bool = False

    @property
    def vocab_size(self) -> int:
        return self.meta["vocab_size"]

    def validated_on(self) -> str | None:
        """What validates, where it is not a held-out cut of the training data: a dataset's own
        split (data.hf_val_split), or in a mixture, the sources' that have one (None: cuts alone)."""
        if self.meta.get("val_split"):
            return f"the dataset's {self.meta['val_split']} split"
        own = [f"the {part['val_split']} split of {part['source']}" for part in self.meta.get("parts", [])
               if part.get("val_split")]
        return ", ".join(own) + " (the others: held-out cuts)" if own else None


@dataclass
class TextData(TokenFiles):
    """A text's token files."""

    @property
    def chat_template(self) -> str | None:
        """The Jinja template that rendered the conversations (None: a text has none)."""
        return None

    def sampler(self, block_size: int, batch_size: int, seed: int, rank: int = 0, world_size: int = 1,
                pack: bool = False) -> BatchSampler:
        """Random windows of the training text (every window is full: nothing to pack)."""
        return BatchSampler(self.train, block_size, batch_size, seed, rank, world_size)

    def evaluation_rows(self, split: str, block_size: int, count: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        """What a run is scored on, the same at every evaluation: `count` fixed windows of a split."""
        return fixed_windows(self.train if split == "train" else self.val, block_size, count, seed, split)

    def check_fits(self, block_size: int, too_long: str = "cut", say: bool = True) -> None:
        """A DataError if a split is too short for one window of block_size + 1 tokens."""
        check_length(self.train, block_size, "train")
        check_length(self.val, block_size, "val")

    def bad_records(self) -> str | None:
        """What was left out of the corpus as bad, in words (None: nothing; a text has no records)."""
        return None

    def bits_per_character(self, loss: float) -> float | None:
        """A validation loss in nats per token, as bits per character of the validation text."""
        return loss * self.meta["val_tokens"] / max(1, self.meta["val_characters"]) / math.log(2)

    def suggested_prompt(self, sample_prompt: str) -> str | None:
        """A prompt to try the model with, that the tokenizer encodes (tokenizer.suggest_prompt)."""
        return suggest_prompt(self.tokenizer, sample_prompt, self.tokenizer.decode(self.val[:256].tolist()))


@dataclass
class ConversationData(TokenFiles):
    """Conversations' token files: besides the tokens, each split's Conversations (the ids, the
    assistant's flags, where each starts) and, for a mixture (data.sources), each source's
    training conversations with its weight."""

    conversations: dict[str, Conversations] | None = None
    weights: list[tuple[np.ndarray, float]] | None = None

    @property
    def chat_template(self) -> str | None:
        return self.meta["chat_template"]

    def sampler(self, block_size: int, batch_size: int, seed: int, rank: int = 0, world_size: int = 1,
                pack: bool = False) -> ConversationSampler:
        """Epochs of the training conversations, packed several a row with `pack`, a mixture's
        sources weighted."""
        return ConversationSampler(self.conversations["train"], block_size, batch_size, seed, rank, world_size, pack,
                                   self.weights)

    def evaluation_rows(self, split: str, block_size: int, count: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The same `count` conversations of a split at every evaluation (all of them, if fewer)."""
        return fixed_conversations(self.conversations[split], block_size, count, seed, split)

    def check_fits(self, block_size: int, too_long: str = "cut", say: bool = True) -> None:
        """Conversations longer than the context: counted, then cut at the end (said, with
        those cut before any answer, which are left out) or refused (too_long: data.chat_too_long)."""
        counts = {split: (longer_than(rows, block_size), len(rows), len(rows) - len(answered(rows, block_size)))
                  for split, rows in self.conversations.items()}
        longer = " and ".join(f"{n:,} of {total:,} {split}" for split, (n, total, _) in counts.items() if n)
        if not longer:
            return
        if too_long == "refuse":
            raise DataError(f"{longer} conversations are longer than the context ({block_size + 1} tokens with the "
                            "last target); shorten them, raise model.block_size, or set data.chat_too_long=cut")
        dropped = sum(empty for _, _, empty in counts.values())
        if say:
            print(f"note: {longer} conversations are longer than the context ({block_size + 1} tokens with the last "
                  f"target): each is cut at its end (data.chat_too_long=cut)"
                  + (f"; {dropped:,} keep no answer and are left out" if dropped else ""))

    def bad_records(self) -> str | None:
        """The bad conversations skipped when the token files were made (data.skip_bad_records),
        in words: how many of how many, by reason, the first named (None: none)."""
        if "skipped" not in self.meta:
            return None
        skipped = Skipped.added([self.meta["skipped"]])
        return (f"{skipped.count:,} of {skipped.seen:,} conversations are bad and left out (data.skip_bad_records="
                f"{skipped.allowed:g}): {skipped.said()}")

    def bits_per_character(self, loss: float) -> float | None:
        """None: the loss is on the assistant's tokens alone, not on a text."""
        return None

    def suggested_prompt(self, sample_prompt: str) -> str | None:
        """None: a model of conversations is tried with generate.py --chat, in its template."""
        return None
