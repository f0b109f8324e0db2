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

import json

from collections.abc import Iterable, Iterator
from itertools import chain
import unicodedata
from pathlib import Path

import numpy as np
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

from .shared import END, DataError, Piece

UNK = "<unk>"
EOT = "<|endoftext|>"
KINDS = ("char", "bpe")
BYTE_ALPHABET = 256


def train_tokenizer(kind: str, pieces: Iterable[Piece], vocab_size: int) -> Tokenizer:
    """Build a tokenizer of `kind` (one of KINDS) from the training text (vocab_size is
    for bpe only: check_bpe_vocabulary)."""
    return train_char(pieces) if kind == "char" else train_bpe(pieces, vocab_size)


def train_char(pieces: Iterable[Piece]) -> Tokenizer:
    chars = {"\n"}  # documents are separated by blank lines (data/prepare.py), whatever their text
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


BPE_SAMPLE = 1 << 26  # characters of training text (64 Mi) a BPE tokenizer learns its merges from


def check_bpe_vocabulary(vocab_size: int) -> None:
    """A byte-level BPE trained here starts from the 256 bytes and <|endoftext|>: a smaller
    data.vocab_size is a DataError. (A tokenizer brought in, train.init_from, is not trained
    here: one trained on a text's own bytes may have fewer tokens, and is used as it is.)"""
    if vocab_size < BYTE_ALPHABET + 1:
        raise DataError(f"data.vocab_size={vocab_size} is below the {BYTE_ALPHABET} byte tokens byte-level BPE starts "
                        f"from, plus {EOT}; use at least {BYTE_ALPHABET + 1}")


def train_bpe(pieces: Iterable[Piece], vocab_size: int) -> Tokenizer:
    """Byte-level BPE learned from the first BPE_SAMPLE characters of the training text:
    its trainer counts every distinct word it meets, so on a corpus of gigabytes it would
    grow with the corpus; a few tens of millions of characters teach a vocabulary of
    thousands of tokens as well."""
    check_bpe_vocabulary(vocab_size)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOT], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(first_characters(pieces, BPE_SAMPLE), trainer)
    tokenizer.encode_special_tokens = True
    return tokenizer


def first_characters(pieces: Iterable[Piece], limit: int) -> Iterator[str]:
    """The texts of `pieces` up to `limit` characters in all (the last one cut)."""
    for piece in pieces:
        if piece is END:
            continue
        yield piece[:limit]
        limit -= len(piece)
        if limit <= 0:
            return


def tokenizer_kind(tokenizer: Tokenizer) -> str:
    """Which of KINDS a tokenizer is: "char" (one token a character: WordLevel) or "bpe"
    (any BPE, byte-level or a published model's)."""
    return "char" if json.loads(tokenizer.to_str())["model"]["type"] == "WordLevel" else "bpe"


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


# The end-of-text tokens of the model families this project reads (ours and GPT-2's first):
# the special tokens that end a document, and so a generated sample.
END_OF_TEXT = (EOT, "<|end_of_text|>", "<|eot_id|>", "</s>", "<|im_end|>")


def end_of_text_ids(tokenizer: Tokenizer) -> tuple[int, ...]:
    """The ids of the tokenizer's end-of-text tokens (special tokens named in END_OF_TEXT)."""
    special = {token.content: i for i, token in tokenizer.get_added_tokens_decoder().items() if token.special}
    return tuple(special[name] for name in END_OF_TEXT if name in special)


def end_of_text_id(tokenizer: Tokenizer) -> int | None:
    """The token that separates documents: the first of end_of_text_ids, or None."""
    ids = end_of_text_ids(tokenizer)
    return ids[0] if ids else None


def start_ids(tokenizer: Tokenizer) -> list[int]:
    """What the tokenizer puts before every text it encodes (a Llama tokenizer's <s> or
    <|begin_of_text|>; nothing for this project's tokenizers and GPT-2's). Each document
    of the training data starts with them, as every prompt does, so that the data and
    generation agree."""
    return tokenizer.encode("").ids


def suppressed_ids(tokenizer: Tokenizer) -> tuple[int, ...]:
    """Ids a model should never generate: a char tokenizer's <unk> stands for a character
    the model never saw, so no text continues with it. (Byte-level BPE has none: every
    token, <|endoftext|> included, can be a right next token.)"""
    unk = tokenizer.token_to_id(UNK)
    return (unk,) if unk is not None and tokenizer.token_to_id(EOT) is None else ()


def encode_or_start(tokenizer: Tokenizer, text: str) -> list[int]:
    """Token ids of text (after start_ids, where the tokenizer has them); for empty text,
    the token a document starts after: <|endoftext|> (bpe) or a newline (char)."""
    ids = tokenizer.encode(text).ids
    if ids:
        return ids
    eot = end_of_text_id(tokenizer)
    return [eot] if eot is not None else tokenizer.encode("\n").ids


def unknown_characters(tokenizer: Tokenizer, text: str) -> list[str]:
    """Characters of `text` a char tokenizer would turn into <unk> (none for bpe)."""
    unk = tokenizer.token_to_id(UNK)
    if unk is None:
        return []
    return sorted({ch for ch in set(text) if tokenizer.token_to_id(ch) is None})


class Unencodable:
    """The characters of the texts it is shown that a tokenizer cannot write: those whose
    decode(encode(·)) loses them (a BPE whose alphabet lacks a character or a byte drops it
    without a word: the model would learn the text without it, a JSON string without its
    escapes). Counted per character, with every character seen. A tokenizer with <unk> writes
    <unk> instead, counted as unknown (data/prepare.py), so this counts nothing for it. A
    character is tried alone and between two letters (a decoder may drop a leading space, as a
    Llama's does); the special tokens a template writes (<|im_start|>, ...) are one id each,
    and their characters are not the text's."""

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        self.checks = tokenizer.token_to_id(UNK) is None
        self.specials = [t.content for t in tokenizer.get_added_tokens_decoder().values() if t.special]
        self.writes: dict[str, bool] = {}  # character -> whether the tokenizer writes it
        self.lost: dict[str, int] = {}  # character -> how many times the texts held it
        self.characters = 0

    def count(self, text: str) -> None:
        for special in self.specials:
            if special in text:
                text = text.replace(special, "")
        self.characters += len(text)
        if not self.checks:
            return
        for ch in set(text):
            if ch not in self.writes:
                self.writes[ch] = any(ch in self.written(probe) for probe in (ch, f"a{ch}a"))
            if not self.writes[ch]:
                self.lost[ch] = self.lost.get(ch, 0) + text.count(ch)

    def written(self, text: str) -> str:
        """decode(encode(text)): the text as the tokenizer writes it back."""
        return self.tokenizer.decode(self.tokenizer.encode(text, add_special_tokens=False).ids)


def lost_characters(lost: dict[str, int], characters: int) -> str:
    """Unencodable's count in words: how many characters, how many times in how many, and each
    (in JSON's spelling: a newline as "\\n")."""
    times = sum(lost.values())
    by_count = sorted(lost.items(), key=lambda item: -item[1])
    each = ", ".join(f"{json.dumps(ch, ensure_ascii=False)} ×{n:,}" for ch, n in by_count)
    return (f"{len(lost)} character{'s' if len(lost) > 1 else ''} it cannot write, {times:,} times in {characters:,} "
            f"({times / max(characters, 1):.2%}): {each}")


PROMPT_CHARACTERS = 40  # the longest prompt suggest_prompt gives
UNQUOTABLE = set('"$`\\!')  # characters a shell reads inside double quotes


def suggest_prompt(tokenizer: Tokenizer, sample_prompt: str, text: str) -> str:
    """A short prompt for this tokenizer's model, to show how to try it: the run's
    train.sample_prompt if it has words, else the first whole line of `text` (the start of
    the validation split; its first line may be cut off, so the next one). Cut before any
    character the tokenizer never saw and any a shell reads inside double quotes, and at a
    word within PROMPT_CHARACTERS. A newline if nothing is left."""
    lines = [sample_prompt, *(text.split("\n")[1:] or [text])]
    unknown = set(unknown_characters(tokenizer, text + sample_prompt)) | UNQUOTABLE
    for line in lines:
        line = line.strip()
        cut = next((i for i, ch in enumerate(line) if ch in unknown), len(line))
        line = line[:cut].strip()
        if len(line) > PROMPT_CHARACTERS:
            line = line[:PROMPT_CHARACTERS].rsplit(" ", 1)[0] if " " in line[:PROMPT_CHARACTERS] else line[:PROMPT_CHARACTERS]
        if line:
            return line
    return "\n"


# Unicode's White_Space characters: what \s matches in the regex of byte-level BPE
WHITE_SPACE = frozenset("\t\n\v\f\r \x85\xa0\u1680\u2028\u2029\u202f\u205f\u3000"
                        + "".join(chr(c) for c in range(0x2000, 0x200B)))


def char_class(ch: str) -> str:
    """S (white space), L (letter), N (number) or P (anything else), as the GPT-2 regex sees it."""
    if ch in WHITE_SPACE:
        return "S"
    kind = unicodedata.category(ch)[0]
    return kind if kind in "LN" else "P"


def can_cut(text: str, i: int) -> bool:
    r"""True if text[:i] and text[i:] tokenize, each alone, into the tokens of the whole
    text. Byte-level BPE merges only inside the pieces its regex splits the text into
    (GPT-2's: 's|'t|…| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+), so a cut is
    safe where a piece always ends and nothing looks across: after a non-space character
    and before a space; or between a letter or number and something of another class; or
    between punctuation and a number (not before a letter: 's and 't start with ')."""
    before, after = char_class(text[i - 1]), char_class(text[i])
    return before != "S" and (after == "S" or (before in "LN" and after != before) or (before, after) == ("P", "N"))


class Encoder:
    """Text -> token ids as a numpy array, for tokenizing large corpora in bounded memory,
    with exactly the ids `tokenizer.encode` gives for the whole text.

    A char tokenizer maps each code point through a lookup table (the same ids as
    tokenizer.encode, without building a Python object per character). Other tokenizers
    (byte-level BPE) encode in pieces of about PIECE characters, spread over the CPU's
    cores, cut only where `can_cut` says the tokens cannot differ. Text that arrives in
    chunks cut anywhere goes through `feed` and `flush`, which hold back the end of each
    chunk up to its last safe cut."""

    PIECE = 1 << 16

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        self.unk = tokenizer.token_to_id(UNK)
        vocab = tokenizer.get_vocab()
        chars = {ch: i for ch, i in vocab.items() if ch != UNK}
        self.table = None
        if self.unk is not None and all(len(ch) == 1 for ch in chars):
            # the id of every code point up to the largest known one; past it, <unk>
            self.table = np.full(max(map(ord, chars), default=0) + 2, self.unk, dtype=np.int64)
            for ch, i in chars.items():
                self.table[ord(ch)] = i
        self.held = ""  # the end of the text fed so far, not yet encoded

    def __call__(self, text: str) -> np.ndarray:
        """The ids of text, a whole text (or one whole document)."""
        return self.many([text])[0]

    def many(self, texts: list[str]) -> list[np.ndarray]:
        """The ids of each text, as if each were encoded alone. Byte-level BPE encodes all
        their pieces in one encode_batch: many small documents (the rows of a .jsonl file)
        then cost one call spread over the cores, not one call each."""
        if self.table is not None:
            return [self.lookup(text) for text in texts]
        pieces = [self.pieces(text) for text in texts]
        encodings = iter(self.tokenizer.encode_batch([p for ps in pieces for p in ps], add_special_tokens=False))
        ids = []
        for ps in pieces:  # each text's pieces, in order
            ids.append(np.fromiter(chain.from_iterable(next(encodings).ids for _ in ps), dtype=np.int64))
        return ids

    def lookup(self, text: str) -> np.ndarray:
        codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
        return self.table[np.minimum(codes, len(self.table) - 1)]

    def pieces(self, text: str) -> list[str]:
        """text cut into pieces of about PIECE characters, only where can_cut allows."""
        pieces, start = [], 0
        while start < len(text):
            end = len(text)
            if start + self.PIECE < len(text):
                end = self.last_cut(text, start + self.PIECE, start)
                if end == start:  # no safe cut in this piece: it grows to the next one
                    end = self.next_cut(text, start + self.PIECE)
            pieces.append(text[start:end])
            start = end
        return pieces

    def feed(self, chunk: str) -> np.ndarray:
        """The ids of the text fed so far up to its last safe cut; the rest waits for
        the next chunk (or `flush`)."""
        text = self.held + chunk
        cut = len(text) if self.table is not None else self.last_cut(text, len(text) - 1, 0)
        self.held = text[cut:]
        return self(text[:cut])

    def flush(self) -> np.ndarray:
        """The ids of what `feed` held back: call it at the end of a text or document."""
        text, self.held = self.held, ""
        return self(text)

    @staticmethod
    def last_cut(text: str, end: int, start: int) -> int:
        """The last safe cut in (start, end], or start if there is none."""
        return next((i for i in range(end, start, -1) if can_cut(text, i)), start)

    @staticmethod
    def next_cut(text: str, start: int) -> int:
        """The first safe cut after `start`, or the end of the text."""
        return next((i for i in range(start + 1, len(text)) if can_cut(text, i)), len(text))
