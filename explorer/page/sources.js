// Where a head's score comes from: inspection/circuits.py's score_sources, computed by the
// page from the pass it shows (the stream's pieces: the token's embedding, the position
// vectors, each earlier head's output through its columns of W_O, each W_O's bias, each
// feed-forward network) and the model's weights. With the norm's mean and scale taken at
// each position's own statistics, every piece goes linearly through the norm, W_Q (or W_K)
// and the rotation; the norm's shift with the bias is one more piece. So q·k/√d_k, the
// score of step 2, is a sum over (query piece, key piece) cells. Sums are taken in double
// precision, as model.js takes them.
const Sources = (() => {
  "use strict";
  const { values, rowOf, normStatistics, dot } = Numbers;

  const param = (model, name) => model.weights[name] ?? null;

  // What wrote the stream entering block `layer` at position t: [{name, vector [C]}] (they add up to it)
  function pieces(model, data, layer, t) {
    const c = model.config;
    const { n_embd: C, head_size: dk, heads_width: HD } = c;
    const found = [{ name: "token", vector: rowOf(data.embedding.token, t) }];
    if (data.embedding.position) found.push({ name: "position", vector: rowOf(data.embedding.position, t) });
    for (let l = 0; l < layer; l++) {
      const wO = values(param(model, `transformer.h.${l}.attn.c_proj.weight`)); // [C, H d_k]: head h writes through its d_k columns
      data.layers[l].heads.forEach((head, h) => {
        const y = rowOf(head.output, t); // [d_k]
        const vector = Array.from({ length: C }, (_, i) => {
          let sum = 0;
          for (let d = 0; d < dk; d++) sum += wO[i * HD + h * dk + d] * y[d];
          return sum;
        });
        found.push({ name: `L${l}H${h}`, vector });
      });
      const bias = param(model, `transformer.h.${l}.attn.c_proj.bias`);
      if (bias) found.push({ name: `L${l} b_O`, vector: Array.from(values(bias)) });
      if (c.mlp !== "none") found.push({ name: `L${l} FFN`, vector: rowOf(data.layers[l].mlp, t) }); // (attention-only: none)
    }
    return found;
  }

  // Each piece at position t through block `layer`'s first norm, at the stream's own statistics
  // there (LayerNorm γ (p − mean(p)) / √(var(x) + ε); RMSNorm γ p / √(mean(x²) + ε)); then the
  // shift (β, or nothing) as one more piece
  function normed(model, data, layer, t, found) {
    const c = model.config;
    const gamma = values(param(model, `transformer.h.${layer}.ln_1.weight`));
    const beta = param(model, `transformer.h.${layer}.ln_1.bias`);
    const { divisor } = normStatistics(rowOf(data.layers[layer].residual_in, t), c.norm, c.norm_eps);
    const through = found.map(({ vector }) => {
      const mean = c.norm === "layernorm" ? vector.reduce((a, b) => a + b, 0) / vector.length : 0;
      return vector.map((x, i) => (gamma[i] * (x - mean)) / divisor);
    });
    through.push(beta ? Array.from(values(beta)) : new Array(c.n_embd).fill(0));
    return through;
  }

  // The rows of c_attn that make head h's q (or k: its key/value head's), and their bias
  function projection(model, layer, which, head) {
    const c = model.config;
    const { n_embd: C, head_size: dk, heads_width: HD } = c;
    const start = which === "q" ? head * dk : HD + Math.floor(head / (c.n_head / c.n_kv_head)) * dk;
    const weight = values(param(model, `transformer.h.${layer}.attn.c_attn.weight`));
    const bias = param(model, `transformer.h.${layer}.attn.c_attn.bias`);
    const rows = Array.from({ length: dk }, (_, d) => weight.subarray((start + d) * C, (start + d + 1) * C));
    return { rows, bias: bias ? values(bias).subarray(start, start + dk) : null };
  }

  // The pieces at position t as q (or k) parts [P + 1][d_k]: through W (the shift with the
  // bias), QK-norm where the model has it (each part divided by the RMS of their sum, the vector
  // the norm sees, and scaled by its gain: parts that still add up), then turned by the rotation
  // of position t where the model has RoPE
  function parts(model, data, layer, which, head, t) {
    const through = normed(model, data, layer, t, pieces(model, data, layer, t));
    const { rows, bias } = projection(model, layer, which, head);
    let made = through.map((x, p) => rows.map((w, d) => dot(w, x) + (p === through.length - 1 && bias ? bias[d] : 0)));
    const c = model.config;
    if (c.qk_norm) {
      const gain = values(param(model, `transformer.h.${layer}.attn.${which}_norm.weight`));
      const whole = made[0].map((_, d) => made.reduce((sum, part) => sum + part[d], 0));
      const { divisor } = normStatistics(whole, "rmsnorm", c.norm_eps);
      made = made.map((part) => Numbers.qkNormed(part, gain, c.norm_eps, divisor));
    }
    return c.pos_encoding === "rope" ? made.map((vector) => Array.from(Model.rotate(vector, t, c.rope_frequencies))) : made;
  }

  // Where head `head` of block `layer` gets its score for (query, key): {pieces (the stream's
  // names, then "shift"), contributions [P + 1][P + 1] (query piece × key piece), score (the
  // pass's own q·k/√d_k), others: against the other keys the query may see, the picked key's
  // cells less their mean, by key piece ("key") and by query piece ("query"), and their total
  // ("gap"); null where the query sees no other key}
  function scoreSources(model, data, layer, head, query, key) {
    const dk = model.config.head_size;
    const names = [...pieces(model, data, layer, query).map((p) => p.name), "shift"];
    const q = parts(model, data, layer, "q", head, query);
    const cells = (k) => q.map((qa) => k.map((kb) => dot(qa, kb) / Math.sqrt(dk)));
    const contributions = cells(parts(model, data, layer, "k", head, key));
    let others = null;
    if (query > 0) {
      const P = names.length;
      const rest = Array.from({ length: P }, () => new Array(P).fill(0));
      for (let j = 0; j <= query; j++) {
        if (j === key) continue;
        cells(parts(model, data, layer, "k", head, j)).forEach((row, a) => row.forEach((x, b) => { rest[a][b] += x / query; }));
      }
      const lead = contributions.map((row, a) => row.map((x, b) => x - rest[a][b]));
      others = { key: names.map((_, b) => lead.reduce((sum, row) => sum + row[b], 0)),
        query: lead.map((row) => row.reduce((a, b) => a + b, 0)), gap: lead.flat().reduce((a, b) => a + b, 0) };
    }
    const h = data.layers[layer].heads[head];
    const score = dot(rowOf(h.q, query), rowOf(h.k, key)) / Math.sqrt(dk);
    return { pieces: names, contributions, score, others };
  }

  // Where the logit of `token` at position t comes from (inspection/circuits.py's logit_sources,
  // direct logit attribution): the final stream's pieces (the embedding, the positions, each
  // head, each bias, each feed-forward network) through ln_f at the stream's own statistics there
  // and the LM head's row of the token; ln_f's shift is one more piece. {pieces (names, then
  // "shift"), contributions [P + 1] (they add up to the logit), logit (the pass's own)}
  function logitSources(model, data, t, token) {
    const c = model.config;
    const found = pieces(model, data, c.n_layer, t);
    const gamma = values(param(model, "transformer.ln_f.weight"));
    const beta = param(model, "transformer.ln_f.bias");
    const { divisor } = normStatistics(rowOf(data.layers[c.n_layer - 1].residual_out, t), c.norm, c.norm_eps);
    const head = values(param(model, "lm_head.weight") ?? param(model, "transformer.wte.weight"));
    const row = head.subarray(token * c.n_embd, (token + 1) * c.n_embd); // W_U's row of the token
    const contributions = found.map(({ vector }) => {
      const mean = c.norm === "layernorm" ? vector.reduce((a, b) => a + b, 0) / vector.length : 0;
      let sum = 0;
      for (let i = 0; i < c.n_embd; i++) sum += ((gamma[i] * (vector[i] - mean)) / divisor) * row[i];
      return sum;
    });
    contributions.push(beta ? dot(Array.from(values(beta)), row) : 0);
    return { pieces: [...found.map((p) => p.name), "shift"], contributions, logit: dot(rowOf(data.ln_f, t), row) };
  }

  return { scoreSources, logitSources };
})();
