"""The run folder: the one place that knows its files. Every program opens a run through
a RunDir; no other module names a file in it.

    out_dir/
      config.json, model.safetensors   the model (GPT.save_pretrained's two files)
      tokenizer.json                   the tokenizer, in Hugging Face tokenizers' format
      chat_template.jinja              a run on conversations: the template that renders them (data/template.py)
      special_tokens_map.json          a run from a transformers model: the roles it gave its special tokens
                                       (and the ids its config.json gave them, "eos_token_id": ...)
      adapter_model.safetensors        a run with LoRA adapters (lora/): the adapters alone (model.safetensors
      adapter_config.json              holds the model with them merged), and their settings
      config.yaml                      the fully resolved run config
      summary.json                     what the run measured, for model cards and tools
      trainer_state.pt                 the resume point: the weights again, the optimizers,
                                       the iteration, the schedule, RNG and sampler states
      snapshots/step_NNNNNN.safetensors the model at a schedule of steps (train.snapshots)
      events.out.tfevents.*            TensorBoard's curves (training/logger.py)
      metrics.jsonl                    the same scalars, one JSON line a step: {"step": N, "train/loss": x, ...}
      best/                            the model with the lowest validation loss so far (train.keep_best),
                                       a run folder of its own: model, tokenizer, summary.json, config.yaml
      .lock                            held while a run trains into out_dir

Every file is written by storage.atomic.write_atomic (a temporary file, flushed, renamed
over the old one, then the folder flushed), so a kill or a full disk at any moment
leaves the previous complete file in place. trainer_state.pt is written last and alone
decides where a resume starts, so a kill between two files can never pair new weights
with an old optimizer.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import torch
import yaml
from filelock import FileLock, Timeout
from tokenizers import Tokenizer

from data.config import DataConfig
from data.tokenizer import load_tokenizer
from model import GPT
from model.config import checked_types
from storage.atomic import write_atomic
from model.gpt import CONFIG_FILE, WEIGHTS_FILE

from cli.program import UserError

DEFAULT_RUN = Path("out/tiny")  # where configs/tiny.yaml trains: the run generate.py samples by default


class RunDir:
    """One run folder. Reading needs nothing but the folder; writing is the trainer's."""

    MODEL_CONFIG = CONFIG_FILE  # config.json, named by the model (GPT.save_pretrained)
    WEIGHTS = WEIGHTS_FILE  # model.safetensors, the same
    TOKENIZER = "tokenizer.json"
    CHAT_TEMPLATE = "chat_template.jinja"  # (transformers' name for the file)
    SPECIAL_TOKENS = "special_tokens_map.json"  # (transformers' name too: {"eos_token": "</s>", ...})
    ADAPTERS, ADAPTER_CONFIG = "adapter_model.safetensors", "adapter_config.json"  # (peft's names)
    WHOLE_STARTS = "modules_to_save.start.safetensors"  # LoRA: the modules trained whole, as they started
    RUN_CONFIG = "config.yaml"
    SUMMARY = "summary.json"
    STATE = "trainer_state.pt"
    SNAPSHOTS = "snapshots"
    METRICS = "metrics.jsonl"
    BEST = "best"
    LOCK = ".lock"
    MODEL_FILES = (MODEL_CONFIG, WEIGHTS, TOKENIZER)  # what generate.py needs: a finished model

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)

    def __str__(self) -> str:
        return str(self.path)

    # ---- reading: what generate.py, evaluate.py, export.py and explore.py open -------------

    def load_model(self, device: torch.device | str = "cpu") -> tuple[GPT, Tokenizer]:
        """The model and tokenizer, or a UserError saying what is wrong."""
        if not self.path.is_dir():
            hint = " (the tiny config's run)" if self.path == DEFAULT_RUN else ""
            raise UserError(f"checkpoint folder {self.path}{hint} does not exist; train one first: "
                            "python train.py --config configs/tiny.yaml")
        missing = [name for name in self.MODEL_FILES if not (self.path / name).is_file()]
        if missing:
            raise UserError(f"{self.path} is missing {', '.join(missing)}; it is not a finished run "
                            "directory (train again with python train.py --config ...)")
        try:
            model = GPT.from_pretrained(self.path, device=device)
            tokenizer = load_tokenizer(self.path / self.TOKENIZER)
        except (ValueError, FileNotFoundError) as e:
            raise UserError(f"{e}; retrain or copy the run directory again") from None
        if tokenizer.get_vocab_size() != model.config.vocab_size:
            raise UserError(f"{self.path / self.TOKENIZER} has {tokenizer.get_vocab_size()} tokens but the model "
                            f"expects {model.config.vocab_size}; they come from different runs")
        return model, tokenizer

    def run_config(self) -> dict[str, Any]:
        """config.yaml as plain sections ({} if the run has none): read, never executed."""
        path = self.path / self.RUN_CONFIG
        if not path.is_file():
            return {}
        try:
            raw = yaml.safe_load(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
            raise UserError(f"{path} cannot be read ({str(e).splitlines()[0]}); copy the run directory again") from None
        return raw if isinstance(raw, dict) else {}

    def data_config(self) -> DataConfig:
        """The data section of config.yaml: where the run's text came from and how it became tokens."""
        section = self.run_config().get("data")
        if not isinstance(section, dict):
            raise UserError(f"{self.path / self.RUN_CONFIG} does not exist or has no data: section (train.py "
                            "writes it)")
        try:
            return DataConfig(**checked_types(DataConfig, section))
        except (ValueError, TypeError, KeyError) as e:
            raise UserError(f"{self.path / self.RUN_CONFIG}: data.{e}") from None

    def chat_template(self) -> str | None:
        """The Jinja template of a run trained on conversations (None: a run on plain text).
        It is text that data/template.py runs in Jinja's sandbox, never Python."""
        path = self.path / self.CHAT_TEMPLATE
        try:
            return path.read_text(encoding="utf-8") if path.is_file() else None
        except (OSError, UnicodeDecodeError) as e:
            raise UserError(f"{path} cannot be read ({e}); copy the run directory again") from None

    def adapters(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """A LoRA run's trained tensors (adapter_model.safetensors, our names) and their
        settings (adapter_config.json); a one-line refusal for a run without adapters."""
        from safetensors.torch import load_file

        if not (self.path / self.ADAPTERS).is_file():
            raise UserError(f"{self.path} has no LoRA adapters ({self.ADAPTERS}): it trained every weight; "
                            "export it without --adapters")
        try:
            return load_file(str(self.path / self.ADAPTERS)), json.loads((self.path / self.ADAPTER_CONFIG).read_text())
        except (OSError, ValueError) as e:
            raise UserError(f"{self.path}'s adapters cannot be read ({e}); copy the run directory again") from None

    def special_tokens(self) -> dict[str, str]:
        """The roles of the special tokens of the model the run came from ({} when it kept none)."""
        return {role: token for role, token in self.kept_tokens().items() if isinstance(token, str)}

    def token_ids(self) -> dict[str, Any]:
        """The ids the config.json of the model the run came from gave its start, end and
        padding tokens ({"eos_token_id": 2, "pad_token_id": 0}; an end may be a list), kept
        beside the roles; {} when it kept none."""
        return {key: value for key, value in self.kept_tokens().items() if key.endswith("_token_id")}

    def kept_tokens(self) -> dict[str, Any]:
        """special_tokens_map.json as the run wrote it ({} for a run that wrote none)."""
        path = self.path / self.SPECIAL_TOKENS
        try:
            return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise UserError(f"{path} cannot be read ({e}); copy the run directory again") from None

    def summary(self) -> dict[str, Any]:
        """summary.json ({} for a run that wrote none): the last evaluation and what it scored."""
        try:
            return json.loads((self.path / self.SUMMARY).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            return {}

    # ---- writing: the trainer's side ------------------------------------------------

    def save_model(self, model: GPT, tokenizer: Tokenizer) -> None:
        """The model files alone (a folder generate.py and evaluate.py can read)."""
        self.path.mkdir(parents=True, exist_ok=True)
        for name, data in self.model_files(model, tokenizer).items():
            write_atomic(self.path / name, data)

    def model_files(self, model: GPT, tokenizer: Tokenizer) -> dict[str, bytes]:
        return {**model.pretrained_files(), self.TOKENIZER: tokenizer.to_str().encode()}

    def save_adapters(self, tensors: dict[str, torch.Tensor], config: dict) -> None:
        """A run with LoRA adapters: the trained tensors alone, and their settings."""
        from storage.atomic import safetensors_bytes

        write_atomic(self.path / self.ADAPTERS,
                     safetensors_bytes({k: v.contiguous() for k, v in tensors.items()}, {"format": "pt"}))
        write_atomic(self.path / self.ADAPTER_CONFIG, (json.dumps(config, indent=2) + "\n").encode())

    def save_whole_starts(self, tensors: dict[str, torch.Tensor]) -> None:
        """A LoRA run's modules trained whole (lora.modules_to_save), as they started: the base
        export.py --adapters writes has them so."""
        from storage.atomic import safetensors_bytes

        write_atomic(self.path / self.WHOLE_STARTS, safetensors_bytes(tensors, {"format": "pt"}))

    def whole_starts(self) -> dict[str, torch.Tensor]:
        """What save_whole_starts kept ({} for a run that trained no module whole)."""
        from safetensors.torch import load_file

        if not (self.path / self.WHOLE_STARTS).is_file():
            return {}
        try:
            return load_file(str(self.path / self.WHOLE_STARTS))
        except (OSError, ValueError) as e:
            raise UserError(f"{self.path / self.WHOLE_STARTS} cannot be read ({e}); copy the run directory again") from None

    def save_chat_template(self, template: str) -> None:
        """A run on conversations: its template, once, at the start (it never changes)."""
        write_atomic(self.path / self.CHAT_TEMPLATE, template.encode())

    def save_special_tokens(self, roles: dict[str, Any]) -> None:
        """A run from a transformers model: the roles it gave its special tokens and the ids its
        config.json gave them, at the start."""
        write_atomic(self.path / self.SPECIAL_TOKENS, (json.dumps(roles, indent=2, ensure_ascii=False) + "\n").encode())

    def check_writable(self) -> None:
        """Fail before any work if the folder cannot be made or written."""
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            probe = self.path / ".write-test"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as e:
            raise UserError(f"out_dir {self.path} cannot be written ({e.strerror}); "
                            "choose another with out_dir=PATH") from None

    def remove_if_unused(self) -> None:
        """Remove the folder if it holds nothing but its lock: a run refused before it
        wrote anything (bad data, a bad setting) leaves nothing behind."""
        try:
            if {entry.name for entry in self.path.iterdir()} <= {self.LOCK}:
                (self.path / self.LOCK).unlink(missing_ok=True)
                self.path.rmdir()
        except OSError:  # (gone already, or another process wrote into it meanwhile: keep it)
            pass

    def lock(self) -> "RunLock":
        return RunLock(self.path / self.LOCK)

    def load_state(self) -> Any:
        """The trainer state as saved (training/state.py reads its layout), or None if there
        is none. Never unpickles code: weights_only=True refuses anything but tensors and
        plain containers."""
        path = self.path / self.STATE
        if not path.is_file():
            return None
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as e:
            raise UserError(f"{path} cannot be loaded safely ({str(e).splitlines()[0][:200]}); "
                            "it is damaged or not ours: start over with --fresh or use another out_dir") from e
        return state

    def save_run_config(self, text: str) -> None:
        write_atomic(self.path / self.RUN_CONFIG, text.encode())

    def save_checkpoint(self, model: GPT, tokenizer: Tokenizer, summary: dict[str, Any],
                        state: dict[str, Any]) -> None:
        """One checkpoint: the model and tokenizer generate.py needs, the summary, then the
        trainer state, in that order."""
        buffer = io.BytesIO()
        torch.save(state, buffer)
        files = {**self.model_files(model, tokenizer),
                 self.SUMMARY: (json.dumps(summary, indent=2, ensure_ascii=False) + "\n").encode(),
                 self.STATE: buffer.getvalue()}
        for name in self.checkpoint_files():
            write_atomic(self.path / name, files[name])

    def save_best(self, model: GPT, tokenizer: Tokenizer, summary: dict[str, Any]) -> None:
        """best/: the model just evaluated, the best so far (train.keep_best), with its summary
        and the run's config (and chat template): a folder generate.py, evaluate.py and
        export.py open as a run."""
        best = self.path / self.BEST
        best.mkdir(exist_ok=True)
        files = {**self.model_files(model, tokenizer),
                 self.SUMMARY: (json.dumps(summary, indent=2, ensure_ascii=False) + "\n").encode(),
                 self.RUN_CONFIG: (self.path / self.RUN_CONFIG).read_bytes()}
        for name in (self.CHAT_TEMPLATE, self.SPECIAL_TOKENS):
            if (self.path / name).is_file():
                files[name] = (self.path / name).read_bytes()
        for name, data in files.items():
            write_atomic(best / name, data)

    def best(self) -> "RunDir | None":
        """The best model's folder, where the run keeps one."""
        return RunDir(self.path / self.BEST) if (self.path / self.BEST / self.SUMMARY).is_file() else None

    @classmethod
    def checkpoint_files(cls) -> tuple[str, ...]:
        """The files of one checkpoint, in the order they are written: the state last."""
        return *cls.MODEL_FILES, cls.SUMMARY, cls.STATE

    def start_over(self) -> None:
        """--fresh: forget the resume point, the old curves (TensorBoard's and metrics.jsonl),
        the best model and the snapshots (the model files are replaced by the first
        checkpoint of the new run)."""
        (self.path / self.STATE).unlink(missing_ok=True)
        (self.path / self.METRICS).unlink(missing_ok=True)
        shutil.rmtree(self.path / self.BEST, ignore_errors=True)
        for old in [*self.path.glob("events.out.tfevents.*"), *self.snapshot_paths().values()]:
            old.unlink()

    def open_metrics(self, resumed_at: int):
        """metrics.jsonl, open for appending one JSON line a step. A run resumed at iteration
        `resumed_at` first drops the lines past it (written by the process that was killed
        after its last checkpoint, and about to be written again), and a last line a kill cut
        short."""
        path = self.path / self.METRICS
        if path.exists():
            kept = []
            for line in path.read_text(encoding="utf-8").splitlines():
                try:
                    step = json.loads(line)["step"]
                except (ValueError, KeyError, TypeError):
                    continue
                if step <= resumed_at:
                    kept.append(line + "\n")
            write_atomic(path, "".join(kept).encode())
        return open(path, "a", encoding="utf-8")

    # ---- snapshots: the model as it forms ---------------------------------------------

    def snapshot_path(self, step: int) -> Path:
        return self.path / self.SNAPSHOTS / f"step_{step:06d}.safetensors"

    def snapshot_paths(self) -> dict[int, Path]:
        """{step: file} of the snapshots kept, in step order."""
        found = {}
        for path in (self.path / self.SNAPSHOTS).glob("step_*.safetensors"):
            match = re.fullmatch(r"step_(\d+)\.safetensors", path.name)
            if match:
                found[int(match.group(1))] = path
        return dict(sorted(found.items()))

    def save_snapshot(self, step: int, model: GPT) -> None:
        """The model's weights at `step`, the bytes save_pretrained writes (float32 while
        training): the snapshot of the last step is model.safetensors itself."""
        (self.path / self.SNAPSHOTS).mkdir(parents=True, exist_ok=True)
        write_atomic(self.snapshot_path(step), model.pretrained_files()[self.WEIGHTS])

    def load_snapshot(self, step: int, model: GPT) -> GPT:
        """`model` (the run's, from load_model) with the weights of the snapshot of `step`."""
        from safetensors.torch import load_model

        load_model(model, str(self.snapshot_path(step)), strict=True, device=str(model.lm_head.weight.device))
        return model


class RunLock:
    """An exclusive lock on out_dir/.lock (filelock: flock on POSIX, msvcrt on Windows).
    The OS releases it when the process dies, even by SIGKILL, so a crashed run never
    leaves a stale lock. The holder writes its process id into the file, for messages."""

    def __init__(self, path: Path):
        self.path = path
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
