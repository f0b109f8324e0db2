"""Writing a file so that no crash, kill or full disk can leave half of it behind."""

from __future__ import annotations

import os
from pathlib import Path


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
