"""What one forward pass computed, piece by piece: model.trace(idx) hands it back, so a
learner (and the explorer, --explain and the attention maps) can follow a token through
the whole model with the model's own numbers.

Forward hooks keep what each module hands on (`recording`), and attention fills in its own
insides (q, k, v, the weights): nothing is computed twice. With pre-LN (GPT-2):
    ln_1 = LN(residual_in); attn = concat(heads) W_O + b_O; mid = residual_in + attn
    ln_2 = LN(mid); mlp = mlp_hidden W_2 + b_2; residual_out = mid + mlp
With post-LN (the paper) the norms come after each residual:
    ln_1 = LN(residual_in + attn); ln_2 = LN(ln_1 + mlp) = residual_out
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.nn as nn


@dataclass
class LayerTrace:
    """One block's pieces (B batch rows, T new tokens, S keys with the cached ones, C width,
    H heads, H_kv key/value heads, d_k head size, F the feed-forward width). An attention-only
    block (mlp="none") has no feed-forward network: its ln_2 and mlp are zeros, mlp_hidden of width 0."""

    residual_in: torch.Tensor = None  # [B, T, C] the stream entering the block
    ln_1: torch.Tensor = None  # [B, T, C] the first norm's output
    q: torch.Tensor = None  # [B, H, T, d_k] the queries (rotated, with RoPE)
    k: torch.Tensor = None  # [B, H_kv, S, d_k] the keys (rotated, with RoPE)
    v: torch.Tensor = None  # [B, H_kv, S, d_k] the values
    weights: torch.Tensor = None  # [B, H, T, S] softmax(q kᵀ / √d_k), masked; each row sums to 1
    heads: torch.Tensor = None  # [B, H, T, d_k] each head's output, weights @ v (0 for a head switched off)
    attn: torch.Tensor = None  # [B, T, C] the heads concatenated and mixed by W_O: what attention adds
    ln_2: torch.Tensor = None  # [B, T, C] the second norm's output
    mlp_hidden: torch.Tensor = None  # [B, T, F] the feed-forward network's hidden layer, after the activation
    mlp: torch.Tensor = None  # [B, T, C] the feed-forward network's output
    residual_out: torch.Tensor = None  # [B, T, C] the stream leaving the block


@dataclass
class Trace:
    """The whole pass: the embedding's pieces, every block's LayerTrace, the final norm
    and the logits.

    token:    [B, T, C] wte[idx], the token embedding
    position: [B, T, C] the position vectors added to it (learned or sinusoidal), or None
              with RoPE (position enters q and k instead)
    layers:   one LayerTrace per block; layers[0].residual_in = token + position
    ln_f:     [B, T, C] the final norm of the last residual_out (the LM head's input)
    logits:   [B, T, vocab_size] what the LM head makes of ln_f
    loss:     [] the mean cross-entropy, when the pass was given targets
    """

    layers: list[LayerTrace] = field(default_factory=list)
    token: torch.Tensor = None
    position: torch.Tensor | None = None
    ln_f: torch.Tensor = None
    logits: torch.Tensor = None
    loss: torch.Tensor | None = None

    @classmethod
    def empty(cls, n_layer: int) -> "Trace":
        """A trace for the forward pass to fill."""
        return cls([LayerTrace() for _ in range(n_layer)])

    def stacked(self, name: str) -> torch.Tensor:
        return torch.stack([getattr(layer, name) for layer in self.layers])

    # every layer's attention, stacked [n_layer, B, H, ...]: the five steps' inputs and results
    q = property(lambda self: self.stacked("q"))
    k = property(lambda self: self.stacked("k"))
    v = property(lambda self: self.stacked("v"))
    weights = property(lambda self: self.stacked("weights"))
    heads = property(lambda self: self.stacked("heads"))


@contextmanager
def recording(model: nn.Module, trace: Trace) -> Iterator[Trace]:
    """Inside the block, every forward pass of `model` (a GPT) writes what its modules hand on
    into `trace`: forward hooks on the embeddings, each block and its norms, attention, W_O's
    input (the heads, after any switched off) and the feed-forward network, and the final
    norm. Attention's q, k, v and weights are filled by attention itself (the pass's record)."""
    def output_as(record, name: str):
        return lambda module, args, output: setattr(record, name, output)

    def input_as(record, name: str):
        return lambda module, args: setattr(record, name, args[0])

    def heads_of(record, n_head: int):  # W_O's input [B, T, C] as the heads [B, H, T, d_k]
        return lambda module, args: setattr(record, "heads", args[0].unflatten(-1, (n_head, -1)).transpose(1, 2))

    transformer = model.transformer
    hooks = [transformer.wte.register_forward_hook(output_as(trace, "token")),
             transformer.ln_f.register_forward_hook(output_as(trace, "ln_f"))]
    if "wpe" in transformer:
        hooks.append(transformer.wpe.register_forward_hook(output_as(trace, "position")))
    def without_feed_forward(record):  # an attention-only block: its FFN writes nothing, of width 0
        def fill(module, args, output):
            record.residual_out = output
            record.ln_2, record.mlp, record.mlp_hidden = torch.zeros_like(output), torch.zeros_like(output), \
                output.new_zeros(*output.shape[:-1], 0)
        return fill

    for block, layer in zip(transformer.h, trace.layers):
        hooks += [block.register_forward_pre_hook(input_as(layer, "residual_in")),
                  block.ln_1.register_forward_hook(output_as(layer, "ln_1")),
                  block.attn.c_proj.register_forward_pre_hook(heads_of(layer, block.attn.n_head)),
                  block.attn.register_forward_hook(output_as(layer, "attn"))]
        if block.mlp is None:
            hooks.append(block.register_forward_hook(without_feed_forward(layer)))
            continue
        hooks += [block.ln_2.register_forward_hook(output_as(layer, "ln_2")),
                  block.mlp.c_proj.register_forward_pre_hook(input_as(layer, "mlp_hidden")),
                  block.mlp.register_forward_hook(output_as(layer, "mlp")),
                  block.register_forward_hook(output_as(layer, "residual_out"))]
    try:
        yield trace
    finally:
        for hook in hooks:
            hook.remove()


def switch_off_heads(model: nn.Module, head_mask: torch.Tensor) -> list:
    """Switch heads of `model` (a GPT) off: head_mask [n_layer, n_head], or [B, n_layer,
    n_head] for one pattern a batch row; 0 zeroes the head's output before W_O (transformers'
    head_mask), 1 leaves it as it is. A forward pre-hook on each block's W_O does it, so that
    the model's own pass runs as ever. Returns the hooks (`.remove()` each to switch them on)."""
    hooks = []
    for layer, block in enumerate(model.transformer.h):
        n_head = block.attn.n_head

        def zero_heads(module, args, layer=layer, n_head=n_head):
            heads = args[0].unflatten(-1, (n_head, -1))  # [B, T, C] -> [B, T, H, d_k]
            keep = head_mask[..., layer, :].to(heads.dtype).view(-1, 1, n_head, 1)  # [B or 1, 1, H, 1]
            return ((heads * keep).flatten(-2),)  # [B, T, C]

        hooks.append(block.attn.c_proj.register_forward_pre_hook(zero_heads))
    return hooks


@dataclass
class Patch:
    """One component's output taken from another pass (activation patching): `value` replaces
    this pass's own where `where` says. A head's output is W_O's input columns for it, so the
    head writes value W_Oᵀ instead; a feed-forward network's output is added to the stream.

    path, for a head: "all" (everything after it reads the patched output), "direct" (only the
    final norm's input gets the difference, value − own, through W_O: the head's direct path
    to the logits) or "ffn" (only its own block's feed-forward network reads the difference,
    through ln_2: the path through that network). A network's output: "all" alone."""

    layer: int
    head: int | None  # None: the block's feed-forward network
    value: torch.Tensor  # [T, d_k] a head's output (W_O's input), [T, C] a network's; or with a batch dimension
    where: torch.Tensor  # [B, T] (or [T]) of 0 and 1: the rows and positions that take it
    path: str = "all"


def patch_outputs(model: nn.Module, patches: list[Patch]) -> list:
    """Forward hooks that run each patch in every forward pass of `model` (a GPT) until they are
    removed (`.remove()` each): the model's own pass, with those outputs replaced."""
    hooks = []
    for patch in patches:
        block = model.transformer.h[patch.layer]
        where = patch.where.float()[..., None]  # [B or 1, T, 1]
        if patch.head is None:
            if patch.path != "all":
                raise ValueError("a feed-forward network's output is patched on every path it takes")
            hooks.append(block.mlp.register_forward_hook(
                lambda module, args, output, p=patch, w=where: output + w.to(output.dtype) * (p.value.to(output.dtype) - output)))
            continue
        columns = slice(patch.head * block.attn.d_k, (patch.head + 1) * block.attn.d_k)
        if patch.path == "all":
            def replace(module, args, p=patch, w=where, columns=columns):
                heads = args[0].clone()  # [B, T, C]: the heads side by side, W_O's input
                heads[..., columns] += w.to(heads.dtype) * (p.value.to(heads.dtype) - heads[..., columns])
                return (heads,)
            hooks.append(block.attn.c_proj.register_forward_pre_hook(replace))
            continue
        def differ(module, args, p=patch, w=where, columns=columns, delta=(delta := {})):  # the patch's, through W_O
            difference = w.to(args[0].dtype) * (p.value.to(args[0].dtype) - args[0][..., columns])  # [B, T, d_k]
            delta["value"] = difference @ module.weight[:, columns].T  # [B, T, C]

        def add(module, args, delta=delta):
            return (args[0] + delta["value"],)

        reader = {"direct": model.transformer.ln_f, "ffn": block.ln_2}.get(patch.path)
        if reader is None:
            raise ValueError(f"path={patch.path!r}: must be all, direct or ffn")
        hooks += [block.attn.c_proj.register_forward_pre_hook(differ), reader.register_forward_pre_hook(add)]
    return hooks
