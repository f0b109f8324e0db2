// The page's data for a text typed into the page, or for a snapshot of the model's training:
// explorer/data.py's page_data (schema version 3), filled from model.js's forward pass
// instead of torch's, so that every panel draws from it unchanged. What data.py reads off
// the model, this reads off the same pass: each token's loss, the logit lens (the model's
// own ln_f and LM head on each layer's output) and, on request, the heads switched off one
// at a time (one more pass each). The names mirror data.py's: pageData ↔ page_data,
// ablated ↔ ablated, logitLens ↔ logit_lens, tokenLosses ↔ token_losses (the last two used here).
const PageData = (() => {
  "use strict";
  const { tensor, lastRow, logSoftmax, largest } = Numbers;
  const { forward, finalNorm, lmHead, cAttnOf } = Model;

  // What every token reads as, once per model: {id: text} (data.py keeps only the ids it shows)
  function allTexts(model, tokenizer) {
    model.texts ??= Object.fromEntries(Array.from({ length: model.config.vocab_size }, (_, id) => [id, tokenizer.text(id)]));
    return model.texts;
  }

  // A list of vectors -> one array [T, width]
  function stacked(vectors) {
    const width = vectors[0].length;
    const out = new Float32Array(vectors.length * width);
    vectors.forEach((v, t) => out.set(v, t * width));
    return tensor([vectors.length, width], out);
  }

  // ids (at most block_size) -> the page's data. shown: the fields that stay as the file has
  // them (which model, its config, its run, the colour map, the timeline).
  function pageData(model, tokenizer, ids, truncated, shown) {
    const c = model.config;
    const T = ids.length;
    const pass = forward(model, ids, { trace: true });
    const layers = pass.layers.map((layer, l) => ({
      ...Object.fromEntries(["residual_in", "ln_1", "attn", "ln_2", "mlp"].map((name) => [name, tensor([T, c.n_embd], layer[name])])),
      residual_out: l === c.n_layer - 1 ? tensor([T, c.n_embd], layer.residual_out) : null,
      mlp_top: hiddenTop(layer.mlp_hidden, T, c.ffn_hidden, model.limits.top_units),
      heads: layer.q.map((q, h) => {
        const g = Math.floor(h / (c.n_head / c.n_kv_head)); // a group's heads each carry their shared k and v
        return { q: stacked(q), k: stacked(layer.k[g]), v: stacked(layer.v[g]), weights: stacked(layer.weights[h]),
          output: tensor([T, c.head_size], layer.heads[h]) };
      }),
      lens: logitLens(model, l === c.n_layer - 1 ? pass.logits : lmHead(model, finalNorm(model, layer.residual_out, T), T), T),
      c_attn: cAttnOf(model, l),
    }));
    return {
      version: 3, model: shown.model, config: shown.config, tokens: tokenizer.views(ids), truncated,
      embedding: { token: tensor([T, c.n_embd], pass.token), position: pass.position && tensor([T, c.n_embd], pass.position) },
      layers, ln_f: tensor([T, c.n_embd], pass.ln_f),
      prediction: { logits: tensor([c.vocab_size], Float32Array.from(lastRow(pass.logits, c.vocab_size))),
        suppressed: model.suppressed },
      losses: tokenLosses(pass.logits, ids, c.vocab_size),
      ablation: null, // on request: ablated
      texts: allTexts(model, tokenizer), left_out: [], colormap: shown.colormap, timeline: shown.timeline, run: shown.run,
      sources: null, // (the page splits any score itself: sources.js)
    };
  }

  // Each token's loss, −log p(token | the tokens before it), from the logits [T, V] of the
  // positions before it: T − 1 numbers (the first token has nothing before it)
  function tokenLosses(logits, ids, V) {
    return ids.slice(1).map((id, t) => -logSoftmax(logits.subarray(t * V, (t + 1) * V))[id]);
  }

  // The feed-forward network's largest hidden units (by magnitude) at each position
  function hiddenTop(hidden, T, F, k) {
    const ids = [], kept = [];
    for (let t = 0; t < T; t++) {
      const row = hidden.subarray(t * F, (t + 1) * F);
      const order = largest(row, k, Math.abs);
      ids.push(order);
      kept.push(order.map((i) => row[i]));
    }
    return { ids, values: kept, width: F };
  }

  // The logit lens: softmax(lm_head(ln_f(x))) of each layer's output x (for the last layer, the
  // model's own logits), its likeliest tokens per position: those of the largest logits, each
  // e^(logit − max) / Σ e^(logit − max). logits [T, V]
  function logitLens(model, logits, T) {
    const V = model.config.vocab_size;
    const ids = [], probs = [];
    for (let t = 0; t < T; t++) {
      const row = logits.subarray(t * V, (t + 1) * V);
      const order = largest(row, model.limits.lens_tokens);
      const max = row[order[0]];
      let total = 0;
      for (let i = 0; i < V; i++) total += Math.exp(row[i] - max);
      ids.push(order);
      probs.push(order.map((i) => Math.exp(row[i] - max) / total));
    }
    return { ids, probs };
  }

  // Every head switched off in turn (its output zeroed before W_O): the next-token distribution
  // after the text, its likeliest tokens, its logits, its KL divergence from the model's,
  // KL(p ‖ p_off) = Σ p log(p / p_off), and each token's loss; [layer][head], as data.py's
  function ablated(model, ids) {
    const c = model.config;
    const V = c.vocab_size;
    const on = () => Array.from({ length: c.n_layer }, () => new Array(c.n_head).fill(1));
    const logp = logSoftmax(lastRow(forward(model, ids).logits, V));
    return Array.from({ length: c.n_layer }, (_, l) => Array.from({ length: c.n_head }, (_, h) => {
      const off = on();
      off[l][h] = 0;
      const all = forward(model, ids, { off }).logits;
      const logits = lastRow(all, V);
      const logq = logSoftmax(logits);
      const probs = logq.map(Math.exp);
      const order = largest(probs, model.limits.ablation_tokens);
      return { ids: order, probs: order.map((i) => probs[i]), logits: tensor([V], Float32Array.from(logits)),
        kl: logp.reduce((sum, x, i) => sum + Math.exp(x) * (x - logq[i]), 0), losses: tokenLosses(all, ids, V) };
    }));
  }

  return { pageData, ablated, tokenLosses };
})();
