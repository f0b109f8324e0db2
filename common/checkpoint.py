"""The run directory: the one place that knows its files, writes them so that no fault
leaves a broken one, reads them back, and locks it against a second run.

    out_dir/
      config.json, model.safetensors   the model (GPT.pretrained_files)
      tokenizer.json                   the tokenizer, in Hugging Face tokenizers' format
      config.yaml                      the fully resolved run config
      trainer_state.pt                 the resume point: the weights again, the optimizer,
                                       the iteration, RNG and sampler states
      events.out.tfevents.*            TensorBoard's curves (training/logger.py)
      .lock                            held while a run trains into out_dir

Every file is written by model.files.write_atomic (a temporary file, flushed, renamed
over the old one, then the folder flushed), so a kill or a full disk at any moment
leaves the previous complete file in place. trainer_state.pt is written last and alone
decides where a resume starts, so a kill between two files can never pair new weights
with an old optimizer.
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

import torch
from filelock import FileLock, Timeout
from tokenizers import Tokenizer

from data import load_tokenizer
from model import GPT
from model.files import write_atomic
from model.gpt import CONFIG_FILE, WEIGHTS_FILE

from .cli import UserError

TOKENIZER_FILE = "tokenizer.json"
RUN_CONFIG_FILE = "config.yaml"
STATE_FILE = "trainer_state.pt"
LOCK_FILE = ".lock"
CHECKPOINT_FILES = (CONFIG_FILE, WEIGHTS_FILE, TOKENIZER_FILE, STATE_FILE)  # in the order they are written
DEFAULT_RUN = Path("out/tiny")  # where configs/tiny.yaml trains: the run generate.py samples by default


def save_run(out_dir: Path, model: GPT, tokenizer: Tokenizer, state: dict[str, Any]) -> None:
    """One checkpoint: the model and tokenizer generate.py needs, then the trainer state."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    files = {**model.pretrained_files(), TOKENIZER_FILE: tokenizer.to_str().encode(), STATE_FILE: buffer.getvalue()}
    for name in CHECKPOINT_FILES:
        write_atomic(out_dir / name, files[name])


def save_run_config(out_dir: Path, text: str) -> None:
    write_atomic(out_dir / RUN_CONFIG_FILE, text.encode())


def start_over(out_dir: Path) -> None:
    """--fresh: forget the resume point and the old curves (the model files are replaced
    by the first checkpoint of the new run)."""
    (out_dir / STATE_FILE).unlink(missing_ok=True)
    for old in out_dir.glob("events.out.tfevents.*"):
        old.unlink()


def load_state(out_dir: Path) -> dict[str, Any] | None:
    """The trainer state, or None if there is none. Never unpickles code:
    weights_only=True refuses anything but tensors and plain containers."""
    path = out_dir / STATE_FILE
    if not path.is_file():
        return None
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise UserError(f"{path} cannot be loaded safely ({str(e).splitlines()[0][:200]}); "
                        "it is damaged or not ours: start over with --fresh or use another out_dir") from e


def load_run(directory: Path, device: torch.device | str = "cpu") -> tuple[GPT, Tokenizer]:
    """The model and tokenizer of a run directory, or a UserError saying what is wrong."""
    if not directory.is_dir():
        hint = " (the tiny config's run)" if directory == DEFAULT_RUN else ""
        raise UserError(f"checkpoint folder {directory}{hint} does not exist; train one first: "
                        "python train.py --config configs/tiny.yaml")
    missing = [name for name in (CONFIG_FILE, WEIGHTS_FILE, TOKENIZER_FILE) if not (directory / name).is_file()]
    if missing:
        raise UserError(f"{directory} is missing {', '.join(missing)}; it is not a finished run "
                        "directory (train again with python train.py --config ...)")
    try:
        model = GPT.from_pretrained(directory, device=device)
        tokenizer = load_tokenizer(directory / TOKENIZER_FILE)
    except (ValueError, FileNotFoundError) as e:
        raise UserError(f"{e}; retrain or copy the run directory again") from None
    if tokenizer.get_vocab_size() != model.config.vocab_size:
        raise UserError(f"{directory}/{TOKENIZER_FILE} has {tokenizer.get_vocab_size()} tokens but the model "
                        f"expects {model.config.vocab_size}; they come from different runs")
    return model, tokenizer


class RunLock:
    """An exclusive lock on out_dir/.lock (filelock: flock on POSIX, msvcrt on Windows).
    The OS releases it when the process dies, even by SIGKILL, so a crashed run never
    leaves a stale lock. The holder writes its process id into the file, for messages."""

    def __init__(self, out_dir: Path):
        self.path = out_dir / LOCK_FILE
        self.lock = FileLock(self.path)

    def acquire(self) -> bool:
        try:
            self.lock.acquire(timeout=0)
        except Timeout:
            return False
        self.path.write_text(f"{os.getpid()}\n")
        return True

    def holder(self) -> str:
        try:
            return self.path.read_text().strip() or "another process"
        except OSError:
            return "another process"

    def release(self) -> None:
        if self.lock.is_locked:
            self.lock.release()
