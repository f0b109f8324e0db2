"""Shared fixtures: a small corpus and a micro run configuration that trains in seconds."""

import os
import queue
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def corpus(tmp_path_factory) -> Path:
    """About 100 kB of real Shakespeare (one play of the built-in corpus)."""
    from data import shakespeare

    speeches = shakespeare.markdown_to_speeches(
        next(p for p in shakespeare.play_files() if p.stem == "macbeth").read_text(encoding="utf-8"))
    path = tmp_path_factory.mktemp("corpus") / "macbeth.txt"
    path.write_text("\n".join(speeches), encoding="utf-8")
    return path


@pytest.fixture
def micro(tmp_path, corpus):
    """Overrides for a micro run into tmp_path/run, with a char tokenizer (tests read its
    tokens as characters) and no average of the weights (after 30 steps tiny.yaml's would
    still be mostly the initial model); pass extra 'key=value' strings."""
    cache = tmp_path.parent / "token-cache"  # shared by the runs of one test

    def overrides(*extra: str, out: str = "run") -> list[str]:
        return [
            f"data.source={corpus}", f"data.cache_dir={cache}", f"out_dir={tmp_path / out}",
            "data.tokenizer=char", "model.n_layer=2", "model.n_head=2", "model.n_embd=32", "model.block_size=32",
            "train.batch_size=8", "train.max_iters=30", "train.eval_interval=10", "train.eval_iters=2",
            "train.warmup_iters=5", "train.log_interval=5", "train.sample_tokens=20",
            "train.dtype=float32", "train.threads=1", "train.max_minutes=null", "train.ema=0", *extra,
        ]

    return overrides


def run_cli(script: str, *args: str, timeout: float = 120, **kwargs) -> subprocess.CompletedProcess:
    cwd = Path(kwargs.pop("cwd", ROOT))
    if "MUTANT_UNDER_TEST" in os.environ and cwd != ROOT:  # a mutmut run: the child's mutmut
        shutil.copy(ROOT / "setup.cfg", cwd)  # reads its setup.cfg from the working directory
    return subprocess.run([sys.executable, str(ROOT / script), *args], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd, **kwargs)


def favour_token(model, token: int) -> None:
    """Make `token` every position's likeliest next token, by far: the final norm then
    outputs its bias b whatever the input, and the tied head scores token i as b · wte[i]."""
    import torch

    with torch.no_grad():
        ln_f, wte = model.transformer.ln_f, model.transformer.wte.weight
        ln_f.weight.zero_()
        ln_f.bias.copy_(torch.linspace(-1, 1, ln_f.bias.numel()))
        wte[token] = 10 * ln_f.bias


def make_trainer(overrides: list[str], dtype=None, config: str = "configs/tiny.yaml"):
    """A Trainer for a config file (tiny.yaml) and overrides, set up as train.py sets it up."""
    import torch

    from training.config import load_config
    from training.preparation import prepare_run
    from training.trainer import Trainer

    return Trainer(prepare_run(load_config(ROOT / config, overrides)), torch.device("cpu"), dtype or torch.float32)


def untrained_run(folder, kind="char", source="shakespeare", state=True, config=True, **model_settings):
    """A run directory made without training (fast): an untrained micro model (rope
    positions unless model_settings say otherwise), a tokenizer, and optionally the
    summary, trainer state and config.yaml train.py would write."""
    from runs.folder import RunDir
    from data.tokenizer import train_tokenizer
    from model import GPT, GPTConfig

    text = "First Citizen:\nBefore we proceed any further, hear me speak. " * 20
    tokenizer = train_tokenizer(kind, [text], 300)
    model = GPT(GPTConfig(**{"vocab_size": tokenizer.get_vocab_size(), "block_size": 16, "n_layer": 1, "n_head": 2,
                             "n_embd": 16, "pos_encoding": "rope", **model_settings}))
    folder.mkdir(parents=True)
    summary = {"iteration": 1234, "val_loss": 1.5, "val_bits_per_char": 2.164, "data_fingerprint": "0123abcd"}
    RunDir(folder).save_checkpoint(model, tokenizer, summary, {"iteration": 1234})
    if not state:
        (folder / "trainer_state.pt").unlink()
        (folder / "summary.json").unlink()
    if config:
        (folder / "config.yaml").write_text(f"data:\n  source: {source}\n  tokenizer: {kind}\n")
    return folder


class Lines:
    """A child's pipe, read line by line in a thread, so that waiting for a line can
    fail (never hang) if the child closes the pipe or the time runs out first."""

    def __init__(self, stream):
        self.queue: queue.Queue = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=lambda: [self.queue.put(line) for line in iter(stream.readline, "")]
                         + [self.queue.put("")], daemon=True).start()

    def wait_for(self, text: str, timeout: float = 60) -> None:
        deadline = time.time() + timeout
        while True:
            try:
                line = self.queue.get(timeout=max(0.0, deadline - time.time()))
            except queue.Empty:
                pytest.fail(f"no line with {text!r} within {timeout} s")
            self.seen.append(line)
            if text in line:
                return
            if line == "":
                pytest.fail(f"the process ended without printing {text!r}: {''.join(self.seen)[-2000:]}")

    def rest(self, timeout: float = 30) -> str:
        """Everything printed, once the child has closed the pipe."""
        while (line := self.queue.get(timeout=timeout)) != "":
            self.seen.append(line)
        return "".join(self.seen)
