"""Tokenizers, built with Hugging Face `tokenizers` and saved as a standard tokenizer.json
(loadable by `tokenizers.Tokenizer.from_file` and `transformers.PreTrainedTokenizerFast`).

char: one token per character seen in the training text, plus <unk>. A character
      never seen in training encodes as <unk>: data preparation counts and reports
      them; generate.py refuses a prompt holding them and names them.
bpe:  byte-level BPE (GPT-2's scheme) trained on the training text: any Unicode
      string round-trips exactly, since every byte has a token. Documents are
      separated by <|endoftext|>.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

from .sources import END, DataError, Piece

UNK = "<unk>"
EOT = "<|endoftext|>"
KINDS = ("char", "bpe")
BYTE_ALPHABET = 256


def train_tokenizer(kind: str, pieces: Iterable[Piece], vocab_size: int) -> Tokenizer:
    """Build a tokenizer of `kind` from the training text (vocab_size is for bpe only)."""
    if kind == "char":
        return train_char(pieces)
    if kind == "bpe":
        return train_bpe(pieces, vocab_size)
    raise DataError(f"data.tokenizer={kind!r}: must be one of {', '.join(KINDS)}")


def train_char(pieces: Iterable[Piece]) -> Tokenizer:
    chars: set[str] = set()
    for piece in pieces:
        if piece is not END:
            chars.update(piece)
    vocab = {ch: i for i, ch in enumerate(sorted(chars))}
    # <unk> is an ordinary vocabulary entry, not a special token, so a literal "<unk>"
    # in some text still encodes as its five characters
    vocab[UNK] = len(vocab)
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tokenizer.decoder = decoders.Fuse()  # join characters back without spaces
    return tokenizer


def train_bpe(pieces: Iterable[Piece], vocab_size: int) -> Tokenizer:
    if vocab_size < BYTE_ALPHABET + 1:
        raise DataError(f"data.vocab_size={vocab_size} is below the {BYTE_ALPHABET} byte tokens "
                        f"byte-level BPE starts from, plus {EOT}; use at least {BYTE_ALPHABET + 1}")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOT], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    texts: Iterator[str] = (p for p in pieces if p is not END)
    tokenizer.train_from_iterator(texts, trainer)
    tokenizer.encode_special_tokens = True
    return tokenizer


def load_tokenizer(path: str | Path) -> Tokenizer:
    """Load a tokenizer.json; raises ValueError if it is missing or malformed."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist")
    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception as e:  # tokenizers raises a plain Exception for bad JSON
        raise ValueError(f"{path} is not a valid tokenizer.json ({str(e).splitlines()[0]})") from e
    # text that happens to spell "<|endoftext|>" stays text; only we insert the real token
    tokenizer.encode_special_tokens = True
    return tokenizer


def end_of_text_id(tokenizer: Tokenizer) -> int | None:
    return tokenizer.token_to_id(EOT)


def unknown_characters(tokenizer: Tokenizer, text: str) -> list[str]:
    """Characters of `text` a char tokenizer would turn into <unk> (none for bpe)."""
    unk = tokenizer.token_to_id(UNK)
    if unk is None:
        return []
    return sorted({ch for ch in set(text) if tokenizer.token_to_id(ch) is None})
