"""Checkpoints that survive faults, and a lock so two runs never share an out_dir.

A run directory holds what generate.py needs (model.safetensors, config.json,
tokenizer.json) and what a resume needs (trainer_state.pt: the weights again, the
optimizer, the iteration, RNG and sampler states). Every file is written to a
temporary name, flushed to disk, then renamed over the old one (os.replace is atomic),
so a kill or a full disk at any moment leaves the previous complete file in place.
trainer_state.pt is written last and alone decides where a resume starts, so a kill
between two files can never pair new weights with an old optimizer.
"""

from __future__ import annotations

import fcntl
import io
import os
from pathlib import Path
from typing import Any

import torch

STATE_FILE = "trainer_state.pt"
LOCK_FILE = ".lock"


def write_atomic(path: Path, data: bytes) -> None:
    """Write bytes to path so that readers see the old file or the new one, never half."""
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


def save_state(out_dir: Path, state: dict[str, Any]) -> None:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    write_atomic(out_dir / STATE_FILE, buffer.getvalue())


def load_state(out_dir: Path) -> dict[str, Any] | None:
    """The trainer state, or None if there is none. Never unpickles code:
    weights_only=True refuses anything but tensors and plain containers."""
    path = out_dir / STATE_FILE
    if not path.is_file():
        return None
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise ValueError(f"{path} cannot be loaded safely ({str(e).splitlines()[0][:200]}); "
                         "it is damaged or not ours: start over with --fresh or use another out_dir") from e


class RunLock:
    """An exclusive lock on out_dir/.lock. The OS releases it when the process dies,
    even by SIGKILL, so a crashed run never leaves a stale lock."""

    def __init__(self, out_dir: Path):
        self.path = out_dir / LOCK_FILE
        self.file = None

    def acquire(self) -> bool:
        self.file = open(self.path, "a+")
        try:
            fcntl.flock(self.file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.file.close()
            self.file = None
            return False
        self.file.seek(0)
        self.file.truncate()
        self.file.write(f"{os.getpid()}\n")
        self.file.flush()
        return True

    def holder(self) -> str:
        try:
            return self.path.read_text().strip() or "another process"
        except OSError:
            return "another process"

    def release(self) -> None:
        if self.file is not None:
            fcntl.flock(self.file, fcntl.LOCK_UN)
            self.file.close()
            self.file = None
