"""Training batches: random windows of block_size tokens, targets shifted by one."""

from __future__ import annotations

import numpy as np
import torch

from .sources import DataError


def check_length(tokens: np.ndarray, block_size: int, split: str) -> None:
    if len(tokens) < block_size + 1:
        raise DataError(f"the {split} split has {len(tokens)} tokens, fewer than block_size + 1 = "
                        f"{block_size + 1}; use a smaller model.block_size or more text")


def windows(tokens: np.ndarray, starts: torch.Tensor, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x = tokens[s : s+T], y = tokens[s+1 : s+T+1] for each start s: the label of each
    position is the next token. Returns x, y [B, T] (int64)."""
    index = starts.numpy()[:, None] + np.arange(block_size + 1)  # [B, T+1]
    rows = torch.from_numpy(tokens[index].astype(np.int64))  # one gather from the memmap
    return rows[:, :-1], rows[:, 1:]


class BatchSampler:
    """Random windows, reproducible from a seed, with a state that can be saved and
    restored so a resumed run draws exactly the batches it would have drawn.

    Under DDP every rank draws the same global batch of batch_size × world_size windows
    and keeps its own slice: ranks see different windows, and together exactly the
    windows one process with the whole global batch would see.
    """

    def __init__(self, tokens: np.ndarray, block_size: int, batch_size: int, seed: int,
                 rank: int = 0, world_size: int = 1):
        check_length(tokens, block_size, "train")
        self.tokens, self.block_size, self.batch_size = tokens, block_size, batch_size
        self.rank, self.world_size = rank, world_size
        self.generator = torch.Generator().manual_seed(seed)

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        starts = torch.randint(len(self.tokens) - self.block_size, (self.batch_size * self.world_size,),
                               generator=self.generator)
        mine = starts[self.rank * self.batch_size:(self.rank + 1) * self.batch_size]
        return windows(self.tokens, mine, self.block_size)

    def state_dict(self) -> dict:
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.generator.set_state(state["generator"])


def fixed_windows(tokens: np.ndarray, block_size: int, count: int, seed: int,
                  split: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The same `count` windows every time, so evaluations are comparable over a run, and
    the same whatever the batches they are cut into: x, y [count, T]."""
    check_length(tokens, block_size, split)
    g = torch.Generator().manual_seed(seed)
    return windows(tokens, torch.randint(len(tokens) - block_size, (count,), generator=g), block_size)
