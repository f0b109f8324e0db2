// The run's tokenizer in the page: text -> token ids exactly as Hugging Face `tokenizers`
// encodes it with the run's tokenizer.json, and ids -> text. Two kinds, those that
// data/tokenizer.py trains (explorer/data.py's page_tokenizer says which a page can carry):
//   char: one token per character seen in training; any other character is <unk>, which a
//         prompt may not hold (named and refused, as explore.py and the server do);
//   bpe:  byte-level BPE (GPT-2's scheme): the text cut into pieces by GPT-2's regex, each
//         piece's UTF-8 bytes written as printable characters (the byte map), then the
//         merges applied, the earliest learned first.
const PageTokenizer = (() => {
  "use strict";

  // GPT-2's byte map (data/token_text.py's byte_alphabet): the printable bytes stand for
  // themselves, the other 68 move up to U+0100 and beyond, in order.
  const BYTE_CHARS = (() => {
    const printable = (b) => (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
    const chars = [];
    let moved = 0;
    for (let b = 0; b < 256; b++) chars.push(String.fromCharCode(printable(b) ? b : 256 + moved++));
    return chars;
  })();
  const BYTE_OF = new Map(BYTE_CHARS.map((ch, b) => [ch, b]));

  // GPT-2's pre-tokenizer regex, as `tokenizers` runs it for ByteLevel(use_regex=true): \s is
  // Unicode's White_Space (which JavaScript's \s is not quite: it adds U+FEFF, leaves out U+0085)
  const WS = "\\p{White_Space}";
  const PIECES = new RegExp(`'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^${WS}\\p{L}\\p{N}]+|[${WS}]+(?![^${WS}])|[${WS}]+`, "gu");

  const utf8 = new TextEncoder();
  // ignoreBOM: a byte order mark (U+FEFF) is text like any other, kept where it stands
  const strictUtf8 = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true });
  const lossyUtf8 = new TextDecoder("utf-8", { ignoreBOM: true }); // a broken sequence as U+FFFD, as tokenizers' decoder does

  class PageTokenizer {
    // spec: explorer/data.py's page_tokenizer: {kind, vocab, merges, unk, add_prefix_space,
    // ignore_merges, special: {id: text}}
    constructor(spec) {
      this.kind = spec.kind;
      this.vocab = new Map(Object.entries(spec.vocab));
      this.pieceOf = [];
      for (const [piece, id] of this.vocab) this.pieceOf[id] = piece;
      this.special = new Map(Object.entries(spec.special).map(([id, text]) => [Number(id), text]));
      for (const [id, text] of this.special) this.pieceOf[id] = text;
      this.unk = spec.unk;
      this.addPrefixSpace = spec.add_prefix_space;
      this.ignoreMerges = spec.ignore_merges;
      // a merge's rank: how early it was learned; "a b" (older files) or ["a", "b"]
      this.ranks = new Map((spec.merges ?? []).map((m, rank) => [Array.isArray(m) ? m.join(" ") : m, rank]));
      this.words = new Map(); // a piece's tokens, once computed
    }

    // Characters of text that a char tokenizer would turn into <unk> (none for bpe), in
    // code point order as data/tokenizer.py's unknown_characters gives them
    unknown(text) {
      if (this.kind !== "char") return [];
      return [...new Set(text)].filter((ch) => !this.vocab.has(ch)).sort((a, b) => a.codePointAt(0) - b.codePointAt(0));
    }

    encode(text) {
      if (this.kind === "char") return Array.from(text, (ch) => this.vocab.get(ch) ?? this.unk);
      return this.pieces(text).flatMap((piece) => this.merged(piece).map((token) => this.vocab.get(token)));
    }

    // The text cut by GPT-2's regex, each piece's UTF-8 bytes in the byte map (what tokenizers'
    // ByteLevel pre-tokenizer gives): a merge never crosses a piece's edge. add_prefix_space
    // puts a space before a text that does not start with one (a space: a tab still gets one)
    pieces(text) {
      if (this.addPrefixSpace && text && !text.startsWith(" ")) text = ` ${text}`;
      return Array.from(text.matchAll(PIECES), ([piece]) => Array.from(utf8.encode(piece), (b) => BYTE_CHARS[b]).join(""));
    }

    // One piece's tokens: its bytes, then, while any two neighbours make a learned merge, the
    // earliest learned of them merged wherever it occurs, left to right
    merged(word) {
      if (this.words.has(word)) return this.words.get(word);
      let symbols = Array.from(word);
      if (this.ignoreMerges && this.vocab.has(word)) symbols = [word]; // (Llama 3's rule: a known word is one token)
      for (;;) {
        let best = null;
        for (let i = 0; i + 1 < symbols.length; i++) {
          const rank = this.ranks.get(`${symbols[i]} ${symbols[i + 1]}`);
          if (rank !== undefined && (best === null || rank < best)) best = rank;
        }
        if (best === null) break;
        const next = [];
        for (let i = 0; i < symbols.length; i++) {
          if (i + 1 < symbols.length && this.ranks.get(`${symbols[i]} ${symbols[i + 1]}`) === best) {
            next.push(symbols[i] + symbols[i + 1]);
            i += 1;
          } else {
            next.push(symbols[i]);
          }
        }
        symbols = next;
      }
      this.words.set(word, symbols);
      return symbols;
    }

    // The bytes a byte-level token stands for, or null (a char tokenizer's, a special token)
    bytesOf(id) {
      const piece = this.pieceOf[id];
      if (this.kind !== "bpe" || piece === undefined || this.special.has(id) || !piece) return null;
      return Uint8Array.from(piece, (ch) => BYTE_OF.get(ch));
    }

    // ids -> text, special tokens left out (tokenizers' decode, skip_special_tokens=True)
    decode(ids) {
      const kept = ids.filter((id) => !this.special.has(id));
      if (this.kind === "char") return kept.map((id) => this.pieceOf[id]).join("");
      const bytes = kept.flatMap((id) => Array.from(this.bytesOf(id)));
      return lossyUtf8.decode(Uint8Array.from(bytes));
    }

    // What one token reads as on its own; bytes that are no whole character as ⟨e4 bd⟩
    // (data/token_text.py's token_text)
    text(id) {
      const bytes = this.bytesOf(id);
      if (bytes === null) return this.pieceOf[id];
      try {
        return strictUtf8.decode(bytes);
      } catch {
        return `⟨${hex(bytes)}⟩`;
      }
    }

    // The text of ids, with each run of bytes that make no whole character as ⟨..⟩ instead of
    // U+FFFD and each character that draws nothing as its bytes (data/token_text.py's
    // readable_decode): what the text box shows after Continue
    readableDecode(ids) {
      const kept = ids.filter((id) => !this.special.has(id));
      if (this.kind === "char") return readable(kept.map((id) => this.pieceOf[id]).join(""));
      const data = Uint8Array.from(kept.flatMap((id) => Array.from(this.bytesOf(id))));
      let out = "", broken = [];
      for (const [start, end, ch] of charSpans(data)) {
        if (ch === null) {
          broken.push(...data.subarray(start, end));
          continue;
        }
        if (broken.length) out += `⟨${hex(broken)}⟩`;
        broken = [];
        out += readable(ch);
      }
      return out + (broken.length ? `⟨${hex(broken)}⟩` : "");
    }

    // Each token's id and text; a byte-level token whose bytes are no whole character also
    // gets "bytes" and "joined", the characters it helps to make (data/token_text.py's token_views)
    views(ids) {
      const pieces = ids.map((id) => this.bytesOf(id));
      if (pieces.some((p) => p === null)) return ids.map((id) => ({ id, text: this.pieceOf[id] }));
      const all = new Uint8Array(pieces.reduce((n, p) => n + p.length, 0));
      let start = 0;
      for (const p of pieces) { all.set(p, start); start += p.length; }
      const spans = charSpans(all);
      start = 0;
      return ids.map((id, i) => {
        const end = start + pieces[i].length;
        const chars = spans.filter(([a, b]) => a < end && b > start);
        const whole = chars.every(([a, b, ch]) => start <= a && b <= end && ch !== null); // (a cut byte: no character)
        const text = chars.filter(([, , ch]) => ch !== null).map(([, , ch]) => ch).join("");
        const view = whole ? { id, text } : { id, text: `⟨${hex(pieces[i])}⟩`, bytes: hex(pieces[i]), joined: text };
        start = end;
        return view;
      });
    }
  }

  const hex = (bytes) => Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join(" ");

  // A control character other than the newline and the tab (C0, DEL, C1), or an invisible
  // format character, as its UTF-8 bytes: ⟨03⟩ (data/token_text.py's readable)
  const readable = (text) => text.replace(/[\u0000-\u0008\u000b-\u001f\u007f-\u009f]|\p{Cf}/gu,
    (c) => `⟨${hex(utf8.encode(c))}⟩`);

  // [start, end, character] for each UTF-8 character of the bytes; a byte that starts no
  // valid character is its own span, with null for its character (data/token_text.py's char_spans)
  function charSpans(bytes) {
    const spans = [];
    for (let i = 0; i < bytes.length;) {
      const lead = bytes[i];
      let size = lead < 0x80 ? 1 : lead >> 5 === 0b110 ? 2 : lead >> 4 === 0b1110 ? 3 : lead >> 3 === 0b11110 ? 4 : 1;
      let ch;
      try {
        ch = strictUtf8.decode(bytes.subarray(i, i + size));
      } catch {
        size = 1;
        ch = null;
      }
      spans.push([i, i + size, ch]);
      i += size;
    }
    return spans;
  }

  PageTokenizer.readable = readable; // (view.js draws every token's text by this rule)
  return PageTokenizer;
})();
