"""`train.py --explain`: one forward pass of the real model on a real batch, traced.

Module hooks say which module is running; a TorchFunctionMode sees every torch
operation inside it, with the tensor it returned. Each step of the tutorials'
attention (Q Kᵀ, scale, mask, softmax, dropout, weights × V, ...) is recognised by the
operation that computes it, so every printed shape is the shape of a tensor that the
model really produced. The expected symbolic shape sits beside it; the tests check
that both agree for every positional encoding and norm position.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch.overrides import TorchFunctionMode

from model import GPT
from training.attention_maps import explicit_attention


@dataclass
class Row:
    step: str
    shape: tuple[int, ...]  # from the traced tensor
    symbolic: str  # e.g. "[B, H, T, T]"
    meaning: str


class _Recorder(TorchFunctionMode):
    """Records (module path, operation name, output) for every torch call and module."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.events: list[tuple[str, str, object]] = []
        self.stack = [""]
        self.handles = []
        for name, module in model.named_modules():
            self.handles.append(module.register_forward_pre_hook(lambda m, a, name=name: self.stack.append(name)))
            self.handles.append(module.register_forward_hook(lambda m, a, out, name=name: self._leave(name, out)))

    def _leave(self, name: str, out) -> None:
        self.stack.pop()
        self.events.append((name, "module", out))

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.events.append((self.stack[-1], getattr(func, "__name__", str(func)), out))
        return out

    def remove_hooks(self) -> None:
        for handle in self.handles:
            handle.remove()


def trace(model: GPT, idx: torch.Tensor, targets: torch.Tensor) -> list[Row]:
    """Run model(idx, targets) once in training mode (dropout on, no gradients) and
    return the steps of the embedding, the first block, and the head, in order."""
    c = model.config
    d_k = c.head_size
    recorder = _Recorder(model)
    try:  # the five steps ('sdpa' does the same in one fused kernel), dropout on
        with torch.no_grad(), explicit_attention(model, training=True), recorder:
            model(idx, targets)
    finally:
        recorder.remove_hooks()

    rows: list[Row] = []

    def add(step, out, symbolic, meaning):
        tensor = out[0] if isinstance(out, tuple) else out
        rows.append(Row(step, tuple(tensor.shape), symbolic, meaning))

    norm = {"layernorm": "LayerNorm", "rmsnorm": "RMSNorm"}[c.norm]
    norm_meaning = ("each vector to mean 0, variance 1, then γ, β" if c.norm == "layernorm"
                    else "each vector divided by its root mean square, then γ")
    block0, attn0 = "transformer.h.0", "transformer.h.0.attn"
    matmuls = masks = residuals = 0
    weights = None  # the attention weights, to stand in for dropout when it is off
    for where, op, out in recorder.events:
        if where == "transformer.wte" and op == "module":
            add("token embedding (wte)", out, "[B, T, C]", "each token id becomes a C-dim vector")
        elif where == "transformer.wpe" and op == "module":
            add(f"positional encoding ({c.pos_encoding})", out, "[1, T, C]",
                "one vector per position, shared by the batch")
        elif where == "" and op == "add":
            add("embedding + position", out, "[B, T, C]", "order is now part of each vector")
        elif where == "rotary" and op == "module":
            add("positional encoding (rope)", out, "[1, 1, T, d_k]",
                "cos, sin of position × θ_i; rotate q and k in every layer")
        elif where in (f"{block0}.ln_1", f"{block0}.ln_2") and op == "module":
            before = "attention" if where.endswith("ln_1") else "feed-forward"
            place = f"before {before}" if c.norm_position == "pre" else f"after {before} + residual"
            add(f"{norm} ({place})", out, "[B, T, C]", norm_meaning)
        elif where == f"{attn0}.c_attn" and op == "module":
            add("Q, K, V projections (c_attn)", out, "[B, T, 3C]", "X W_Q, X W_K, X W_V side by side")
        elif where == attn0 and op == "permute":
            add("split into heads", out, "[3, B, H, T, d_k]", f"C = H × d_k = {c.n_head} × {d_k}")
        elif where == attn0 and op == "add":
            add("rotate q and k (rope)", out, "[2, B, H, T, d_k]", "q·k now depends on the offset m − n")
        elif where == attn0 and op == "matmul":
            matmuls += 1
            if matmuls == 1:
                add("1. similarity Q Kᵀ", out, "[B, H, T, T]", "one score per (query, key) pair")
            else:
                if c.dropout == 0:
                    add("   dropout (p = 0: off)", weights, "[B, H, T, T]", "nothing dropped in this config")
                add("5. weighted sum: weights × V", out, "[B, H, T, d_k]", "each output mixes the values")
        elif where == attn0 and op == "div":
            add(f"2. scale by 1/√d_k = 1/√{d_k} = {1 / math.sqrt(d_k):.3f}", out, "[B, H, T, T]",
                "keeps the scores' variance near 1")
        elif where == attn0 and op == "masked_fill":
            masks += 1
            if masks == 1:
                add("3. causal mask", out, "[B, H, T, T]", "future keys get −inf: weight 0")
        elif where == attn0 and op == "softmax":
            weights = out
            add("4. softmax over keys", out, "[B, H, T, T]", "each row: positive weights summing to 1")
        elif where == attn0 and op == "dropout":
            add(f"   dropout (p = {c.dropout})", out, "[B, H, T, T]", "training only: zero some weights")
        elif where == attn0 and op == "view" and out.dim() == 3:
            add("merge heads", out, "[B, T, C]", "concatenate the H heads again")
        elif where == f"{attn0}.c_proj" and op == "module":
            add("output projection W_O (c_proj)", out, "[B, T, C]", "mix the heads' results")
        elif where == block0 and op == "add":
            residuals += 1
            branch = "attention" if residuals == 1 else "feed-forward"
            add(f"residual: x + {branch}", out, "[B, T, C]", "the sub-layer adds to x, never replaces it")
        elif where == f"{block0}.mlp.c_fc" and op == "module":
            add("feed-forward layer 1 (W_1)", out, "[B, T, 4C]", "widen to 4 × C")
        elif where == f"{block0}.mlp.gelu" and op == "module":
            add(f"{c.activation.replace('_', ' ').upper()}", out, "[B, T, 4C]", "the non-linearity")
        elif where == f"{block0}.mlp.c_proj" and op == "module":
            add("feed-forward layer 2 (W_2)", out, "[B, T, C]", "back to C")
        elif where.startswith("transformer.h.") and where.count(".") == 2 and op == "module":
            if where == f"transformer.h.{c.n_layer - 1}":
                add(f"blocks 1 … {c.n_layer - 1}: the same steps" if c.n_layer > 1 else "end of the block",
                    out, "[B, T, C]", f"{c.n_layer} blocks in all")
        elif where == "transformer.ln_f" and op == "module" and c.norm_position == "pre":
            add(f"final {norm} (ln_f)", out, "[B, T, C]", "normalise before the head")
        elif where == "lm_head" and op == "module":
            add("LM head (tied to wte)", out, "[B, T, V]", "a score for every token of the vocabulary")
        elif where == "" and op == "cross_entropy":
            add("loss: cross-entropy", out, "[]", f"{out.item():.4f} ≈ ln V = {math.log(c.vocab_size):.4f} at init")
    return rows


def symbolic_sizes(model: GPT, idx: torch.Tensor) -> dict[str, int]:
    c = model.config
    B, T = idx.shape
    return {"B": B, "T": T, "C": c.n_embd, "H": c.n_head, "d_k": c.head_size, "V": c.vocab_size,
            "3C": 3 * c.n_embd, "4C": 4 * c.n_embd}


def evaluate_symbolic(symbolic: str, sizes: dict[str, int]) -> tuple[int, ...]:
    """'[B, H, T, T]' -> (32, 4, 128, 128) for the given sizes."""
    names = [s.strip() for s in symbolic.strip("[]").split(",") if s.strip()]
    return tuple(int(n) if n.isdigit() else sizes[n] for n in names)


def parameter_groups(model: GPT) -> list[tuple[str, int]]:
    """Parameters per component; the tied embedding / LM head counted once."""
    def count(module: torch.nn.Module) -> int:
        return sum(p.numel() for p in module.parameters())

    c = model.config
    block = model.transformer.h[0]
    groups = [("token embedding wte (= LM head, tied)", count(model.transformer.wte))]
    if c.pos_encoding == "learned":
        groups.append(("position embedding wpe", count(model.transformer.wpe)))
    groups += [
        (f"attention W_Q, W_K, W_V, W_O × {c.n_layer} blocks", c.n_layer * count(block.attn)),
        (f"feed-forward W_1, W_2 × {c.n_layer} blocks", c.n_layer * count(block.mlp)),
        (f"norms × {c.n_layer} blocks, and the final one",
         c.n_layer * (count(block.ln_1) + count(block.ln_2)) + count(model.transformer.ln_f)),
    ]
    groups.append(("total", model.num_parameters()))
    return groups


def report(model: GPT, idx: torch.Tensor, targets: torch.Tensor, dtype: torch.dtype) -> str:
    """The trace table, then parameters, FLOPs and memory, as plain text."""
    c = model.config
    B, T = idx.shape
    rows = trace(model, idx, targets)
    sizes = symbolic_sizes(model, idx)
    legend = ", ".join(f"{k}={v}" for k, v in sizes.items() if k not in ("3C", "4C"))
    widths = [max(len(r.step) for r in rows), max(len(str(list(r.shape))) for r in rows),
              max(len(r.symbolic) for r in rows)]
    header = ["step", "shape", "symbolic"]
    lines = [f"One forward pass of this model on a batch of training data ({legend}); "
             f"shapes from hooks, block 0 in full:", ""]
    lines.append("  ".join(h.ljust(w) for h, w in zip(header, widths)) + "  meaning")
    lines.append("  ".join("-" * w for w in widths) + "  -------")
    for r in rows:
        lines.append(f"{r.step.ljust(widths[0])}  {str(list(r.shape)).ljust(widths[1])}  "
                     f"{r.symbolic.ljust(widths[2])}  {r.meaning}")

    lines += ["", "Parameters:"]
    lines += [f"  {name:<48} {n:>12,}" for name, n in parameter_groups(model)]
    train_flops, forward_flops = model.flops_per_token(T), model.flops_per_token(T, training=False)
    lines += ["", f"FLOPs per token (context {T}): {forward_flops / 1e6:,.2f} M forward, "
                  f"{train_flops / 1e6:,.2f} M for a training step (3 × forward)"]
    nbytes = torch.tensor([], dtype=dtype).element_size()
    scores = B * c.n_head * T * T
    lines.append(f"Attention scores [B, H, T, T] = {B}×{c.n_head}×{T}×{T} = {scores:,} values = "
                 f"{scores * nbytes / 2**20:,.1f} MiB per layer in {str(dtype)[6:]} "
                 f"(× {c.n_layer} layers kept for the backward pass; grows with T²)")
    per_token = 2 * c.n_layer * c.n_embd  # a key and a value of C numbers per layer
    lines.append(f"KV cache: 2 × {c.n_layer} layers × {c.n_embd} = {per_token:,} values per token = "
                 f"{per_token * nbytes / 1024:,.1f} KiB in {str(dtype)[6:]}; "
                 f"{per_token * nbytes * c.block_size / 2**20:,.2f} MiB per sequence at block_size {c.block_size}")
    if c.attn_impl == "sdpa":
        lines.append("This config uses attn_impl=sdpa: steps 1–5 run as one fused kernel; "
                     "the trace used the explicit path, which computes the same.")
    return "\n".join(lines)
