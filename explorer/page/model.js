// The model's forward pass in the page, in plain JavaScript: the pieces of model/gpt.py,
// model/block.py and model/attention.py in the order they run there, with the same names,
// on the run's own weights (explorer/data.py's page_model embeds them). Each block's
// attention is the five numbered steps of numbers.js's fiveSteps, the function the steps
// panel explains, once per head and query. Every vector is stored as float32
// (Float32Array), as torch stores it; sums are taken in double precision (JavaScript's
// numbers), so the page is at least as exact as torch's float32 kernels.
const Model = (() => {
  "use strict";
  const { values, add, lastRow, fiveSteps, ropeAngles, normStatistics, qkNormed, nextTokenProbabilities } = Numbers;


  // The weights: {name: array} as model.state_dict() names them ("transformer.h.0.attn.c_attn.weight")
  const param = (model, name) => model.weights[name] ?? null;

  // The same model with other weights of the same names (a snapshot of its training)
  const withWeights = (model, weights) => ({ ...model, weights });

  // Layer l's W_Q, W_K, W_V, fused as model/attention.py keeps them (for q's sum of products)
  const cAttnOf = (model, l) => ({ weight: param(model, `transformer.h.${l}.attn.c_attn.weight`),
    bias: param(model, `transformer.h.${l}.attn.c_attn.bias`) });

  // ---- the pieces ----------------------------------------------------------------------------

  // x Wᵀ + b: x [T, in], W [out, in] (as nn.Linear stores it), b [out] -> [T, out]. Two rows of x
  // against four rows of W at a time, so that each number read serves several products (about
  // twice as fast here as one at a time); each output is still one sum over i, in order.
  function linear(x, T, W, b) {
    const [outDim, inDim] = W.shape;
    const w = values(W);
    const bias = b ? values(b) : null;
    const y = new Float32Array(T * outDim);
    const dotRow = (t, o) => { // one output, for a row or a column the blocks below leave over
      let sum = 0;
      for (let i = 0; i < inDim; i++) sum += x[t * inDim + i] * w[o * inDim + i];
      return sum;
    };
    let t = 0;
    for (; t + 2 <= T; t += 2) {
      const xRow0 = t * inDim; // x[t]
      const xRow1 = xRow0 + inDim; // x[t + 1]
      let o = 0;
      for (; o + 4 <= outDim; o += 4) {
        const wRow0 = o * inDim; // W[o] ... W[o + 3]
        const wRow1 = wRow0 + inDim;
        const wRow2 = wRow1 + inDim;
        const wRow3 = wRow2 + inDim;
        // sTO: the sum for x[t + T] and W[o + O]
        let s00 = 0;
        let s01 = 0;
        let s02 = 0;
        let s03 = 0;
        let s10 = 0;
        let s11 = 0;
        let s12 = 0;
        let s13 = 0;
        for (let i = 0; i < inDim; i++) {
          const x0 = x[xRow0 + i];
          const x1 = x[xRow1 + i];
          const w0 = w[wRow0 + i];
          const w1 = w[wRow1 + i];
          const w2 = w[wRow2 + i];
          const w3 = w[wRow3 + i];
          s00 += x0 * w0;
          s01 += x0 * w1;
          s02 += x0 * w2;
          s03 += x0 * w3;
          s10 += x1 * w0;
          s11 += x1 * w1;
          s12 += x1 * w2;
          s13 += x1 * w3;
        }
        const y0 = t * outDim + o; // y[t][o]
        const y1 = y0 + outDim; // y[t + 1][o]
        y[y0] = s00;
        y[y0 + 1] = s01;
        y[y0 + 2] = s02;
        y[y0 + 3] = s03;
        y[y1] = s10;
        y[y1 + 1] = s11;
        y[y1 + 2] = s12;
        y[y1 + 3] = s13;
      }
      for (; o < outDim; o++) {
        y[t * outDim + o] = dotRow(t, o);
        y[(t + 1) * outDim + o] = dotRow(t + 1, o);
      }
    }
    for (; t < T; t++) for (let o = 0; o < outDim; o++) y[t * outDim + o] = dotRow(t, o); // an odd last row
    if (bias) for (let i = 0; i < y.length; i++) y[i] += bias[i % outDim];
    return y;
  }

  // LayerNorm(x) = γ (x − mean) / √(var + ε) + β, or RMSNorm(x) = γ x / √(mean(x²) + ε), for
  // each of the T vectors (model/block.py's make_norm)
  function normalised(model, prefix, x, T) {
    const c = model.config;
    const C = c.n_embd;
    const gamma = values(param(model, `${prefix}.weight`));
    const beta = param(model, `${prefix}.bias`) && values(param(model, `${prefix}.bias`));
    const y = new Float32Array(T * C);
    for (let t = 0; t < T; t++) {
      const v = x.subarray(t * C, (t + 1) * C);
      const { mean, divisor } = normStatistics(v, c.norm, c.norm_eps);
      for (let i = 0; i < C; i++) y[t * C + i] = ((v[i] - mean) / divisor) * gamma[i] + (beta ? beta[i] : 0);
    }
    return y;
  }

  // erf, which JavaScript's Math lacks: its Taylor series, summed in double precision until the
  // terms stop counting (under 4 the error stays below 1e-9, far under float32's 6e-8); from 4
  // on, erf is ±1 to float32 (1 − erf(4) = 1.5e-8).
  function erf(x) {
    if (Math.abs(x) >= 4) return Math.sign(x);
    // erf(x) = 2/√π Σ_n (−1)^n x^(2n+1) / (n! (2n+1))
    let term = x, sum = x;
    for (let n = 1; n < 100 && Math.abs(term) > 1e-17 * Math.abs(sum); n++) {
      term *= (-x * x) / n;
      sum += term / (2 * n + 1);
    }
    return (2 / Math.sqrt(Math.PI)) * sum;
  }

  const ACTIVATIONS = {
    gelu: (z) => 0.5 * z * (1 + erf(z / Math.SQRT2)), // exact: z Φ(z)
    gelu_tanh: (z) => 0.5 * z * (1 + Math.tanh(Math.sqrt(2 / Math.PI) * (z + 0.044715 * z ** 3))), // GPT-2's
    silu: (z) => z / (1 + Math.exp(-z)), // SwiGLU's gate: z σ(z)
  };

  // FFN(x) = act(x W_1 + b_1) W_2 + b_2, or (SiLU(x W_gate) ⊙ x W_up) W_2 (model/block.py); an
  // attention-only model's (mlp none) writes nothing, from a hidden layer of width 0
  function feedForward(model, prefix, x, T) {
    const c = model.config;
    if (c.mlp === "none") return { hidden: new Float32Array(0), output: new Float32Array(x.length) };
    const up = linear(x, T, param(model, `${prefix}.c_fc.weight`), param(model, `${prefix}.c_fc.bias`)); // [T, F]
    const hidden = new Float32Array(up.length);
    if (c.mlp === "swiglu") {
      const gate = linear(x, T, param(model, `${prefix}.c_gate.weight`), param(model, `${prefix}.c_gate.bias`));
      for (let i = 0; i < up.length; i++) hidden[i] = ACTIVATIONS.silu(gate[i]) * up[i];
    } else {
      const act = ACTIVATIONS[c.activation];
      for (let i = 0; i < up.length; i++) hidden[i] = act(up[i]);
    }
    return { hidden, output: linear(hidden, T, param(model, `${prefix}.c_proj.weight`), param(model, `${prefix}.c_proj.bias`)) };
  }

  // ---- positions -------------------------------------------------------------------------------

  // The position vectors added to the token embeddings [T, C] (learned: wpe's rows; sinusoidal:
  // sin and cos of position × the model's own frequencies, interleaved), or null with RoPE
  function positionVectors(model, past, T) {
    const c = model.config;
    const C = c.n_embd;
    if (c.pos_encoding === "rope") return null;
    if (c.pos_encoding === "learned") return values(param(model, "transformer.wpe.weight")).slice(past * C, (past + T) * C);
    const pe = new Float32Array(T * C);
    for (let t = 0; t < T; t++) {
      c.sinusoidal_frequencies.forEach((f, i) => {
        pe[t * C + 2 * i] = Math.sin((past + t) * f);
        pe[t * C + 2 * i + 1] = Math.cos((past + t) * f);
      });
    }
    return pe;
  }

  // RoPE (model/positional.py's apply_rotary): dims i and i + d_k/2 turn by position · θ_i
  function rotate(vector, position, frequencies) {
    const half = frequencies.length;
    const out = new Float32Array(vector.length);
    ropeAngles(position, frequencies).forEach((angle, i) => {
      const cos = Math.cos(angle), sin = Math.sin(angle);
      out[i] = vector[i] * cos - vector[i + half] * sin;
      out[i + half] = vector[i + half] * cos + vector[i] * sin;
    });
    return out;
  }

  // ---- attention, with the KV cache -------------------------------------------------------------

  // The keys and values of the tokens seen so far: k[layer][kv head] and v, a list of d_k-vectors
  // per position (model/attention.py's KVCache, growing instead of preallocated)
  function newCache(model) {
    const c = model.config;
    const heads = () => Array.from({ length: c.n_kv_head }, () => []);
    return { k: Array.from({ length: c.n_layer }, heads), v: Array.from({ length: c.n_layer }, heads), length: 0 };
  }

  // MultiHead(x) = concat(head_1 … head_H) W_O, head_h = Attention(x W_Q,h, x W_K,h, x W_V,h):
  // x [T, C] -> [T, C]; with grouped-query attention key/value head h / (H / H_kv) serves head h;
  // with QK-norm each head's q and k are normed before the rotation (qkNorm).
  // options: scale, mask (the experiments: false switches them off), off (this layer's heads
  // switched off: [H] of 0 or 1), patches (this layer's heads' patches: patched), deltas (where
  // a patch on one path leaves its difference). record, if given, receives q, k, v, weights and heads.
  function attention(model, layer, x, T, cache, options, record) {
    const c = model.config;
    const { n_head: H, n_kv_head: Hkv, head_size: dk, heads_width: HD } = c; // (HD = H · d_k: C unless head_dim)
    const prefix = `transformer.h.${layer}.attn`;
    const qkv = linear(x, T, param(model, `${prefix}.c_attn.weight`), param(model, `${prefix}.c_attn.bias`)); // [T, H d_k + 2 H_kv d_k]
    const width = HD + 2 * Hkv * dk;
    const past = cache.length;
    const slice = (t, start) => qkv.slice(t * width + start, t * width + start + dk);
    const turned = (vector, t) => (c.pos_encoding === "rope" ? rotate(vector, past + t, c.rope_frequencies) : vector);
    const normed = qkNorm(model, layer);
    // split into heads: q [H][T] d_k-vectors; k and v [H_kv][T], appended to the cache's
    const q = Array.from({ length: H }, (_, h) => Array.from({ length: T }, (_, t) => turned(normed.q(slice(t, h * dk)), t)));
    for (let g = 0; g < Hkv; g++) {
      for (let t = 0; t < T; t++) {
        cache.k[layer][g].push(turned(normed.k(slice(t, HD + g * dk)), t));
        cache.v[layer][g].push(slice(t, HD + Hkv * dk + g * dk));
      }
    }
    const merged = new Float32Array(T * HD); // [T, H · d_k]: the heads side by side
    const weights = [], heads = [];
    for (let h = 0; h < H; h++) {
      const g = Math.floor(h / (H / Hkv));
      const keys = cache.k[layer][g], vs = cache.v[layer][g];
      const on = options.off ? options.off[h] : 1;
      const rows = [], outputs = new Float32Array(T * dk);
      for (let t = 0; t < T; t++) {
        const s = fiveSteps(q[h][t], keys, vs, past + t, options); // the five steps, for query t
        rows.push(s.weights);
        for (let d = 0; d < dk; d++) outputs[t * dk + d] = on * s.output[d];
      }
      for (const patch of (options.patches || []).filter((p) => p.head === h)) patched(model, layer, patch, outputs, options.deltas);
      for (let t = 0; t < T; t++) merged.set(outputs.subarray(t * dk, (t + 1) * dk), t * HD + h * dk);
      weights.push(rows);
      heads.push(outputs);
    }
    if (record) Object.assign(record, { q, k: cache.k[layer], v: cache.v[layer], weights, heads });
    return linear(merged, T, param(model, `${prefix}.c_proj.weight`), param(model, `${prefix}.c_proj.bias`)); // W_O
  }

  // QK-norm of block `layer` (Qwen3's): {q, k}, each a d_k-vector -> itself normed (the identity
  // where the model has none)
  function qkNorm(model, layer) {
    const c = model.config;
    if (!c.qk_norm) return { q: (v) => v, k: (v) => v };
    const gain = (which) => values(param(model, `transformer.h.${layer}.attn.${which}_norm.weight`));
    const [gq, gk] = [gain("q"), gain("k")];
    return { q: (v) => Float32Array.from(qkNormed(v, gq, c.norm_eps)), k: (v) => Float32Array.from(qkNormed(v, gk, c.norm_eps)) };
  }

  // Activation patching (model/trace.py's Patch): {layer, head (null: the block's feed-forward
  // network), value (another pass's output: a head's [T, d_k], a network's [T, C]), where [T] of 0
  // and 1, path}. On path "all" the output is replaced where `where` says; on "direct" or "ffn"
  // it stays, and the difference value − own, through the head's columns of W_O, is added to
  // deltas[path]: the final norm's input, or this block's ln_2 input, alone reads it.
  function patched(model, layer, patch, outputs, deltas) {
    const { n_embd: C, head_size: dk, heads_width: HD } = model.config;
    const width = patch.head === null ? C : dk;
    const T = outputs.length / width;
    if (patch.path === "all") {
      for (let t = 0; t < T; t++) {
        if (!patch.where[t]) continue;
        for (let d = 0; d < width; d++) outputs[t * width + d] = patch.value[t * width + d];
      }
      return;
    }
    const wO = values(param(model, `transformer.h.${layer}.attn.c_proj.weight`)); // [C, H d_k]
    const delta = deltas[patch.path];
    for (let t = 0; t < T; t++) {
      if (!patch.where[t]) continue;
      for (let i = 0; i < C; i++) {
        let sum = 0;
        for (let d = 0; d < dk; d++) sum += wO[i * HD + patch.head * dk + d] * (patch.value[t * dk + d] - outputs[t * dk + d]);
        delta[t * C + i] += sum;
      }
    }
  }

  // ---- the whole pass ------------------------------------------------------------------------

  // ids (the new tokens; the cache holds those before them) -> { logits [T, V] } and, with
  // trace, every piece explorer/data.py's page_data shows (model/trace.py's Trace):
  // embedding -> positions -> blocks (pre-LN x + Attn(LN(x)), x + FFN(LN(x)); post-LN
  // LN(x + Attn(x)), LN(x + FFN(x))) -> final norm -> LM head. options: scale, mask (false:
  // the experiments, in every head), off ([L][H] of 0 or 1: heads switched off), patches
  // (activation patching, pre-LN: patched's).
  function forward(model, ids, { cache = newCache(model), trace = false, scale = true, mask = true, off = null,
    patches = [] } = {}) {
    const c = model.config;
    const T = ids.length;
    const C = c.n_embd;
    const past = cache.length;
    if (past + T > c.block_size) throw new Error(`sequence of ${past + T} tokens is longer than block_size=${c.block_size}`);
    const wte = values(param(model, "transformer.wte.weight"));
    const token = new Float32Array(T * C);
    ids.forEach((id, t) => token.set(wte.subarray(id * C, (id + 1) * C), t * C));
    const position = positionVectors(model, past, T);
    let x = position ? add(token, position) : token;
    const layers = [];
    const direct = patches.some((p) => p.path === "direct") ? new Float32Array(T * C) : null; // (the final norm's alone)
    for (let l = 0; l < c.n_layer; l++) {
      const b = `transformer.h.${l}`;
      const record = trace ? { residual_in: x } : null;
      const own = patches.filter((p) => p.layer === l);
      const deltas = { direct, ffn: own.some((p) => p.path === "ffn") ? new Float32Array(T * C) : null };
      const options = { scale, mask, off: off && off[l], patches: own.filter((p) => p.head !== null), deltas };
      let normed, attended, normed2, fed;
      if (c.norm_position === "pre") {
        normed = normalised(model, `${b}.ln_1`, x, T);
        attended = attention(model, l, normed, T, cache, options, record);
        x = add(x, attended);
        normed2 = c.mlp === "none" ? new Float32Array(T * C) : normalised(model, `${b}.ln_2`, deltas.ffn ? add(x, deltas.ffn) : x, T);
        fed = feedForward(model, `${b}.mlp`, normed2, T);
        for (const patch of own.filter((p) => p.head === null)) patched(model, l, patch, fed.output, deltas);
        x = add(x, fed.output);
      } else {
        attended = attention(model, l, x, T, cache, options, record);
        x = normed = normalised(model, `${b}.ln_1`, add(x, attended), T);
        fed = feedForward(model, `${b}.mlp`, x, T);
        normed2 = c.mlp === "none" ? new Float32Array(T * C) : normalised(model, `${b}.ln_2`, add(x, fed.output), T);
        if (c.mlp !== "none") x = normed2;
      }
      if (trace) layers.push(Object.assign(record, { ln_1: normed, attn: attended, ln_2: normed2, mlp_hidden: fed.hidden,
        mlp: fed.output, residual_out: x }));
    }
    cache.length += T;
    const lnF = finalNorm(model, direct ? add(x, direct) : x, T);
    const logits = lmHead(model, lnF, T);
    return trace ? { token, position, layers, ln_f: lnF, logits } : { logits };
  }

  // ln_f (pre-LN; post-LN blocks already end in a norm) and the LM head (tied: wte's matrix)
  const finalNorm = (model, x, T) => (model.config.norm_position === "pre" ? normalised(model, "transformer.ln_f", x, T) : x);
  const lmHead = (model, x, T) => linear(x, T, param(model, "lm_head.weight") ?? param(model, "transformer.wte.weight"), null);

  // ---- generation ----------------------------------------------------------------------------

  // Yields the next token, `count` times, sampled from the logits by the page's rule
  // (nextTokenProbabilities, model/sampling.py's): the prompt runs once, then each step runs only
  // the new token against the cache. The model sees the last block_size tokens; once that window
  // slides, every stored key would change, so it runs the window afresh (as GPT.generate does).
  function* generate(model, ids, count, sampling, random = Math.random) {
    const seq = ids.slice();
    let cache = null;
    for (let n = 0; n < count; n++) {
      let logits;
      if (cache === null || cache.length === model.config.block_size) {
        cache = newCache(model);
        logits = forward(model, seq.slice(-model.config.block_size), { cache }).logits;
      } else {
        logits = forward(model, seq.slice(-1), { cache }).logits;
      }
      const next = draw(nextTokenProbabilities(lastRow(logits, model.config.vocab_size), sampling), random());
      seq.push(next);
      yield next;
    }
  }

  function draw(probs, u) { // the token whose share of [0, 1) holds u
    let total = 0;
    for (let i = 0; i < probs.length; i++) {
      total += probs[i];
      if (u < total) return i;
    }
    return probs.findLastIndex((p) => p > 0);
  }

  return { withWeights, cAttnOf, forward, linear, normalised, feedForward, finalNorm, lmHead, rotate, qkNorm, generate,
    erf, ACTIVATIONS };
})();
