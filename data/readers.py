"""Reading files and the Hugging Face hub: what the text sources (data/text.py) and the
conversation sources (data/conversations.py) both need. JSON lines, Parquet files and
datasets are read as streams, a batch at a time, never held whole in memory."""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlparse

from .shared import DataError

LOCAL_FORMATS = {".txt": "text", ".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}


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


def hub_reachable(timeout: float = 3.0) -> bool:
    """A quick TCP check, so an offline machine fails in seconds, not after a minute of retries."""
    from huggingface_hub import constants

    url = urlparse(constants.ENDPOINT)
    try:
        socket.create_connection((url.hostname, url.port or 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def hub_out_of_reach(name: str) -> bool:
    """Whether dataset name must come from the hub (not a folder here, not HF_HUB_OFFLINE's cache)
    and the hub cannot be reached."""
    return not Path(name).is_dir() and not os.environ.get("HF_HUB_OFFLINE") and not hub_reachable()


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


def parquet_rows(path: Path) -> Iterator[tuple[str, dict]]:
    """(where, row) of each row of a Parquet file, read a batch at a time."""
    import pyarrow.parquet

    number = 0
    try:
        for batch in pyarrow.parquet.ParquetFile(path).iter_batches(batch_size=1000):
            for row in batch.to_pylist():
                number += 1
                yield f"{path}, row {number}", row
    except pyarrow.ArrowException as e:
        raise DataError(f"could not read {path}: {str(e).splitlines()[0]}") from None


def parquet_columns(path: Path) -> list[str]:
    import pyarrow.parquet

    try:
        return pyarrow.parquet.read_schema(path).names
    except (OSError, pyarrow.ArrowException):
        return []  # (the text path says what is wrong with the file)


def dataset_splits(name: str, config: str, data_files: str | None) -> list[str]:
    """The splits an hf: dataset has (its description's, or its files' as datasets names them
    from a folder in the hub's layout: train-*, test-*, validation-*); [] where it cannot say."""
    import datasets

    datasets.disable_progress_bars()
    try:
        builder = datasets.load_dataset_builder(name, data_files=data_files, name=config or None)
    except Exception:  # (datasets raises many kinds; loading the split says what is wrong)
        return []
    if builder.info.splits:
        return list(builder.info.splits)
    return list(builder.config.data_files or {})


def held_out_split(config, name: str, subset: str) -> Callable[[], str | None]:
    """The split an hf: dataset is validated on (DataConfig.held_out_split; None: a cut of
    data.hf_split), found from the dataset's splits when the data is first read, so that token
    files already made are found without it."""
    found: list = []

    def split() -> str | None:
        if not found:
            # (a hub out of reach: reading the data says so at once, in one line, without waiting on datasets)
            splits = [] if hub_out_of_reach(name) else dataset_splits(name, subset, config.hf_data_files)
            found.append(config.held_out_split(splits))
        return found[0]

    return split


def dataset_columns(name: str, config: str, split: str, data_files: str | None) -> list[str]:
    """The columns of an hf: dataset's split: from its description (the hub's dataset info), or
    from the schema or first record of its first local file, else by loading it."""
    import datasets

    datasets.disable_progress_bars()
    try:
        builder = datasets.load_dataset_builder(name, data_files=data_files, name=config or None)
    except Exception:  # (datasets raises many kinds; the text path says what is wrong)
        return []
    if builder.info.features is not None:
        return list(builder.info.features)
    files = (builder.config.data_files or {}).get(split.split("[")[0]) or []
    first = Path(str(files[0])) if files else None
    if first is not None and first.is_file():
        if first.suffix.lower() == ".parquet":
            return parquet_columns(first)
        if first.suffix.lower() == ".jsonl" and isinstance(record := first_record(first), dict):
            return list(record)
    return load_split(name, data_files, split, name=config or None)[0].column_names
