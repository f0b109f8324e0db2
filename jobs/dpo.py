"""Direct preference optimisation (Rafailov et al., 2023): the objective a preference job
(jobs/preference.py) trains with, where the other jobs train with each next token's
cross-entropy (training/objective.py). training/step.py calls either the same way.

A pair is a prompt x and two answers, y_w preferred to y_l. The policy π (the model that
trains) and a reference π_ref (the weights training started from) each give an answer a
log-probability, the sum over its tokens; β (log π(y) − log π_ref(y)) is the answer's
implicit reward r(y). DPO lowers

    −log σ(r(y_w) − r(y_l))

the chosen answer's reward against the rejected one's, each measured from where the
reference had it, so that the policy cannot gain by drifting from the reference elsewhere.
IPO (Azar et al., 2023) squares the distance of the margin from 1/(2β) instead, with each
answer's log-probability averaged over its tokens (as trl computes it), so that the margin
stops growing once it is reached.

The reference is what trains' to give (training/trained.py): a frozen copy of the starting
weights; with LoRA, the same model with its adapters off (no second copy: the frozen
matrices are the starting weights). With dpo.precompute (trl's precompute_ref_log_probs) the
reference scores every pair once, before the first step, and is then let go: no reference
pass a step, and no copy held while training.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from data.batches import IGNORE, Conversations, fits, pair_batch
from machine.device import autocast
from model import GPT, evaluating

LOSSES = ("sigmoid", "ipo")


@dataclass
class DPOConfig:
    """The `dpo:` section of a run config (a preference job's; trl's DPOConfig names them beta
    and loss_type)."""

    beta: float = 0.1  # how strongly the policy is held to the reference (trl's default 0.1)
    loss: str = "sigmoid"  # sigmoid: DPO's −log σ(margin); ipo: (margin − 1/(2β))², per-token log-probabilities
    precompute: bool = False  # the reference scores each pair once before training, and is let go

    def __post_init__(self) -> None:
        if not self.beta > 0:
            raise ValueError(f"dpo.beta={self.beta}: must be positive, e.g. 0.1")
        if self.loss not in LOSSES:
            raise ValueError(f"dpo.loss={self.loss!r}: one of {', '.join(LOSSES)}")


def answer_logps(logits: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's answer: the sum of log p(token) over its scored targets (y != IGNORE) and
    how many there are. logits [N, L, V], y [N, L] -> [N], [N]."""
    logp = -GPT.loss(logits, y, reduction="none")  # [N, L], 0 where not scored (in float32)
    return logp.sum(-1), (y != IGNORE).sum(-1)


def pair_rows(t: torch.Tensor) -> torch.Tensor:
    """[B, 2, L] (each pair's chosen and rejected sides) -> [2B, L]: the chosen rows, then the rejected."""
    return t.transpose(0, 1).flatten(0, 1)


@dataclass
class SharedRows:
    """A batch of pairs as one row a pair, the prompt run once: the prompt, then the chosen
    answer, then the rejected one, which attends to the prompt and to itself but not to the
    chosen answer, its positions going on from the prompt's as if it followed it alone. Each
    token's logits are then those of its own side's sequence (tested), for a little over half
    the tokens of two rows when the prompt is most of a pair."""

    x: torch.Tensor  # [B, T] token ids
    positions: torch.Tensor  # [B, T] each token's position in its own side's sequence
    mask: torch.Tensor  # [B, T, T] True where a token (row) may attend to another (column)
    chosen: torch.Tensor  # [B, T] the chosen answer's targets (IGNORE elsewhere)
    rejected: torch.Tensor  # [B, T] the rejected answer's


def shared_rows(x: torch.Tensor, y: torch.Tensor) -> SharedRows:
    """x, y [B, 2, L] (each pair's two sides, right-padded) -> SharedRows. The prompt shared is
    what both sides' inputs start with up to the first answer target of either (the last
    prompt token is in both branches: it predicts each answer's first token); an answer's
    branch ends at its last target (what a template writes after an answer's end is not scored)."""
    B = len(x)
    sides = []  # per pair: (prompt length, chosen end, rejected end)
    for pair in range(B):
        scored = [torch.nonzero(y[pair, side] != IGNORE).flatten() for side in (0, 1)]
        ends = [int(s[-1]) + 1 for s in scored]
        same = x[pair, 0, :min(ends)] != x[pair, 1, :min(ends)]
        prefix = int(torch.nonzero(same)[0]) if same.any() else min(ends)
        sides.append((min(int(scored[0][0]), int(scored[1][0]), prefix), *ends))
    T = max(p + (c - p) + (r - p) for p, c, r in sides)
    rows = torch.zeros(B, T, dtype=x.dtype, device=x.device)
    positions = torch.zeros(B, T, dtype=torch.long, device=x.device)
    chosen = torch.full((B, T), IGNORE, dtype=y.dtype, device=y.device)
    rejected = torch.full((B, T), IGNORE, dtype=y.dtype, device=y.device)
    order = torch.arange(T, device=x.device)
    mask = (order[None, :] <= order[:, None]).expand(B, T, T).clone()  # causal along the row
    for pair, (p, c, r) in enumerate(sides):
        branch = slice(c, c + r - p)  # the rejected answer's place in the row
        rows[pair, :c], rows[pair, branch] = x[pair, 0, :c], x[pair, 1, p:r]
        positions[pair, :c], positions[pair, branch] = order[:c], order[p:r]
        chosen[pair, :c], rejected[pair, branch] = y[pair, 0, :c], y[pair, 1, p:r]
        mask[pair, branch, p:c] = False  # the rejected answer never sees the chosen one
    mask |= torch.eye(T, dtype=torch.bool, device=x.device)  # (padding sees itself: no empty row)
    return SharedRows(rows, positions, mask, chosen, rejected)


def side_logps(model, rows: SharedRows) -> tuple[torch.Tensor, torch.Tensor]:
    """[2B] each answer's log-probability (the chosen answers first) and [2B] its token count,
    from one pass of `model` over the shared rows."""
    logits, _ = model(rows.x, attention_mask=rows.mask, position_ids=rows.positions)
    (chosen, chosen_tokens), (rejected, rejected_tokens) = (answer_logps(logits, t) for t in (rows.chosen, rows.rejected))
    return torch.cat([chosen, rejected]), torch.cat([chosen_tokens, rejected_tokens])


def dpo_loss(policy: torch.Tensor, reference: torch.Tensor, lengths: torch.Tensor, beta: float,
             kind: str = "sigmoid") -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The mean loss over B pairs, and what trl logs of them. policy, reference, lengths [2B]:
    each answer's log-probability under each model and its token count, the chosen answers
    first. Returns (loss, {"rewards/chosen", "rewards/rejected", "rewards/margins",
    "rewards/accuracies", "logps/chosen", "logps/rejected"}: means over the pairs, detached)."""
    ratios = policy - reference  # [2B]: log π(y) − log π_ref(y)
    chosen, rejected = ratios.chunk(2)
    if kind == "sigmoid":
        losses = -F.logsigmoid(beta * (chosen - rejected))
    else:  # ipo: per-token log-probabilities, the margin pulled to 1/(2β)
        chosen_tokens, rejected_tokens = lengths.chunk(2)
        margin = chosen / chosen_tokens.clamp(min=1) - rejected / rejected_tokens.clamp(min=1)
        losses = (margin - 1 / (2 * beta)) ** 2
    rewards = beta * ratios.detach()
    chosen_rewards, rejected_rewards = rewards.chunk(2)
    chosen_logps, rejected_logps = policy.detach().chunk(2)
    return losses.mean(), {"rewards/chosen": chosen_rewards.mean(), "rewards/rejected": rejected_rewards.mean(),
                           "rewards/margins": (chosen_rewards - rejected_rewards).mean(),
                           "rewards/accuracies": (chosen_rewards > rejected_rewards).float().mean(),
                           "logps/chosen": chosen_logps.mean(), "logps/rejected": rejected_logps.mean()}


@torch.no_grad()
def reference_table(reference, model: GPT, pairs: Conversations, block_size: int, batch_size: int,
                    dtype: torch.dtype) -> torch.Tensor:
    """[P, 2] the reference's log-probability of each pair's chosen and rejected answer, as a
    step would compute it (shared rows, the run's autocast), NaN for a pair that does not fit
    the context (no batch holds it). reference.use(model): a context giving the reference."""
    device = model.lm_head.weight.device
    table = torch.full((len(pairs) // 2, 2), float("nan"))
    usable = fits(pairs, block_size)
    for start in range(0, len(usable), batch_size):
        x, y, indices = pair_batch(pairs, usable[start:start + batch_size], block_size)
        rows = shared_rows(x.to(device), y.to(device))
        with autocast(device, dtype), reference.use(model) as scorer:
            logps = side_logps(scorer, rows)[0].float().cpu()
        table[indices] = torch.stack(logps.chunk(2), dim=1)  # [2B] (chosen answers first) -> [B, 2]
    return table


class DPO:
    """The objective of a preference job: a batch (x, y [B, 2, L], each pair's chosen and
    rejected rows; the pairs' indices [B]) through the model that trains and the reference;
    returns the loss and what trl logs of it. `evaluate` sums the same over fixed pairs."""

    per_token = False  # the loss is a mean over pairs

    def __init__(self, config: DPOConfig, model: GPT, reference=None, tables: dict[str, torch.Tensor] | None = None):
        self.config = config
        self.model = model  # the model that trains, unwrapped (the reference may be it, its adapters off)
        self.reference = reference  # .use(model): a context giving the reference model (training/trained.py)
        self.tables = tables  # or each split's reference_table, computed once (dpo.precompute)

    def reference_logps(self, rows: SharedRows, indices: torch.Tensor, split: str) -> torch.Tensor:
        """[2B] the reference's log-probability of each answer of the pairs `indices` of `split`."""
        if self.tables is not None:
            chosen, rejected = self.tables[split][indices].unbind(1)
            return torch.cat([chosen, rejected]).to(rows.x.device)
        with torch.no_grad(), self.reference.use(self.model) as reference:
            return side_logps(reference, rows)[0]

    def __call__(self, forward, batch, device: torch.device) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        rows = shared_rows(*(t.to(device, non_blocking=True) for t in batch[:2]))  # each pair's prompt once
        policy, lengths = side_logps(forward, rows)
        return dpo_loss(policy, self.reference_logps(rows, batch[2], "train"), lengths, self.config.beta,
                        self.config.loss)

    @torch.no_grad()
    def evaluate(self, model: GPT, batch, device: torch.device, split: str) -> tuple[dict[str, float], int]:
        """The sums over a batch of fixed pairs of `split` of the loss and of each figure, and how many pairs."""
        rows = shared_rows(*(t.to(device) for t in batch[:2]))
        with evaluating(model):
            policy, lengths = side_logps(model, rows)
        loss, figures = dpo_loss(policy, self.reference_logps(rows, batch[2], split), lengths, self.config.beta,
                                 self.config.loss)
        pairs = len(rows.x)
        return {"loss": loss.item() * pairs, **{key: value.item() * pairs for key, value in figures.items()}}, pairs
