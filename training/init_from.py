"""train.init_from: begin a new run with existing weights (interop/base_model.py reads them:
a run directory, or a Hugging Face GPT-2 family or Llama-family model). The model's settings
and tokenizer come from the source; the run may change only model.dropout, model.attn_impl
(the same computation) and a smaller model.block_size.
"""

from __future__ import annotations

import dataclasses

from cli.program import UserError
from interop.base_model import BaseModel
from model import GPTConfig

OVERRIDABLE = ("dropout", "attn_impl")  # and block_size, downwards


def config_for(base: BaseModel, wanted: GPTConfig, keys: tuple[str, ...]) -> GPTConfig:
    """The base model's settings with the run's allowed changes (`keys`: the model fields
    the run config sets); a one-line error for any other."""
    changes = {}
    for key in keys:
        ours, theirs = getattr(wanted, key), getattr(base.config, key)
        if ours == theirs:
            continue
        if key in OVERRIDABLE or (key == "block_size" and ours < theirs):
            changes[key] = ours
            continue
        allowed = "only model.dropout, model.attn_impl and a smaller model.block_size may differ"
        raise UserError(f"model.{key}={ours!r} differs from train.init_from={base.name}, which has "
                        f"{key}={theirs!r}; remove it from the config ({allowed})")
    return dataclasses.replace(base.config, **changes)
