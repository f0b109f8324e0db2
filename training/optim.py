"""The optimizer and the learning-rate schedule."""

from __future__ import annotations

import math

import torch

from model import GPT

from .config import TrainConfig


def learning_rate(it: int, cfg: TrainConfig) -> float:
    """Linear warmup to lr, then cosine decay to min_lr at lr_decay_iters, then min_lr."""
    decay_iters = cfg.lr_decay_iters or cfg.max_iters
    if it < cfg.warmup_iters:
        return cfg.lr * (it + 1) / (cfg.warmup_iters + 1)
    if it >= decay_iters:
        return cfg.min_lr
    progress = (it - cfg.warmup_iters) / max(1, decay_iters - cfg.warmup_iters)
    return cfg.min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (cfg.lr - cfg.min_lr)


def make_optimizer(model: GPT, cfg: TrainConfig, device: torch.device) -> torch.optim.AdamW:
    """AdamW; weight decay only on the matrices of Linear layers, never on norms,
    biases or embeddings (the tied embedding/LM head included)."""
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    decay = [p for p in model.parameters() if p.dim() >= 2 and id(p) not in embeddings]
    rest = [p for p in model.parameters() if p.dim() < 2 or id(p) in embeddings]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": rest, "weight_decay": 0.0}]
    fused = device.type in ("cpu", "cuda")
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), fused=fused)
