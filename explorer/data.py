"""A model and a prompt -> the explorer page's data, from the model's own forward pass.

Nothing here computes attention: `model(idx, return_attention=True)` hands back, for
every layer and head, q (rotated, with RoPE), k, v, the weights and the head's output,
and this module only rounds them and names them. The schema is in docs/explorer.md.
"""

from __future__ import annotations

import json

import torch

from inspection.attention_maps import VIRIDIS
from data.tokenizer import suppressed_ids
from model import GPT

SCHEMA_VERSION = 1
DIGITS = 7  # significant digits of every number: float32 carries about 7
TOP_TOKENS = 100  # the likeliest next tokens whose text the page can show
MAX_TOKENS = 64  # the prompt's tokens a page shows by default (the file grows with their square)


def rounded(t: torch.Tensor):
    """Nested lists of floats with DIGITS significant digits (JSON has no float32)."""
    if t.dim() == 0:
        return float(f"{t.item():.{DIGITS}g}")
    return [rounded(row) for row in t] if t.dim() > 1 else [float(f"{x:.{DIGITS}g}") for x in t.tolist()]


@torch.no_grad()
def page_data(model: GPT, tokenizer, ids: list[int], truncated: int = 0) -> dict:
    """Everything the page shows for the prompt `ids` (at most block_size tokens)."""
    was_training = model.training
    model.eval()
    try:
        idx = torch.tensor([ids], device=model.lm_head.weight.device)
        logits, _, trace = model(idx, return_attention=True)
    finally:
        model.train(was_training)
    layers = [{"heads": [head_data(trace, layer, head) for head in range(model.config.n_head)]}
              for layer in range(model.config.n_layer)]
    last = logits[0, -1].float().cpu()  # [vocab_size]
    top = last.topk(min(TOP_TOKENS, last.numel())).indices.tolist()
    suppressed = list(suppressed_ids(tokenizer))
    return {
        "version": SCHEMA_VERSION,
        "config": {**model.config.to_dict(), "head_size": model.config.head_size},
        "tokens": token_views(tokenizer, ids),
        "truncated": truncated,
        "layers": layers,
        "prediction": {"logits": rounded(last), "suppressed": suppressed,
                       "texts": {str(i): token_text(tokenizer, i) for i in sorted({*top, *suppressed})}},
        "colormap": VIRIDIS.tolist(),
    }


def head_data(trace, layer: int, head: int) -> dict:
    """One head's q, k, v [T, d_k], weights [T, T] and output [T, d_k] (batch row 0)."""
    data = {name: rounded(tensor[layer, 0, head].float().cpu()) for name, tensor in
            (("q", trace.q), ("k", trace.k), ("v", trace.v), ("weights", trace.weights), ("output", trace.heads))}
    # a key after its query was -inf before the softmax (the causal mask); JSON has no -inf
    data["weights"] = [[None if j > i else w for j, w in enumerate(row)] for i, row in enumerate(data["weights"])]
    return data


def to_json(data: dict) -> str:
    """Compact JSON that can sit inside <script type="application/json">: every "<" is
    written as \\u003c, so no text (a prompt holding "</script>") can close the tag."""
    return json.dumps(data, ensure_ascii=False, separators=(",", ":"), allow_nan=False).replace("<", "\\u003c")


# ---- tokens as text -----------------------------------------------------------------

def byte_alphabet() -> dict[str, int]:
    """Byte-level BPE writes each byte as a printable character (GPT-2's table): the
    printable bytes stand for themselves, the others move up to 256 and beyond, in order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in printable]
    return {chr(b): b for b in printable} | {chr(256 + n): b for n, b in enumerate(others)}


BYTES = byte_alphabet()


def token_bytes(tokenizer, token_id: int) -> bytes | None:
    """The bytes a byte-level BPE token stands for, or None for other tokens."""
    piece = tokenizer.id_to_token(token_id)
    if piece is None or not piece or any(ch not in BYTES for ch in piece) or not is_byte_level(tokenizer):
        return None
    return bytes(BYTES[ch] for ch in piece)


def is_byte_level(tokenizer) -> bool:
    decoder = json.loads(tokenizer.to_str()).get("decoder") or {}
    return decoder.get("type") == "ByteLevel"


def token_text(tokenizer, token_id: int) -> str:
    """What one token reads as on its own; bytes that are no whole character as ⟨e4 bd⟩."""
    raw = token_bytes(tokenizer, token_id)
    if raw is None:
        return tokenizer.id_to_token(token_id)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return f"⟨{raw.hex(' ')}⟩"


def token_views(tokenizer, ids: list[int]) -> list[dict]:
    """Each token's id and text. A byte-level BPE token whose bytes are not whole UTF-8
    characters also gets "bytes" (hex) and "joined": the characters its bytes help to
    make, decoded from the bytes of its neighbours too."""
    pieces = [token_bytes(tokenizer, i) for i in ids]
    if any(p is None for p in pieces):
        return [{"id": i, "text": tokenizer.id_to_token(i)} for i in ids]
    spans = char_spans(b"".join(pieces))
    views, start = [], 0
    for token_id, piece in zip(ids, pieces):
        end = start + len(piece)
        chars = [(a, b, ch) for a, b, ch in spans if a < end and b > start]
        whole = all(start <= a and b <= end for a, b, _ in chars)
        text = "".join(ch for _, _, ch in chars)
        views.append({"id": token_id, "text": text} if whole else
                     {"id": token_id, "text": f"⟨{piece.hex(' ')}⟩", "bytes": piece.hex(" "), "joined": text})
        start = end
    return views


def char_spans(data: bytes) -> list[tuple[int, int, str]]:
    """(start, end, character) for each UTF-8 character of data; a byte that starts no
    valid character is its own span, decoded as U+FFFD."""
    spans, i = [], 0
    while i < len(data):
        lead = data[i]
        size = 1 if lead < 0x80 else 2 if lead >> 5 == 0b110 else 3 if lead >> 4 == 0b1110 else 4 if lead >> 3 == 0b11110 else 1
        try:
            spans.append((i, i + size, data[i:i + size].decode("utf-8")))
        except UnicodeDecodeError:
            size = 1
            spans.append((i, i + 1, "\ufffd"))
        i += size
    return spans
