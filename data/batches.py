"""Training batches: random windows of block_size tokens, targets shifted by one; or, for
conversations, epochs of them shuffled, one a row or packed several a row, with targets only
where the assistant speaks."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from .shared import DataError


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

    items = "windows"  # what it draws, for messages

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

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor, None]:
        starts = torch.randint(len(self.tokens) - self.block_size, (self.batch_size * self.world_size,),
                               generator=self.generator)
        mine = starts[self.rank * self.batch_size:(self.rank + 1) * self.batch_size]
        self.drawn += len(mine) * self.block_size
        return *windows(self.tokens, mine, self.block_size), None  # (no position ids: one text a row)

    def rows_in(self, epochs: float) -> int:
        """Epochs are passes over conversations; a text's windows are drawn at random, without them."""
        raise DataError(f"train.epochs={epochs:g} counts passes over conversations; this run trains on a text's "
                        "random windows: set train.max_iters (or train.max_minutes) instead")

    @property
    def epochs_done(self) -> None:
        """None: a text's windows come in no epochs."""
        return None

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


# ---- conversations (data/conversations.py, data/template.py) -----------------------------------

IGNORE = -100  # a target that is not scored (F.cross_entropy's ignore_index, the model's loss)


@dataclass
class Conversations:
    """One split's conversations as token files hold them: all their ids one after the
    other (`tokens`), the assistant's flags (`mask`, one per token) and where each one
    starts (`starts`, with the end of the last appended)."""

    tokens: np.ndarray
    mask: np.ndarray
    starts: np.ndarray

    def __len__(self) -> int:
        return len(self.starts) - 1

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        start, end = self.starts[i], self.starts[i + 1]
        return self.tokens[start:end], self.mask[start:end]


def in_memory(encoded: list[tuple[np.ndarray, np.ndarray]]) -> Conversations:
    """Conversations from (ids, mask) pairs, as token files would hold them."""
    lengths = [len(ids) for ids, _ in encoded]
    return Conversations(np.concatenate([ids for ids, _ in encoded]), np.concatenate([mask for _, mask in encoded]),
                         np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64))


def conversation_rows(conversations: Conversations, rows, block_size: int,
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Rows of conversations: each row's conversations (an index, or a list of them packed in
    one row) one after the other; x their tokens, y the next token where that token is the
    assistant's, else IGNORE; each conversation cut to its first block_size + 1 tokens. Rows
    are padded on the right to the longest, and the padding is never scored. x, y [B, L],
    L <= block_size, and for packed rows the position of each token in its own conversation
    [B, L] (0, 1, 2, ..., 0, 1, ...; the padding counts from 0 too), from which the model
    knows where each conversation starts: it attends within one and starts each one's
    positions at 0. One conversation a row needs none (the mask is causal, so a real token
    never attends to the padding after it)."""
    packed = any(not np.isscalar(row) for row in rows)
    rows = [[row] if np.isscalar(row) else list(row) for row in rows]
    pieces = [[conversations[int(i)] for i in row] for row in rows]
    length = min(block_size, max(sum(len(ids) - 1 for ids, _ in row) for row in pieces))
    x = torch.zeros(len(rows), length, dtype=torch.long)
    y = torch.full((len(rows), length), IGNORE, dtype=torch.long)
    positions = torch.zeros(len(rows), length, dtype=torch.long)
    for row, conversations_of_row in enumerate(pieces):
        at = 0
        for ids, mask in conversations_of_row:
            ids = ids[:block_size + 1].astype(np.int64)
            mask = mask[:block_size + 1]
            n = min(len(ids) - 1, length - at)  # (a packed row's conversations fit: the packer saw to it)
            x[row, at:at + n] = torch.from_numpy(ids[:n])
            y[row, at:at + n] = torch.from_numpy(np.where(mask[1:n + 1] == 1, ids[1:n + 1], IGNORE))
            positions[row, at:at + n] = torch.arange(n)
            at += n
        positions[row, at:] = torch.arange(length - at)  # the padding: a sequence of its own
    return x, y, positions if packed else None


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


def best_fit(sizes: np.ndarray, capacity: int) -> list[list[int]]:
    """Pack items of `sizes` (each <= capacity) into as few rows as best-fit decreasing finds:
    the largest first, each into the row it leaves the least room in (a new row when none
    has room). Equal sizes keep their order, so a shuffled input packs differently each time.
    Returns each row's items, by index into sizes."""
    import bisect

    rows: list[list[int]] = []
    room: list[tuple[int, int]] = []  # (room left, row), sorted
    for item in np.argsort(-sizes, kind="stable"):
        size = int(sizes[item])
        at = bisect.bisect_left(room, (size, -1))  # the row with the least room that still fits it
        if at == len(room):
            rows.append([int(item)])
            bisect.insort(room, (capacity - size, len(rows) - 1))
        else:
            left, row = room.pop(at)
            rows[row].append(int(item))
            bisect.insort(room, (left - size, row))
    return rows


class ConversationSampler:
    """Conversations in epochs: each epoch holds every `answered` conversation once (a mixture's
    source `weight` times: data/prepare.py), in an order shuffled from (seed, epoch), without
    replacement; one conversation a row, or with `pack` several, best-fit (the rows then
    shuffled too). Batches take the next rows, across epochs; the state is where the stream
    is (epoch, row), so a resumed run goes on mid-epoch with the very rows it would have had.
    Under DDP every rank takes the global batch's rows and keeps its own slice."""

    items = "conversations"  # what an epoch passes over, for messages

    def __init__(self, conversations: Conversations, block_size: int, batch_size: int, seed: int,
                 rank: int = 0, world_size: int = 1, pack: bool = False, weights: list[tuple[np.ndarray, float]] | None = None):
        self.conversations = conversations
        self.block_size = block_size
        self.batch_size = batch_size
        self.usable = self.usable_items()
        # each source's usable conversations and its weight (one source, weight 1, unless mixed)
        self.weights = [(self.usable, 1.0)] if weights is None else [
            (np.intersect1d(indices, self.usable), weight) for indices, weight in weights]
        self.sizes = self.item_sizes()  # the positions each fills
        self.pack = pack
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.epoch = 0
        self.row = 0  # rows of this epoch already taken
        self.plan = self.rows_of(0)
        if not self.plan:
            raise DataError(f"the data.sources weights leave no {self.items[:-1]} in an epoch (a weight below 1 "
                            f"takes that share of a source's {self.items}); raise them")
        self.drawn = 0  # the real tokens of the batches this process drew (inputs; padding left out)

    def usable_items(self) -> np.ndarray:
        """The items an epoch draws from: the conversations with an answer within the context."""
        usable = answered(self.conversations, self.block_size)
        if len(usable) == 0:
            raise DataError(f"no training conversation has an answer within the first {self.block_size + 1} tokens; "
                            "use a larger model.block_size or shorter conversations")
        return usable

    def item_sizes(self) -> np.ndarray:
        """The positions each item fills in a batch."""
        return np.minimum(np.diff(self.conversations.starts) - 1, self.block_size)

    def batch_of(self, rows: list) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """A batch of these rows (conversation_rows)."""
        return conversation_rows(self.conversations, rows, self.block_size)

    def rows_of(self, epoch: int) -> list:
        """The rows of an epoch, in order: each a conversation's index, or a packed list of them."""
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        chosen = []
        for indices, weight in self.weights:  # weight 2.5: each twice, and a random half once more
            whole, part = divmod(weight, 1.0)
            chosen += [indices] * int(whole)
            chosen.append(indices[torch.randperm(len(indices), generator=generator)[:round(part * len(indices))].numpy()])
        epoch_items = np.concatenate(chosen)
        epoch_items = epoch_items[torch.randperm(len(epoch_items), generator=generator).numpy()]
        if not self.pack:
            return list(epoch_items)
        rows = [epoch_items[row] for row in best_fit(self.sizes[epoch_items], self.block_size)]
        return [rows[i] for i in torch.randperm(len(rows), generator=generator).tolist()]

    def rows_in(self, epochs: float) -> int:
        """How many rows `epochs` epochs hold (a fraction: that share of the last one's)."""
        whole, part = divmod(epochs, 1.0)
        rows = sum(len(self.rows_of(epoch)) for epoch in range(int(whole)))
        return rows + (math.ceil(part * len(self.rows_of(int(whole)))) if part else 0)

    @property
    def epochs_done(self) -> float:
        """Epochs taken so far by the stream, e.g. 1.5."""
        return self.epoch + self.row / len(self.plan)

    def next_row(self):
        if self.row == len(self.plan):
            self.epoch += 1
            self.row = 0
            self.plan = self.rows_of(self.epoch)
        self.row += 1
        return self.plan[self.row - 1]

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        rows = [self.next_row() for _ in range(self.batch_size * self.world_size)]
        mine = rows[self.rank * self.batch_size:(self.rank + 1) * self.batch_size]
        self.drawn += sum(int(self.sizes[np.atleast_1d(row)].sum()) for row in mine)
        return self.batch_of(mine)

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "row": self.row}

    def load_state_dict(self, state: dict) -> None:
        if "epoch" not in state:
            raise DataError("this run's conversations were drawn at random by an earlier version, which cannot "
                            "be continued in epochs; start it afresh (--fresh) or finish it with that version")
        self.epoch, self.row = state["epoch"], state["row"]
        self.plan = self.rows_of(self.epoch)


class PairSampler(ConversationSampler):
    """Preference pairs (data/preferences.py; sequence 2i is pair i's chosen answer, 2i + 1 its
    rejected one) in epochs, as ConversationSampler draws conversations, one pair an item:
    a batch of B pairs is x, y [B, 2, L] (each pair's chosen row, then its rejected one) and the
    pairs' indices [B]. A pair with a side longer than the context is left out (`fits`):
    cutting an answer would compare part of one with the whole other."""

    items = "pairs"

    def usable_items(self) -> np.ndarray:
        usable = fits(self.conversations, self.block_size)
        if len(usable) == 0:
            raise DataError(f"no training pair fits the context ({self.block_size + 1} tokens a side); use a "
                            "larger model.block_size or shorter answers")
        return usable

    def item_sizes(self) -> np.ndarray:
        lengths = np.diff(self.conversations.starts) - 1
        return lengths[0::2] + lengths[1::2]

    def batch_of(self, rows: list) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return pair_batch(self.conversations, rows, self.block_size)


def pair_batch(pairs: Conversations, indices, block_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Pairs as rows: x, y [N, 2, L] (conversation_rows of each pair's two sides, padded to the
    longest of all) and the pairs' indices [N]."""
    indices = [int(i) for i in indices]
    x, y, _ = conversation_rows(pairs, [2 * i for i in indices] + [2 * i + 1 for i in indices], block_size)
    sides = lambda t: t.view(2, len(indices), -1).transpose(0, 1)  # noqa: E731  [2N, L] -> [N, 2, L]
    return sides(x), sides(y), torch.tensor(indices, dtype=torch.long)


def fits(pairs: Conversations, block_size: int) -> np.ndarray:
    """The pairs whose two sides each fit the context (block_size + 1 tokens with the last target)."""
    lengths = np.diff(pairs.starts)
    return np.flatnonzero((lengths[0::2] <= block_size + 1) & (lengths[1::2] <= block_size + 1))


def fixed_pairs(pairs: Conversations, block_size: int, count: int, seed: int, split: str
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The same `count` pairs that fit every time (all of them, if fewer), for evaluations
    comparable over a run: pair_batch's x, y [N, 2, L] and indices [N]."""
    usable = fits(pairs, block_size)
    if len(usable) == 0:
        raise DataError(f"no {split} pair fits the context ({block_size + 1} tokens a side); use a larger "
                        "model.block_size or shorter answers")
    order = np.sort(usable[torch.randperm(len(usable), generator=torch.Generator().manual_seed(seed))[:count].numpy()])
    return pair_batch(pairs, order, block_size)


def fixed_conversations(conversations: Conversations, block_size: int, count: int, seed: int,
                        split: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The same `count` answered conversations every time (all of them, if fewer), for
    evaluations comparable over a run: x, y [N, L]."""
    usable = answered(conversations, block_size)
    if len(usable) == 0:
        raise DataError(f"no {split} conversation has an answer within the first {block_size + 1} tokens; "
                        "use a larger model.block_size or shorter conversations")
    order = torch.randperm(len(usable), generator=torch.Generator().manual_seed(seed))[:count]
    x, y, _ = conversation_rows(conversations, usable[np.sort(order.numpy())], block_size)
    return x, y
