"""What a token reads as. A byte-level BPE token stands for bytes, not characters: a
Chinese character or an emoji is often cut across two or three tokens, none of which is
text on its own. These turn token ids into text a page or a terminal can show, by one rule
(explorer/page/tokenizer.js and view.js follow it): what cannot be shown as a character,
bytes that make no whole character and characters that draw nothing (control and
invisible format characters), is shown as its bytes in hex, ⟨e4 bd⟩, ⟨03⟩.
"""

from __future__ import annotations

import json
import unicodedata


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


def in_hex(data: bytes) -> str:
    """Bytes as the pages and terminals show them: ⟨e4 bd⟩."""
    return f"⟨{data.hex(' ')}⟩"


def draws_nothing(ch: str) -> bool:
    """A control character other than the newline and the tab (C0, DEL, C1), or an invisible
    format character (a zero-width space, a right-to-left override): drawn as its bytes."""
    return (ch < " " and ch not in "\n\t") or "\x7f" <= ch <= "\x9f" or unicodedata.category(ch) == "Cf"


def readable(text: str) -> str:
    """text with each character that draws nothing written as its UTF-8 bytes (⟨03⟩)."""
    return "".join(in_hex(ch.encode("utf-8")) if draws_nothing(ch) else ch for ch in text)


def readable_decode(tokenizer, ids: list[int]) -> str:
    """The text of ids (special tokens left out, as decode does), with each run of bytes
    that make no whole character written as ⟨..⟩ instead of U+FFFD, and each character that
    draws nothing as its bytes."""
    special = {i for i, token in tokenizer.get_added_tokens_decoder().items() if token.special}
    kept = [i for i in ids if i not in special]
    pieces = [token_bytes(tokenizer, i) for i in kept]
    if any(p is None for p in pieces):
        return readable(tokenizer.decode(kept))
    data = b"".join(pieces)
    out, broken = [], b""
    for start, end, ch in char_spans(data):
        if ch is None:
            broken += data[start:end]
            continue
        if broken:
            out.append(in_hex(broken))
            broken = b""
        out.append(readable(ch))
    return "".join(out) + (in_hex(broken) if broken else "")


def token_text(tokenizer, token_id: int) -> str:
    """What one token reads as on its own; bytes that are no whole character as ⟨e4 bd⟩."""
    raw = token_bytes(tokenizer, token_id)
    if raw is None:
        return tokenizer.id_to_token(token_id)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return in_hex(raw)


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
        whole = all(start <= a and b <= end and ch is not None for a, b, ch in chars)  # (a cut byte: no character)
        text = "".join(ch for _, _, ch in chars if ch is not None)
        views.append({"id": token_id, "text": text} if whole else
                     {"id": token_id, "text": in_hex(piece), "bytes": piece.hex(" "), "joined": text})
        start = end
    return views


def char_spans(data: bytes) -> list[tuple[int, int, str | None]]:
    """(start, end, character) for each UTF-8 character of data; a byte that starts no
    valid character is its own span, with None for its character."""
    spans, i = [], 0
    while i < len(data):
        lead = data[i]
        size = 1 if lead < 0x80 else 2 if lead >> 5 == 0b110 else 3 if lead >> 4 == 0b1110 else 4 if lead >> 3 == 0b11110 else 1
        try:
            spans.append((i, i + size, data[i:i + size].decode("utf-8")))
        except UnicodeDecodeError:
            size = 1
            spans.append((i, i + 1, None))
        i += size
    return spans
