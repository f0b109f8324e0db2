"""What a preference job (jobs/preference.py) does with its data:

    PreferenceFormat  how pairs become token files (data/prepare.py's Format): each pair two
                      sequences, chosen then rejected, with its answer's tokens flagged
    PreferenceData    its prepared corpus: the trainer's pairs, the fixed pairs it is scored on
    score_pairs       evaluate.py's: the share of pairs whose implicit reward ranks the chosen
                      answer first, and the mean margin
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer

from data.batches import PairSampler, fits, fixed_pairs, in_memory, pair_batch
from data.conversations import BadRecord, ChatSource
from data.prepare import write_conversations
from data.preferences import Pair, encode_pair
from data.shared import END, DataError, Piece
from data.template import ChatTemplate, chat_tokenizer, template_for
from data.tokenizer import Unencodable
from model import GPT, evaluating

from .chat_data import ConversationData, template_settings
from .dpo import shared_rows, side_logps

PREFERENCE_FORMAT = 1  # pairs' token files: chosen then rejected, each answer's tokens flagged


class PreferenceFormat:
    """Pairs' token files (data/prepare.py's Format), laid out as conversations' (ids, the
    answer's flags, where each sequence starts): sequence 2i is pair i's chosen answer after its
    prompt, 2i + 1 its rejected one (data/preferences.py's encode_pair). Conversational pairs
    are rendered by the chat template (the model's own, or the default, whose markers the
    tokenizer then gets); plain-text pairs need none."""

    kind = "preference"  # (meta.json's: the job's name)

    def __init__(self, source: ChatSource, chat_template: str | None, conversational: bool):
        self.source = source
        self.chat_template = chat_template
        self.conversational = conversational
        self.settings = {"preference_format": PREFERENCE_FORMAT, "conversational": conversational,
                         **(template_settings(chat_template) if conversational else {})}
        self.template: ChatTemplate | None = None

    @staticmethod
    def texts(records: Iterable[tuple[str, Pair]]) -> Iterator[Piece]:
        """What a tokenizer learns from: each side's text, a document each (a preference job
        tunes a model brought in, with its own tokenizer, so this is seldom asked)."""
        for _, pair in records:
            for part in (pair.prompt, pair.chosen, pair.rejected):
                texts = [part] if isinstance(part, str) else [message["content"] for message in part]
                for text in texts:
                    yield text
                    yield END

    def tokenizer_for(self, tokenizer: Tokenizer) -> Tokenizer:
        if self.conversational:
            if self.chat_template is None:
                tokenizer = chat_tokenizer(tokenizer)
            self.template = template_for(tokenizer, self.chat_template, "the chat template of train.init_from"
                                         if self.chat_template else "the default chat template")
        return tokenizer

    def write_split(self, split: str, records: Iterable[tuple[str, Pair]], tokenizer: Tokenizer, folder: Path, dtype,
                    advance) -> dict:
        def sequences(record: tuple[str, Pair], lost: Unencodable) -> list[tuple[np.ndarray, np.ndarray]]:
            where, pair = record
            if pair.conversational != self.conversational:
                raise BadRecord("of the other kind", f"{where}: its sides are {'messages' if pair.conversational else 'texts'}"
                                f", the source's first pair's are {'messages' if self.conversational else 'texts'}",
                                "give every pair of a source the same kind")
            try:
                return list(encode_pair(tokenizer, self.template, pair, lost))
            except DataError as e:
                raise BadRecord("that could not be tokenized", f"{where}: {e}") from None

        sizes = write_conversations(records, sequences, tokenizer, folder, split, dtype, self.source.skipped)
        sizes["pairs"] = sizes.pop("records")
        return sizes

    def check(self, sizes: dict[str, dict]) -> None:
        self.source.skipped.check(self.source.label)

    def meta(self) -> dict:
        skipped = self.source.skipped
        return {"chat_template": self.template.source if self.template else None, "conversational": self.conversational,
                **({"skipped": skipped.report()} if skipped.count else {})}


@dataclass
class PreferenceData(ConversationData):
    """Pairs' token files (PreferenceFormat): each split's sequences as Conversations, two a pair."""

    def items(self, split: str) -> int:
        """How many pairs a split holds."""
        return len(self.conversations[split]) // 2

    def sampler(self, block_size: int, batch_size: int, seed: int, rank: int = 0, world_size: int = 1,
                pack: bool = False) -> PairSampler:
        """Epochs of the training pairs, batch_size pairs a batch (x, y [B, 2, L]), a mixture's sources weighted."""
        if pack:
            raise DataError("train.packing packs conversations; a preference pair's two sides are compared side by "
                            "side, a pair a row: remove train.packing")
        return PairSampler(self.conversations["train"], block_size, batch_size, seed, rank, world_size,
                           weights=self.weights)

    def evaluation_rows(self, split: str, block_size: int, count: int, seed: int) -> tuple:
        """The same `count` pairs of a split at every evaluation (all of them, if fewer)."""
        return fixed_pairs(self.conversations[split], block_size, count, seed, split)

    def check_fits(self, block_size: int, too_long: str = "cut", say: bool = True) -> None:
        """Pairs with a side longer than the context are left out of training (and said): an
        answer cut short would be compared whole with the other."""
        counts = {split: (len(rows) // 2 - len(fits(rows, block_size)), len(rows) // 2)
                  for split, rows in self.conversations.items()}
        longer = " and ".join(f"{n:,} of {total:,} {split}" for split, (n, total) in counts.items() if n)
        if longer and too_long == "refuse":
            raise DataError(f"{longer} pairs have a side longer than the context ({block_size + 1} tokens with the last "
                            "target); shorten them, raise model.block_size, or set data.chat_too_long=cut to leave them "
                            "out")
        if longer and say:
            print(f"note: {longer} pairs have a side longer than the context ({block_size + 1} tokens with the last "
                  "target): they are left out")

    def bad_records(self) -> str | None:
        said = super().bad_records()
        return said.replace("conversations are bad", "pairs are bad") if said else None

    def loss_figures(self, loss: float) -> tuple[dict[str, float], str]:
        """The loss is DPO's, a mean over pairs: no bits per character."""
        return {}, "DPO loss a pair"

    def suggested_prompt(self, sample_prompt: str) -> str | None:
        """Plain-text pairs: the first validation pair's prompt (a model of conversations is
        tried with generate.py --chat: None)."""
        if self.meta["conversational"]:
            return None
        ids, mask = self.conversations["val"][0]
        return self.tokenizer.decode(ids[:int(np.argmax(mask))].tolist())


# ---- scoring pairs (evaluate.py) ---------------------------------------------------------------------


@torch.no_grad()
def score_pairs(model: GPT, reference: GPT | None, tokenizer: Tokenizer, template: ChatTemplate | None,
                pairs: list[Pair], beta: float, batch_size: int, device) -> dict:
    """Each pair's answers scored by the model and the reference (their log-probabilities, the
    sum over each answer's tokens), the implicit reward of each answer β (log π − log π_ref)
    (reference None: the model's log-probability alone, β = 1), and over the pairs: the share
    whose chosen answer gets the higher reward, the mean margin, the mean rewards. A pair with a
    side longer than the context is left out and counted."""
    encoded = in_memory([side for pair in pairs for side in encode_pair(tokenizer, template, pair)])
    usable = fits(encoded, model.config.block_size)
    rewards = []  # [pairs, 2]
    for start in range(0, len(usable), batch_size):
        x, y, _ = pair_batch(encoded, usable[start:start + batch_size], model.config.block_size)
        rows = shared_rows(x.to(device), y.to(device))  # each pair's prompt once, its two answers after it
        with evaluating(model):
            policy = side_logps(model, rows)[0]  # [2B]: the chosen answers, then the rejected
        if reference is not None:
            with evaluating(reference):
                policy = beta * (policy - side_logps(reference, rows)[0])
        rewards.append(torch.stack(policy.chunk(2), 1).double().cpu())
    rewards = torch.cat(rewards) if rewards else torch.zeros(0, 2, dtype=torch.float64)
    margins = rewards[:, 0] - rewards[:, 1]
    count = len(rewards)
    return {"pairs": count, "left_out": len(pairs) - count, "ranked_right": (margins > 0).double().mean().item()
            if count else None, "margin": margins.mean().item() if count else None,
            "chosen_reward": rewards[:, 0].mean().item() if count else None,
            "rejected_reward": rewards[:, 1].mean().item() if count else None,
            "against": "reference" if reference is not None else "none"}


def pairs_of(sources: list[ChatSource], whole: bool) -> list[Pair]:
    """The pairs to score: all of a file (whole), or a run's validation pairs (a mixture's every
    source's); bad ones skipped and said."""
    pairs = []
    for source in sources:
        pairs += [pair for _, pair in (source.everything() if whole else source.val())]
        if source.skipped.count:
            print(f"note: {source.skipped.count:,} of {source.skipped.seen:,} pairs of {source.label} are bad and "
                  f"skipped: {source.skipped.said()}", file=sys.stderr)
    return pairs
