"""Run configuration: a YAML file with sections model/data/train (lora, for adapters; dpo, for preference pairs)
and an out_dir, plus dotted overrides from the command line, loaded into typed dataclasses.

Each section is a dataclass that checks its own values when it is made (GPTConfig in
model/, DataConfig in data/, LoRAConfig in lora/, TrainConfig here); this module parses the YAML, checks
every value's type against the field it fills (model.config.checked_types), and turns
any mistake (a missing file, bad YAML, an unknown or misspelled key, a wrong type, an
impossible value) into a ConfigError naming the key, the value and the file.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from cli.program import UserError
from machine.device import DTYPES
from data.config import DataConfig
from data.tokenizer import check_bpe_vocabulary
from jobs.dpo import DPOConfig
from lora import LoRAConfig
from model import GPTConfig
from model.config import checked_types


class ConfigError(UserError):
    pass


HEAD = re.compile(r"L(\d+)H(\d+)")  # a head as train.heads_off names it: L0H1 is layer 0, head 1


@dataclass
class TrainConfig:
    max_iters: int = 2000
    epochs: float | None = None  # conversations: end after this many passes over them (or at max_iters, if sooner)
    packing: bool = False  # conversations: several a row (best-fit), each attending to itself alone
    max_minutes: float | None = None  # a time budget: max_iters is set to fit, from the measured speed
    batch_size: int = 32  # sequences per micro-batch, per process
    grad_accum: int = 1  # micro-batches per optimizer step
    optimizer: str = "adamw"  # adamw, or muon: Muon for the blocks' matrices, AdamW for the rest
    lr: float = 1e-3  # AdamW's peak learning rate, reached after warmup
    muon_lr: float = 0.02  # Muon's peak learning rate (optimizer: muon), scaled like AdamW's updates
    muon_momentum: float = 0.95
    muon_momentum_warmup: int = 0  # iterations over which Muon's momentum rises from 0.85 (0: none)
    min_lr: float = 1e-4  # the learning rate at the end of the decay
    warmup_iters: int = 100
    lr_schedule: str = "cosine"  # cosine decay after warmup, or wsd: stable, then a linear cooldown
    cooldown: float = 0.4  # wsd: the share of the iterations spent decaying to min_lr
    lr_decay_iters: int | None = None  # default: max_iters
    weight_decay: float = 0.1  # on matrices only; never on norms, biases, embeddings
    beta1: float = 0.9
    beta2: float = 0.99
    ema: float = 0.0  # evaluate and save an exponential moving average of the weights with this decay (0: off)
    grad_clip: float = 1.0  # 0 disables clipping
    eval_interval: int = 250
    eval_iters: int = 20  # fixed batches per evaluation: eval_iters × the global batch windows
    eval_windows: int | None = None  # or this many windows (however the batch is laid out)
    checkpoint_interval: int | None = None  # default: eval_interval
    keep_best: bool = False  # also keep the model of the lowest validation loss so far, in out_dir/best
    log_interval: int = 10
    sample_tokens: int = 200  # generated at each evaluation (0: none)
    sample_prompt: str = "\n"
    snapshots: int | None = None  # keep at most this many snapshots of the model as it forms (0: none);
    # unset: 16 to 64 (64 MB of them) for a model of up to 4 M parameters, none for a larger one (training/snapshots.py)
    snapshot_every: int = 10  # a snapshot every this many steps, the spacing doubled whenever there would be too many
    device: str = "auto"  # auto (cuda, then mps, then cpu), cpu, cuda, cuda:N, mps
    dtype: str = "auto"  # auto, float32, bfloat16, float16 (autocast)
    compile: bool = False
    checkpointing: bool = False  # gradient checkpointing: each block's activations computed again in the backward
    base_dtype: str = "float32"  # LoRA: the frozen matrices of the model brought in, kept in float32 or bfloat16
    heads_off: list = dataclasses.field(default_factory=list)  # heads held off from step 0, e.g. [L0H1, L0H3]
    threads: int = 0  # torch's CPU threads; 0: $OMP_NUM_THREADS if set, else one per core (machine/threads.py)
    seed: int = 1337
    init_from: str | None = None  # start from these weights: a run directory or a GPT-2 family model

    def __post_init__(self) -> None:
        rules = [
            ("max_iters", self.max_iters >= 1, "must be at least 1"),
            ("epochs", self.epochs is None or self.epochs > 0, "must be positive, e.g. 2 (or unset)"),
            ("max_minutes", self.max_minutes is None or self.max_minutes > 0, "must be positive (or unset)"),
            ("batch_size", self.batch_size >= 1, "must be at least 1"),
            ("grad_accum", self.grad_accum >= 1, "must be at least 1"),
            ("optimizer", self.optimizer in ("adamw", "muon"), "must be one of adamw, muon"),
            ("lr", self.lr > 0, "must be positive, e.g. 1e-3"),
            ("muon_lr", self.muon_lr > 0, "must be positive, e.g. 0.02"),
            ("muon_momentum", 0 <= self.muon_momentum < 1, "must be in [0, 1)"),
            ("muon_momentum_warmup", self.muon_momentum_warmup >= 0, "must be 0 (none) or more"),
            ("min_lr", 0 <= self.min_lr <= self.lr, "must be between 0 and train.lr"),
            ("warmup_iters", self.warmup_iters >= 0, "must be 0 or more"),
            ("lr_schedule", self.lr_schedule in ("cosine", "wsd"), "must be one of cosine, wsd"),
            ("cooldown", 0 < self.cooldown <= 1, "must be in (0, 1], e.g. 0.4"),
            ("lr_decay_iters", self.lr_decay_iters is None or self.lr_decay_iters >= 1,
             "must be at least 1 (or unset: max_iters)"),
            ("weight_decay", self.weight_decay >= 0, "must be 0 or more"),
            ("beta1", 0 <= self.beta1 < 1, "must be in [0, 1)"),
            ("beta2", 0 <= self.beta2 < 1, "must be in [0, 1)"),
            ("ema", 0 <= self.ema < 1, "must be in [0, 1), e.g. 0.99 (0: off)"),
            ("grad_clip", self.grad_clip >= 0, "must be 0 (off) or more"),
            ("eval_interval", self.eval_interval >= 1, "must be at least 1"),
            ("eval_iters", self.eval_iters >= 1, "must be at least 1"),
            ("eval_windows", self.eval_windows is None or self.eval_windows >= 1, "must be at least 1 (or unset)"),
            ("checkpoint_interval", self.checkpoint_interval is None or self.checkpoint_interval >= 1,
             "must be at least 1 (or unset)"),
            ("log_interval", self.log_interval >= 1, "must be at least 1"),
            ("sample_tokens", self.sample_tokens >= 0, "must be 0 or more"),
            ("snapshots", self.snapshots is None or self.snapshots >= 0, "must be 0 (none) or more, or unset"),
            ("snapshot_every", self.snapshot_every >= 1, "must be at least 1"),
            ("dtype", self.dtype in ("auto", *DTYPES), f"must be one of auto, {', '.join(DTYPES)}"),
            ("threads", self.threads >= 0, "must be 0 (torch's default) or more"),
            ("base_dtype", self.base_dtype in ("float32", "bfloat16"), "must be float32 or bfloat16"),
            ("heads_off", isinstance(self.heads_off, list) and all(isinstance(h, str) and HEAD.fullmatch(h)
                                                                    for h in self.heads_off),
             "must be a list of heads, each L<layer>H<head>, e.g. [L0H1, L0H3]"),
        ]
        for key, ok, message in rules:
            if not ok:
                raise ValueError(f"train.{key}={getattr(self, key)!r}: {message}")


SECTIONS = {"model": GPTConfig, "data": DataConfig, "train": TrainConfig, "lora": LoRAConfig, "dpo": DPOConfig}
MODEL_SET_BY_DATA = ("vocab_size",)


@dataclass
class RunConfig:
    model: GPTConfig  # vocab_size is a placeholder: the tokenizer sets it (model_with_vocab)
    data: DataConfig
    train: TrainConfig
    out_dir: str
    model_keys: tuple[str, ...] = ()  # the model fields the file or the overrides set
    lora: LoRAConfig = dataclasses.field(default_factory=LoRAConfig)  # low-rank adapters (lora/), off by default
    dpo: DPOConfig = dataclasses.field(default_factory=DPOConfig)  # preference pairs' objective (jobs/dpo.py)

    def __post_init__(self) -> None:
        if self.data.tokenizer == "bpe" and not self.train.init_from:  # (a model brought in brings its tokenizer)
            check_bpe_vocabulary(self.data.vocab_size)

    def model_with_vocab(self, vocab_size: int) -> GPTConfig:
        return dataclasses.replace(self.model, vocab_size=vocab_size)

    def to_dict(self, model: GPTConfig | None = None) -> dict[str, Any]:
        """The run config as YAML-ready sections, with the model actually built if given
        (with train.init_from, the source's settings)."""
        model = {k: v for k, v in (model or self.model).to_dict().items() if k not in MODEL_SET_BY_DATA}
        sections = {"out_dir": self.out_dir, "model": model,
                    "data": dataclasses.asdict(self.data), "train": dataclasses.asdict(self.train)}
        return sections | ({"lora": dataclasses.asdict(self.lora)} if self.lora.rank else {}) \
            | ({"dpo": dataclasses.asdict(self.dpo)} if self.dpo != DPOConfig() else {})


def load_config(path: str | Path, overrides: list[str] = ()) -> RunConfig:
    """Read a YAML run config and apply 'section.key=value' overrides (values typed as YAML)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist; see configs/ for examples, e.g. configs/tiny.yaml")
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise ConfigError(f"{path} is not UTF-8 text; save it as UTF-8") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"{path} is not valid YAML{where}: {problem}") from None
    if raw is None:
        raise ConfigError(f"{path} is empty; it needs model:, data: and train: sections (see configs/tiny.yaml)")
    if not isinstance(raw, dict):
        raise ConfigError(f"{path} must be a mapping with model:, data:, train: and out_dir, "
                          f"not a {type(raw).__name__}")
    raw = {**raw}
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"override {item!r} must look like section.key=value, e.g. train.max_iters=100")
        try:
            parsed = yaml.safe_load(value) if value else ""
        except yaml.YAMLError:
            parsed = value  # not YAML: take it as a plain string
        set_dotted(raw, key, parsed, path)
    return run_config(raw, path)


def set_dotted(raw: dict, key: str, value: Any, path: Path) -> None:
    parts = key.split(".")
    if len(parts) == 1:
        raw[key] = value
        return
    if len(parts) != 2:
        raise ConfigError(f"override key {key!r}: use section.key, e.g. train.lr=3e-4")
    section, name = parts
    if section not in SECTIONS:
        raise ConfigError(f"override {key!r}: unknown section {section!r}{suggest(section, SECTIONS)}")
    current = raw.get(section) or {}
    if not isinstance(current, dict):
        raise ConfigError(f"{path}: section {section}: must be a mapping")
    raw[section] = {**current, name: value}


def run_config(raw: dict, path: Path) -> RunConfig:
    for key in sorted(set(raw) - {*SECTIONS, "out_dir"}):
        raise ConfigError(f"{path}: unknown key {key!r}{suggest(key, [*SECTIONS, 'out_dir'])}")
    sections = {}
    for section, cls in SECTIONS.items():
        values = raw.get(section) or {}
        if not isinstance(values, dict):
            raise ConfigError(f"{path}: {section}: must be a mapping of keys to values, not {values!r}")
        fields = {f.name for f in dataclasses.fields(cls)}
        for key in values:
            if section == "model" and key in MODEL_SET_BY_DATA:
                raise ConfigError(f"{path}: model.{key} is set from the tokenizer; remove it "
                                  "(for bpe, set data.vocab_size)")
            if key not in fields:
                raise ConfigError(f"{path}: unknown key {section}.{key}{suggest(key, fields)}")
        try:
            sections[section] = cls(**checked_types(cls, values))
        except ValueError as e:  # a wrong type, or the section's own checks
            message = str(e) if str(e).startswith(f"{section}.") else f"{section}.{e}"
            raise ConfigError(f"{path}: {message}") from None
    out_dir = raw.get("out_dir", f"out/{path.stem}")
    if not isinstance(out_dir, str) or not out_dir:
        raise ConfigError(f"{path}: out_dir={out_dir!r}: must be a folder path")
    return RunConfig(sections["model"], sections["data"], sections["train"], out_dir, tuple(raw.get("model") or {}),
                     sections["lora"], sections["dpo"])


def suggest(word: str, choices) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else f"; known: {', '.join(sorted(choices))}"
