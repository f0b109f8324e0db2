"""Training batches: random windows of block_size tokens, targets shifted by one; or, for
conversations, random conversations, one a row, with targets only where the assistant speaks."""

from __future__ import annotations

import numpy as np
import torch

from .chat import Conversations
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
        self.tokens = tokens
        self.block_size = block_size
        self.batch_size = batch_size
        self.rank = rank
        self.world_size = world_size
        self.generator = torch.Generator().manual_seed(seed)
        self.drawn = 0  # the real tokens of the batches this process drew (inputs; here every position is one)

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        starts = torch.randint(len(self.tokens) - self.block_size, (self.batch_size * self.world_size,),
                               generator=self.generator)
        mine = starts[self.rank * self.batch_size:(self.rank + 1) * self.batch_size]
        self.drawn += len(mine) * self.block_size
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


# ---- conversations (data/chat.py) -----------------------------------------------------------

IGNORE = -100  # a target that is not scored (F.cross_entropy's ignore_index, the model's loss)


def conversation_rows(conversations: Conversations, indices, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The conversations `indices`, one a row: x its tokens, y the next token where that
    token is the assistant's, else IGNORE; each cut to its first block_size + 1 tokens.
    Rows are padded on the right to the longest: a real token never attends to the padding
    after it (the mask is causal), and the padding is never scored, so one conversation
    never sees another and nothing but the answers is learnt. x, y [B, L], L <= block_size."""
    rows = [conversations[int(i)] for i in indices]
    length = min(block_size, max(len(ids) for ids, _ in rows) - 1)
    x = torch.zeros(len(rows), length, dtype=torch.long)
    y = torch.full((len(rows), length), IGNORE, dtype=torch.long)
    for row, (ids, mask) in enumerate(rows):
        ids = ids[:block_size + 1].astype(np.int64)
        mask = mask[:block_size + 1]
        n = len(ids) - 1
        x[row, :n] = torch.from_numpy(ids[:-1])
        y[row, :n] = torch.from_numpy(np.where(mask[1:] == 1, ids[1:], IGNORE))
    return x, y


def answered(conversations: Conversations, block_size: int) -> np.ndarray:
    """The conversations with at least one of the assistant's tokens among the targets of
    their first block_size + 1 tokens (a conversation cut before its answer teaches nothing)."""
    starts = conversations.starts
    counted = np.concatenate([[0], np.cumsum(conversations.mask, dtype=np.int64)])  # flags before each token
    ends = np.minimum(starts[1:], starts[:-1] + block_size + 1)
    return np.flatnonzero(counted[ends] - counted[starts[:-1] + 1] > 0)


def longer_than(conversations: Conversations, block_size: int) -> int:
    """How many conversations are longer than block_size + 1 tokens (cut when batched)."""
    return int((np.diff(conversations.starts) > block_size + 1).sum())


class ConversationSampler:
    """Random conversations (among the `answered` ones), one a row, reproducible from a seed
    and resumable, as BatchSampler's windows; under DDP every rank draws the global batch's
    picks and keeps its own slice."""

    def __init__(self, conversations: Conversations, block_size: int, batch_size: int, seed: int,
                 rank: int = 0, world_size: int = 1):
        self.conversations = conversations
        self.block_size = block_size
        self.batch_size = batch_size
        self.usable = answered(conversations, block_size)
        if len(self.usable) == 0:
            raise DataError(f"no training conversation has an answer within the first {block_size + 1} tokens; "
                            "use a larger model.block_size or shorter conversations")
        self.rank = rank
        self.world_size = world_size
        self.generator = torch.Generator().manual_seed(seed)
        self.drawn = 0  # the real tokens of the batches this process drew (inputs; padding left out)

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        picks = torch.randint(len(self.usable), (self.batch_size * self.world_size,), generator=self.generator)
        mine = self.usable[picks[self.rank * self.batch_size:(self.rank + 1) * self.batch_size].numpy()]
        lengths = self.conversations.starts[mine + 1] - self.conversations.starts[mine]
        self.drawn += int(np.minimum(lengths - 1, self.block_size).sum())
        return conversation_rows(self.conversations, mine, self.block_size)

    def state_dict(self) -> dict:
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.generator.set_state(state["generator"])


def fixed_conversations(conversations: Conversations, block_size: int, count: int, seed: int,
                        split: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The same `count` answered conversations every time (all of them, if fewer), for
    evaluations comparable over a run: x, y [N, L]."""
    usable = answered(conversations, block_size)
    if len(usable) == 0:
        raise DataError(f"no {split} conversation has an answer within the first {block_size + 1} tokens; "
                        "use a larger model.block_size or shorter conversations")
    order = torch.randperm(len(usable), generator=torch.Generator().manual_seed(seed))[:count]
    return conversation_rows(conversations, usable[np.sort(order.numpy())], block_size)


def sampler_for(data, block_size: int, batch_size: int, seed: int, rank: int = 0, world_size: int = 1):
    """The training batches of prepared data (data/prepare.py's TokenData): windows of
    text, or conversations."""
    if data.chat is not None:
        return ConversationSampler(data.chat["train"], block_size, batch_size, seed, rank, world_size)
    return BatchSampler(data.train, block_size, batch_size, seed, rank, world_size)


def evaluation_rows(data, split: str, block_size: int, count: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """What a run is scored on, the same at every evaluation: `count` fixed windows of a
    split's text, or its conversations."""
    if data.chat is not None:
        return fixed_conversations(data.chat[split], block_size, count, seed, split)
    return fixed_windows(data.train if split == "train" else data.val, block_size, count, seed, split)
