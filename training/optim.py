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
    """Linear warmup to 1, then cosine decay to min_lr / lr at lr_decay_iters, then flat.
    Every parameter group's learning rate is its peak rate times this factor."""
    decay_iters = cfg.lr_decay_iters or cfg.max_iters
    floor = cfg.min_lr / cfg.lr
    if it < cfg.warmup_iters:
        return (it + 1) / (cfg.warmup_iters + 1)
    if it >= decay_iters:
        return floor
    progress = (it - cfg.warmup_iters) / max(1, decay_iters - cfg.warmup_iters)
    return floor + 0.5 * (1.0 + math.cos(math.pi * progress)) * (1.0 - floor)


def learning_rate(it: int, cfg: TrainConfig) -> float:
    """AdamW's learning rate at iteration it: lr after warmup, min_lr at the end."""
    return cfg.lr * lr_factor(it, cfg)


def make_optimizers(model: GPT, cfg: TrainConfig, device: torch.device) -> list[torch.optim.Optimizer]:
    """AdamW (weight decay only on the matrices of Linear layers, never on norms, biases
    or embeddings, the tied embedding/LM head included), and with optimizer=muon, Muon
    for the blocks' matrices. Each group remembers its peak rate as initial_lr."""
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    matrices = [p for p in model.transformer.h.parameters() if p.dim() == 2]
    rest = [p for p in model.parameters() if p.dim() < 2 or id(p) in embeddings]
    optimizers = []
    if cfg.optimizer == "muon":
        optimizers.append(torch.optim.Muon(matrices, lr=cfg.muon_lr, momentum=cfg.muon_momentum,
                                           weight_decay=cfg.weight_decay, adjust_lr_fn="match_rms_adamw"))
        matrices = []
    groups = [{"params": matrices, "weight_decay": cfg.weight_decay}, {"params": rest, "weight_decay": 0.0}]
    optimizers.append(torch.optim.AdamW([g for g in groups if g["params"]], lr=cfg.lr, betas=(cfg.beta1, cfg.beta2),
                                        fused=device.type in ("cpu", "cuda")))
    for optimizer in optimizers:
        for group in optimizer.param_groups:
            group["initial_lr"] = group["lr"]
    return optimizers
