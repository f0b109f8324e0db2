"""Run configuration: a YAML file with sections model/data/train and an out_dir,
plus dotted overrides from the command line, loaded into typed dataclasses.

Every mistake (a missing file, bad YAML, an unknown or misspelled key, a wrong type,
an impossible value) raises ConfigError naming the key, the value and the file.
"""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from model import GPTConfig


class UserError(Exception):
    """Bad input from the user: the message says what is wrong and how to fix it."""


class ConfigError(UserError):
    pass


@dataclass
class DataConfig:
    source: str = "shakespeare"  # 'shakespeare', a local file or folder, or 'hf:<name>[:<config>]'
    tokenizer: str = "char"  # char or bpe
    vocab_size: int = 4096  # bpe only
    text_field: str = "text"  # column of .jsonl/.csv/.parquet and hub datasets
    val_fraction: float = 0.1
    cache_dir: str | None = None  # token files; default data/cache


@dataclass
class TrainConfig:
    max_iters: int = 2000
    batch_size: int = 32  # sequences per micro-batch, per process
    grad_accum: int = 1  # micro-batches per optimizer step
    lr: float = 1e-3  # peak learning rate, reached after warmup
    min_lr: float = 1e-4  # end of the cosine decay
    warmup_iters: int = 100
    lr_decay_iters: int | None = None  # default: max_iters
    weight_decay: float = 0.1  # on matrices only; never on norms, biases, embeddings
    beta1: float = 0.9
    beta2: float = 0.99
    grad_clip: float = 1.0  # 0 disables clipping
    eval_interval: int = 250
    eval_iters: int = 20  # fixed batches per evaluation
    checkpoint_interval: int | None = None  # default: eval_interval
    log_interval: int = 10
    sample_tokens: int = 200  # generated at each evaluation (0: none)
    sample_prompt: str = "\n"
    device: str = "auto"  # auto (cuda, then mps, then cpu), cpu, cuda, cuda:N, mps
    dtype: str = "auto"  # auto, float32, bfloat16, float16 (autocast)
    compile: bool = False
    threads: int = 0  # torch intra-op threads; 0 leaves torch's default
    seed: int = 1337


SECTIONS = {"model": GPTConfig, "data": DataConfig, "train": TrainConfig}
MODEL_SET_BY_DATA = ("vocab_size",)


@dataclass
class RunConfig:
    model: dict[str, Any] = field(default_factory=dict)  # GPTConfig fields but vocab_size
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    out_dir: str = "out/run"
    source: str = "<defaults>"  # the file it came from, for messages

    def model_config(self, vocab_size: int) -> GPTConfig:
        try:
            return GPTConfig(vocab_size=vocab_size, **self.model)
        except ValueError as e:
            raise ConfigError(f"{self.source}: model.{e}") from None

    def to_dict(self) -> dict[str, Any]:
        return {"out_dir": self.out_dir, "model": dict(self.model),
                "data": dataclasses.asdict(self.data), "train": dataclasses.asdict(self.train)}


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
    return build(raw, path)


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


def build(raw: dict, path: Path) -> RunConfig:
    unknown = set(raw) - {*SECTIONS, "out_dir"}
    for key in sorted(unknown):
        raise ConfigError(f"{path}: unknown key {key!r}{suggest(key, [*SECTIONS, 'out_dir'])}")
    sections = {}
    for section, cls in SECTIONS.items():
        values = raw.get(section) or {}
        if not isinstance(values, dict):
            raise ConfigError(f"{path}: {section}: must be a mapping of keys to values, not {values!r}")
        fields = {f.name: f for f in dataclasses.fields(cls)}
        for key, value in values.items():
            if section == "model" and key in MODEL_SET_BY_DATA:
                raise ConfigError(f"{path}: model.{key} is set from the tokenizer; remove it "
                                  "(for bpe, set data.vocab_size)")
            if key not in fields:
                raise ConfigError(f"{path}: unknown key {section}.{key}{suggest(key, fields)}")
            values[key] = check_type(f"{section}.{key}", value, fields[key].type, path)
        sections[section] = values
    out_dir = raw.get("out_dir", f"out/{path.stem}")
    if not isinstance(out_dir, str) or not out_dir:
        raise ConfigError(f"{path}: out_dir={out_dir!r}: must be a folder path")
    try:
        data, train = DataConfig(**sections["data"]), TrainConfig(**sections["train"])
    except TypeError as e:
        raise ConfigError(f"{path}: {e}") from None
    config = RunConfig(sections["model"], data, train, out_dir, str(path))
    validate(config, path)
    config.model_config(vocab_size=1)  # the model section's own checks (sizes, options)
    return config


def check_type(key: str, value: Any, annotation: str, path: Path) -> Any:
    """Check a YAML value against a field's annotation ('int', 'float | None', ...)."""
    kinds = [k.strip() for k in annotation.split("|")]
    if value is None and "None" in kinds:
        return None
    kind = kinds[0]
    if kind == "float" and isinstance(value, str):
        try:  # PyYAML reads 3e-4 (no dot) as a string; take it as the number it means
            value = float(value)
        except ValueError:
            pass
    ok = {
        "int": isinstance(value, int) and not isinstance(value, bool),
        "float": isinstance(value, (int, float)) and not isinstance(value, bool),
        "bool": isinstance(value, bool),
        "str": isinstance(value, str),
    }[kind]
    if not ok:
        names = {"int": "an integer", "float": "a number", "bool": "true or false", "str": "a string"}
        raise ConfigError(f"{path}: {key}={value!r}: must be {names[kind]}")
    return float(value) if kind == "float" else value


def validate(config: RunConfig, path: Path) -> None:
    t = config.train
    rules = [
        ("train.max_iters", t.max_iters, t.max_iters >= 1, "must be at least 1"),
        ("train.batch_size", t.batch_size, t.batch_size >= 1, "must be at least 1"),
        ("train.grad_accum", t.grad_accum, t.grad_accum >= 1, "must be at least 1"),
        ("train.lr", t.lr, t.lr > 0, "must be positive, e.g. 1e-3"),
        ("train.min_lr", t.min_lr, 0 <= t.min_lr <= t.lr, "must be between 0 and train.lr"),
        ("train.warmup_iters", t.warmup_iters, t.warmup_iters >= 0, "must be 0 or more"),
        ("train.lr_decay_iters", t.lr_decay_iters, t.lr_decay_iters is None or t.lr_decay_iters >= 1,
         "must be at least 1 (or unset: max_iters)"),
        ("train.weight_decay", t.weight_decay, t.weight_decay >= 0, "must be 0 or more"),
        ("train.beta1", t.beta1, 0 <= t.beta1 < 1, "must be in [0, 1)"),
        ("train.beta2", t.beta2, 0 <= t.beta2 < 1, "must be in [0, 1)"),
        ("train.grad_clip", t.grad_clip, t.grad_clip >= 0, "must be 0 (off) or more"),
        ("train.eval_interval", t.eval_interval, t.eval_interval >= 1, "must be at least 1"),
        ("train.eval_iters", t.eval_iters, t.eval_iters >= 1, "must be at least 1"),
        ("train.checkpoint_interval", t.checkpoint_interval,
         t.checkpoint_interval is None or t.checkpoint_interval >= 1, "must be at least 1 (or unset)"),
        ("train.log_interval", t.log_interval, t.log_interval >= 1, "must be at least 1"),
        ("train.sample_tokens", t.sample_tokens, t.sample_tokens >= 0, "must be 0 or more"),
        ("train.dtype", t.dtype, t.dtype in ("auto", "float32", "bfloat16", "float16"),
         "must be one of auto, float32, bfloat16, float16"),
        ("train.threads", t.threads, t.threads >= 0, "must be 0 (torch's default) or more"),
        ("data.tokenizer", config.data.tokenizer, config.data.tokenizer in ("char", "bpe"),
         "must be one of char, bpe"),
        ("data.val_fraction", config.data.val_fraction, 0 < config.data.val_fraction < 1,
         "must be between 0 and 1, e.g. 0.1"),
    ]
    for key, value, ok, message in rules:
        if not ok:
            raise ConfigError(f"{path}: {key}={value!r}: {message}")


def suggest(word: str, choices) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else f"; known: {', '.join(sorted(choices))}"
