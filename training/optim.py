"""The optimizers (the learning rate at each step is training/schedule.py's).

train.optimizer: adamw trains every parameter with AdamW. muon trains the 2-D weight
matrices of the blocks (W_Q, W_K, W_V, W_O, W_1, W_2) with Muon, which replaces each
update by the nearest orthogonal matrix (Newton-Schulz iterations), so every direction
of a matrix learns at the same rate; the embedding (= the LM head), positions, norms and
biases stay with AdamW, as in the modded-nanogpt speedruns and nanochat.
"""

from __future__ import annotations

import math

import torch

from .config import TrainConfig
from .trained import Groups


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


def make_optimizers(groups: Groups, cfg: TrainConfig, device: torch.device) -> list[torch.optim.Optimizer]:
    """The optimizers of the weights that train, as what trains groups them (training/trained.py):
    AdamW, with weight decay on the matrices of Linear layers alone (never on norms, biases or
    embeddings, a tied embedding/LM head included), and with optimizer=muon, Muon for the
    blocks' matrices. Every parameter that trains is in exactly one group; each group remembers
    its peak rate as initial_lr."""
    optimizers = []
    blocks = groups.blocks
    if cfg.optimizer == "muon" and blocks:
        optimizers.append(Muon(blocks, lr=cfg.muon_lr, momentum=cfg.muon_momentum, weight_decay=cfg.weight_decay))
        blocks = []
    groups = [{"params": blocks + groups.decayed, "weight_decay": cfg.weight_decay},
              {"params": groups.rest, "weight_decay": 0.0}]
    optimizers.append(torch.optim.AdamW([g for g in groups if g["params"]], lr=cfg.lr, betas=(cfg.beta1, cfg.beta2),
                                        fused=device.type in ("cpu", "cuda")))
    for optimizer in optimizers:
        for group in optimizer.param_groups:
            group["initial_lr"] = group["lr"]
    return optimizers
