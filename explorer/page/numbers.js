// The explorer's arithmetic, kept apart from the drawing: the page's arrays decoded, the
// vector helpers every other script uses, and the few things the page computes itself, each
// the lesson of a panel: the five steps of one head from its q, k and v (with the scale or
// the mask switched off, as an experiment), q = LN(x) W + b written out as a sum of products,
// RoPE's angles, a norm's mean and spread, and the next-token distribution under the
// learner's sampling settings (the rule of model/sampling.py, tested against it).
// Each script of the page is one namespace (here Numbers); the others take what they use
// from it by name.
const Numbers = (() => {
  "use strict";

  // ---- the data's arrays: {"dtype": "float32" or "float16", "shape": [...], "base64": "..."} ----

  const decodedArrays = new WeakMap();

  // An array the page made itself (data.js) carries its numbers as they are: {dtype, shape, data}
  const tensor = (shape, data) => ({ dtype: "float32", shape, data });

  // IEEE half precision -> float32 (the snapshots' weights travel in float16: half the size)
  function fromHalves(halves) {
    const out = new Float32Array(halves.length);
    for (let i = 0; i < halves.length; i++) {
      const h = halves[i];
      const sign = h & 0x8000 ? -1 : 1;
      const exponent = (h >> 10) & 0x1f;
      const fraction = h & 0x3ff;
      out[i] = exponent === 0 ? sign * 2 ** -14 * (fraction / 1024) // subnormal
        : exponent === 31 ? (fraction ? NaN : sign * Infinity)
          : sign * 2 ** (exponent - 15) * (1 + fraction / 1024);
    }
    return out;
  }

  function values(a) { // the array's numbers as one Float32Array, decoded once
    if (a.data) return a.data;
    if (!decodedArrays.has(a)) {
      const bytes = Uint8Array.from(atob(a.base64), (c) => c.charCodeAt(0));
      decodedArrays.set(a, a.dtype === "float16" ? fromHalves(new Uint16Array(bytes.buffer)) : new Float32Array(bytes.buffer));
    }
    return decodedArrays.get(a);
  }

  function rowOf(a, i) { // row i of a 2-D array [rows, columns], as a plain array
    const width = a.shape[a.shape.length - 1];
    return Array.from(values(a).subarray(i * width, (i + 1) * width));
  }

  function rows(a) { // a 2-D array as an array of rows
    return Array.from({ length: a.shape[0] }, (_, i) => rowOf(a, i));
  }

  const lastRow = (matrix, width) => Array.from(matrix.subarray(matrix.length - width)); // of a flat [T, width]

  // ---- vectors ------------------------------------------------------------------------------

  function dot(a, b) {
    let sum = 0;
    for (let d = 0; d < a.length; d++) sum += a[d] * b[d];
    return sum;
  }

  const add = (a, b) => a.map((x, i) => x + b[i]); // (a Float32Array stays one)
  const norm = (vector) => Math.sqrt(dot(vector, vector));

  // e^(x − max) / Σ e^(x − max): the largest score is subtracted first, so that no e^x overflows
  function softmax(scores) {
    const max = Math.max(...scores);
    if (max === -Infinity) return scores.map(() => 0);
    const exps = scores.map((v) => Math.exp(v - max));
    const total = exps.reduce((a, b) => a + b, 0);
    return exps.map((e) => e / total);
  }

  function logSoftmax(row) {
    const max = Math.max(...row);
    const total = row.reduce((sum, x) => sum + Math.exp(x - max), 0);
    return Array.from(row, (x) => x - max - Math.log(total));
  }

  // The indices of the k largest of a row by `key`, largest first (one pass, keeping the best k)
  function largest(row, k, key = (x) => x) {
    const best = [];
    for (let i = 0; i < row.length; i++) {
      const value = key(row[i]);
      if (best.length === k && value <= key(row[best[k - 1]])) continue;
      const at = best.findIndex((j) => value > key(row[j]));
      best.splice(at === -1 ? best.length : at, 0, i);
      if (best.length > k) best.pop();
    }
    return best;
  }

  // ---- the five steps, for one head and one query ------------------------------------------

  // Attention for query number `query` (its position: the keys after it are the future) over
  // every key: model/attention.py's five steps, for one row. The page's steps panel shows
  // each step's numbers; model.js runs it for every head and query of the model.
  function fiveSteps(q, keys, vs, query, { scale = true, mask = true } = {}) {
    const dk = q.length;
    const factor = scale ? 1 / Math.sqrt(dk) : 1;
    const scores = keys.map((k) => dot(q, k)); // 1. similarity q·k for every key
    const scaled = scores.map((s) => s * factor); // 2. scale by 1/√d_k
    const masked = scaled.map((s, j) => (mask && j > query ? -Infinity : s)); // 3. causal mask
    const exps = masked.map((s) => Math.exp(s)); // 4. softmax: e^score / Σ e^score
    const total = exps.reduce((a, b) => a + b, 0);
    // (without the scale a score can pass e^709, where e^score overflows: then the same weights
    // from softmax, which subtracts the largest score first)
    const weights = Number.isFinite(total) && total > 0 ? exps.map((e) => e / total) : softmax(masked);
    const output = new Array(dk).fill(0); // 5. weighted sum Σ_j w_j v_j
    vs.forEach((v, j) => { if (weights[j]) for (let d = 0; d < dk; d++) output[d] += weights[j] * v[d]; });
    return { dk, factor, scores, scaled, masked, exps, total, weights, output };
  }

  // ---- where q, k and v come from: one head's slice of x W + b --------------------------------

  // c_attn's weight is [H·d_k + 2·H_kv·d_k, C] (out × in, as nn.Linear stores it; H·d_k = C
  // unless the model sets head_dim): the rows of q (H heads of d_k), then of k, then of v (H_kv
  // heads each: grouped-query attention shares key/value head h / (H / H_kv) among its group);
  // coordinate d of head h is one row.
  function projectionTerms(cAttn, which, head, dim, x, config) {
    const { heads_width: HD, head_size: dk, n_head: H } = config;
    const kv = config.n_kv_head ?? H;
    const start = { q: 0, k: HD, v: HD + kv * dk }[which];
    const row = start + (which === "q" ? head : Math.floor(head / (H / kv))) * dk + dim;
    const weights = rowOf(cAttn.weight, row); // [3C, C]: one row per output coordinate
    const bias = cAttn.bias ? values(cAttn.bias)[row] : 0;
    const terms = x.map((xi, c) => xi * weights[c]);
    return { terms, weights, bias, value: terms.reduce((a, b) => a + b, 0) + bias };
  }

  function projected(cAttn, which, head, x, config) { // the head's q (or k, v) before any rotation
    return Array.from({ length: config.head_size }, (_, d) => projectionTerms(cAttn, which, head, d, x, config).value);
  }

  // RoPE (model/positional.py): dims i and i + d_k/2 turn by position · θ_i, where θ_i are the
  // model's own frequencies (base^(-2i/d_k), stretched where it has Llama 3's rope_scaling)
  function ropeAngles(position, frequencies) {
    return frequencies.map((theta) => position * theta);
  }

  // QK-norm (model/attention.py's q_norm and k_norm, Qwen3's): a head's q (or k) divided by its
  // root mean square and scaled by the gain, coordinate by coordinate. `divisor`, where given, is
  // the whole vector's: a piece of it (sources.js) is divided by the same, and the pieces still add up.
  function qkNormed(vector, gain, eps, divisor = normStatistics(vector, "rmsnorm", eps).divisor) {
    return Array.from(vector, (x, d) => (x / divisor) * gain[d]);
  }

  // What a norm divides by, and what it takes away first: LayerNorm (x − mean) / √(var + ε),
  // RMSNorm x / √(mean(x²) + ε) (its mean taken as 0)
  function normStatistics(x, kind, eps) {
    let mean = 0;
    if (kind === "layernorm") {
      for (let i = 0; i < x.length; i++) mean += x[i];
      mean /= x.length;
    }
    let spread = 0; // the variance (LayerNorm) or the mean square (RMSNorm)
    for (let i = 0; i < x.length; i++) spread += (x[i] - mean) ** 2;
    return { mean, divisor: Math.sqrt(spread / x.length + eps) };
  }

  // ---- the next-token distribution: model/sampling.py's rule --------------------------------

  function nextTokenProbabilities(logits, sampling) {
    let scores = logits.slice();
    for (const id of sampling.suppress) scores[id] = -Infinity;
    if (sampling.temperature === 0) { // greedy: all the mass on the likeliest allowed token
      const best = scores.indexOf(Math.max(...scores));
      return scores.map((_, i) => (i === best ? 1 : 0));
    }
    scores = scores.map((v) => v / sampling.temperature);
    if (sampling.topK !== null && sampling.topK < scores.length) {
      const kth = scores.slice().sort((a, b) => b - a)[sampling.topK - 1];
      scores = scores.map((v) => (v < kth ? -Infinity : v));
    }
    if (sampling.topP !== null && sampling.topP < 1) {
      const order = scores.map((_, i) => i).sort((a, b) => scores[b] - scores[a]);
      const probs = softmax(order.map((i) => scores[i]));
      let before = 0; // probability of the tokens ranked above this one
      order.forEach((id, rank) => {
        if (before >= sampling.topP) scores[id] = -Infinity; // the ones above already reach top_p
        before += probs[rank];
      });
    }
    return softmax(scores);
  }

  // Which setting removed a token from the distribution: "suppressed", "topK", "topP" or null.
  function cutBy(logits, sampling, id) {
    if (sampling.suppress.includes(id)) return "suppressed";
    if (sampling.temperature === 0) return null;
    const allowed = logits.map((v, i) => (sampling.suppress.includes(i) ? -Infinity : v / sampling.temperature));
    const rank = allowed.filter((v) => v > allowed[id]).length; // tokens above this one
    if (sampling.topK !== null && rank >= sampling.topK) return "topK";
    const keptByK = nextTokenProbabilities(logits, { ...sampling, topP: null });
    if (sampling.topP !== null && keptByK[id] > 0 && nextTokenProbabilities(logits, sampling)[id] === 0) return "topP";
    return null;
  }

  return { tensor, values, rowOf, rows, lastRow, add, dot, norm, softmax, logSoftmax, largest, fiveSteps,
    projectionTerms, projected, ropeAngles, normStatistics, qkNormed, nextTokenProbabilities, cutBy };
})();
