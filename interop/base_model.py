"""A model brought in: a run directory of this project or a Hugging Face GPT-2 family or
Llama-family model (a local folder, or a hub id such as gpt2 or HuggingFaceTB/SmolLM2-135M,
downloaded once with huggingface_hub: config, safetensors weights, in one file or in shards
with their index, tokenizer and chat template only), read into this project's settings and
names. What train.init_from starts from (training/init_from.py) and what evaluate.py scores
before fine-tuning.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Tokenizer

from cli.program import UserError
from runs.folder import RunDir
from interop.hf import Unsupported, config_from_transformers, state_from_transformers
from data.template import chat_tokenizer, turn_ends
from data.tokenizer import END_OF_TEXT, end_of_text_ids, load_tokenizer
from model import GPT, GPTConfig

# (a run folder's model files, RunDir's names, are also what a transformers model folder names them)
# a model over a few GB ships its weights in shards, with an index naming the shard of each tensor
SHARD_INDEX = "model.safetensors.index.json"
# where a folder keeps its chat template: our runs and newer transformers in a file of its own, older in the config
TOKENIZER_CONFIG = "tokenizer_config.json"
DOWNLOAD = [RunDir.MODEL_CONFIG, RunDir.WEIGHTS, SHARD_INDEX, "model-*-of-*.safetensors", RunDir.TOKENIZER, TOKENIZER_CONFIG,
            RunDir.CHAT_TEMPLATE, RunDir.SPECIAL_TOKENS]
SPECIAL_ROLES = ("bos_token", "eos_token", "pad_token", "unk_token")
TOKEN_IDS = ("bos_token_id", "eos_token_id", "pad_token_id")  # config.json's, kept as the model came in with them


@dataclass
class BaseModel:
    """The model a run starts from: its settings, its tokenizer, and a way to read its weights."""

    name: str
    folder: Path
    config: GPTConfig
    label: str = ""  # how one-line errors name it: "train.init_from=NAME" (the default) or evaluate's "--checkpoint DIR"

    def __post_init__(self) -> None:
        self.label = self.label or f"train.init_from={self.name}"

    def tokenizer(self) -> Tokenizer:
        try:
            return load_tokenizer(self.folder / RunDir.TOKENIZER)
        except (ValueError, FileNotFoundError) as e:
            raise UserError(f"{self.label}: {e}") from None

    def chat_template(self) -> str | None:
        """The folder's chat template (Jinja text, run only in data/template.py's sandbox), or None."""
        if (self.folder / RunDir.CHAT_TEMPLATE).is_file():
            return (self.folder / RunDir.CHAT_TEMPLATE).read_text(encoding="utf-8")
        if (self.folder / TOKENIZER_CONFIG).is_file():
            template = read_json(self.folder / TOKENIZER_CONFIG).get("chat_template")
            if isinstance(template, list):  # several, by name (transformers' form): the default one
                template = next((t.get("template") for t in template if t.get("name") == "default"), None)
            return template if isinstance(template, str) else None
        return None

    def special_tokens(self) -> dict[str, str]:
        """The roles the folder gives its special tokens ({"eos_token": "<|im_end|>", ...}, from
        tokenizer_config.json, else special_tokens_map.json): those its tokenizer has, kept
        by the run so that an export declares them as the model came in with them."""
        vocabulary = self.tokenizer().get_vocab()
        for name in (TOKENIZER_CONFIG, RunDir.SPECIAL_TOKENS):
            if (self.folder / name).is_file():
                declared = read_json(self.folder / name)
                roles = {role: token.get("content") if isinstance(token, dict) else token
                         for role, token in declared.items() if role in SPECIAL_ROLES}
                roles = {role: token for role, token in roles.items() if isinstance(token, str) and token in vocabulary}
                if roles:
                    return roles
        return {}

    def token_ids(self) -> dict[str, int | list[int]]:
        """The ids config.json gives its start, end and padding tokens (an end may be a list),
        those its tokenizer has; for a run folder (a model fine-tuned here, brought in again),
        those it kept from the transformers model it came from. Kept by the run so that an
        export's config.json says them as the model came in with them."""
        size = self.tokenizer().get_vocab_size()
        settings = read_json(self.folder / RunDir.MODEL_CONFIG)
        if "model_type" not in settings and (self.folder / RunDir.SPECIAL_TOKENS).is_file():
            settings = read_json(self.folder / RunDir.SPECIAL_TOKENS)
        ids = {}
        for key in TOKEN_IDS:
            value = settings.get(key)
            listed = value if isinstance(value, list) else [value]
            if value is not None and all(isinstance(i, int) and 0 <= i < size for i in listed):
                ids[key] = value
        return ids

    def state_dict(self, config: GPTConfig) -> dict[str, torch.Tensor]:
        """The weights in our names, cut to config.block_size (learned positions), with the
        embedding (and head) grown to config.vocab_size where a chat template's markers
        were added to the tokenizer (grown_vocabulary)."""
        from safetensors.torch import load_file

        tensors = {}
        for shard in weight_files(self.folder, self.label):
            tensors.update(load_file(str(shard)))
        if "model_type" in read_json(self.folder / RunDir.MODEL_CONFIG):
            try:
                tensors = state_from_transformers(self.config, tensors)
            except Unsupported as e:
                raise UserError(f"{self.label}: {e}") from None
        elif self.config.tie_embeddings:
            tensors["transformer.wte.weight"] = tensors["lm_head.weight"]  # one tensor, stored once (tied)
        if "transformer.wpe.weight" in tensors:
            tensors["transformer.wpe.weight"] = tensors["transformer.wpe.weight"][:config.block_size]
        return grown_vocabulary(tensors, config.vocab_size)


def grown_vocabulary(state: dict[str, torch.Tensor], vocab_size: int) -> dict[str, torch.Tensor]:
    """A model's weights with the embedding (and an untied head) grown to vocab_size rows,
    each new row the mean of the old ones: a new token starts as an average token, neither
    favoured nor far off by the head (the mean-embedding start transformers'
    resize_token_embeddings uses); fine-tuning then teaches it."""
    for name in ("transformer.wte.weight", "lm_head.weight"):
        rows = state.get(name)
        if rows is not None and vocab_size > rows.size(0):
            state[name] = torch.cat([rows, rows.mean(0, keepdim=True).expand(vocab_size - rows.size(0), -1)])
    return state


def with_chat_markers(model: GPT, tokenizer: Tokenizer) -> tuple[GPT, Tokenizer]:
    """The model as fine-tuning with the default template starts it (evaluate.py scores the
    base this way): the template's markers added to the tokenizer (data/template.py), and the
    embedding (and an untied head) grown by their rows (grown_vocabulary)."""
    tokenizer = chat_tokenizer(tokenizer)
    config = dataclasses.replace(model.config, vocab_size=tokenizer.get_vocab_size())
    grown = GPT(config).to(model.lm_head.weight.device)
    grown.load_state_dict(grown_vocabulary(model.state_dict(), config.vocab_size))
    return grown, tokenizer


def weight_files(folder: Path, label: str) -> list[Path]:
    """model.safetensors, or the shards its index names (each a file of this folder: a name
    with a folder in it, or anything but safetensors, is refused)."""
    if (folder / RunDir.WEIGHTS).is_file():
        return [folder / RunDir.WEIGHTS]
    weight_map = read_json(folder / SHARD_INDEX).get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise UserError(f"{label}: {SHARD_INDEX} has no weight_map")
    shards = sorted(set(weight_map.values()))
    for shard in shards:
        if not isinstance(shard, str) or Path(shard).name != shard or not shard.endswith(".safetensors"):
            raise UserError(f"{label}: {SHARD_INDEX} names {shard!r}, not a safetensors file "
                            "of the model's folder")
        if not (folder / shard).is_file():
            raise UserError(f"{label}: the shard {shard} that {SHARD_INDEX} names is missing")
    return [folder / shard for shard in shards]


def read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UserError(f"{path} is not a readable JSON file ({e})") from None


def open_base_model(init_from: str, label: str | None = None) -> BaseModel:
    """Find the source (a folder, else a hub id) and read its settings; `label` names it in
    one-line errors (default: train.init_from=NAME)."""
    label = label or f"train.init_from={init_from}"
    folder = Path(init_from).expanduser()
    if not folder.is_dir():
        folder = download(init_from)
    files = {p.name for p in folder.iterdir()}
    if not {RunDir.WEIGHTS, SHARD_INDEX} & files:
        if {"pytorch_model.bin", "model.bin"} & files:
            raise UserError(f"{label} holds only pytorch_model.bin, a pickle, which this project "
                            "never loads (it can run code); convert it once to safetensors, e.g. "
                            f"python -c \"from transformers import AutoModelForCausalLM as M; "
                            f"M.from_pretrained('{folder}').save_pretrained('{folder}-safetensors')\"")
        raise UserError(f"{label} is neither a run directory ({RunDir.MODEL_CONFIG}, {RunDir.WEIGHTS}, "
                        f"{RunDir.TOKENIZER}) nor a Hugging Face model folder with {RunDir.WEIGHTS} (or its shards "
                        f"and {SHARD_INDEX})")
    for name in (RunDir.MODEL_CONFIG, RunDir.TOKENIZER):
        if name not in files:
            raise UserError(f"{label} has no {name}")
    settings = read_json(folder / RunDir.MODEL_CONFIG)
    try:
        if "model_type" in settings:  # a transformers model
            config = config_from_transformers(settings)
        else:
            config = GPTConfig.from_dict(settings)
    except (Unsupported, ValueError, KeyError) as e:
        raise UserError(f"{label}: {e}") from None
    base = BaseModel(init_from, folder, config, label)
    if "model_type" in settings:
        check_end_of_text(base, settings.get("eos_token_id"))
    return base


def check_end_of_text(base: BaseModel, declared) -> None:
    """The end-of-text tokens a transformers folder declares must be ones this project
    stops generation at and separates documents with (data.tokenizer.END_OF_TEXT), or the
    end of a chat turn (data.template.TURN_ENDS: a chat model's)."""
    tokenizer = base.tokenizer()
    known = set(end_of_text_ids(tokenizer)) | turn_ends(tokenizer)
    for token_id in [] if declared is None else declared if isinstance(declared, list) else [declared]:
        if token_id not in known:
            raise UserError(f"{base.label} declares end-of-text token {tokenizer.id_to_token(token_id)!r} "
                            f"(id {token_id}), which is not among the end-of-text tokens this project knows "
                            f"({', '.join(END_OF_TEXT)}): generation would not stop at it")


def download(repo_id: str) -> Path:
    """A hub model's config, weights and tokenizer, through huggingface_hub's cache."""
    from huggingface_hub import snapshot_download

    from data.readers import hub_reachable

    offline = bool(os.environ.get("HF_HUB_OFFLINE"))
    if not offline and not hub_reachable():
        raise UserError(f"train.init_from={repo_id} is not a folder here, and the Hugging Face hub cannot be "
                        "reached to download it; download it elsewhere and give its folder "
                        "(config.json, model.safetensors, tokenizer.json): train.init_from=path/to/folder")
    try:
        return Path(snapshot_download(repo_id, allow_patterns=DOWNLOAD, local_files_only=offline))
    except Exception as e:  # huggingface_hub raises many kinds: not found, gated, offline, ...
        raise UserError(f"train.init_from={repo_id}: could not download it ({type(e).__name__}: "
                        f"{str(e).splitlines()[0] if str(e) else ''}); give a local folder instead") from None


