"""Every file and folder the project writes, written so that a reader sees the old one or
the new one, never part of either: the new one is made under a temporary name beside it,
flushed to the disk, renamed over the old one (a rename is atomic), and then the folder
is flushed too, so that the rename itself survives a power cut.

    write_atomic(path, data)          bytes into a file
    with replaced(path) as tmp: ...   what a library writes into a path of its own (a GGUF
                                      file, a folder of token files, an export's folder)
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # (torch is imported by whoever hands tensors over)
    import torch


def write_atomic(path: Path, data: bytes) -> None:
    """Write bytes to path atomically (the module's docstring says how). On any failure the
    temporary file is removed and the old file is untouched."""
    with replaced(Path(path)) as tmp:
        tmp.write_bytes(data)


@contextmanager
def replaced(path: Path) -> Iterator[Path]:
    """A temporary path beside `path` for the block to fill, a file or a folder; when the block
    ends, everything under it is flushed to the disk and it is renamed to `path` (over an old
    file; a folder only where none is, or an empty one), then the folder that holds it is
    flushed. If the block fails, the temporary path is removed and `path` is untouched."""
    path = Path(path)
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    remove(tmp)  # (a killed process's leftover of the same number)
    try:
        yield tmp
        flush_tree(tmp)
        if path.is_dir():
            path.rmdir()  # (an empty folder: Windows cannot rename over one)
        os.replace(tmp, path)
    except BaseException:
        remove(tmp)
        raise
    fsync_folder(path.parent)


def flush_tree(path: Path) -> None:
    """Flush a file, or every file of a folder and the folders themselves, to the disk."""
    if path.is_dir():
        for child in path.iterdir():
            flush_tree(child)
        fsync_folder(path)
        return
    with open(path, "rb+") as f:
        os.fsync(f.fileno())


def fsync_folder(folder: Path) -> None:
    """Flush a folder's entries to the disk (POSIX). Windows cannot open a folder for
    this and its file system journals renames itself, so there it does nothing."""
    if os.name == "nt":
        return
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def remove(path: Path) -> None:
    """A folder and what it holds, or a file; nothing if it is not there."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def safetensors_bytes(tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> bytes:
    """safetensors' `save`, with the header's metadata in sorted key order. The library
    writes the metadata from a hash map, whose order changes from process to process, so
    the same weights would give files of different bytes (and checksums)."""
    from safetensors.torch import save

    data = save({name: t.contiguous() for name, t in tensors.items()}, metadata=metadata)
    size = int.from_bytes(data[:8], "little")  # the file: [header size][JSON header][tensor bytes]
    header = json.loads(data[8:8 + size])
    header["__metadata__"] = dict(sorted(header["__metadata__"].items()))
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    if len(text) != len(data[8:8 + size].rstrip(b" ")):  # the same keys and values take the same bytes
        raise ValueError("safetensors wrote a header this function cannot reorder")
    return data[:8] + text.ljust(size) + data[8 + size:]  # (the library pads the header with spaces)
