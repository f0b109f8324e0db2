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

from common.device import autocast
from model import GPT, in_mode

from .words import words as piece_words

# Each step's name and meaning, and the report's other words, in each language. The
# Chinese follows the glossary of docs/attention.zh-CN.md (注意力权重, 块, 缩放, 掩码).
WORDS = {
    "en": {
        "steps": {
            "wte": "{token_embedding} (wte)", "rotary": "{positional_encoding} (rope)",
            "wpe": "{positional_encoding} ({kind})", "add_position": "embedding + position",
            "ln_1_pre": "{norm} (before attention)", "ln_2_pre": "{norm} (before feed-forward)",
            "ln_1_post": "{norm} (after attention + residual)", "ln_2_post": "{norm} (after feed-forward + residual)",
            "c_attn": "Q, K, V projections (c_attn)", "split": "split into heads", "split_gqa": "split into heads (k, v: H_kv)",
            "rotate": "rotate q and k (rope)",
            "similarity": "1. {similarity} Q Kᵀ", "scale": "2. {scale} by 1/√d_k = 1/√{d_k} = {scale_factor:.3f}",
            "mask": "3. {causal_mask}", "softmax": "4. {softmax} over keys", "dropout": "   dropout (p = {p})",
            "no_dropout": "   dropout (p = 0: off)", "weighted_sum": "5. {weighted_sum}: weights × V",
            "merge": "merge heads", "c_proj": "output projection W_O (c_proj)",
            "residual_attention": "{residual}: x + {attention}", "c_fc": "{feed_forward}, layer 1 (W_1)",
            "c_gate": "{feed_forward}, the gate (W_gate)", "c_up": "{feed_forward}, layer 1 (W_up)",
            "activation": "{name}", "mlp_proj": "{feed_forward}, layer 2 (W_2)",
            "residual_mlp": "{residual}: x + {feed_forward}", "blocks": "blocks 1 … {last}: the same steps",
            "end": "end of the block", "ln_f": "final {norm} (ln_f)", "lm_head": "LM head (tied to wte)", "lm_head_untied": "LM head",
            "loss": "loss: cross-entropy",
        },
        "wte": "each token id becomes a C-dim vector", "wpe": "one vector per position, shared by the batch",
        "add_position": "order is now part of each vector",
        "rotary": "cos, sin of position × θ_i; rotate q and k in every layer",
        "layernorm": "each vector to mean 0, variance 1, then γ, β",
        "rmsnorm": "each vector divided by its root mean square, then γ",
        "c_attn": "X W_Q, X W_K, X W_V side by side", "split": "q, k, v each; C = H × d_k = {H} × {d_k}",
        "split_gqa": "q: {H} heads; k, v: {H_kv}, each shared by {group} query heads",
        "rotate": "position enters q·k only through the offset m − n",
        "similarity": "one score per (query, key) pair; std {std:.3f}",
        "scale": "std {std:.3f} → {scaled:.3f}: no growth with d_k",
        "mask": "{n:,} future keys get −inf: weight 0",
        "softmax": "positive weights; row sums {low:.6f} … {high:.6f}",
        "dropout": "training only: zero some weights", "no_dropout": "nothing dropped in this config",
        "weighted_sum": "each output mixes the values", "merge": "concatenate the H heads again",
        "c_proj": "mix the heads' results", "residual": "the sub-layer adds to x, never replaces it",
        "c_fc": "widen to F = {F}", "activation": "the non-linearity", "mlp_proj": "back to C",
        "c_gate": "widen to F = {F}: what SiLU turns into a gate", "c_up": "widen to F = {F}: what the gate scales",
        "blocks": "{n} blocks in all", "end": "the only block", "ln_f": "normalise before the head",
        "lm_head": "a score for every token of the vocabulary", "loss": "{loss:.4f} at init ≈ ln V = {ln_v:.4f}",
        "title": "One forward pass of this model on a batch of training data ({sizes}); shapes from hooks, "
                 "block 0 in full (steps 1–4 all have the weights' shape):",
        "header": ("step", "shape", "symbolic", "meaning"), "parameters": "Parameters:",
        "groups": {"wte": "token embedding wte (= LM head, tied)", "wte_untied": "token embedding wte",
                   "lm_head": "LM head (its own matrix)", "wpe": "position embedding wpe",
                   "attention": "attention W_Q, W_K, W_V, W_O × {n} blocks", "mlp": "feed-forward W_1, W_2 × {n} blocks",
                   "norms": "norms × {n} blocks, and the final one", "total": "total"},
        "flops": "FLOPs per token (context {T}): {forward:,.2f} M forward, {train:,.2f} M for a training "
                 "step (3 × forward)",
        "memory": "Kept for the backward pass, measured ({device}, {dtype}, one batch): {paths} ({L} layers; "
                  "a [B, H, T, T] tensor holds B·H·T² = {n:,} values)",
        "memory_path": "{impl} path {total:,.1f} MiB, of which [B, H, T, T] weights {square:,.1f} MiB", "and": "; ",
        "cache": "KV cache: 2 × {L} layers × {C} = {n:,} values per token = {kib:,.1f} KiB in {dtype}; "
                 "{mib:,.2f} MiB per sequence at block_size {T}",
        "sdpa": "This config uses attn_impl=sdpa: steps 1–5 run as one fused kernel; the trace used the "
                "explicit path, which computes the same.",
    },
    "zh": {
        "steps": {
            "wte": "{token_embedding}（wte）", "rotary": "{positional_encoding}（rope）", "wpe": "{positional_encoding}（{kind}）",
            "add_position": "词嵌入 + 位置", "ln_1_pre": "{norm}（注意力之前）", "ln_2_pre": "{norm}（前馈网络之前）",
            "ln_1_post": "{norm}（注意力 + 残差之后）", "ln_2_post": "{norm}（前馈网络 + 残差之后）",
            "c_attn": "Q、K、V 投影（c_attn）", "split": "拆分成多个头", "split_gqa": "拆分成多个头（k、v：H_kv 个）",
            "rotate": "旋转 q 和 k（rope）",
            "similarity": "1. {similarity} Q Kᵀ", "scale": "2. {scale}：乘以 1/√d_k = 1/√{d_k} = {scale_factor:.3f}",
            "mask": "3. {causal_mask}", "softmax": "4. 对 key 做 {softmax}", "dropout": "   dropout（p = {p}）",
            "no_dropout": "   dropout（p = 0，关闭）", "weighted_sum": "5. {weighted_sum}：{attention_weights} × V",
            "merge": "合并各个头", "c_proj": "输出投影 W_O（c_proj）", "residual_attention": "{residual}：x + {attention}",
            "c_fc": "{feed_forward}第 1 层（W_1）", "activation": "{name}", "mlp_proj": "{feed_forward}第 2 层（W_2）",
            "c_gate": "{feed_forward}的门（W_gate）", "c_up": "{feed_forward}第 1 层（W_up）",
            "residual_mlp": "{residual}：x + {feed_forward}", "blocks": "块 1 … {last}：步骤相同", "end": "块结束",
            "ln_f": "最后的 {norm}（ln_f）", "lm_head": "语言模型头（与 wte 共享权重）", "lm_head_untied": "语言模型头", "loss": "loss：交叉熵",
        },
        "wte": "每个 token id 变成一个 C 维向量", "wpe": "每个位置一个向量，整批共用",
        "add_position": "词序从此成为每个向量的一部分",
        "rotary": "位置 × θ_i 的 cos、sin；每一层都用它旋转 q 和 k",
        "layernorm": "把每个向量变成均值 0、方差 1，再乘 γ、加 β",
        "rmsnorm": "每个向量除以它的均方根，再乘 γ",
        "c_attn": "X W_Q、X W_K、X W_V 并排输出", "split": "q、k、v 各一份；C = H × d_k = {H} × {d_k}",
        "split_gqa": "q：{H} 个头；k、v：{H_kv} 个，每个由 {group} 个 query 头共用",
        "rotate": "位置只通过偏移 m − n 进入 q·k",
        "similarity": "每对（query, key）一个分数；标准差 {std:.3f}",
        "scale": "标准差 {std:.3f} → {scaled:.3f}：不再随 d_k 增大",
        "mask": "{n:,} 个未来的 key 得到 −inf，注意力权重为 0",
        "softmax": "注意力权重都是正数；每行之和在 {low:.6f} … {high:.6f} 之间",
        "dropout": "仅在训练时：随机置零部分注意力权重", "no_dropout": "本配置不做 dropout",
        "weighted_sum": "每个输出是 value 的加权混合", "merge": "把 H 个头重新拼接起来",
        "c_proj": "混合各个头的结果", "residual": "子层的结果加到 x 上，而不是取代 x",
        "c_fc": "扩展到 F = {F}", "activation": "非线性激活", "mlp_proj": "变回 C",
        "c_gate": "扩展到 F = {F}：经 SiLU 变成门", "c_up": "扩展到 F = {F}：被门缩放的部分",
        "blocks": "共 {n} 个块", "end": "唯一的一个块", "ln_f": "进入输出层之前先归一化",
        "lm_head": "为词表中的每个 token 打一个分数", "loss": "初始化时的 loss {loss:.4f} ≈ ln V = {ln_v:.4f}",
        "title": "本模型在一批训练数据上的一次前向传播（{sizes}）；形状取自钩子，完整展示块 0"
                 "（第 1–4 步的形状都与注意力权重相同）：",
        "header": ("步骤", "形状", "符号形状", "含义"), "parameters": "参数：",
        "groups": {"wte": "词嵌入 wte（= 语言模型头，共享）", "wte_untied": "词嵌入 wte",
                   "lm_head": "语言模型头（自己的矩阵）", "wpe": "位置嵌入 wpe",
                   "attention": "注意力 W_Q、W_K、W_V、W_O × {n} 个块", "mlp": "前馈网络 W_1、W_2 × {n} 个块",
                   "norms": "归一化层 × {n} 个块，外加最后一个", "total": "合计"},
        "flops": "每个 token 的 FLOPs（上下文 {T}）：前向 {forward:,.2f} M，一个训练步 {train:,.2f} M（前向的 3 倍）",
        "memory": "为反向传播保留的张量，实测（{device}，{dtype}，一个 batch）：{paths}（共 {L} 层；"
                  "一个 [B, H, T, T] 张量有 B·H·T² = {n:,} 个数）",
        "memory_path": "{impl} 路径共 {total:,.1f} MiB，其中形如 [B, H, T, T] 的注意力权重 {square:,.1f} MiB", "and": "；",
        "cache": "KV 缓存：2 × {L} 层 × {C} = 每个 token {n:,} 个数 = {kib:,.1f} KiB（{dtype}）；"
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
    words, names = WORDS[lang], {**piece_words(lang)["steps"], **piece_words(lang)["pieces"]}

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
    gqa = c.n_kv_head != c.n_head
    attention = [row("c_attn", rec.outputs[f"{b}.attn.c_attn"], "[B, T, QKV]" if gqa else "[B, T, 3C]"),
                 row("split_gqa", layer.v, "[B, H_kv, T, d_k]", H=c.n_head, H_kv=c.n_kv_head, group=c.n_head // c.n_kv_head)
                 if gqa else row("split", layer.v, "[B, H, T, d_k]", H=c.n_head, d_k=d_k)]
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
        row("merge", rec.inputs[f"{b}.attn.c_proj"], "[B, T, C]"),
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
            "H_kv": c.n_kv_head, "F": c.ffn_hidden, "3C": 3 * c.n_embd, "QKV": c.n_embd + 2 * c.n_kv_head * c.head_size}


def parameter_groups(model: GPT, lang: str = "en") -> list[tuple[str, int]]:
    """Parameters per component; the tied embedding / LM head counted once."""
    def count(module: torch.nn.Module) -> int:
        return sum(p.numel() for p in module.parameters())

    c, names = model.config, WORDS[lang]["groups"]
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
    c, words = model.config, WORDS[lang]
    B, T = idx.shape
    rows = trace(model, idx, targets, lang)
    sizes = ", ".join(f"{k}={v}" for k, v in symbolic_sizes(model, idx).items() if k not in ("3C", "QKV") and (k != "H_kv" or v != model.config.n_head)
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
