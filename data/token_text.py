"""What a token reads as. A byte-level BPE token stands for bytes, not characters: a
Chinese character or an emoji is often cut across two or three tokens, none of which is
text on its own. These turn token ids into text a page or a terminal can show, and say
which bytes a piece holds where it is no whole character.
"""

from __future__ import annotations

import json


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
