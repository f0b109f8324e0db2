"""The optimizers and the learning-rate schedule.

train.optimizer: adamw trains every parameter with AdamW. muon trains the 2-D weight
matrices of the blocks (W_Q, W_K, W_V, W_O, W_1, W_2) with Muon, which replaces each
update by the nearest orthogonal matrix (Newton-Schulz iterations), so every direction
of a matrix learns at the same rate; the embedding (= the LM head), positions, norms and
biases stay with AdamW, as in the modded-nanogpt speedruns and nanochat.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from model import GPT

from .config import TrainConfig


class Anchor(NamedTuple):
    """Where a decay that changed its end goes on from."""

    iteration: int
    progress: float  # the decay's progress there, from 0 (end of the warm-up) to 1
    cooldown_start: float  # wsd: the progress at which its straight line down begins


class Ramp(NamedTuple):
    """Where a warm-up rises from."""

    iteration: int  # -1: before the first iteration
    factor: float


WARMUP_SHARE = 0.1  # a run fitted shorter than its warm-up allows: the share of the rest spent warming up


class Schedule:
    """The learning-rate factor at each iteration; every group's rate is its peak times it.

    Linear warmup to 1 over `warmup` iterations, then down to `floor` (min_lr / lr) at
    `decay_iters`, then flat. Down is a curve of the progress p, from 0 at the end of the
    warmup to 1 at decay_iters: a cosine (shape cosine), or flat at 1 until the last
    `cooldown` share of the iterations, then a straight line (wsd: warmup-stable-decay).

    When decay_iters changes in the middle of a run (train.max_minutes fits max_iters to
    the measured speed; a finished run is given a larger max_iters), the rest of the curve
    is stretched from where it stands: p goes on from its value at that iteration (the
    anchor) to 1 at the new decay_iters, so the rate never jumps. A finished run that is
    continued stays at the floor. When the new length is so short that the warm-up would
    take more than WARMUP_SHARE of what is left of it (a busy machine under a time budget),
    the warm-up is shortened to that share: the ramp rises from where the rate stands to the peak at the
    new end of the warm-up (`ramp_start`), so that no run ends still warming up. Muon's
    momentum has a warmup of its own (`momentum`).
    """

    def __init__(self, cfg: TrainConfig, max_iters: int):
        self.warmup = cfg.warmup_iters
        self.ramp_start = Ramp(-1, 0.0)  # the warm-up rises from 0 before iteration 0: iteration 0 is one step up
        self.decay_iters = cfg.lr_decay_iters or max_iters
        self.floor = cfg.min_lr / cfg.lr
        self.shape = cfg.lr_schedule
        self.cooldown = cfg.cooldown
        self.anchor: Anchor | None = None  # where a changed decay goes on from
        self.momentum_warmup = cfg.muon_momentum_warmup
        self.momentum_peak = cfg.muon_momentum

    def apply(self, optimizers: list[torch.optim.Optimizer], it: int) -> float:
        """Set every group's learning rate (and Muon's momentum) for iteration `it`;
        returns the factor applied to the peak rates."""
        factor = self.factor(it)
        for optimizer in optimizers:
            for group in optimizer.param_groups:
                group["lr"] = group["initial_lr"] * factor
                if "momentum" in group:  # Muon's
                    group["momentum"] = self.momentum(it)
        return factor

    def cooldown_start(self) -> float:
        """wsd: the progress at which the straight line down begins."""
        if self.anchor is not None:
            return self.anchor.cooldown_start
        start = max(self.warmup, self.decay_iters - round(self.cooldown * self.decay_iters))
        return (start - self.warmup) / max(1, self.decay_iters - self.warmup)

    def progress(self, it: int) -> float:
        if it >= self.decay_iters:
            return 1.0
        if self.anchor is None:
            return max(0.0, (it - self.warmup) / max(1, self.decay_iters - self.warmup))
        at = self.anchor
        return at.progress + (1.0 - at.progress) * max(0, it - at.iteration) / (self.decay_iters - at.iteration)

    def factor(self, it: int) -> float:
        if it < self.warmup:
            start = self.ramp_start
            return start.factor + (1.0 - start.factor) * (it - start.iteration) / (self.warmup - start.iteration)
        p = self.progress(it)
        if self.shape == "wsd":
            start = self.cooldown_start()
            down = (p - start) / (1.0 - start) if p > start else 0.0
            return 1.0 - down * (1.0 - self.floor)
        return self.floor + 0.5 * (1.0 + math.cos(math.pi * p)) * (1.0 - self.floor)

    def momentum(self, it: int) -> float:
        """Muon's momentum at iteration it: from 0.85 up to muon_momentum over the first
        muon_momentum_warmup iterations (as in the modded-nanogpt speedruns), then constant."""
        if it >= self.momentum_warmup:
            return self.momentum_peak
        return 0.85 + (self.momentum_peak - 0.85) * it / self.momentum_warmup

    def retarget(self, it: int, decay_iters: int, shorten: bool = True) -> None:
        """End the decay at decay_iters instead, going on from iteration it; with shorten,
        a warm-up that would take too much of the run is shortened (a time budget's trainer
        allows it once the pace has settled: training/budget.py)."""
        if decay_iters == self.decay_iters:
            return
        if it < self.warmup:  # (in the warmup nothing has decayed yet: the new length from the start)
            if shorten:
                self.shorten_warmup(it, decay_iters)
        elif it > self.warmup:
            self.anchor = Anchor(it, self.progress(it), self.cooldown_start())
        self.decay_iters = decay_iters

    def shorten_warmup(self, it: int, decay_iters: int) -> None:
        """At iteration `it` of the warm-up, a run that now ends at decay_iters: the rest of
        the warm-up takes at most WARMUP_SHARE of what is left of the run (at least one
        iteration). It only ever gets shorter."""
        end = it + max(1, round(WARMUP_SHARE * (decay_iters - it)))
        if end < self.warmup:
            self.ramp_start = Ramp(it, self.factor(it))
            self.warmup = end

    def state_dict(self) -> dict:
        return {"decay_iters": self.decay_iters, "anchor": None if self.anchor is None else list(self.anchor),
                "warmup": self.warmup, "ramp_start": list(self.ramp_start)}

    def load_state_dict(self, state: dict) -> None:
        anchor = state["anchor"]
        self.decay_iters = state["decay_iters"]
        self.anchor = None if anchor is None else Anchor(int(anchor[0]), float(anchor[1]), float(anchor[2]))
        ramp_start = state.get("ramp_start")
        if ramp_start is not None and ramp_start[0] >= 0:  # shortened for a fitted length: it stays so
            self.warmup = state["warmup"]
            self.ramp_start = Ramp(int(ramp_start[0]), float(ramp_start[1]))
        # (else the config's train.warmup_iters, as it is now)


class Muon(torch.optim.Optimizer):
    """Muon (Keller Jordan, 2024) for 2-D weight matrices: SGD with Nesterov momentum,
    whose update is replaced by the nearest semi-orthogonal matrix before it is applied.

    The same algorithm as torch.optim.Muon with adjust_lr_fn="match_rms_adamw", but the
    Newton-Schulz iterations run in the matrix's own dtype. torch's always run in bfloat16,
    which CPUs without bfloat16 units (AMX or AVX512-BF16) compute several times more
    slowly than float32 (measured in docs/performance.md, "Why our own Muon"). And the
    matrices of one shape (every block's W_O, say) are orthogonalized together, as one
    batch: the same numbers, a few large operations instead of many small ones.
    """

    def __init__(self, params, lr: float, momentum: float, weight_decay: float):
        super().__init__(params, dict(lr=lr, momentum=momentum, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self) -> None:
        for group in self.param_groups:
            lr, momentum = group["lr"], group["momentum"]
            params = [p for p in group["params"] if p.grad is not None]
            for kind in dict.fromkeys((p.shape, p.dtype, p.device) for p in params):
                same = [p for p in params if (p.shape, p.dtype, p.device) == kind]
                nesterov = []
                for p in same:
                    state = self.state[p]
                    if "momentum_buffer" not in state:  # (setdefault would allocate zeros every step)
                        state["momentum_buffer"] = torch.zeros_like(p)
                    buffer = state["momentum_buffer"]
                    buffer.lerp_(p.grad, 1 - momentum)
                    nesterov.append(p.grad.lerp(buffer, momentum))  # Nesterov momentum
                updates = orthogonalize(torch.stack(nesterov))  # [matrices, rows, cols]
                for p, update in zip(same, updates):
                    p.mul_(1 - lr * group["weight_decay"])
                    # scaled so that the update's RMS matches AdamW's (Moonshot's rule, as in torch)
                    p.add_(update, alpha=-lr * 0.2 * math.sqrt(max(p.shape)))


def orthogonalize(g: torch.Tensor, steps: int = 5) -> torch.Tensor:
    """U Vᵀ of g = U S Vᵀ, approximately, for a matrix g or each of a batch [..., rows, cols]:
    a quintic Newton-Schulz iteration tuned to push every singular value towards 1 fast
    (torch.optim.Muon's coefficients)."""
    a, b, c = 3.4445, -4.7750, 2.0315
    tall = g.size(-2) > g.size(-1)
    x = g.mT if tall else g  # the smaller Gram matrix
    x = x / x.norm(dim=(-2, -1), keepdim=True).clamp(min=1e-7)  # singular values at most 1
    for _ in range(steps):
        gram = x @ x.mT
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.mT if tall else x


def make_optimizers(model: GPT, cfg: TrainConfig, device: torch.device) -> list[torch.optim.Optimizer]:
    """AdamW (weight decay only on the matrices of Linear layers, an untied LM head's
    included, never on norms, biases or embeddings, a tied embedding/LM head included),
    and with optimizer=muon, Muon for the blocks' matrices. Every parameter that trains is
    in exactly one group; each group remembers its peak rate as initial_lr. LoRA's
    adapters (lora/: the only block matrices that train then) are AdamW's: Muon would
    orthogonalise their low-rank updates."""
    trains = {id(p) for p in model.parameters() if p.requires_grad}
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    blocks = [p for p in model.transformer.h.parameters() if p.dim() == 2 and id(p) in trains]
    adapters = [p for name, p in model.transformer.h.named_parameters() if "lora_" in name]
    # an untied LM head, decayed as a matrix where it trains whole (with adapters only new tokens' rows
    # train, in `rest`: no decay there, so that every other row stays exactly as it was)
    whole_head = id(model.lm_head.weight) not in embeddings and id(model.lm_head.weight) in trains and not adapters
    head = [model.lm_head.weight] if whole_head else []
    chosen = {id(p) for p in blocks + head}
    rest = [p for p in model.parameters() if id(p) not in chosen and id(p) in trains]  # embeddings, norms, biases
    optimizers = []
    if cfg.optimizer == "muon" and not adapters:
        optimizers.append(Muon(blocks, lr=cfg.muon_lr, momentum=cfg.muon_momentum, weight_decay=cfg.weight_decay))
        blocks = []
    groups = [{"params": blocks + head, "weight_decay": cfg.weight_decay}, {"params": rest, "weight_decay": 0.0}]
    optimizers.append(torch.optim.AdamW([g for g in groups if g["params"]], lr=cfg.lr, betas=(cfg.beta1, cfg.beta2),
                                        fused=device.type in ("cpu", "cuda")))
    for optimizer in optimizers:
        for group in optimizer.param_groups:
            group["initial_lr"] = group["lr"]
    return optimizers
