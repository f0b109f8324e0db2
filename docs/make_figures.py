"""The pictures of the code tour, as SVG (their words stay text), in English and Chinese:

    python docs/make_figures.py [--checkpoint out/tiny]

writes docs/images/{qkv,maps,causal,cache}{,.zh-CN}.svg (--out: elsewhere). The attention maps are the
model's own (model.trace): the model of --checkpoint (the quick start's run by
default) as trained, and the same model freshly initialised. The other pictures
draw the shapes of model/attention.py and model/gpt.py for small sizes, read from their modules.
"""

from __future__ import annotations

import argparse
import base64
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script from anywhere

import torch  # noqa: E402

from inspection.attention_maps import attention_maps, heatmap_grid, png_bytes  # noqa: E402
from inspection.words import words  # noqa: E402
from runs.folder import RunDir  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402
from model.attention import MultiHeadAttention  # noqa: E402
from data.tokenizer import tokenizer_kind  # noqa: E402

IMAGES = ROOT / "docs" / "images"
FONT = "font-family='DejaVu Sans, Noto Sans CJK SC, WenQuanYi Zen Hei, sans-serif'"
QKV_COLOURS = {"q": ("#d62828", "#f4a3a3", "#a61c1c", "#fbd5d5"), "k": ("#1f6fb2", "#9cc6ea"),
               "v": ("#2a9d3f", "#a6dcae")}

WORDS = {
    "en": {
        "qkv_title": "c_attn computes X W_Q, X W_K, X W_V side by side; split cuts them apart, view and transpose "
                     "split each into heads",
        "qkv_row": "c_attn(x): [B, T, C + 2·H_kv·d_k] = [B, T, {{width}}], one token's row (C = {{C}}, H = {{H}}, "
                   "H_kv = {{H_kv}}, d_k = {{d_k}})",
        "qkv_split": "split([C, H_kv·d_k, H_kv·d_k], dim=-1): q, k and v",
        "qkv_heads": "view(B, T, heads, d_k).transpose(1, 2): each split into its heads",
        "qkv_shared": "grouped-query attention: each key/value head serves {{group}} query heads (repeat_interleave)",
        "head": "{head} {{h}}", "maps_title": "Attention weights of layer 0 for the same {{T}} {{unit}}",
        "init": "at initialisation (weights of std 0.02)", "trained": "after the quick start's training",
        "maps_note": "Row i is query i, column j is key j. At init row i is nearly uniform over its i + 1 keys: "
                     "the first row is one bright cell, the last spreads thin, so each map fades from top to bottom.",
        "causal_title": "The {causal_mask} lined up with the targets y[t] = x[t+1]",
        "query": "{query} (input x[t])", "key": "{key}", "target": "target y[t]",
        "causal_note": "Grey cells are set to −∞ before the softmax: position t sees x[0..t] and must predict x[t+1].",
        "cache_title": "The KV cache with block_size = 6",
        "prefill": "prefill: the prompt in one pass", "step": "one new token per step",
        "slide": "full: the window slides; the whole window is run afresh",
        "slide_more": "and so at every step from then on",
        "cache_note": "Blue: keys and values read from the cache. Orange: the tokens run through the model in that step. "
                      "Grey: out of the window.",
    },
    "zh": {
        "qkv_title": "c_attn 并排算出 X W_Q、X W_K、X W_V；split 把它们切开，view 和 transpose 再把各自拆成多个头",
        "qkv_row": "c_attn(x)：[B, T, C + 2·H_kv·d_k] = [B, T, {{width}}]，一个 token 的那一行（C = {{C}}，H = {{H}}，"
                   "H_kv = {{H_kv}}，d_k = {{d_k}}）",
        "qkv_split": "split([C, H_kv·d_k, H_kv·d_k], dim=-1)：q、k、v",
        "qkv_heads": "view(B, T, 头数, d_k).transpose(1, 2)：各自拆成多个头",
        "qkv_shared": "分组查询注意力：每个 key/value 头由 {{group}} 个 query 头共用（repeat_interleave）",
        "head": "{head} {{h}}", "maps_title": "同样 {{T}} 个{{unit}}上，层 0 的{attention_weights}",
        "init": "初始化时（权重标准差 0.02）", "trained": "快速开始训练之后",
        "maps_note": "第 i 行是 query i，第 j 列是 key j。初始化时，第 i 行在它的 i + 1 个 key 上几乎均匀："
                     "第一行只有一个亮格，最后一行分得很散，所以每张图从上到下逐渐变暗。",
        "causal_title": "{causal_mask}与目标 y[t] = x[t+1] 对齐",
        "query": "{query}（输入 x[t]）", "key": "{key}", "target": "目标 y[t]",
        "causal_note": "灰色的格子在 softmax 之前被设为 −∞：位置 t 只看到 x[0..t]，要预测 x[t+1]。",
        "cache_title": "block_size = 6 时的 KV 缓存",
        "prefill": "预填充：提示词一次送入", "step": "每一步一个新 token",
        "slide": "满了：窗口向后滑动，整个窗口重新计算",
        "slide_more": "此后每一步都是这样",
        "cache_note": "蓝色：从缓存里读出的 key 和 value。橙色：这一步送进模型计算的 token。灰色：已经在窗口之外。",
    },
}

# the pieces' names come from the table --explain and the explorer read (inspection/words.json)
WORDS = {lang: {key: text.format(**words(lang)["pieces"]) for key, text in table.items()} for lang, table in WORDS.items()}
UNITS = {"en": {"char": "characters", "bpe": "tokens"}, "zh": {"char": "字符", "bpe": " token "}}  # by tokenizer kind


class Svg:
    """A few shapes and text, written as SVG."""

    def __init__(self, width: int, height: int):
        self.width, self.height, self.parts = width, height, []

    def rect(self, x, y, w, h, fill, stroke="#ffffff") -> None:
        self.parts.append(f"<rect x='{x}' y='{y}' width='{w}' height='{h}' fill='{fill}' stroke='{stroke}'/>")

    def text(self, x, y, words: str, size=13, anchor="start", weight="normal", fill="#1d1d1f") -> None:
        escaped = words.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
        self.parts.append(f"<text x='{x}' y='{y}' font-size='{size}' text-anchor='{anchor}' "
                          f"font-weight='{weight}' fill='{fill}' {FONT}>{escaped}</text>")

    def arrow(self, x1, y1, x2, y2) -> None:
        self.parts.append(f"<line x1='{x1}' y1='{y1}' x2='{x2}' y2='{y2}' stroke='#5f6368' stroke-width='1.5' "
                          "marker-end='url(#arrow)'/>")

    def image(self, x, y, w, h, png: bytes) -> None:
        data = base64.b64encode(png).decode()
        self.parts.append(f"<image x='{x}' y='{y}' width='{w}' height='{h}' href='data:image/png;base64,{data}' "
                          "style='image-rendering: pixelated'/>")

    def svg(self) -> str:
        marker = ("<defs><marker id='arrow' markerWidth='8' markerHeight='8' refX='7' refY='4' orient='auto'>"
                  "<path d='M0,0 L8,4 L0,8 z' fill='#5f6368'/></marker></defs>")
        return (f"<svg xmlns='http://www.w3.org/2000/svg' width='{self.width}' height='{self.height}' "
                f"viewBox='0 0 {self.width} {self.height}'><rect width='100%' height='100%' fill='white'/>"
                + marker + "".join(self.parts) + "</svg>\n")


def qkv_figure(w: dict) -> str:
    """c_attn's output columns, coloured by q/k/v and by head, then split into q, k and v and
    each into heads; the widths are those of model/attention.py's own layer for small sizes."""
    attn = MultiHeadAttention(GPTConfig(n_embd=8, n_head=4, n_kv_head=2, block_size=4, vocab_size=4), layer=0)
    C, H, H_kv, d_k = attn.c_attn.in_features, attn.n_head, attn.n_kv_head, attn.d_k
    widths = {"q": H * d_k, "k": H_kv * d_k, "v": H_kv * d_k}
    assert attn.c_attn.out_features == sum(widths.values())  # C + 2·H_kv·d_k
    heads = {"q": H, "k": H_kv, "v": H_kv}
    cell = 26
    gap = 18
    svg = Svg(760, 400)
    for i, line in enumerate(wrap(w["qkv_title"], 80 if w is WORDS["en"] else 40)):
        svg.text(20, 24 + i * 18, line, 14, weight="bold")
    svg.text(20, 62, w["qkv_row"].format(C=C, H=H, H_kv=H_kv, d_k=d_k, width=attn.c_attn.out_features))
    column = 0
    for part in "qkv":  # one token's row of c_attn's output
        for i in range(widths[part]):
            head = i // d_k
            svg.rect(20 + column * cell, 72, cell, cell, QKV_COLOURS[part][head])
            svg.text(20 + column * cell + cell / 2, 90, str(i % d_k), 10, "middle",
                     fill="white" if head % 2 == 0 else "#1d1d1f")  # (the dark shades: 0 and 2)
            column += 1
    svg.arrow(220, 102, 220, 126)
    svg.text(20, 144, w["qkv_split"])
    x = 20
    starts = {}
    for part in "qkv":  # split: three pieces
        starts[part] = x
        for i in range(widths[part]):
            svg.rect(x + i * cell, 154, cell, cell, QKV_COLOURS[part][i // d_k])
        svg.text(x + widths[part] * cell / 2, 196, f"{part}: [B, T, {widths[part]}]", 11, "middle")
        x += widths[part] * cell + gap
    svg.arrow(220, 206, 220, 230)
    svg.text(20, 248, w["qkv_heads"])
    x0 = 20
    for part in "qkv":  # view + transpose: each piece split into its heads
        shape = "[B, H, T, d_k]" if part == "q" else "[B, H_kv, T, d_k]"
        svg.text(x0, 274, f"{part}: {shape}", 12, weight="bold", fill=QKV_COLOURS[part][0])
        for head in range(heads[part]):
            for t in range(3):  # a few tokens of each head, stacked
                svg.rect(x0 + head * 62 + t * 5, 284 + t * 5, d_k * 22, 24, QKV_COLOURS[part][head], "#5f6368")
            svg.text(x0 + head * 62 + 26, 334, w["head"].format(h=head), 11, "middle")
        x0 += heads[part] * 62 + 40
    svg.text(20, 366, w["qkv_shared"].format(group=H // H_kv))
    return svg.svg()


def maps_figure(w: dict, fresh: torch.Tensor, trained: torch.Tensor, T: int, unit: str) -> str:
    """Layer 0's heads, at init and after training: [2, H, T, T] weights as PNG cells; unit:
    what the T tokens are (UNITS: characters, for a char tokenizer)."""
    H = fresh.shape[0]
    size = 150
    svg = Svg(40 + H * (size + 16), 120 + 2 * (size + 46))
    svg.text(20, 26, w["maps_title"].format(T=T, unit=unit), 15, weight="bold")
    for row, (label, maps) in enumerate(((w["init"], fresh), (w["trained"], trained))):
        top = 50 + row * (size + 46)
        svg.text(20, top + 4, label, 13)
        for head in range(H):
            x = 20 + head * (size + 16)
            svg.image(x, top + 14, size, size, png_bytes(heatmap_grid(maps[head][None, None], gap=0)))
            svg.text(x + size / 2, top + size + 30, w["head"].format(h=head), 11, "middle")
    note_top = 50 + 2 * (size + 46) + 6
    for i, line in enumerate(wrap(w["maps_note"], 105 if w is WORDS["en"] else 52)):
        svg.text(20, note_top + i * 18, line, 12, fill="#5f6368")
    return svg.svg()


def causal_figure(w: dict) -> str:
    """The tutorial's 今天 / 天气 / 很 / 好 with the causal mask and the shifted targets."""
    tokens = ["今天", "天气", "很", "好", "。"]
    cell = 58
    x, y = tokens[:4], tokens[1:]
    svg = Svg(640, 420)
    svg.text(20, 26, w["causal_title"], 15, weight="bold")
    left = 150
    top = 90
    svg.text(left + 2 * cell, top - 30, w["key"], 13, "middle")
    svg.text(20, top - 8, w["query"], 12)
    svg.text(left + 4 * cell + 60, top - 8, w["target"], 12)
    for j, token in enumerate(x):
        svg.text(left + j * cell + cell / 2, top - 8, f"{token} ({j})", 12, "middle")
    for t, token in enumerate(x):
        svg.text(left - 10, top + t * cell + cell / 2 + 5, f"x[{t}] = {token}", 13, "end")
        for j in range(len(x)):
            allowed = j <= t
            svg.rect(left + j * cell, top + t * cell, cell, cell, "#3b528b" if allowed else "#cdcdcd")
            svg.text(left + j * cell + cell / 2, top + t * cell + cell / 2 + 5, "✓" if allowed else "−∞", 14,
                     "middle", fill="white" if allowed else "#5f6368")
        svg.arrow(left + 4 * cell + 8, top + t * cell + cell / 2, left + 4 * cell + 52, top + t * cell + cell / 2)
        svg.text(left + 4 * cell + 60, top + t * cell + cell / 2 + 5, f"y[{t}] = {y[t]}", 13, weight="bold")
    for i, line in enumerate(wrap(w["causal_note"], 80 if w is WORDS["en"] else 40)):
        svg.text(20, top + 4 * cell + 40 + i * 18, line, 12, fill="#5f6368")
    return svg.svg()


def cache_figure(w: dict) -> str:
    """GPT.generate_tokens with block_size 6 and a 3-token prompt: each row is one step,
    the tokens t0, t1, ... the model has seen so far; orange ones run through the model."""
    block = 6
    cell = 34
    rows = [(3, 0, "prefill"), (4, 3, "step"), (5, 4, None), (6, 5, None), (7, 1, "slide"), (8, 2, "slide_more")]
    svg = Svg(720, 90 + len(rows) * (cell + 14) + 40)
    svg.text(20, 26, w["cache_title"], 15, weight="bold")
    for r, (n, first_run, label) in enumerate(rows):
        top = 50 + r * (cell + 14)
        start = max(0, n - block)  # the window the model sees: t[start:n]
        for i in range(n):
            colour = "#eeeeee" if i < start else "#6a9bd1" if i < first_run else "#f3a33a"
            svg.rect(20 + i * cell, top, cell - 2, cell - 2, colour, "#ffffff" if i < start else "#5f6368")
            svg.text(20 + i * cell + cell / 2, top + cell / 2 + 4, f"t{i}", 11, "middle")
        if label:
            svg.text(20 + 9 * cell, top + cell / 2 + 4, w[label], 12)
    note_top = 50 + len(rows) * (cell + 14) + 10
    for i, line in enumerate(wrap(w["cache_note"], 100 if w is WORDS["en"] else 50)):
        svg.text(20, note_top + i * 18, line, 12, fill="#5f6368")
    return svg.svg()


def wrap(text: str, width: int) -> list[str]:
    """Lines of at most `width` characters, broken at spaces (or anywhere in Chinese)."""
    lines, line = [], ""
    for word in (text.split(" ") if " " in text else list(text)):
        joined = f"{line} {word}" if line and " " in text else line + word
        if len(joined) > width and line:
            lines.append(line)
            joined = word
        line = joined
    return [*lines, line]


def attention_of(model: GPT, ids: torch.Tensor) -> torch.Tensor:
    return attention_maps(model.eval(), ids)[0]  # layer 0: [H, T, T]


def score_spreads(model: GPT, ids: torch.Tensor) -> list[dict]:
    """Per layer, the standard deviations docs/attention.md quotes ("Why scale"): of q and k,
    and of the scores q·k each query may see (the causal pairs), before and after 1/√d_k."""
    with torch.no_grad():
        trace = model.eval().trace(ids)
    spreads = []
    for layer in trace.layers:
        q = layer.q[0]  # [H, T, d_k]
        k = layer.k[0].repeat_interleave(q.size(0) // layer.k.size(1), dim=0)  # [H, T, d_k]: a key head per query head
        scores = q @ k.transpose(-2, -1)  # [H, T, T]
        seen = scores[:, torch.ones(q.size(1), q.size(1), dtype=torch.bool).tril()]  # [H, pairs]
        spreads.append({"q": q.std().item(), "k": k.std().item(), "scores": seen.std().item(),
                        "scaled": (seen / q.size(-1) ** 0.5).std().item()})
    return spreads


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", type=Path, default=ROOT / "out" / "tiny", help="a trained tiny.yaml run")
    p.add_argument("--out", type=Path, default=IMAGES, help=f"folder for the SVG files (default {IMAGES})")
    args = p.parse_args(argv)
    trained, tokenizer = RunDir(args.checkpoint).load_model()
    torch.manual_seed(0)
    fresh = GPT(trained.config)  # the same model, as initialised
    text = "ROMEO:\nBut soft, what light through"
    ids = torch.tensor([tokenizer.encode(text).ids])
    maps = attention_of(fresh, ids), attention_of(trained, ids)
    args.out.mkdir(parents=True, exist_ok=True)
    for lang, words in WORDS.items():
        suffix = "" if lang == "en" else ".zh-CN"
        figures = {"qkv": qkv_figure(words), "maps": maps_figure(words, *maps, ids.size(1), UNITS[lang][tokenizer_kind(tokenizer)]),
                   "causal": causal_figure(words), "cache": cache_figure(words)}
        for name, svg in figures.items():
            (args.out / f"{name}{suffix}.svg").write_text(svg, encoding="utf-8")
            print(f"wrote {args.out / f'{name}{suffix}.svg'}")
    for layer, spread in enumerate(score_spreads(trained, ids)):  # (quoted in docs/attention.md, "Why scale")
        print(f"layer {layer}: q std {spread['q']:.2f}, k std {spread['k']:.2f}, scores std {spread['scores']:.2f} "
              f"before 1/√d_k and {spread['scaled']:.2f} after, on {ids.size(1)} tokens of {text!r}")


if __name__ == "__main__":
    main()
