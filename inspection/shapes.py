"""`train.py --explain`: one forward pass of the real model on a real batch, traced.

Every printed shape is the shape of a tensor the model produced in that pass: the
modules' outputs, recorded by forward hooks (the embedding, the norms, the projections,
the head), and the pieces the model hands back itself (model.trace: q, k and v
split into heads, the attention weights, each head's output; model/trace.py). A step of
the attention function can be rewritten without losing its row; steps 1 to 4 all give
tensors of the weights' shape [B, H, T, S]. The expected symbolic shape sits beside each;
the tests check that both agree for every positional encoding and norm position. The
steps' names come from inspection/words.json, in English or Chinese (`--lang`).
"""

from __future__ import annotations

import dataclasses
import math
import unicodedata
from dataclasses import dataclass

import torch

from machine.device import autocast
from model import GPT, in_mode

from .words import words as piece_words


def explain_words(lang: str) -> dict:
    """--explain's lines in `lang` (inspection/words.json, beside the pieces' words they name)."""
    return piece_words(lang)["explain"]



@dataclass
class Row:
    step: str
    shape: tuple[int, ...]  # from the traced tensor
    symbolic: str  # e.g. "[B, H, T, T]"
    meaning: str


class Recorder:
    """For one forward pass: the first input and the output of every module, by its name."""

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.inputs: dict[str, object] = {}
        self.outputs: dict[str, object] = {}

    def __enter__(self) -> "Recorder":
        self.handles = [module.register_forward_hook(lambda m, args, out, name=name: self._module(name, args, out))
                        for name, module in self.model.named_modules()]
        return self

    def __exit__(self, *exc) -> None:
        for handle in self.handles:
            handle.remove()

    def _module(self, name: str, args: tuple, out) -> None:
        self.inputs.setdefault(name, args[0] if args else None)
        self.outputs.setdefault(name, out)


def first(value) -> torch.Tensor:
    return value[0] if isinstance(value, tuple) else value


def trace(model: GPT, idx: torch.Tensor, targets: torch.Tensor, lang: str = "en") -> list[Row]:
    """Run model(idx, targets) once in training mode (dropout on, no gradients) and
    return the steps of the embedding, the first block, and the head, in order."""
    c = model.config
    with in_mode(model, training=True), torch.no_grad(), Recorder(model) as rec:
        passed = model.trace(idx, targets)
    loss = passed.loss
    row = row_maker(lang)
    rows = [row("wte", rec.outputs["transformer.wte"], "[B, T, C]")]
    if c.pos_encoding == "rope":
        rows.append(row("rotary", rec.outputs["rotary"], "[1, 1, T, d_k]"))
    else:
        rows += [row("wpe", rec.outputs["transformer.wpe"], "[1, T, C]", kind=c.pos_encoding),
                 row("add_position", rec.inputs["transformer.drop"], "[B, T, C]")]
    rows += block_rows(model, rec, passed.layers[0], row)
    last = rec.outputs[f"transformer.h.{c.n_layer - 1}"]
    rows.append(row("blocks" if c.n_layer > 1 else "end", last, "[B, T, C]", n=c.n_layer, last=c.n_layer - 1))
    if c.norm_position == "pre":
        rows.append(row("ln_f", rec.outputs["transformer.ln_f"], "[B, T, C]", norm=norm_name(c)))
    rows.append(row("lm_head" if c.tie_embeddings else "lm_head_untied", rec.outputs["lm_head"], "[B, T, V]", "lm_head"))
    rows.append(row("loss", loss, "[]", loss=loss.item(), ln_v=math.log(c.vocab_size)))
    return rows


def row_maker(lang: str):
    """row(step, tensor, symbolic, meaning=step, **values): a Row named and explained in
    the report's language, with the values, and the names of the pieces and steps from
    inspection/words.json, filled into both."""
    words, names = explain_words(lang), {**piece_words(lang)["steps"], **piece_words(lang)["pieces"]}

    def row(step: str, tensor, symbolic: str, meaning: str | None = None, **values) -> Row:
        values = {**names, **values}
        return Row(words["steps"][step].format(**values), tuple(first(tensor).shape), symbolic,
                   words[meaning or step].format(**values))
    return row


def norm_name(c) -> str:
    return {"layernorm": "LayerNorm", "rmsnorm": "RMSNorm"}[c.norm]


def block_rows(model: GPT, rec: Recorder, layer, row) -> list[Row]:
    """Block 0 (its LayerTrace is `layer`), in the order its steps run: pre-LN normalises
    before each sub-layer, post-LN after each residual. The attention rows carry the real
    values: the scores' spread before and after the scaling, the masked keys, the softmax
    rows' sums."""
    c, d_k = model.config, model.config.head_size
    b = "transformer.h.0"
    pre = c.norm_position == "pre"
    position = "pre" if pre else "post"
    norm = [row(f"{ln}_{position}", getattr(layer, ln), "[B, T, C]", c.norm, norm=norm_name(c)) for ln in ("ln_1", "ln_2")]
    keys = layer.k.repeat_interleave(c.n_head // c.n_kv_head, dim=1)  # [B, H, T, d_k]: each group's shared keys
    scores = (layer.q @ keys.transpose(-2, -1)).float()  # [B, H, T, T], as step 1 computes them
    B, T = layer.q.shape[0], layer.q.shape[-2]
    sums = layer.weights.float().sum(-1)  # [B, H, T]
    gqa, own = c.n_kv_head != c.n_head, c.head_dim is not None  # (own: heads of their own size, not C / H)
    attention = [row("c_attn", rec.outputs[f"{b}.attn.c_attn"], "[B, T, QKV]" if gqa or own else "[B, T, 3C]"),
                 row("split_gqa", layer.v, "[B, H_kv, T, d_k]", H=c.n_head, H_kv=c.n_kv_head, group=c.n_head // c.n_kv_head)
                 if gqa else row("split", layer.v, "[B, H, T, d_k]", "split_own" if own else "split", H=c.n_head, d_k=d_k,
                                 width=c.heads_width)]
    if c.qk_norm:
        attention.append(row("qk_norm", rec.outputs[f"{b}.attn.q_norm"], "[B, H, T, d_k]"))
    if c.pos_encoding == "rope":
        attention.append(row("rotate", layer.q, "[B, H, T, d_k]"))
    attention += [
        row("similarity", layer.weights, "[B, H, T, T]", std=scores.std().item()),
        row("scale", layer.weights, "[B, H, T, T]", d_k=d_k, scale_factor=1 / math.sqrt(d_k), std=scores.std().item(),
            scaled=scores.std().item() / math.sqrt(d_k)),
        row("mask", layer.weights, "[B, H, T, T]", n=B * c.n_head * T * (T - 1) // 2),
        row("softmax", layer.weights, "[B, H, T, T]", low=sums.min().item(), high=sums.max().item()),
        row("dropout" if c.dropout else "no_dropout", layer.weights, "[B, H, T, T]", p=c.dropout),
        row("weighted_sum", layer.heads, "[B, H, T, d_k]"),
        row("merge", rec.inputs[f"{b}.attn.c_proj"], "[B, T, H·d_k]" if own else "[B, T, C]"),
        row("c_proj", layer.attn, "[B, T, C]"),
        row("residual_attention", layer.residual_in + layer.attn, "[B, T, C]", "residual"),
    ]
    feed_forward = [
        *([row("c_gate", rec.outputs[f"{b}.mlp.c_gate"], "[B, T, F]", F=c.ffn_hidden),
           row("c_up", rec.outputs[f"{b}.mlp.c_fc"], "[B, T, F]", F=c.ffn_hidden)] if c.mlp == "swiglu" else
          [row("c_fc", rec.outputs[f"{b}.mlp.c_fc"], "[B, T, F]", F=c.ffn_hidden)]),
        row("activation", layer.mlp_hidden, "[B, T, F]",
            name="SiLU(gate) ⊙ up" if c.mlp == "swiglu" else c.activation.replace("_", " ").upper()),
        row("mlp_proj", layer.mlp, "[B, T, C]"),
        row("residual_mlp", layer.residual_out if pre else layer.ln_1 + layer.mlp, "[B, T, C]", "residual"),
    ]
    if pre:
        return [norm[0], *attention, norm[1], *feed_forward]
    return [*attention, norm[0], *feed_forward, norm[1]]


def symbolic_sizes(model: GPT, idx: torch.Tensor) -> dict[str, int]:
    c = model.config
    B, T = idx.shape
    return {"B": B, "T": T, "C": c.n_embd, "H": c.n_head, "d_k": c.head_size, "V": c.vocab_size,
            "H_kv": c.n_kv_head, "F": c.ffn_hidden, "3C": 3 * c.n_embd, "QKV": c.heads_width + 2 * c.n_kv_head * c.head_size, "H·d_k": c.heads_width}


def parameter_groups(model: GPT, lang: str = "en") -> list[tuple[str, int]]:
    """Parameters per component; the tied embedding / LM head counted once."""
    def count(module: torch.nn.Module) -> int:
        return sum(p.numel() for p in module.parameters())

    c, names = model.config, explain_words(lang)["groups"]
    block = model.transformer.h[0]
    groups = [(names["wte" if c.tie_embeddings else "wte_untied"], count(model.transformer.wte))]
    if not c.tie_embeddings:
        groups.append((names["lm_head"], count(model.lm_head)))
    if c.pos_encoding == "learned":
        groups.append((names["wpe"], count(model.transformer.wpe)))
    groups += [
        (names["attention"].format(n=c.n_layer), c.n_layer * count(block.attn)),
        (names["mlp"].format(n=c.n_layer), c.n_layer * count(block.mlp)),
        (names["norms"].format(n=c.n_layer),
         c.n_layer * (count(block.ln_1) + count(block.ln_2)) + count(model.transformer.ln_f)),
    ]
    groups.append((names["total"], model.num_parameters()))
    return groups


def width(text: str) -> int:
    """Columns text takes on a terminal: Chinese characters take two."""
    return sum(2 if unicodedata.east_asian_width(ch) in "WF" else 1 for ch in text)


def pad(text: str, columns: int) -> str:
    return text + " " * (columns - width(text))


def aligned(rows: list[Row], header: tuple[str, ...]) -> list[str]:
    """The rows as text columns under the header, each as wide as its widest cell."""
    widths = [max(width(r.step) for r in rows), max(len(str(list(r.shape))) for r in rows),
              max(len(r.symbolic) for r in rows)]
    lines = ["  ".join(pad(h, w) for h, w in zip(header, widths)) + "  " + header[3],
             "  ".join("-" * w for w in widths) + "  -------"]
    lines += [f"{pad(r.step, widths[0])}  {str(list(r.shape)).ljust(widths[1])}  "
              f"{r.symbolic.ljust(widths[2])}  {r.meaning}" for r in rows]
    return lines


def report(model: GPT, idx: torch.Tensor, targets: torch.Tensor, dtype: torch.dtype, lang: str = "en") -> str:
    """The trace table, then parameters, FLOPs and memory, as plain text."""
    c, words = model.config, explain_words(lang)
    B, T = idx.shape
    rows = trace(model, idx, targets, lang)
    sizes = ", ".join(f"{k}={v}" for k, v in symbolic_sizes(model, idx).items() if k not in ("3C", "QKV", "H·d_k") and (k != "H_kv" or v != model.config.n_head)
                      and (k != "F" or model.config.mlp == "swiglu"))
    lines = [words["title"].format(sizes=sizes), "", *aligned(rows, words["header"]), "", words["parameters"]]
    lines += [f"  {pad(name, 48)} {n:>12,}" for name, n in parameter_groups(model, lang)]
    nbytes, name = torch.tensor([], dtype=dtype).element_size(), str(dtype)[6:]
    kv_width = c.n_kv_head * c.head_size  # what the cache holds of a key (and of a value): H_kv·d_k = C without GQA
    per_token = 2 * c.n_layer * kv_width
    paths = [model]
    if c.attn_impl != "explicit":  # the five steps, for comparison
        paths.append(GPT(dataclasses.replace(c, attn_impl="explicit")))
        paths[-1].load_state_dict(model.state_dict())
    kept = [words["memory_path"].format(impl=m.config.attn_impl, total=total / 2**20, square=square / 2**20)
            for m in paths for total, square in [saved_for_backward(m, idx, targets, dtype)]]
    lines += ["", words["flops"].format(T=T, forward=model.flops_per_token(T, training=False) / 1e6,
                                        train=model.flops_per_token(T) / 1e6),
              words["memory"].format(device=idx.device.type.upper(), dtype=name, paths=words["and"].join(kept),
                                     L=c.n_layer, n=B * c.n_head * T * T),
              words["cache"].format(L=c.n_layer, C=kv_width, n=per_token, kib=per_token * nbytes / 1024, dtype=name,
                                    mib=per_token * nbytes * c.block_size / 2**20, T=c.block_size)]
    if c.attn_impl == "sdpa":
        lines.append(words["sdpa"])
    return "\n".join(lines)


def saved_for_backward(model: GPT, idx: torch.Tensor, targets: torch.Tensor, dtype: torch.dtype) -> tuple[int, int]:
    """Bytes autograd keeps for the backward pass of one training forward, measured with
    saved_tensors_hooks (which sees every saved tensor): (all, of the tensors shaped like
    the attention weights, [B, H, T, T]). Each storage is counted once; parameters are
    left out."""
    B, T = idx.shape
    parameters = {p.untyped_storage().data_ptr() for p in model.parameters()}
    kept: dict[int, tuple[int, bool]] = {}  # storage -> (bytes, holds attention weights)

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in parameters:
            # [B, H, T, T], or [B·H, T, T] as batched matmuls save it (with H = 1 a [B, T, C]
            # activation with C = T would look the same)
            weights = t.dim() >= 3 and tuple(t.shape[-2:]) == (T, T) and math.prod(t.shape[:-2]) == B * model.config.n_head
            _, seen = kept.get(storage.data_ptr(), (0, False))
            kept[storage.data_ptr()] = (storage.nbytes(), seen or weights)
        return t

    with in_mode(model, training=True), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), \
            autocast(idx.device, dtype):
        model(idx, targets)
    return sum(n for n, _ in kept.values()), sum(n for n, weights in kept.values() if weights)
