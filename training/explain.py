"""`train.py --explain`: one forward pass of the real model on a real batch, traced.

Forward hooks on every module record what each one received and returned; the two
functions the attention layer calls, `apply_rotary` and `scaled_dot_product_attention`,
are wrapped for the pass to record their arguments and results (q, k, v split into
heads, the weights, the output). Every printed shape is the shape of a tensor the model
produced, found by where it was produced, not by which torch operations computed it: a
step of the attention function can be rewritten without losing its row. Steps 1 to 4
all give tensors of the weights' shape [B, H, T, S]. The expected symbolic shape sits
beside each; the tests check that both agree for every positional encoding and norm
position. The words are in English or Chinese (`--lang`), from one table.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

import model.attention as attention_module
from model import GPT

from .config import RunConfig
from .distributed import Distributed

WRAPPED = ("apply_rotary", "scaled_dot_product_attention")  # functions of model/attention.py

# What each step means, and the report's other words, in each language.
WORDS = {
    "en": {
        "wte": "each token id becomes a C-dim vector", "wpe": "one vector per position, shared by the batch",
        "add_position": "order is now part of each vector",
        "rotary": "cos, sin of position × θ_i; rotate q and k in every layer",
        "layernorm": "each vector to mean 0, variance 1, then γ, β",
        "rmsnorm": "each vector divided by its root mean square, then γ",
        "c_attn": "X W_Q, X W_K, X W_V side by side", "split": "q, k, v each; C = H × d_k = {H} × {d_k}",
        "rotate": "position enters q·k only through the offset m − n",
        "similarity": "one score per (query, key) pair", "scale": "keeps the scores' variance near 1",
        "mask": "future keys get −inf: weight 0", "softmax": "each row: positive weights summing to 1",
        "dropout": "training only: zero some weights", "no_dropout": "nothing dropped in this config",
        "weighted_sum": "each output mixes the values", "merge": "concatenate the H heads again",
        "c_proj": "mix the heads' results", "residual": "the sub-layer adds to x, never replaces it",
        "c_fc": "widen to 4 × C", "activation": "the non-linearity", "mlp_proj": "back to C",
        "blocks": "{n} blocks in all", "ln_f": "normalise before the head",
        "lm_head": "a score for every token of the vocabulary", "loss": "{loss:.4f} ≈ ln V = {ln_v:.4f} at init",
        "title": "One forward pass of this model on a batch of training data ({sizes}); shapes from hooks, "
                 "block 0 in full (steps 1–4 all have the weights' shape):",
        "header": ("step", "shape", "symbolic", "meaning"), "parameters": "Parameters:",
        "flops": "FLOPs per token (context {T}): {forward:,.2f} M forward, {train:,.2f} M for a training "
                 "step (3 × forward)",
        "scores": "Attention scores [B, H, T, T] = {B}×{H}×{T}×{T} = {n:,} values = {mib:,.1f} MiB per layer "
                  "in {dtype} (× {L} layers kept for the backward pass; grows with T²)",
        "cache": "KV cache: 2 × {L} layers × {C} = {n:,} values per token = {kib:,.1f} KiB in {dtype}; "
                 "{mib:,.2f} MiB per sequence at block_size {T}",
        "sdpa": "This config uses attn_impl=sdpa: steps 1–5 run as one fused kernel; the trace used the "
                "explicit path, which computes the same.",
    },
    "zh": {
        "wte": "每个 token id 变成一个 C 维向量", "wpe": "每个位置一个向量，整批共用",
        "add_position": "词序从此成为每个向量的一部分",
        "rotary": "位置 × θ_i 的 cos、sin；每一层都用它旋转 q 和 k",
        "layernorm": "把每个向量变成均值 0、方差 1，再乘 γ、加 β",
        "rmsnorm": "每个向量除以它的均方根，再乘 γ",
        "c_attn": "X W_Q、X W_K、X W_V 并排输出", "split": "q、k、v 各一份；C = H × d_k = {H} × {d_k}",
        "rotate": "位置只通过偏移 m − n 进入 q·k",
        "similarity": "每对（query, key）一个分数", "scale": "让分数的方差保持在 1 附近",
        "mask": "未来的 key 得到 −inf，权重为 0", "softmax": "每一行：正的权重，和为 1",
        "dropout": "仅在训练时：随机置零部分权重", "no_dropout": "本配置不做 dropout",
        "weighted_sum": "每个输出是 value 的加权混合", "merge": "把 H 个头重新拼接起来",
        "c_proj": "混合各个头的结果", "residual": "子层的结果加到 x 上，而不是取代 x",
        "c_fc": "放宽到 4 × C", "activation": "非线性激活", "mlp_proj": "变回 C",
        "blocks": "共 {n} 个 block", "ln_f": "进入输出层之前先归一化",
        "lm_head": "为词表中的每个 token 打一个分数", "loss": "{loss:.4f} ≈ 初始化时的 ln V = {ln_v:.4f}",
        "title": "本模型在一批训练数据上的一次前向传播（{sizes}）；形状取自钩子，完整展示 block 0"
                 "（第 1–4 步的形状都与权重相同）：",
        "header": ("步骤", "形状", "符号形状", "含义"), "parameters": "参数：",
        "flops": "每个 token 的 FLOPs（上下文 {T}）：前向 {forward:,.2f} M，一个训练步 {train:,.2f} M（前向的 3 倍）",
        "scores": "注意力分数 [B, H, T, T] = {B}×{H}×{T}×{T} = {n:,} 个数 = 每层 {mib:,.1f} MiB（{dtype}；"
                  "{L} 层都要为反向传播保留；随 T² 增长）",
        "cache": "KV cache：2 × {L} 层 × {C} = 每个 token {n:,} 个数 = {kib:,.1f} KiB（{dtype}）；"
                 "block_size {T} 时每条序列 {mib:,.2f} MiB",
        "sdpa": "本配置使用 attn_impl=sdpa：第 1–5 步由一个融合算子完成；追踪走的是显式路径，两者计算结果相同。",
    },
}


@dataclass
class Row:
    step: str
    shape: tuple[int, ...]  # from the traced tensor
    symbolic: str  # e.g. "[B, H, T, T]"
    meaning: str


class Recorder:
    """For one forward pass: the first input and the output of every module (by its
    name), and the arguments and result of the first call of each wrapped function."""

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.inputs: dict[str, object] = {}
        self.outputs: dict[str, object] = {}
        self.calls: dict[str, tuple[tuple, object]] = {}

    def __enter__(self) -> "Recorder":
        self.handles = []
        for name, module in self.model.named_modules():
            self.handles.append(module.register_forward_hook(
                lambda m, args, out, name=name: self._module(name, args, out)))
        self.originals = {name: getattr(attention_module, name) for name in WRAPPED}
        for name, function in self.originals.items():
            setattr(attention_module, name, self._wrap(name, function))
        return self

    def __exit__(self, *exc) -> None:
        for handle in self.handles:
            handle.remove()
        for name, function in self.originals.items():
            setattr(attention_module, name, function)

    def _module(self, name: str, args: tuple, out) -> None:
        self.inputs.setdefault(name, args[0] if args else None)
        self.outputs.setdefault(name, out)

    def _wrap(self, name: str, function):
        def recording(*args, **kwargs):
            result = function(*args, **kwargs)
            self.calls.setdefault(name, (args, result))
            return result
        return recording


def first(value) -> torch.Tensor:
    return value[0] if isinstance(value, tuple) else value


def trace(model: GPT, idx: torch.Tensor, targets: torch.Tensor, lang: str = "en") -> list[Row]:
    """Run model(idx, targets) once in training mode (dropout on, no gradients) and
    return the steps of the embedding, the first block, and the head, in order."""
    c, words = model.config, WORDS[lang]
    was_training = model.training
    model.train()
    try:
        with torch.no_grad(), Recorder(model) as rec:
            _, loss, _ = model(idx, targets, return_attention=True)
    finally:
        model.train(was_training)
    rows: list[Row] = []

    def add(step: str, tensor, symbolic: str, meaning: str, **values) -> None:
        rows.append(Row(step, tuple(first(tensor).shape), symbolic, words[meaning].format(**values)))

    add("token embedding (wte)", rec.outputs["transformer.wte"], "[B, T, C]", "wte")
    if c.pos_encoding == "rope":
        add("positional encoding (rope)", rec.outputs["rotary"], "[1, 1, T, d_k]", "rotary")
    else:
        add(f"positional encoding ({c.pos_encoding})", rec.outputs["transformer.wpe"], "[1, T, C]", "wpe")
        add("embedding + position", rec.inputs["transformer.drop"], "[B, T, C]", "add_position")
    rows += block_rows(model, rec, words)
    last = f"transformer.h.{c.n_layer - 1}"
    add(f"blocks 1 … {c.n_layer - 1}: the same steps" if c.n_layer > 1 else "end of the block",
        rec.outputs[last], "[B, T, C]", "blocks", n=c.n_layer)
    if c.norm_position == "pre":
        add(f"final {norm_name(c)} (ln_f)", rec.outputs["transformer.ln_f"], "[B, T, C]", "ln_f")
    add("LM head (tied to wte)", rec.outputs["lm_head"], "[B, T, V]", "lm_head")
    add("loss: cross-entropy", loss, "[]", "loss", loss=loss.item(), ln_v=math.log(c.vocab_size))
    return rows


def norm_name(c) -> str:
    return {"layernorm": "LayerNorm", "rmsnorm": "RMSNorm"}[c.norm]


def block_rows(model: GPT, rec: Recorder, words: dict) -> list[Row]:
    """Block 0, in the order its steps run: pre-LN normalises before each sub-layer,
    post-LN after each residual."""
    c, d_k = model.config, model.config.head_size
    b = "transformer.h.0"

    def row(step, tensor, symbolic, meaning, **values) -> Row:
        return Row(step, tuple(first(tensor).shape), symbolic, words[meaning].format(**values))

    pre = c.norm_position == "pre"
    norm = [row(f"{norm_name(c)} ({'before' if pre else 'after'} {what})", rec.outputs[f"{b}.{ln}"], "[B, T, C]",
                c.norm) for ln, what in (("ln_1", "attention" if pre else "attention + residual"),
                                        ("ln_2", "feed-forward" if pre else "feed-forward + residual"))]
    (q, k, v, *_), (output, weights) = rec.calls["scaled_dot_product_attention"]
    attention = [row("Q, K, V projections (c_attn)", rec.outputs[f"{b}.attn.c_attn"], "[B, T, 3C]", "c_attn"),
                 row("split into heads", v, "[B, H, T, d_k]", "split", H=c.n_head, d_k=d_k)]
    if c.pos_encoding == "rope":
        attention.append(row("rotate q and k (rope)", rec.calls["apply_rotary"][1], "[2, B, H, T, d_k]", "rotate"))
    attention += [
        row("1. similarity Q Kᵀ", weights, "[B, H, T, T]", "similarity"),
        row(f"2. scale by 1/√d_k = 1/√{d_k} = {1 / math.sqrt(d_k):.3f}", weights, "[B, H, T, T]", "scale"),
        row("3. causal mask", weights, "[B, H, T, T]", "mask"),
        row("4. softmax over keys", weights, "[B, H, T, T]", "softmax"),
        row(f"   dropout (p = {c.dropout})" if c.dropout else "   dropout (p = 0: off)", weights, "[B, H, T, T]",
            "dropout" if c.dropout else "no_dropout"),
        row("5. weighted sum: weights × V", output, "[B, H, T, d_k]", "weighted_sum"),
        row("merge heads", rec.inputs[f"{b}.attn.c_proj"], "[B, T, C]", "merge"),
        row("output projection W_O (c_proj)", rec.outputs[f"{b}.attn.c_proj"], "[B, T, C]", "c_proj"),
        row("residual: x + attention", rec.inputs[f"{b}.ln_2" if pre else f"{b}.ln_1"], "[B, T, C]", "residual"),
    ]
    feed_forward = [
        row("feed-forward layer 1 (W_1)", rec.outputs[f"{b}.mlp.c_fc"], "[B, T, 4C]", "c_fc"),
        row(c.activation.replace("_", " ").upper(), rec.outputs[f"{b}.mlp.gelu"], "[B, T, 4C]", "activation"),
        row("feed-forward layer 2 (W_2)", rec.outputs[f"{b}.mlp.c_proj"], "[B, T, C]", "mlp_proj"),
        row("residual: x + feed-forward", rec.outputs[b] if pre else rec.inputs[f"{b}.ln_2"], "[B, T, C]",
            "residual"),
    ]
    if pre:
        return [norm[0], *attention, norm[1], *feed_forward]
    return [*attention, norm[0], *feed_forward, norm[1]]


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


def table(rows: list[Row], header: tuple[str, ...]) -> list[str]:
    widths = [max(len(r.step) for r in rows), max(len(str(list(r.shape))) for r in rows),
              max(len(r.symbolic) for r in rows)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths)) + "  " + header[3],
             "  ".join("-" * w for w in widths) + "  -------"]
    lines += [f"{r.step.ljust(widths[0])}  {str(list(r.shape)).ljust(widths[1])}  "
              f"{r.symbolic.ljust(widths[2])}  {r.meaning}" for r in rows]
    return lines


def report(model: GPT, idx: torch.Tensor, targets: torch.Tensor, dtype: torch.dtype, lang: str = "en") -> str:
    """The trace table, then parameters, FLOPs and memory, as plain text."""
    c, words = model.config, WORDS[lang]
    B, T = idx.shape
    rows = trace(model, idx, targets, lang)
    sizes = ", ".join(f"{k}={v}" for k, v in symbolic_sizes(model, idx).items() if k not in ("3C", "4C"))
    lines = [words["title"].format(sizes=sizes), "", *table(rows, words["header"]), "", words["parameters"]]
    lines += [f"  {name:<48} {n:>12,}" for name, n in parameter_groups(model)]
    nbytes, name = torch.tensor([], dtype=dtype).element_size(), str(dtype)[6:]
    per_token = 2 * c.n_layer * c.n_embd  # a key and a value of C numbers per layer
    scores = B * c.n_head * T * T
    lines += ["", words["flops"].format(T=T, forward=model.flops_per_token(T, training=False) / 1e6,
                                        train=model.flops_per_token(T) / 1e6),
              words["scores"].format(B=B, H=c.n_head, T=T, n=scores, mib=scores * nbytes / 2**20, dtype=name,
                                     L=c.n_layer),
              words["cache"].format(L=c.n_layer, C=c.n_embd, n=per_token, kib=per_token * nbytes / 1024, dtype=name,
                                    mib=per_token * nbytes * c.block_size / 2**20, T=c.block_size)]
    if c.attn_impl == "sdpa":
        lines.append(words["sdpa"])
    return "\n".join(lines)


def explain(cfg: RunConfig, dtype: torch.dtype, lang: str = "en", source=None) -> str:
    """The report for a run config's model (or train.init_from's: `source`) on one batch
    of its training data. Nothing is trained."""
    from data import fixed_batches

    from .trainer import load_data

    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    data, config = load_data(cfg, Distributed(), source)
    torch.manual_seed(cfg.train.seed)
    model = GPT(config)
    x, y = fixed_batches(data.train, config.block_size, cfg.train.batch_size, 1, cfg.train.seed, "train")[0]
    return report(model, x, y, dtype, lang)
