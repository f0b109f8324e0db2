"""Which components make a prediction, found by running the model twice (activation
patching: Zhang & Nanda, 2023; Heimersheim & Nanda, 2024; ARENA's induction chapter).

On the induction lesson's text a second copy can be predicted only by copying its first
copy. A corrupted run (`corrupted`: every symbol of each first copy replaced by the next
symbol of the lesson's alphabet, the second copies left as they are) loses that: its second
copies are as unpredictable as the first. Into the corrupted run, one component's output
from the clean run is put back (model/trace.py's Patch: a head's output, W_O's input, or a
feed-forward network's; at every position, or at one), and the loss on the second copies is
measured: the share of the gap between the corrupted and the clean loss that the component
restores, (L_corrupt − L_patched) / (L_corrupt − L_clean), 1 where it alone carries what the
clean run knew, 0 where it carries none of it.

Path patching (Wang et al., 2022; Goldowsky-Dill et al., 2023) puts a head's clean output
back on one path only: straight to the logits (the final norm's input alone gets it), or
through its own block's feed-forward network (that network's input alone gets it).
"""

from __future__ import annotations

import torch

from model import GPT
from model.trace import Patch, patch_outputs

from .in_context import copy_marks

ROWS = 256  # patched runs a forward pass holds at most


def corrupted(text: str, symbols: str) -> str:
    """The text with every symbol of each first copy replaced by the next symbol of `symbols`
    (the lesson's alphabet, cyclically): the second copies keep the symbols they had, which
    their first copies no longer show."""
    marks = copy_marks(text)
    following = {s: symbols[(i + 1) % len(symbols)] for i, s in enumerate(symbols)}
    return "".join(following.get(ch, ch) if mark == 0 else ch for ch, mark in zip(text, marks))


def scored_targets(text: str) -> torch.Tensor:
    """[T − 1] of the targets of a char model's pass over `text` (target j: character j + 1),
    those that are a second copy's symbol: what copying predicts (the losses patching restores)."""
    return torch.from_numpy(copy_marks(text))[1:] > 0


def components(model: GPT) -> list[tuple[str, int, int | None]]:
    """(name, layer, head) of every component whose output can be patched: each head, then
    each block's feed-forward network (head None; an attention-only model has none)."""
    c = model.config
    heads = [(f"L{l}H{h}", l, h) for l in range(c.n_layer) for h in range(c.n_head)]
    return heads + [(f"L{l} FFN", l, None) for l, block in enumerate(model.transformer.h) if block.mlp is not None]


@torch.no_grad()
def patched_losses(model: GPT, corrupt: torch.Tensor, scored: torch.Tensor,
                   patches: list[list[Patch]]) -> torch.Tensor:
    """The mean loss on the scored targets of the corrupted ids [T] run once for each list of
    patches (row r of a batch takes patches[r]); [len(patches)]."""
    device = model.lm_head.weight.device
    losses = []
    for start in range(0, len(patches), ROWS):
        rows = patches[start:start + ROWS]
        idx = corrupt.to(device).expand(len(rows), -1)  # [R, T]
        hooks = patch_outputs(model, batched(rows, corrupt.numel(), device))
        try:
            logits, _ = model(idx)
        finally:
            for hook in hooks:
                hook.remove()
        each = GPT.loss(logits[:, :-1], idx[:, 1:], reduction="none")  # [R, T - 1]
        losses.append((each * scored.to(device)).sum(-1).float().cpu() / scored.sum())
    return torch.cat(losses)


def batched(rows: list[list[Patch]], T: int, device) -> list[Patch]:
    """One patch a component and path for a batch whose row r takes rows[r]: its `where`
    [R, T], each row's own positions (the value, the clean run's output, is the same for all)."""
    found: dict[tuple, Patch] = {}
    for r, patches in enumerate(rows):
        for p in patches:
            key = (p.layer, p.head, p.path)
            if key not in found:
                found[key] = Patch(p.layer, p.head, p.value.to(device), torch.zeros(len(rows), T, device=device), p.path)
            found[key].where[r] = p.where.to(device).float()
    return list(found.values())


@torch.no_grad()
def patching(model: GPT, clean: torch.Tensor, corrupt: torch.Tensor, scored: torch.Tensor,
             positions: bool = True) -> dict:
    """Activation patching of every component (`components`), clean into corrupted: ids [T]
    each, scored [T − 1] the targets measured. Returns {"components": names, "clean",
    "corrupt": the two runs' losses, "all": [K] the share each restores patched at every
    position, "positions": [K, T] patched at each position alone (with positions)}."""
    model.eval()
    trace = model.trace(clean[None].to(model.lm_head.weight.device))
    outputs = {(l, h): (trace.layers[l].heads[0, h] if h is not None else trace.layers[l].mlp[0])
               for _, l, h in components(model)}
    T = clean.numel()
    every = torch.ones(T)
    runs = [[]] + [[Patch(l, h, outputs[(l, h)], every)] for _, l, h in components(model)]
    if positions:
        one = torch.eye(T)
        runs += [[Patch(l, h, outputs[(l, h)], one[p])] for _, l, h in components(model) for p in range(T)]
    clean_loss = patched_losses(model, clean, scored, [[]])[0]
    losses = patched_losses(model, corrupt, scored, runs)
    corrupt_loss, gap = losses[0], losses[0] - clean_loss
    K = len(components(model))
    restored = (corrupt_loss - losses[1:]) / gap
    return {"components": [name for name, _, _ in components(model)], "clean": clean_loss.item(),
            "corrupt": corrupt_loss.item(), "all": restored[:K].tolist(),
            "positions": restored[K:].view(K, T).tolist() if positions else None}


@torch.no_grad()
def path_patching(model: GPT, clean: torch.Tensor, corrupt: torch.Tensor, scored: torch.Tensor) -> dict:
    """Each head's clean output put back on one path at a time, at every position: {"heads":
    names, "all", "direct" (to the logits alone), "ffn" (through its own block's feed-forward
    network alone; None for an attention-only model): [H·L] the share of the gap each restores}."""
    model.eval()
    trace = model.trace(clean[None].to(model.lm_head.weight.device))
    heads = [(name, l, h) for name, l, h in components(model) if h is not None]
    every = torch.ones(clean.numel())
    paths = ["all", "direct"] + (["ffn"] if model.config.mlp != "none" else [])
    runs = [[]] + [[Patch(l, h, trace.layers[l].heads[0, h], every, path)] for path in paths for _, l, h in heads]
    clean_loss = patched_losses(model, clean, scored, [[]])[0]
    losses = patched_losses(model, corrupt, scored, runs)
    restored = ((losses[0] - losses[1:]) / (losses[0] - clean_loss)).view(len(paths), len(heads))
    found = {path: restored[i].tolist() for i, path in enumerate(paths)}
    return {"heads": [name for name, _, _ in heads], "clean": clean_loss.item(), "corrupt": losses[0].item(),
            "all": found["all"], "direct": found["direct"], "ffn": found.get("ffn")}
