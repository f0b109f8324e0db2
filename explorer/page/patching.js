// Which components carry what the first copy tells the second: activation and path patching
// in the page, by the rule of inspection/patching.py (tested against it and against
// TransformerLens's hooks). The text's lines written twice are corrupted (each symbol of a
// first copy the next of the lesson's alphabet); the model runs the corrupted text with one
// component's output from the clean run put back (Model.forward's patches), and the loss on
// the second copies says how much of the gap between the two runs it restores:
// (L_corrupt − L_patched) / (L_corrupt − L_clean). Also the lesson's copies, as the score split
// uses them: for a query of a second copy, the right key (the symbol after the earlier copy
// of its own) and that earlier copy.
const Patching = (() => {
  "use strict";
  const { logSoftmax } = Numbers;

  // Each character's copy: 0 in the first copy of a line written twice, n in its second
  // (its source n back), −1 otherwise (inspection/in_context.py's copy_marks)
  function copyMarks(text) {
    const marks = [];
    for (const line of text.split("\n")) {
      const n = Math.floor(line.length / 2);
      const copied = line.length % 2 === 0 && n > 0 && line.slice(0, n) === line.slice(n);
      for (let i = 0; i < line.length; i++) marks.push(copied ? (i < n ? 0 : n) : -1);
      marks.push(-1); // (the newline)
    }
    return marks.slice(0, text.length);
  }

  // The text with each first copy's symbols the next of `symbols`, cyclically
  function corrupted(text, symbols) {
    const marks = copyMarks(text);
    return Array.from(text, (ch, i) => {
      const at = symbols.indexOf(ch);
      return marks[i] === 0 && at >= 0 ? symbols[(at + 1) % symbols.length] : ch;
    }).join("");
  }

  // Target j (the token after position j) is scored where it is a second copy's symbol
  const scoredTargets = (text) => copyMarks(text).slice(1).map((mark) => mark > 0);

  // For query position i of a second copy: {right: the key after the earlier copy of its symbol,
  // same: that earlier copy}; null elsewhere
  function copyKeys(text, i) {
    const n = copyMarks(text)[i];
    return n > 0 ? { right: i - n + 1, same: i - n } : null;
  }

  // (name, layer, head) of each component: the heads, then the feed-forward networks
  function components(model) {
    const c = model.config;
    const found = [];
    for (let l = 0; l < c.n_layer; l++) for (let h = 0; h < c.n_head; h++) found.push({ name: `L${l}H${h}`, layer: l, head: h });
    if (c.mlp !== "none") for (let l = 0; l < c.n_layer; l++) found.push({ name: `L${l} FFN`, layer: l, head: null });
    return found;
  }

  // The mean loss over the scored targets of ids, from logits [T, V]
  function scoredLoss(logits, ids, scored, V) {
    let total = 0, count = 0;
    scored.forEach((on, t) => {
      if (!on) return;
      total -= logSoftmax(logits.subarray(t * V, (t + 1) * V))[ids[t + 1]];
      count += 1;
    });
    return total / count;
  }

  // Patching on a char model's text: {components, clean, corrupt (the two runs' losses), all [K],
  // positions [K][T] (each component at each position alone; with `positions`), paths {heads,
  // all, direct, ffn}} (the share of the gap each restores), or null where the text has no line
  // written twice. tokenizer: the page's (PageTokenizer); symbols: the lesson's alphabet.
  function run(model, tokenizer, text, symbols, { positions = true } = {}) {
    const scored = scoredTargets(text);
    if (!scored.some(Boolean)) return null;
    const c = model.config;
    const V = c.vocab_size;
    const clean = tokenizer.encode(text), corrupt = tokenizer.encode(corrupted(text, symbols));
    const T = clean.length;
    const pass = Model.forward(model, clean, { trace: true });
    const outputOf = ({ layer, head }) => (head === null ? pass.layers[layer].mlp : pass.layers[layer].heads[head]);
    const loss = (patches) => scoredLoss(Model.forward(model, corrupt, { patches }).logits, corrupt, scored, V);
    const cleanLoss = scoredLoss(pass.logits, clean, scored, V);
    const corruptLoss = loss([]);
    const share = (patched) => (corruptLoss - patched) / (corruptLoss - cleanLoss);
    const every = new Uint8Array(T).fill(1);
    const found = components(model);
    const patch = (part, where, path = "all") => ({ layer: part.layer, head: part.head, value: outputOf(part), where, path });
    const all = found.map((part) => share(loss([patch(part, every)])));
    const byPosition = !positions ? null : c.n_layer <= 2 && c.norm_position === "pre"
      ? positionGrid(model, corrupt, Model.forward(model, corrupt, { trace: true }), found.map(outputOf), found, scored)
        .map((row) => row.map(share))
      : found.map((part) => Array.from({ length: T }, (_, p) => { // (any other model: a pass each)
        const where = new Uint8Array(T);
        where[p] = 1;
        return share(loss([patch(part, where)]));
      }));
    const heads = found.filter((part) => part.head !== null);
    const onPath = (path) => heads.map((part) => share(loss([patch(part, every, path)])));
    return { components: found.map((part) => part.name), clean: cleanLoss, corrupt: corruptLoss, all, positions: byPosition,
      paths: { heads: heads.map((part) => part.name), all: all.slice(0, heads.length), direct: onPath("direct"),
        ffn: c.mlp === "none" ? null : onPath("ffn") } };
  }

  // ---- each component at each position, without a whole pass each ---------------------------------
  //
  // A component of the last block patched at position p changes that position's stream alone
  // (row p's W_O sum or network output, then its norm and logits). One of the block before it
  // (a model of two blocks) changes the last block's input at p alone: p's query, key and value
  // there, and so every later query's weight on key p. Its softmax is mended rather than redone:
  // with s the old score of key p and s' the new, Z' = Z − e^s + e^s', every other weight is
  // w Z/Z' and key p's w e^(s'−s) Z/Z', and the head's output moves by those weights. Only the
  // scored rows are carried on to their logits. The same numbers as a whole pass, a few hundred
  // times faster (tested against run's passes and inspection/patching.py).

  // The loss of one target from the final stream's row x [C]
  function rowLoss(model, x, target) {
    const logits = Model.lmHead(model, Model.finalNorm(model, x, 1), 1);
    return -logSoftmax(logits)[target];
  }

  // The last block's output row for its input row x [C] and attention output row a [C] (W_O's, with its bias)
  function lastBlockRow(model, x, a) {
    const c = model.config;
    const L = c.n_layer - 1;
    const mid = x.map((v, i) => v + a[i]);
    const normed = c.mlp === "none" ? new Float32Array(c.n_embd) : Model.normalised(model, `transformer.h.${L}.ln_2`, mid, 1);
    const fed = Model.feedForward(model, `transformer.h.${L}.mlp`, normed, 1).output;
    return mid.map((v, i) => v + fed[i]);
  }

  // [K][T]: the scored loss with component k's clean output `values[k]` at position p alone
  function positionGrid(model, ids, pass, values, found, scored) {
    const c = model.config;
    const { n_embd: C, head_size: dk, heads_width: HD } = c;
    const T = ids.length;
    const L = c.n_layer - 1;
    const targets = ids.slice(1);
    const own = scored.map((on, t) => (on ? rowLoss(model, pass.layers[L].residual_out.subarray(t * C, (t + 1) * C), targets[t]) : 0));
    const base = own.reduce((a, b) => a + b, 0);
    const count = scored.filter(Boolean).length;
    const written = (l, h, difference) => { // a head's output difference [d_k] through its columns of W_O -> [C]
      const w = Numbers.values(model.weights[`transformer.h.${l}.attn.c_proj.weight`]);
      return Float32Array.from({ length: C }, (_, i) => {
        let sum = 0;
        for (let d = 0; d < dk; d++) sum += w[i * HD + h * dk + d] * difference[d];
        return sum;
      });
    };
    const row = (array, t, width = C) => array.subarray(t * width, (t + 1) * width);
    return found.map((part, k) => Array.from({ length: T }, (_, p) => {
      const value = values[k];
      const layer = pass.layers[part.layer];
      let stream; // the patched block's output row p
      if (part.head === null) {
        stream = row(layer.residual_out, p).map((v, i) => v - layer.mlp[p * C + i] + value[p * C + i]);
      } else {
        const difference = row(value, p, dk).map((v, d) => v - layer.heads[part.head][p * dk + d]);
        const moved = written(part.layer, part.head, difference);
        const attn = row(layer.attn, p).map((v, i) => v + moved[i]);
        stream = part.layer === L ? lastBlockRow(model, row(layer.residual_in, p), attn)
          : Float32Array.from(row(layer.residual_in, p), (v, i) => v + attn[i]);
        if (part.layer < L) {
          const normed = Model.normalised(model, `transformer.h.${part.layer}.ln_2`, stream, 1);
          const fed = c.mlp === "none" ? new Float32Array(C) : Model.feedForward(model, `transformer.h.${part.layer}.mlp`, normed, 1).output;
          stream = stream.map((v, i) => v + fed[i]);
        }
      }
      if (part.layer === L) { // the last block: row p alone
        return scored[p] ? (base - own[p] + rowLoss(model, stream, targets[p])) / count : base / count;
      }
      return nextBlock(model, pass, stream, p, scored, targets, own, base) / count;
    }));
  }

  // The scored loss (summed) when the last block's input changes at row p to x [C]
  function nextBlock(model, pass, x, p, scored, targets, own, base) {
    const c = model.config;
    const { n_embd: C, head_size: dk, n_head: H, n_kv_head: Hkv, heads_width: HD } = c;
    const L = c.n_layer - 1;
    const layer = pass.layers[L];
    const prefix = `transformer.h.${L}.attn`;
    const normed = Model.normalised(model, `transformer.h.${L}.ln_1`, x, 1);
    const qkv = Model.linear(normed, 1, model.weights[`${prefix}.c_attn.weight`], model.weights[`${prefix}.c_attn.bias`] ?? null);
    const turned = (vector) => (c.pos_encoding === "rope" ? Model.rotate(vector, p, c.rope_frequencies) : vector);
    const qk = Model.qkNorm(model, L);
    const q = Array.from({ length: H }, (_, h) => turned(qk.q(qkv.slice(h * dk, (h + 1) * dk))));
    const k = Array.from({ length: Hkv }, (_, g) => turned(qk.k(qkv.slice(HD + g * dk, HD + (g + 1) * dk))));
    const v = Array.from({ length: Hkv }, (_, g) => qkv.slice(HD + Hkv * dk + g * dk, HD + Hkv * dk + (g + 1) * dk));
    const dot = Numbers.dot;
    const factor = 1 / Math.sqrt(dk);
    let total = base;
    for (let j = p; j < scored.length; j++) {
      if (!scored[j]) continue;
      const merged = new Float32Array(HD);
      for (let h = 0; h < H; h++) {
        const g = Math.floor(h / (H / Hkv));
        const keys = layer.k[g], values = layer.v[g];
        let out;
        if (j === p) { // the query itself is new: its five steps again, against key p's new key and value
          out = Numbers.fiveSteps(q[h], keys.slice(0, p).concat([k[g]]), values.slice(0, p).concat([v[g]]), p).output;
        } else {
          const w = layer.weights[h][j][p];
          const old = dot(layer.q[h][j], keys[p]) * factor, now = dot(layer.q[h][j], k[g]) * factor;
          const grown = w * Math.exp(now - old);
          const r = 1 - w + grown;
          out = Array.from(layer.heads[h].subarray(j * dk, (j + 1) * dk), (o, d) => (o - w * values[p][d] + grown * v[g][d]) / r);
        }
        for (let d = 0; d < dk; d++) merged[h * dk + d] = out[d];
      }
      const attn = Model.linear(merged, 1, model.weights[`${prefix}.c_proj.weight`], model.weights[`${prefix}.c_proj.bias`] ?? null);
      const input = j === p ? x : layer.residual_in.subarray(j * C, (j + 1) * C);
      total += rowLoss(model, lastBlockRow(model, input, attn), targets[j]) - own[j];
    }
    return total;
  }

  return { copyMarks, corrupted, scoredTargets, copyKeys, components, run };
})();
