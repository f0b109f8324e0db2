"""The optimizers and the learning-rate schedule.

train.optimizer: adamw trains every parameter with AdamW. muon trains the 2-D weight
matrices of the blocks (W_Q, W_K, W_V, W_O, W_1, W_2) with Muon, which replaces each
update by the nearest orthogonal matrix (Newton-Schulz iterations), so every direction
of a matrix learns at the same rate; the embedding (= the LM head), positions, norms and
biases stay with AdamW, as in the modded-nanogpt speedruns and nanochat.
"""

from __future__ import annotations

import math

import torch

from model import GPT

from .config import TrainConfig


def lr_factor(it: int, cfg: TrainConfig) -> float:
    """Linear warmup to 1, then down to min_lr / lr at lr_decay_iters, then flat. Down is a
    cosine over the whole rest (lr_schedule: cosine), or (wsd: warmup-stable-decay) flat at
    1 until the last `cooldown` share of the iterations, then a straight line.
    Every parameter group's learning rate is its peak rate times this factor."""
    decay_iters = cfg.lr_decay_iters or cfg.max_iters
    floor = cfg.min_lr / cfg.lr
    if it < cfg.warmup_iters:
        return (it + 1) / (cfg.warmup_iters + 1)
    if it >= decay_iters:
        return floor
    if cfg.lr_schedule == "wsd":
        cooldown_start = max(cfg.warmup_iters, decay_iters - round(cfg.cooldown * decay_iters))
        progress = max(0, it - cooldown_start) / max(1, decay_iters - cooldown_start)
        return 1.0 - progress * (1.0 - floor)
    progress = (it - cfg.warmup_iters) / max(1, decay_iters - cfg.warmup_iters)
    return floor + 0.5 * (1.0 + math.cos(math.pi * progress)) * (1.0 - floor)


def muon_momentum(it: int, cfg: TrainConfig) -> float:
    """Muon's momentum at iteration it: from 0.85 up to muon_momentum over the first
    muon_momentum_warmup iterations (as in the modded-nanogpt speedruns), then constant."""
    if it >= cfg.muon_momentum_warmup:
        return cfg.muon_momentum
    return 0.85 + (cfg.muon_momentum - 0.85) * it / cfg.muon_momentum_warmup


def learning_rate(it: int, cfg: TrainConfig) -> float:
    """AdamW's learning rate at iteration it: lr after warmup, min_lr at the end."""
    return cfg.lr * lr_factor(it, cfg)


class Muon(torch.optim.Optimizer):
    """Muon (Keller Jordan, 2024) for 2-D weight matrices: SGD with Nesterov momentum,
    whose update is replaced by the nearest semi-orthogonal matrix before it is applied.

    The same algorithm as torch.optim.Muon with adjust_lr_fn="match_rms_adamw", but the
    Newton-Schulz iterations run in the matrix's own dtype. torch's always run in bfloat16,
    which CPUs without bfloat16 units (AMX or AVX512-BF16) compute many times more slowly
    than float32: on a 2-core AMD EPYC without them, a step of tiny.yaml's model at batch
    32 took 1,366 ms with torch's Muon, 495 ms with this one and 421 ms with AdamW alone.
    """

    def __init__(self, params, lr: float, momentum: float, weight_decay: float):
        super().__init__(params, dict(lr=lr, momentum=momentum, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self) -> None:
        for group in self.param_groups:
            lr, momentum = group["lr"], group["momentum"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if "momentum_buffer" not in state:  # (setdefault would allocate zeros every step)
                    state["momentum_buffer"] = torch.zeros_like(p)
                buffer = state["momentum_buffer"]
                buffer.lerp_(p.grad, 1 - momentum)
                update = orthogonalize(p.grad.lerp(buffer, momentum))  # Nesterov momentum
                p.mul_(1 - lr * group["weight_decay"])
                # scaled so that the update's RMS matches AdamW's (Moonshot's rule, as in torch)
                p.add_(update, alpha=-lr * 0.2 * math.sqrt(max(p.shape)))


def orthogonalize(g: torch.Tensor, steps: int = 5) -> torch.Tensor:
    """U Vᵀ of g = U S Vᵀ, approximately: a quintic Newton-Schulz iteration tuned to push
    every singular value towards 1 fast (torch.optim.Muon's coefficients)."""
    a, b, c = 3.4445, -4.7750, 2.0315
    x = g.T if g.size(0) > g.size(1) else g  # the smaller Gram matrix
    x = x / x.norm().clamp(min=1e-7)  # singular values at most 1
    for _ in range(steps):
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.T if g.size(0) > g.size(1) else x


def make_optimizers(model: GPT, cfg: TrainConfig, device: torch.device) -> list[torch.optim.Optimizer]:
    """AdamW (weight decay only on the matrices of Linear layers, never on norms, biases
    or embeddings, the tied embedding/LM head included), and with optimizer=muon, Muon
    for the blocks' matrices. Each group remembers its peak rate as initial_lr."""
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    matrices = [p for p in model.transformer.h.parameters() if p.dim() == 2]
    rest = [p for p in model.parameters() if p.dim() < 2 or id(p) in embeddings]
    optimizers = []
    if cfg.optimizer == "muon":
        optimizers.append(Muon(matrices, lr=cfg.muon_lr, momentum=cfg.muon_momentum, weight_decay=cfg.weight_decay))
        matrices = []
    groups = [{"params": matrices, "weight_decay": cfg.weight_decay}, {"params": rest, "weight_decay": 0.0}]
    optimizers.append(torch.optim.AdamW([g for g in groups if g["params"]], lr=cfg.lr, betas=(cfg.beta1, cfg.beta2),
                                        fused=device.type in ("cpu", "cuda")))
    for optimizer in optimizers:
        for group in optimizer.param_groups:
            group["initial_lr"] = group["lr"]
    return optimizers
