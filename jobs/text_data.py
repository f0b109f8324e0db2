"""What a text job (jobs/text.py) does with its data:

    TextFormat  how a text becomes token files (data/prepare.py's Format): each document
                encoded, documents separated
    TextData    its prepared corpus: the trainer's random windows, fixed windows to score, the
                loss in bits per character of the text
    scoring     evaluate.py's pass over a text: windows moved by a stride, every token scored once
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer
from tqdm import tqdm

from cli.program import UserError
from data.batches import BatchSampler, check_length, fixed_windows
from data.config import DataConfig
from data.prepare import META, TokenFiles, chunked, located, token_dtype, tokens_file, write_tokens
from data.readers import check_readable
from data.shared import DataError, Piece
from data.text import Source, open_source
from data.tokenizer import Encoder, start_ids, suggest_prompt, unknown_characters

CHUNK = 1 << 20  # characters read (or tokens taken) at a time while scoring
PROGRESS_BYTES = 1 << 20  # a text this long shows a progress bar while it is scored


class TextFormat:
    """A text's token files (data/prepare.py's Format): each document encoded, documents
    separated (write_tokens)."""

    kind = "text"  # (meta.json's: the job's name, jobs/text.py)
    settings: dict = {}  # what the fingerprint sees besides the source and the tokenizer: nothing

    def __init__(self, source: Source):
        self.source = source

    @staticmethod
    def texts(pieces: Iterable[Piece]) -> Iterator[Piece]:
        """What a tokenizer learns from: the text, in chunks."""
        return chunked(pieces)

    @staticmethod
    def tokenizer_for(tokenizer: Tokenizer) -> Tokenizer:
        return tokenizer

    @staticmethod
    def write_split(split: str, pieces: Iterable[Piece], tokenizer: Tokenizer, folder: Path, dtype,
                    advance) -> dict:
        return write_tokens(chunked(pieces), tokenizer, folder / tokens_file(split), dtype, advance)

    def check(self, sizes: dict[str, dict]) -> None:
        if sizes["train"]["tokens"] == 0 or sizes["val"]["tokens"] == 0:
            raise DataError(f"data source {self.source.name!r} gave an empty train or validation split; "
                            "give more text or change data.val_fraction")

    @staticmethod
    def meta() -> dict:
        return {}


@dataclass
class TextData(TokenFiles):
    """A text's token files, as the trainer asks things of them."""

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

    def loss_figures(self, loss: float) -> tuple[dict[str, float], str]:
        """A validation loss in nats per token, as bits per character of the validation text:
        ({summary key: value}, words for the log line)."""
        bits = loss * self.meta["val_tokens"] / max(1, self.meta["val_characters"]) / math.log(2)
        return {"val_bits_per_char": bits}, f"{bits:.3f} bits/char"

    def suggested_prompt(self, sample_prompt: str) -> str | None:
        """A prompt to try the model with, that the tokenizer encodes (tokenizer.suggest_prompt)."""
        return suggest_prompt(self.tokenizer, sample_prompt, self.tokenizer.decode(self.val[:256].tolist()))


# ---- scoring a text (evaluate.py), and a run's validation tokens -----------------------------------


def text_chunks(path: Path, tokenizer: Tokenizer, counts: dict) -> Iterator[np.ndarray]:
    """A text file's tokens, a chunk at a time, a Llama tokenizer's BOS first (as training's
    documents start), counting characters and bytes; a progress bar for a long one."""
    check_text(path, tokenizer)
    encode = Encoder(tokenizer)
    yield np.asarray(start_ids(tokenizer), dtype=np.int64)
    bar = tqdm(total=path.stat().st_size, unit="B", unit_scale=True, desc="scoring", file=sys.stderr,
               disable=path.stat().st_size < PROGRESS_BYTES)
    for chunk in read_chunks(path, counts):
        bar.update(len(chunk.encode("utf-8")))
        yield encode.feed(chunk)
    yield encode.flush()
    bar.close()


def read_chunks(path: Path, counts: dict) -> Iterator[str]:
    """The file in pieces of CHUNK characters, counting the characters and UTF-8 bytes
    as they go by. (Encoder.feed puts the cuts where they cannot change the tokens.)
    Newlines are read as training reads a .txt source: \\r\\n and \\r become \\n, so a
    char model trained on a Windows text can score that text."""
    with open(path, encoding="utf-8") as f:
        while block := f.read(CHUNK):
            counts["characters"] += len(block)
            counts["bytes"] += len(block.encode("utf-8"))
            yield block


def check_text(path: Path, tokenizer: Tokenizer) -> None:
    """A readable, non-empty UTF-8 file whose characters the tokenizer knows."""
    if not path.is_file():
        raise UserError(f"--text {path} does not exist")
    check_readable(path, "text")
    unknown: dict[str, int] = {}
    for chunk in read_chunks(path, {"characters": 0, "bytes": 0}):
        for ch in unknown_characters(tokenizer, chunk):
            unknown[ch] = unknown.get(ch, 0) + chunk.count(ch)
    if unknown:
        shown = " ".join(repr(ch) for ch in sorted(unknown, key=unknown.get, reverse=True)[:5])
        raise UserError(f"{path} has {sum(unknown.values()):,} characters the model's tokenizer never saw "
                        f"({len(unknown)} distinct, e.g. {shown}); a char model scores only text made of "
                        "its training characters")


def scored_windows(chunks: Iterable[np.ndarray], block_size: int, stride: int) -> Iterator[tuple[np.ndarray, int]]:
    """(tokens of one window, how many of its last targets to score), along a stream of
    token arrays. Inputs are window[:-1], targets window[1:]; target j (the token after
    j) is scored in the first window that ends past it, so each is scored exactly once."""
    buffer, start = np.empty(0, dtype=np.int64), 0  # buffer[0] is token number `start`
    begin = scored = 0  # this window's first input; targets before `scored` are done
    for chunk in chunks:
        buffer = np.concatenate([buffer, chunk])
        while start + len(buffer) >= begin + block_size + 1:  # a full window is here
            end = begin + block_size
            yield buffer[begin - start:end + 1 - start], end - scored
            scored, begin = end, begin + stride
            buffer, start = buffer[begin - start:], begin
    end = start + len(buffer) - 1  # the last target of the text
    if end > scored:
        yield buffer[max(0, begin - start):], end - scored


@torch.no_grad()
def score(model, windows: Iterable[tuple[np.ndarray, int]], batch_size: int, device,
          threads=None) -> tuple[float, int]:
    """(sum of the negative log-likelihoods, number of tokens scored), in batches of
    windows of one length (only the last window of a text may be shorter); `threads`
    keeps to the thread count that scores faster now (machine/threads.py)."""
    total, count, batch, batches = 0.0, 0, [], 0

    def run(batch) -> float:
        tokens = torch.from_numpy(np.stack([w for w, _ in batch])).to(device)  # [B, L + 1]
        targets = tokens[:, 1:].clone()
        for row, (_, n) in enumerate(batch):
            targets[row, :targets.size(1) - n] = -100  # context only, scored in an earlier window
        logits, _ = model(tokens[:, :-1])
        return model.loss(logits, targets, reduction="sum").item()

    for window in windows:
        if batch and (len(batch) == batch_size or len(window[0]) != len(batch[0][0])):
            total += run(batch)
            batch = []
            batches += 1
            if threads is not None and batches % 8 == 0:
                threads.update(batches)
        batch.append(window)
        count += window[1]
    if batch:
        total += run(batch)
    return total, count


def validation_tokens(config: DataConfig, tokenizer: Tokenizer, scratch: Path) -> tuple[np.ndarray, dict, bool]:
    """A run's validation tokens, encoded by its tokenizer, with the split's counts of
    characters and UTF-8 bytes: from its own token files where they are still in the cache
    (the last value True), else the validation text encoded into the file scratch/val.bin."""
    data = prepared(config, tokenizer)
    if data is not None and "val_bytes" in data.meta:
        return data.val, {"characters": data.meta["val_characters"], "bytes": data.meta["val_bytes"]}, True
    path = scratch / tokens_file("val")
    dtype = token_dtype(tokenizer.get_vocab_size())
    sizes = write_tokens(chunked(open_source(config).val()), tokenizer, path, dtype)
    tokens = np.memmap(path, dtype=dtype, mode="r") if sizes["tokens"] else np.empty(0, dtype=dtype)
    return tokens, {"characters": sizes["characters"], "bytes": sizes["bytes"]}, False


def prepared(config: DataConfig, tokenizer: Tokenizer) -> TextData | None:
    """The token files a run made for config, if they are still there and were encoded by
    `tokenizer` (the run's): trained for these settings, or given (train.init_from)."""
    form = TextFormat(open_source(config))
    for given in (None, tokenizer):
        directory = located(config, form, given)[2]
        if (directory / META).is_file():
            data = TextData.read(directory)
            if data.tokenizer.to_str() == tokenizer.to_str():
                return data
    return None
