"""How a model's loss depends on what it has read before, with its own numbers.

By position in the window: a model that uses its context predicts late tokens better than
early ones. Olsson et al. (2022, "In-context Learning and Induction Heads") take the loss
of the 500th token less that of the 50th (of 1,024) as the in-context learning score; here,
for any block size, the mean loss over the window's second half less the mean over its
positions from a twentieth to a tenth of it (`in_context_score`): negative once the
context helps, and it falls as the induction head forms.

On the induction lesson's text (data/copies.py: each line a random string written twice):
the loss on the first copies, which nothing can predict (about ln 64), against the loss on
the second copies whose first copy lies inside the window, which only copying predicts
(`copy_losses`); the phase change is where the two part (`phase_change`).
"""

from __future__ import annotations

import numpy as np
import torch

from model import GPT

WINDOWS = 64  # windows of the lesson's text the copies' losses are the mean over


def copy_marks(text: str) -> np.ndarray:
    """For each character of a text like the lesson's: 0 in the first copy of a line written
    twice, the string's length n in its second copy (its source n characters back), -1 for
    anything else (a newline, a line that is no string written twice)."""
    marks = []
    for line in text.split("\n"):
        n = len(line) // 2
        copied = len(line) % 2 == 0 and n > 0 and line[:n] == line[n:]
        marks += ([0] * n + [n] * n) if copied else [-1] * len(line)
        marks.append(-1)  # (the newline)
    return np.asarray(marks[:len(text)])


def copy_windows(ids: np.ndarray, marks: np.ndarray, block: int, count: int = WINDOWS,
                 seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """x, y [count, block] from fixed starts; each target's part [count, block]: 0 a first
    copy, 1 a second copy whose first copy is inside the window (copyable), -1 anything else;
    and each input's way back to the same symbol's earlier copy [count, block] (n, where the
    input is a second copy's symbol whose first copy is in the window; else 0)."""
    starts = torch.randint(len(ids) - block - 1, (count,), generator=torch.Generator().manual_seed(seed)).numpy()
    index = starts[:, None] + np.arange(block + 1)
    x, y = torch.from_numpy(ids[index[:, :-1]].astype(np.int64)), torch.from_numpy(ids[index[:, 1:]].astype(np.int64))
    back = marks[index]  # how far back the source of each token is (0: none)
    position = np.arange(block + 1)[None, :]  # token i's source i - n is in the window if i - n >= 0
    part = np.where(back[:, 1:] == 0, 0, np.where((back[:, 1:] > 0) & (position[:, 1:] - back[:, 1:] >= 1), 1, -1))
    inputs = np.where((back[:, :-1] > 0) & (position[:, :-1] - back[:, :-1] >= 0), back[:, :-1], 0)
    return x, y, torch.from_numpy(part), torch.from_numpy(inputs)


@torch.no_grad()
def target_losses(model: GPT, x: torch.Tensor, y: torch.Tensor, head_mask: torch.Tensor | None = None,
                  batch_size: int = 32) -> torch.Tensor:
    """Each target's loss [N, T] (the model's own pass in eval mode; head_mask: heads switched off)."""
    device = model.lm_head.weight.device
    was = model.training
    model.eval()
    try:
        losses = [GPT.loss(model.trace(x[i:i + batch_size].to(device), head_mask=head_mask).logits,
                           y[i:i + batch_size].to(device), reduction="none") for i in range(0, len(x), batch_size)]
    finally:
        model.train(was)
    return torch.cat(losses).float().cpu()


def copy_losses(model: GPT, x: torch.Tensor, y: torch.Tensor, part: torch.Tensor, back: torch.Tensor | None = None,
                head_mask: torch.Tensor | None = None) -> tuple[float, float]:
    """The mean loss on the first copies and on the copyable second copies (copy_windows; its
    `back` is not needed here)."""
    losses = target_losses(model, x, y, head_mask)
    return losses[part == 0].mean().item(), losses[part == 1].mean().item()


@torch.no_grad()
def induction_weights(model: GPT, x: torch.Tensor, part: torch.Tensor, back: torch.Tensor, layer: int,
                      head: int) -> dict[str, float]:
    """Where head `head` of block `layer` puts its weight from the queries that predict a second
    copy's symbol (copy_windows: a query i whose target is copyable and whose own symbol's earlier
    copy lies n = back[i] tokens before it): on the right key (i − n + 1, the symbol that came
    after the earlier copy: an induction head's), on the earlier copy of the query's own symbol
    (i − n), and on the rest; each the mean over those queries."""
    device = model.lm_head.weight.device
    queries = (part == 1) & (back > 0)  # [N, T]
    rows, positions = queries.nonzero(as_tuple=True)
    n = back[rows, positions]
    right, same = [], []
    for start in range(0, len(x), 32):
        chosen = (rows >= start) & (rows < start + 32)
        weights = model.trace(x[start:start + 32].to(device)).layers[layer].weights[:, head].float().cpu()  # [B, T, T]
        r, p, k = rows[chosen] - start, positions[chosen], n[chosen]
        right.append(weights[r, p, p - k + 1])
        same.append(weights[r, p, p - k])
    right, same = torch.cat(right).mean().item(), torch.cat(same).mean().item()
    return {"right": right, "same": same, "rest": 1.0 - right - same}


def position_losses(model: GPT, x: torch.Tensor, y: torch.Tensor) -> list[float]:
    """The mean loss at each position of the window [T] over windows x, y [N, T]."""
    return target_losses(model, x, y).mean(0).tolist()


def in_context_score(losses: list[float]) -> float:
    """The mean loss over the window's second half less that over its positions from
    T/20 to T/10 (Olsson et al.'s 500th token less the 50th, for any T): negative where the
    context helps."""
    T = len(losses)
    early = losses[max(1, T // 20):max(2, T // 10 + 1)]
    late = losses[T // 2:]
    return float(np.mean(late) - np.mean(early))


def phase_change(steps: list[int], first: list[float], second: list[float]) -> dict:
    """Where the second copies' loss leaves its plateau (below 90% of the first copies') and
    where it has come within 10% of its final drop; the snapshots inside that stretch."""
    final = second[-1]
    start = next((s for s, a, b in zip(steps, first, second) if b < 0.9 * a), None)
    end = next((s for s, a, b in zip(steps, first, second) if b <= final + 0.1 * (a - final)), None)
    inside = sum(1 for s in steps if start is not None and end is not None and start <= s <= end)
    return {"start": start, "end": end, "snapshots": inside}
