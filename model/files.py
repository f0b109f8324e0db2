"""Writing a file so that no crash, kill or full disk can leave half of it behind."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch


def write_atomic(path: Path, data: bytes) -> None:
    """Write bytes to path so that readers see the old file or the new one, never part
    of either: write a temporary file beside it, flush it to the disk, rename it over
    the old one (a rename is atomic), then flush the folder so the rename is kept too.
    On any failure the temporary file is removed and the old file is untouched."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_folder(path.parent)


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
