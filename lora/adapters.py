"""Low-rank adapters (lora/__init__.py says what and why): the layer, putting adapters on a
model, their state, and merging them back into plain matrices."""

from __future__ import annotations

import copy
import math
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from model import GPT

TARGETS = ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_gate", "mlp.c_proj")  # each block's matrices
WHOLE = ("wte", "lm_head", "ln_f", "ln_1", "ln_2")  # what lora.modules_to_save may name: embedding, head, norms


@dataclass
class LoRAConfig:
    """The `lora:` section of a run config."""

    rank: int = 0  # r, the adapters' rank; 0: no adapters (every weight trains)
    alpha: float = 16.0  # the update B A is scaled by alpha / rank
    dropout: float = 0.0  # on each adapter's input, while training
    targets: list[str] = field(default_factory=lambda: list(TARGETS))  # which matrices of each block get one
    modules_to_save: list[str] = field(default_factory=list)  # modules that train whole beside the adapters (peft's
    # name): wte (the embedding), lm_head, ln_f, ln_1 and ln_2 (each block's norms)

    def __post_init__(self) -> None:
        if self.rank < 0:
            raise ValueError(f"lora.rank={self.rank}: must be 0 (off) or more, e.g. 8")
        if self.alpha <= 0:
            raise ValueError(f"lora.alpha={self.alpha}: must be positive, e.g. 16")
        if not 0 <= self.dropout < 1:
            raise ValueError(f"lora.dropout={self.dropout}: must be in [0, 1)")
        unknown = [t for t in self.targets if t not in TARGETS]
        if unknown or not self.targets:
            raise ValueError(f"lora.targets={self.targets}: each must be one of {', '.join(TARGETS)}")
        if not isinstance(self.modules_to_save, list) or any(m not in WHOLE for m in self.modules_to_save):
            raise ValueError(f"lora.modules_to_save={self.modules_to_save}: a list of modules that train whole, each "
                             f"one of {', '.join(WHOLE)}")


class LoRALinear(nn.Linear):
    """y = x Wᵀ + b + (α/r) · dropout(x) Aᵀ Bᵀ: a Linear whose W and b are the frozen ones
    it was made from (the same tensors, under the same names), plus the rank-r update B A.
    A [r, in] starts as nn.Linear starts a matrix, B [out, r] at zero: the layer starts as
    the Linear was. The state_dict names are those of peft's layers' roles: lora_A, lora_B."""

    def __init__(self, linear: nn.Linear, rank: int, alpha: float, dropout: float):
        super().__init__(linear.in_features, linear.out_features, bias=linear.bias is not None, device="meta")
        self.weight, self.bias = linear.weight, linear.bias  # (frozen by add_adapters)
        self.lora_A = nn.Parameter(torch.empty(rank, linear.in_features, device=linear.weight.device))
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))  # as nn.Linear (and peft) start a matrix
        self.lora_B = nn.Parameter(torch.zeros(linear.out_features, rank, device=linear.weight.device))
        self.scale = alpha / rank
        self.dropout = nn.Dropout(dropout)
        self.enabled = True  # False: the frozen Linear alone (adapters_off)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # (a frozen W kept in bfloat16, train.base_dtype: autocast computes with it as it is; else in x's dtype)
        weight = self.weight if torch.is_autocast_enabled(x.device.type) else self.weight.to(x.dtype)
        if not self.enabled:
            return F.linear(x, weight, self.bias)
        update = F.linear(F.linear(self.dropout(x), self.lora_A), self.lora_B)  # x Aᵀ Bᵀ: [..., r] -> [..., out]
        return F.linear(x, weight, self.bias) + self.scale * update

    @torch.no_grad()
    def merged(self) -> nn.Linear:
        """A plain Linear with W + (α/r) B A: the same function, without dropout. (Made on
        the meta device and then given its tensors, so that no random numbers are drawn
        for a start it never has: a resumed run draws the same ones as one that went on.)"""
        linear = nn.Linear(self.in_features, self.out_features, bias=self.bias is not None, device="meta")
        linear.weight = nn.Parameter(self.weight.float() + self.scale * (self.lora_B @ self.lora_A).float())
        if self.bias is not None:
            linear.bias = nn.Parameter(self.bias.clone())
        return linear


@contextmanager
def adapters_off(model: GPT):
    """The model brought in, as it was: every adapter's update left out while inside (DPO's
    reference, jobs/dpo.py; peft's disable_adapter). Modules trained whole and new tokens' rows
    are what they have become."""
    layers = [module for module in model.modules() if isinstance(module, LoRALinear)]
    for layer in layers:
        layer.enabled = False
    try:
        yield model
    finally:
        for layer in layers:
            layer.enabled = True


def adapted_layers(model: GPT):
    """(target name, parent module, attribute name, layer) of each matrix that
    LoRAConfig.targets can name, block by block."""
    for block in model.transformer.h:
        for target in TARGETS:
            parent_name, name = target.split(".")
            parent = getattr(block, parent_name)
            layer = getattr(parent, name, None)
            if isinstance(layer, nn.Linear):
                yield target, parent, name, layer


def add_adapters(model: GPT, config: LoRAConfig, new_tokens_from: int | None = None) -> GPT:
    """Freeze every weight of `model` and put an adapter beside each targeted matrix of
    each block; the modules config.modules_to_save names train whole (whole_modules). new_tokens_from:
    the first id a chat template added to the tokenizer, whose embedding rows (and an untied
    head's) then train too, and only those rows (unless the matrix trains whole)."""
    rows = new_rows(model, config, new_tokens_from)  # (before the model changes: its names as they are)
    model.requires_grad_(False)
    for target, parent, name, layer in list(adapted_layers(model)):
        if target in config.targets:
            setattr(parent, name, LoRALinear(layer, config.rank, config.alpha, config.dropout))
    for module in whole_modules(model, config.modules_to_save).values():
        module.requires_grad_(True)
    parameters = dict(model.named_parameters())
    for name, first in rows.items():
        train_rows(parameters[name], first)
    return model


def new_rows(model: GPT, config: LoRAConfig, new_tokens_from: int | None) -> dict[str, int]:
    """{name: first row that trains} of each matrix whose new tokens' rows alone train with
    these adapters: the embedding and an untied head, where new tokens were added from
    new_tokens_from (None: none) and the matrix does not train whole (config.modules_to_save)."""
    if new_tokens_from is None:
        return {}
    whole = {id(p) for module in whole_modules(model, config.modules_to_save).values() for p in module.parameters()}
    heads = {id(model.transformer.wte.weight), id(model.lm_head.weight)}  # (a tied head is the embedding: one name)
    return {name: new_tokens_from for name, p in model.named_parameters() if id(p) in heads and id(p) not in whole}


def whole_modules(model: GPT, names: list[str]) -> dict[str, nn.Module]:
    """{name: module} of the modules that train whole (lora.modules_to_save: a name matches
    the module of that name, or its name's last part: ln_1 is every block's first norm)."""
    return {name: module for name, module in model.named_modules()
            if any(name == wanted or name.endswith(f".{wanted}") for wanted in names)}


def frozen_in(model: GPT, dtype: torch.dtype) -> None:
    """Keep the adapted layers' frozen matrices in `dtype` (train.base_dtype: bfloat16 halves
    their memory; autocast computed with them in it anyway, so the results are the same)."""
    for module in model.modules():
        if isinstance(module, LoRALinear):
            module.weight = nn.Parameter(module.weight.detach().to(dtype), requires_grad=False)


def train_rows(weight: nn.Parameter, start: int) -> None:
    """Let the rows from `start` on train: the gradient of the others is zeroed, so AdamW
    (with no weight decay on such a matrix: training/trained.py) leaves them exactly as they were."""
    weight.requires_grad_(True)
    rows = torch.zeros(weight.size(0), 1, device=weight.device, dtype=weight.dtype)
    rows[start:] = 1
    weight.register_hook(lambda grad: grad * rows)


def trained_parameters(model: nn.Module) -> dict[str, nn.Parameter]:
    """The parameters that train: with adapters, theirs (and new tokens' rows' matrices)."""
    return {name: p for name, p in model.named_parameters() if p.requires_grad}


def trained_count(model: nn.Module, rows_from: dict[str, int]) -> int:
    """The numbers that train: every number of a parameter that trains, but of a matrix whose
    new tokens' rows alone train (rows_from: new_rows'), those rows only."""
    return sum((p.size(0) - rows_from[name]) * p[0].numel() if name in rows_from else p.numel()
               for name, p in model.named_parameters() if p.requires_grad)


def adapter_state(model: nn.Module, names) -> dict[str, torch.Tensor]:
    """The tensors of `names` (the trained parameters' names), as the run keeps them."""
    state = model.state_dict()
    return {name: state[name] for name in names}


def adapter_file(model: nn.Module, names, rows_from: dict[str, int]) -> dict[str, torch.Tensor]:
    """adapter_model.safetensors: the trained tensors, and of a matrix whose new tokens'
    rows alone train (rows_from: new_rows'), those rows only."""
    return {name: t[rows_from[name]:] if name in rows_from else t for name, t in adapter_state(model, names).items()}


def load_adapter_state(model: nn.Module, state: dict[str, torch.Tensor], names) -> None:
    """Put back the trained tensors saved by adapter_state; the others stay as they are."""
    missing = set(names) - set(state)
    unexpected = set(state) - set(names)
    if missing or unexpected:
        raise ValueError(f"the adapters saved do not fit this model (missing {sorted(missing)[:3]}, "
                         f"unexpected {sorted(unexpected)[:3]})")
    model.load_state_dict(state, strict=False)


def merged(model: GPT) -> GPT:
    """A plain GPT with every adapter folded into its matrix (W + (α/r) B A): what the run
    saves as model.safetensors, for every program that reads a run, and export.py writes."""
    plain = copy.deepcopy(model)
    for _, parent, name, layer in list(adapted_layers(plain)):
        if isinstance(layer, LoRALinear):
            setattr(parent, name, layer.merged())
    return plain.requires_grad_(False)
