"""What a run trains, as one type of two kinds, so that the loop never asks which:

    AllWeights  every weight of the model (from scratch, or a model brought in fine-tuned whole),
                but those of the heads held off (train.heads_off)
    Adapters    LoRA's adapters beside a frozen model brought in (lora/), the modules named
                to train whole (lora.modules_to_save), and any new chat markers' embedding rows

and what the weights were before training, where a job measures against them (`reference`:
DPO's, jobs/dpo.py): a frozen copy of them, or the model with its adapters off.

Each knows the weights that train and how the optimizers take them (`groups`: which decay,
which Muon may take), the weights the run's state keeps (`state_dict`, `load_state_dict`), the
model the run folder keeps (`saved`: with adapters, merged into plain matrices) and what it
writes beside it (`save_beside`: the adapters alone, as peft keeps them).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from lora import (adapters_off, add_adapters, adapter_file, adapter_state, frozen_in, load_adapter_state, merged,
                  new_rows, trained_count, trained_parameters, whole_modules)
from model import GPT, evaluating
from runs.folder import RunDir

from .config import HEAD, ConfigError
from .preparation import PreparedRun


@dataclass
class Groups:
    """The weights that train, as the optimizers take them (training/optim.py)."""

    blocks: list[nn.Parameter]  # the blocks' matrices (W_Q, W_K, W_V, W_O, W_1, W_2): Muon's, with train.optimizer=muon
    decayed: list[nn.Parameter]  # other matrices of Linear layers (an untied LM head, LoRA's A and B): AdamW's, decayed
    rest: list[nn.Parameter]  # embeddings, norms, biases, matrices whose new rows alone train: AdamW's, never decayed


def groups_of(model: GPT, blocks: list[nn.Parameter], rows_only: dict[str, int]) -> Groups:
    """The weights of `model` that train, `blocks` apart: a matrix of a Linear layer decays (as
    AdamW's weight decay is meant for), but an embedding (a tied LM head is one) and a matrix
    whose new tokens' rows alone train (`rows_only`: weight decay would move its other rows)."""
    chosen = {id(p) for p in blocks}
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    trains = [(name, p) for name, p in model.named_parameters() if p.requires_grad and id(p) not in chosen]
    decayed = [p for name, p in trains if p.dim() == 2 and id(p) not in embeddings and name not in rows_only]
    decays = {id(p) for p in decayed}
    return Groups(blocks, decayed, [p for _, p in trains if id(p) not in decays])


class AllWeights:
    """Every weight trains: the run's state keeps them all; the run folder keeps the model as it is."""

    def __init__(self, model: GPT, starts: Callable[[], dict[str, torch.Tensor]] | None = None):
        self.model = model
        self.starts = starts  # () -> the weights brought in (train.init_from), read again; None: from scratch

    def count(self) -> int:
        """The numbers that train: all of them."""
        return self.model.num_parameters()

    def groups(self) -> Groups:
        """The blocks' matrices (Muon's where train.optimizer says), an untied head (decayed), the rest."""
        blocks = [p for p in self.model.transformer.h.parameters() if p.dim() == 2 and p.requires_grad]
        return groups_of(self.model, blocks, {})

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self.model.state_dict()

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.model.load_state_dict(state)

    def saved(self, model: GPT) -> GPT:
        """The model the run folder keeps (model: the trained weights, or their average)."""
        return model

    def save_beside(self, run_dir: RunDir, model: GPT) -> None:
        """Nothing is kept beside the model."""

    def reference(self) -> "FrozenCopy":
        """The weights training started from, as a model of their own (DPO's reference)."""
        if self.starts is None:
            raise ConfigError("preference tuning measures the model against the weights it starts from: set "
                              "train.init_from (the run or model to tune)")
        return FrozenCopy(self.model, self.starts())


class Adapters:
    """LoRA (lora/): the model brought in freezes, adapters train beside the matrices that
    lora.targets names (and the new chat markers' embedding rows, where the data added
    some); with train.base_dtype=bfloat16 its adapted matrices are kept in bfloat16. The
    run's state keeps the trained tensors alone."""

    def __init__(self, model: GPT, run: PreparedRun):
        lora = run.config.lora
        first_new = run.base.tokenizer().get_vocab_size()  # (the ids data/template.py added come after)
        self.new_tokens_from = first_new if run.data.vocab_size > first_new else None
        self.rows_from = new_rows(model, lora, self.new_tokens_from)  # {matrix: its first row that trains}
        add_adapters(model, lora, self.new_tokens_from)
        if run.config.train.base_dtype == "bfloat16":  # the frozen matrices as autocast computes with them: half the memory
            frozen_in(model, torch.bfloat16)
        self.model = model
        self.names = list(trained_parameters(model))  # the parameters that train
        whole = whole_modules(model, lora.modules_to_save)
        # what the modules trained whole start from: export.py --adapters writes it as base/'s
        self.starts: dict[str, torch.Tensor] | None = {f"{name}.{key}": t.detach().to("cpu", copy=True)
                                                      for name, module in whole.items()
                                                      for key, t in module.state_dict().items()} or None
        self.settings = {"r": lora.rank, "lora_alpha": lora.alpha, "lora_dropout": lora.dropout,
                         "target_modules": lora.targets, "modules_to_save": sorted(whole),
                         "base_model_name_or_path": run.config.train.init_from}

    def count(self) -> int:
        """The numbers that train: the adapters', the modules trained whole, and the new tokens' rows."""
        return trained_count(self.model, self.rows_from)

    def groups(self) -> Groups:
        """No Muon (it would orthogonalise the adapters' low-rank updates): the adapters and a
        head trained whole decay as matrices do; the new tokens' rows, norms and embeddings do not."""
        return groups_of(self.model, [], self.rows_from)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return adapter_state(self.model, self.names)

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """The adapters saved (the weights brought in are loaded already, as they were)."""
        load_adapter_state(self.model, state, self.names)

    def saved(self, model: GPT) -> GPT:
        """The model the run folder keeps, and every program reads: the adapters merged."""
        return merged(model)

    def reference(self) -> "AdaptersOff":
        """The weights training started from: the model itself with its adapters off, where
        nothing else trains (a module trained whole, or new tokens' rows, would be what they
        have become, not what they were)."""
        if self.settings["modules_to_save"] or self.rows_from:
            trained = ", ".join(self.settings["modules_to_save"] + list(self.rows_from))
            raise ConfigError(f"preference tuning with LoRA measures the model against itself with its adapters off, "
                              f"but {trained} train beside them; leave lora.modules_to_save empty and tune a model "
                              "whose tokenizer already has its chat template's markers")
        return AdaptersOff()

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


class FrozenCopy:
    """The reference as a model of its own: the starting weights, frozen."""

    def __init__(self, model: GPT, weights: dict[str, torch.Tensor]):
        self.model = GPT(model.config).to(model.lm_head.weight.device)
        self.model.load_state_dict(weights)
        self.model.requires_grad_(False).eval()

    @contextmanager
    def use(self, model: GPT):
        yield self.model


class AdaptersOff:
    """The reference as the model itself with LoRA's adapters off: what it computes is the
    frozen model brought in (no second copy held); dropout off while it does."""

    @contextmanager
    def use(self, model: GPT):
        with adapters_off(model), evaluating(model):
            yield model


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
    starts = None
    if run.base is not None:  # existing weights (train.init_from)
        starts = lambda: run.base.state_dict(run.model_config)  # noqa: E731 (read again for a reference, not kept)
        model.load_state_dict(starts())
    held_off(model, run.config.train.heads_off)  # (train.heads_off: none by default)
    return Adapters(model, run) if lora.rank else AllWeights(model, starts)
