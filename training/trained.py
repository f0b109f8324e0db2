"""What a run trains, as one type of two kinds, so that the loop never asks which:

    AllWeights  every weight of the model (from scratch, or a model brought in fine-tuned whole),
                but those of the heads held off (train.heads_off)
    Adapters    LoRA's adapters beside a frozen model brought in (lora/), the modules named
                to train whole (lora.modules_to_save), and any new chat markers' embedding rows

Each knows the weights the run's state keeps (`state_dict`, `load_state_dict`), the model
the run folder keeps (`saved`: with adapters, merged into plain matrices) and what it
writes beside it (`save_beside`: the adapters alone, as peft keeps them).
"""

from __future__ import annotations

import torch

from common.run_dir import RunDir
from lora import (add_adapters, adapter_file, adapter_state, frozen_in, load_adapter_state, merged, new_rows_from,
                  trained_count, trained_parameters, whole_modules)
from model import GPT

from .config import HEAD, ConfigError
from .preparation import PreparedRun


class AllWeights:
    """Every weight trains: the run's state keeps them all; the run folder keeps the model as it is."""

    def __init__(self, model: GPT):
        self.model = model

    def count(self) -> int:
        """The numbers that train: all of them."""
        return self.model.num_parameters()

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self.model.state_dict()

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.model.load_state_dict(state)

    def saved(self, model: GPT) -> GPT:
        """The model the run folder keeps (model: the trained weights, or their average)."""
        return model

    def save_beside(self, run_dir: RunDir, model: GPT) -> None:
        """Nothing is kept beside the model."""


class Adapters:
    """LoRA (lora/): the model brought in freezes, adapters train beside the matrices that
    lora.targets names (and the new chat markers' embedding rows, where the data added
    some); with train.base_dtype=bfloat16 its adapted matrices are kept in bfloat16. The
    run's state keeps the trained tensors alone."""

    def __init__(self, model: GPT, run: PreparedRun):
        lora = run.config.lora
        first_new = run.base.tokenizer().get_vocab_size()  # (the ids data/template.py added come after)
        self.new_tokens_from = first_new if run.data.vocab_size > first_new else None
        add_adapters(model, lora, self.new_tokens_from)
        if run.config.train.base_dtype == "bfloat16":  # the frozen matrices as autocast computes with them: half the memory
            frozen_in(model, torch.bfloat16)
        self.model = model
        self.names = list(trained_parameters(model))  # the parameters that train
        self.rows_from = new_rows_from(model)  # (a matrix whose new rows alone train: the first)
        whole = whole_modules(model, lora.modules_to_save)
        # what the modules trained whole start from: export.py --adapters writes it as base/'s
        self.starts: dict[str, torch.Tensor] | None = {f"{name}.{key}": t.detach().to("cpu", copy=True)
                                                      for name, module in whole.items()
                                                      for key, t in module.state_dict().items()} or None
        self.settings = {"r": lora.rank, "lora_alpha": lora.alpha, "lora_dropout": lora.dropout,
                         "target_modules": lora.targets, "modules_to_save": sorted(whole),
                         "base_model_name_or_path": run.config.train.init_from}

    def count(self) -> int:
        """The numbers that train: the adapters', and the new tokens' rows."""
        return trained_count(self.model)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return adapter_state(self.model, self.names)

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """The adapters saved (the weights brought in are loaded already, as they were)."""
        load_adapter_state(self.model, state, self.names)

    def saved(self, model: GPT) -> GPT:
        """The model the run folder keeps, and every program reads: the adapters merged."""
        return merged(model)

    def save_beside(self, run_dir: RunDir, model: GPT) -> None:
        """adapter_model.safetensors and adapter_config.json: the adapters alone (and the modules
        trained whole), and their settings (peft's keys where they mean the same: r, lora_alpha,
        lora_dropout, target_modules, modules_to_save); at a process's first save, what the
        modules trained whole started from."""
        run_dir.save_adapters(adapter_file(model, self.names, self.rows_from),
                              self.settings | {"trained": self.names, "rows_from": self.rows_from})
        if self.starts is not None:
            run_dir.save_whole_starts(self.starts)
            self.starts = None


def held_off(model: GPT, heads: list[str]) -> None:
    """train.heads_off: each named head (L0H1: layer 0, head 1) writes nothing from step 0
    (Singh et al., 2024, "What needs to go right for an induction head?", clamp heads while
    the model trains): its columns of W_O are zero and stay zero, their gradient zeroed
    (AdamW and Muon then leave them at zero). The saved model is the one trained: every
    program opens it with those heads off, their attention still computed, writing nothing."""
    c = model.config
    for name in heads:
        layer, head = map(int, HEAD.fullmatch(name).groups())
        if layer >= c.n_layer or head >= c.n_head:
            raise ConfigError(f"train.heads_off names {name}, but the model has {c.n_layer} layers of {c.n_head} "
                              f"heads (L0H0 to L{c.n_layer - 1}H{c.n_head - 1})")
        w_o = model.transformer.h[layer].attn.c_proj.weight  # [C, C]: head h writes through its d_k columns
        keep = torch.ones_like(w_o)
        keep[:, head * c.head_size:(head + 1) * c.head_size] = 0
        with torch.no_grad():
            w_o.mul_(keep)
        w_o.register_hook(lambda grad, keep=keep: grad * keep)


def what_trains(model: GPT, run: PreparedRun, dtype: torch.dtype) -> AllWeights | Adapters:
    """What the run trains of `model`, with the weights it starts from: a model brought in
    (train.init_from) is loaded into it (a resume then loads what it trained over them); with
    lora.rank it freezes under adapters."""
    lora = run.config.lora
    if run.config.train.base_dtype == "bfloat16" and (not lora.rank or dtype != torch.bfloat16):
        raise ConfigError("train.base_dtype=bfloat16 keeps LoRA's frozen matrices in bfloat16, which needs "
                          "lora.rank > 0 and train.dtype=bfloat16 (autocast computes with them as they are); "
                          "remove it, or set both")
    if run.config.train.heads_off and lora.rank:
        raise ConfigError("train.heads_off holds heads off while every weight trains; LoRA's adapters would write "
                          "through them: remove one of the two")
    if run.base is not None:  # existing weights (train.init_from)
        model.load_state_dict(run.base.state_dict(run.model_config))
    held_off(model, run.config.train.heads_off)  # (train.heads_off: none by default)
    return Adapters(model, run) if lora.rank else AllWeights(model)
