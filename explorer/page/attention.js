// The attention panels: the picked token's embedding; every head's map and the picked query's
// row in each; the picked head's map with its labels and its lines; where its q, k and v come
// from (each coordinate a sum of products); the five steps, complete, with the experiments
// on them (no 1/√d_k, no causal mask); and where the picked score comes from (sources.js).
const AttentionPanels = (() => {
  "use strict";
  const { t, word } = Page;
  const { rowOf, rows, fiveSteps, projectionTerms, projected, ropeAngles, normStatistics, norm } = Numbers;
  const { el, $, fmt, tokenLabel, index, axisLabel, vectorBox, vectorRow, colour, diverging, drawMap, drawLabels,
    svg } = View;

  const layerData = (l) => Page.data.layers[l];
  const residualOut = (l) => rowOf(l + 1 < Page.data.layers.length ? layerData(l + 1).residual_in : layerData(l).residual_out,
    Page.view().query);

  // what the attention layer projects to q, k and v: LN(x) with pre-LN; x itself with post-LN
  // (inputName: how the page writes it)
  const inputName = () => (Page.data.config.norm_position === "post" ? "x" : "LN(x)");
  const attentionInput = (layer, position) => rowOf(Page.data.config.norm_position === "post" ? layer.residual_in : layer.ln_1,
    position);

  function headVectors(l, h) { // q, k, v and weights of one head, as rows
    const head = layerData(l).heads[h];
    return { q: rows(head.q), k: rows(head.k), v: rows(head.v), weights: rows(head.weights), output: rows(head.output) };
  }


  // ---- 1. from token to vector ---------------------------------------------------------------

  function renderEmbedding() {
    const v = Page.view();
    const c = Page.data.config;
    const token = Page.data.tokens[v.query];
    const wte = rowOf(Page.data.embedding.token, v.query);
    const box = $("embedding");
    $("embedding-title").textContent = t("embeddingTitle", { query: v.query, text: tokenLabel(token) });
    const stored = c.tie_embeddings ? t("embeddingTied", { id: token.id })  // (where a learner finds the row in the file)
      : t("embeddingStored", { id: token.id, name: "transformer.wte.weight" });
    box.replaceChildren(el("p", { class: "note", text: t("embeddingId", { id: token.id, vocab: c.vocab_size }) + stored }),
      vectorRow(t("wteRow", { id: token.id }), `[C] = [${c.n_embd}]`, wte, "wte"));
    if (Page.data.embedding.position === null) {
      const angles = ropeAngles(v.query, c.rope_frequencies);
      box.append(el("p", { class: "note", id: "rope-angle", "data-value": angles[0], text: t("ropeEmbedding", {
        query: v.query, first: fmt(angles[0], 4), last: fmt(angles[angles.length - 1], 6), half: angles.length - 1 }) }));
    } else {
      box.append(vectorRow(t("positionRow", { query: v.query, kind: word("positions", c.pos_encoding) }),
        `[C] = [${c.n_embd}]`, rowOf(Page.data.embedding.position, v.query), "position"));
    }
    box.append(vectorRow(t(Page.data.embedding.position === null ? "streamInRope" : "streamIn"), `[C] = [${c.n_embd}]`,
      rowOf(layerData(0).residual_in, v.query), "sum"));
  }

  // ---- every layer and head; one query across them all ------------------------------------------

  let gridDrawn = null; // the data and language the grid was drawn for: redrawn only when they change

  function renderGrid() {
    const grid = $("grid");
    const v = Page.view();
    if (gridDrawn !== `${Page.version} ${Page.state.lang}`) {
      gridDrawn = `${Page.version} ${Page.state.lang}`;
      grid.replaceChildren();
      const cell = Math.max(1, Math.floor(96 / Page.data.tokens.length));
      grid.style.gridTemplateColumns = `auto repeat(${Page.data.config.n_head}, auto)`;
      grid.append(el("span"));
      for (let h = 0; h < Page.data.config.n_head; h++) grid.append(el("span", { class: "axis", text: t("headN", { n: h }) }));
      Page.data.layers.forEach((layer, l) => {
        grid.append(el("span", { class: "axis", text: t("layerN", { n: l }) }));
        layer.heads.forEach((head, h) => {
          const canvas = el("canvas", { class: "thumb", "data-layer": l, "data-head": h,
            title: t("layerHead", { layer: l, head: h }) });
          drawMap(canvas, rows(head.weights), cell, null);
          canvas.addEventListener("mouseenter", () => Page.preview({ layer: l, head: h }));
          canvas.addEventListener("mouseleave", () => Page.preview(null));
          canvas.addEventListener("click", () => Page.choose({ layer: l, head: h, coordinate: null }));
          grid.append(canvas);
        });
      });
    }
    for (const canvas of grid.querySelectorAll("canvas")) {
      canvas.classList.toggle("selected", Number(canvas.dataset.layer) === v.layer && Number(canvas.dataset.head) === v.head);
    }
  }

  function renderQueryGrid() { // the picked query's row of weights in every layer and head at once
    const v = Page.view();
    const T = Page.data.tokens.length;
    const box = $("query-grid");
    $("query-title").textContent = t("queryTitle", { query: v.query, text: tokenLabel(Page.data.tokens[v.query]) });
    box.replaceChildren();
    box.style.gridTemplateColumns = `auto repeat(${Page.data.config.n_head}, auto)`;
    box.append(el("span"));
    for (let h = 0; h < Page.data.config.n_head; h++) box.append(el("span", { class: "axis", text: t("headN", { n: h }) }));
    const cell = Math.max(2, Math.floor(160 / T));
    Page.data.layers.forEach((layer, l) => {
      box.append(el("span", { class: "axis", text: t("layerN", { n: l }) }));
      layer.heads.forEach((head, h) => {
        const weights = rowOf(head.weights, v.query);
        const strip = el("canvas", { class: "strip", "data-layer": l, "data-head": h, "data-values": JSON.stringify(weights),
          title: t("layerHead", { layer: l, head: h }) });
        strip.width = T * cell;
        strip.height = 14;
        const ctx = strip.getContext("2d");
        weights.forEach((w, j) => { ctx.fillStyle = colour(j > v.query ? null : w); ctx.fillRect(j * cell, 0, cell, 14); });
        strip.addEventListener("click", () => Page.choose({ layer: l, head: h, coordinate: null }));
        box.append(strip);
      });
    });
  }

  // ---- the picked head: its map, with token labels, and its lines ------------------------------

  const MAP_MARGIN = 64; // pixels of the map's canvas left for the token labels

  function mapCellSize() {
    return Math.max(2, Math.min(24, Math.floor(480 / Page.data.tokens.length)));
  }

  function renderMap() {
    const v = Page.view();
    const { weights } = headVectors(v.layer, v.head);
    const cell = mapCellSize();
    $("map-title").textContent = t("mapTitle", { layer: v.layer, head: v.head });
    const ctx = drawMap($("map"), weights, cell, v.query, MAP_MARGIN);
    const every = drawLabels(ctx, cell, MAP_MARGIN);
    $("labels-note").textContent = every > 1 ? t("labelsEvery", { every }) : "";
    const c = Page.data.config;
    $("position-note").textContent = c.pos_encoding === "rope" ? t("ropeNote")
      : t("additiveNote", { kind: word("positions", c.pos_encoding) });
    renderHeadView(weights, v.query);
  }

  function mapCell(event) {
    const canvas = $("map");
    const T = Page.data.tokens.length;
    const box = canvas.getBoundingClientRect();
    const scale = canvas.width / box.width; // CSS pixels to canvas pixels
    const cell = mapCellSize();
    const i = Math.floor(((event.clientY - box.top) * scale - MAP_MARGIN) / cell);
    const j = Math.floor(((event.clientX - box.left) * scale - MAP_MARGIN) / cell);
    return i >= 0 && i < T && j >= 0 && j < T ? { query: i, key: j } : null;
  }

  function showReadout(cell) {
    const v = Page.view();
    if (!cell) { $("map-readout").textContent = ""; return; }
    const w = headVectors(v.layer, v.head).weights[cell.query][cell.key];
    $("map-readout").textContent = t("readout", {
      query: cell.query, qtext: tokenLabel(Page.data.tokens[cell.query]), key: cell.key,
      ktext: tokenLabel(Page.data.tokens[cell.key]), weight: cell.key > cell.query ? t("maskedWord") : fmt(w, 6) });
  }

  // bertviz's "head view": the tokens twice, queries on the left and keys on the right, a line
  // from each query to each key it may see, as thick as its weight; the picked query's in red.
  function renderHeadView(weights, query) {
    const T = Page.data.tokens.length;
    const step = 16, width = 300, height = T * step + 8;
    const box = svg("svg", { width, height, viewBox: `0 0 ${width} ${height}`, id: "head-lines" });
    Page.data.tokens.forEach((token, i) => {
      for (const [x, anchor] of [[95, "end"], [205, "start"]]) {
        const label = svg("text", { x, y: 12 + i * step, "text-anchor": anchor, class: i === query ? "picked" : "" });
        label.textContent = axisLabel(i).slice(0, 14);
        box.append(label);
      }
    });
    weights.forEach((row, i) => row.forEach((w, j) => {
      if (j > i || w < 0.01) return; // masked, or too faint to draw
      const line = svg("line", { x1: 100, y1: 8 + i * step, x2: 200, y2: 8 + j * step, "data-query": i, "data-key": j,
        "data-value": w, "stroke-width": (0.5 + 5 * w).toFixed(2),
        stroke: i === query ? "rgb(214, 40, 40)" : "rgb(59, 82, 139)", "stroke-opacity": i === query ? 0.9 : 0.15 * w + 0.03 });
      box.append(line);
    }));
    $("head-view").replaceChildren(box);
  }

  // ---- 2. where q, k and v come from -----------------------------------------------------------

  function renderQKV() {
    const v = Page.view();
    const c = Page.data.config;
    const layer = layerData(v.layer);
    const x = attentionInput(layer, v.query); // what this layer projects, for the query token
    const stats = normStatistics(rowOf(layer.residual_in, v.query), c.norm, c.norm_eps ?? 1e-5);
    const key = v.key ?? v.query;
    const head = headVectors(v.layer, v.head);
    const box = $("qkv");
    $("qkv-title").textContent = t("qkvTitle", { layer: v.layer, head: v.head, query: v.query, key });
    $("qkv-note").textContent = t("qkvNote", { input: inputName() });
    const normNote = c.norm_position === "post" ? t("postNormNote")
      : c.norm === "rmsnorm" ? t("rmsNote", { rms: fmt(stats.divisor, 6) })
        : t("layerNormNote", { mean: fmt(stats.mean, 6), std: fmt(stats.divisor, 6) });
    box.replaceChildren(el("p", { class: "note", id: "norm-stats", text: normNote }),
      vectorRow(c.norm_position === "post" ? t("streamRow") : t("lnRow", { norm: word("norms", c.norm) }),
        `[C] = [${c.n_embd}]`, x, "ln_1"));
    if (!layer.c_attn) {
      box.append(el("p", { class: "note", text: t("weightsLeftOut") }));
    }
    const kvs = c.n_kv_head ?? c.n_head;
    if (kvs < c.n_head) { // grouped-query attention: say whose k and v these are
      const group = c.n_head / kvs, kv = Math.floor(v.head / group);
      box.append(el("p", { class: "note", id: "shared-kv", text: t("sharedKV", { kv, kvs, first: kv * group,
        last: kv * group + group - 1 }) }));
    }
    for (const [which, position] of [["q", v.query], ["k", key], ["v", key]]) {
      box.append(projectionRow(which, position, head[which][position]));
    }
    renderTermsOfProjection(layer, v);
  }

  function projectionRow(which, position, traced) {
    const v = Page.view();
    const c = Page.data.config;
    const row = el("div", { class: "vector-row", "data-which": which });
    row.append(el("h4", { text: t(`${which}Row`, { position, text: tokenLabel(Page.data.tokens[position]) }) }));
    const turned = (c.pos_encoding === "rope" || c.qk_norm) && which !== "v"; // (q and k go on past W)
    const layer = layerData(v.layer);
    if (!layer.c_attn) { // too large to embed: the model's vector alone
      row.append(vectorBox(traced, `${which}-model`));
    } else if (turned) { // RoPE, QK-norm: computed from the weights before them, the model's after them
      const before = projected(layer.c_attn, which, v.head, attentionInput(layer, position), c);
      row.append(el("p", { class: "note", text: t(c.qk_norm ? "beforeQkNorm" : "beforeRotation", { position, input: inputName() }) }),
        coordinates(before, which, position, `${which}-before`),
        el("p", { class: "note", text: t(c.qk_norm ? "afterQkNorm" : "afterRotation", { position }) }),
        vectorBox(traced, `${which}-model`));
    } else { // the model's own vector, each coordinate a sum of products to click
      row.append(el("p", { class: "note", text: t("modelVector", { input: inputName() }) }), coordinates(traced, which, position, `${which}-model`));
    }
    return row;
  }

  function coordinates(vector, which, position, name) { // one button per coordinate: click for its sum
    const box = el("p", { class: "vector mono coordinates", "data-name": name, "data-values": JSON.stringify(vector) });
    vector.forEach((x, d) => {
      const button = el("button", { type: "button", class: "coordinate", "data-dim": d, text: fmt(x, 3),
        title: t("clickCoordinate") });
      button.addEventListener("click", () => Page.choose({ coordinate: { which, position, dim: d } }));
      box.append(button);
    });
    return box;
  }

  function renderTermsOfProjection(layer, v) {
    const box = $("projection-terms");
    box.replaceChildren();
    const c = Page.data.config;
    if (!v.coordinate || !layer.c_attn) { box.append(el("p", { class: "note", text: t("projectionHint") })); return; }
    const { which, position, dim } = v.coordinate;
    const x = attentionInput(layer, position);
    const { terms, weights, bias, value } = projectionTerms(layer.c_attn, which, v.head, dim, x, c);
    box.append(el("h3", { text: t("projectionTitle", { which, dim, position, C: c.n_embd, input: inputName() }) }));
    const list = el("ul", { class: "terms" });
    terms.forEach((term, i) => list.append(el("li", { "data-value": term,
      text: `${inputName()}[${i}] · W[${i}] = ${fmt(x[i], 3)} × ${fmt(weights[i], 3)} = ${fmt(term, 4)}` })));
    box.append(list, el("p", { class: "sum", "data-value": value,
      text: t("projectionSum", { C: c.n_embd, bias: fmt(bias, 4), value: fmt(value, 6), input: inputName() }) }));
  }

  // ---- 3. the five steps, complete, and the experiments on them --------------------------------

  function renderSteps() {
    const v = Page.view();
    const head = headVectors(v.layer, v.head);
    const s = fiveSteps(head.q[v.query], head.k, head.v, v.query);
    const experiment = v.noScale || v.noMask ? fiveSteps(head.q[v.query], head.k, head.v, v.query,
      { scale: !v.noScale, mask: !v.noMask }) : null;
    const future = Page.data.tokens.length - 1 - v.query;
    $("steps-title").textContent = t("stepsTitle", { layer: v.layer, head: v.head, query: v.query,
      text: tokenLabel(Page.data.tokens[v.query]) });
    const name = (step) => word("steps", step);
    $("step-1").textContent = t("step1", { name: name("similarity"), dk: s.dk,
      rotated: Page.data.config.pos_encoding === "rope" ? t("rotatedQK") : "" });
    $("step-2").textContent = t("step2", { name: name("scale"), dk: s.dk, scale: s.factor.toFixed(6) });
    $("step-3").textContent = future ? t("step3", { name: name("mask"), count: future }) : t("step3none", { name: name("mask") });
    $("step-4").textContent = t("step4", { name: name("softmax"), total: sumText(s.total),
      sum: s.weights.reduce((a, b) => a + b, 0).toFixed(6) });
    $("step-5").textContent = t("step5", { name: name("weighted_sum"), dk: s.dk });
    $("experiment-head").textContent = experiment ? t("colExperiment") : "";
    const contributions = head.v.map((vector, j) => vector.map((x) => s.weights[j] * x)); // step 5's terms, w_j v_j
    stepRows(s, contributions, experiment, v);
    $("weights-sum").textContent = `Σ = ${s.weights.reduce((a, b) => a + b, 0).toFixed(6)}`;
    $("exps-sum").textContent = `Σ = ${sumText(s.total)}`;
    $("exps-sum").dataset.value = s.total;
    renderTerms(head, v, s);
    renderOutput(head, v, s, contributions, experiment);
  }

  // Σ e^score: six decimals while it is small; past a million (the scores of a head that was
  // never scaled) in six significant digits, not seventeen
  const sumText = (total) => (Math.abs(total) < 1e6 ? fmt(total, 6) : total.toPrecision(6).replace("e+", "e"));

  function stepRows(s, contributions, experiment, v) {
    const biggest = Math.max(...contributions.map(norm), 1e-12);
    const body = $("steps").tBodies[0];
    body.replaceChildren();
    for (let j = 0; j < s.scores.length; j++) {
      const isMasked = j > v.query;
      const scoreCell = el("td", { class: "num score", "data-step": "1", "data-key": j, "data-value": s.scores[j],
        tabindex: "0", title: t("clickScore"), text: fmt(s.scores[j]) });
      scoreCell.addEventListener("click", () => Page.choose({ key: j }));
      scoreCell.addEventListener("keydown", (e) => { if (e.key === "Enter") Page.choose({ key: j }); });
      const share = norm(contributions[j]);
      const bar = el("span", { class: "bar" });
      bar.style.width = `${(60 * share) / biggest}px`;
      const row = el("tr", { "data-key": j, class: isMasked ? "masked" : "" },
        el("td", { class: "key", text: `${index(j)} ${tokenLabel(Page.data.tokens[j])}` }), scoreCell,
        el("td", { class: "num", "data-step": "2", "data-value": s.scaled[j], text: fmt(s.scaled[j]) }),
        el("td", { class: "num", "data-step": "3", "data-value": isMasked ? "-Infinity" : s.masked[j],
          text: isMasked ? `−∞ (${t("maskedWord")})` : fmt(s.masked[j]) }),
        el("td", { class: "num", "data-step": "4e", "data-value": s.exps[j], text: isMasked ? "0" : s.exps[j].toPrecision(5) }),
        el("td", { class: "num", "data-step": "4", "data-value": s.weights[j], text: fmt(s.weights[j]) }),
        el("td", { class: "contribution", "data-step": "5", "data-value": share },
          bar, el("span", { class: "num", text: isMasked ? "0" : fmt(share, 3) })),
        el("td", { class: "num experiment", "data-step": "x", "data-value": experiment ? experiment.weights[j] : "",
          text: experiment ? fmt(experiment.weights[j]) : "" }));
      if (j === v.key) row.classList.add("selected");
      body.append(row);
    }
  }

  function renderTerms(head, v, s) {
    const box = $("terms");
    box.replaceChildren();
    if (v.key === null) { box.append(el("p", { class: "note", text: t("termsHint") })); return; }
    const q = head.q[v.query];
    const k = head.k[v.key];
    box.append(el("h3", { text: t("termsTitle", { query: v.query, key: v.key, dk: s.dk }) }));
    const list = el("ul", { class: "terms" });
    q.forEach((x, d) => list.append(el("li", { "data-value": x * k[d],
      text: `q[${d}]·k[${d}] = ${fmt(x, 3)} × ${fmt(k[d], 3)} = ${fmt(x * k[d], 3)}` })));
    box.append(list, el("p", { class: "sum", "data-value": s.scores[v.key],
      text: t("termsSum", { dk: s.dk, value: fmt(s.scores[v.key], 6) }) }));
  }

  function renderOutput(head, v, s, contributions, experiment) {
    const model = head.output[v.query];
    const gap = Math.max(...s.output.map((x, d) => Math.abs(x - model[d])));
    const key = v.key ?? v.query;
    const box = $("output");
    box.replaceChildren(
      el("h3", { text: t("valueTitle", { key, weight: fmt(s.weights[key], 6) }) }),
      vectorRow(t("vjRow", { key }), `[d_k] = [${s.dk}]`, head.v[key], "v_j"),
      vectorRow(t("wvRow", { key }), `[d_k] = [${s.dk}]`, contributions[key], "w_j v_j"),
      el("h3", { text: t("outputTitle", { query: v.query, dk: s.dk }) }),
      el("p", { class: "vector mono", id: "head-output", "data-values": JSON.stringify(s.output),
        text: s.output.map((x) => fmt(x, 3)).join("  ") }),
      el("p", { class: "note", text: t("outputCheck", { gap: gap.toExponential(1) }) }));
    if (experiment) {
      const changed = Math.max(...experiment.output.map((x, d) => Math.abs(x - s.output[d])));
      const title = v.noMask && v.noScale ? "experimentBothTitle" : v.noMask ? "experimentMaskTitle" : "experimentScaleTitle";
      const note = t("experimentNote", { changed: fmt(changed, 4), spread: fmt(Math.max(...experiment.weights), 4),
        own: fmt(Math.max(...s.weights), 4) });
      const why = v.noMask // (without the mask the future keys take weight; without the scale only the spread changes)
        ? t("experimentMaskNote", { future: experiment.weights.slice(v.query + 1).reduce((a, b) => a + b, 0).toFixed(4) })
        : t("experimentScaleNote", { root: Math.sqrt(s.dk).toFixed(3) });
      box.append(el("h3", { text: t(title) }),
        el("p", { class: "vector mono", id: "experiment-output", "data-values": JSON.stringify(experiment.output),
          text: experiment.output.map((x) => fmt(x, 3)).join("  ") }),
        el("p", { class: "note", id: "experiment-note", text: note + t("sentenceGap") + why }));
    }
  }

  // ---- 4. where the score comes from --------------------------------------------------------------

  // A piece of the stream in the page's words: the embedding, the positions, a head, a
  // feed-forward network, a bias, the norm's shift
  function pieceName(name) {
    const head = /^L(\d+)H(\d+)$/.exec(name);
    if (head) return t("layerHead", { layer: Number(head[1]), head: Number(head[2]) });
    const part = /^L(\d+) (FFN|b_O)$/.exec(name);
    if (part) return t(part[2] === "FFN" ? "pieceFfn" : "pieceBias", { layer: Number(part[1]) });
    return t({ token: "pieceToken", position: "piecePosition", shift: "pieceShift" }[name]);
  }

  // The lesson's copies in the text the panels show, where each token is one character: for a
  // query of a second copy, {right, same} (patching.js's copyKeys); else null
  function copyKeys(query) {
    const tokens = Page.data.tokens;
    if (!tokens.every((token) => typeof token.text === "string" && [...token.text].length === 1)) return null;
    return Patching.copyKeys(tokens.map((token) => token.text).join(""), query);
  }

  const topKey = (v) => { // the key the query weighs most
    const weights = rowOf(layerData(v.layer).heads[v.head].weights, v.query).slice(0, v.query + 1);
    return weights.indexOf(Math.max(...weights));
  };

  // The key the sources are shown for: the picked one; else, on a second copy of the lesson's
  // text, the right key (the symbol after the earlier copy of the query's own: an induction
  // head's, whether or not the head looks there yet); else the one the query weighs most
  function sourcesKey(v) {
    if (v.key !== null && v.key <= v.query) return v.key;
    const copied = copyKeys(v.query);
    return copied ? copied.right : topKey(v);
  }

  function renderSources() {
    const v = Page.view();
    const key = sourcesKey(v);
    $("sources-title").textContent = t("sourcesTitle", { layer: v.layer, head: v.head, query: v.query, key,
      text: tokenLabel(Page.data.tokens[v.query]), keyText: tokenLabel(Page.data.tokens[key]) });
    const found = Page.data.config.norm_position !== "pre" ? { why: "sourcesPostLn" }
      : Page.sourcesOf(v.layer, v.head, v.query, key);
    const table = $("sources");
    if (!found || found.why) { // none here (a page that does not run its model: the last token's only), or not yet
      $("sources-note").textContent = t(found ? found.why : "sourcesElsewhere", found ?? {});
      table.tHead.replaceChildren();
      table.tBodies[0].replaceChildren();
      table.tFoot.replaceChildren();
      $("sources-others-title").textContent = "";
      $("sources-others-note").textContent = "";
      $("sources-by-key").replaceChildren();
      $("sources-by-query").replaceChildren();
      return;
    }
    const { pieces, contributions, score, others } = found;
    const total = contributions.flat().reduce((a, b) => a + b, 0);
    const copied = copyKeys(v.query);
    const top = topKey(v);
    $("sources-note").textContent = t("sourcesNote", { layer: v.layer, count: pieces.length - 1, score: fmt(score, 6),
      total: fmt(total, 6) }) + (copied && (v.key === null || v.key > v.query) ? t("sentenceGap") + t("sourcesRightKey") : "")
      + (top !== key ? t("sentenceGap") + t("sourcesTopOther", { top, text: tokenLabel(Page.data.tokens[top]),
        which: copied && top === copied.same ? t("sourcesTopSame") : "" }) : "");
    const biggest = Math.max(...contributions.flat().map(Math.abs), 1e-12);
    table.tHead.replaceChildren(el("tr", {}, el("th", { text: t("sourcesCorner") }),
      ...pieces.map((name) => el("th", { text: pieceName(name) })), el("th", { text: t("sourcesRowTotal") })));
    table.tBodies[0].replaceChildren(...contributions.map((row, a) => el("tr", { "data-piece": pieces[a] },
      el("th", { text: pieceName(pieces[a]) }),
      ...row.map((x, b) => el("td", { class: "num", "data-query": pieces[a], "data-key": pieces[b], "data-value": x,
        style: `background:${diverging(x / biggest)}`, text: fmt(x, 3) })),
      el("td", { class: "num total", "data-value": row.reduce((s, x) => s + x, 0), text: fmt(row.reduce((s, x) => s + x, 0), 3) }))));
    const columns = pieces.map((_, b) => contributions.reduce((s, row) => s + row[b], 0));
    table.tFoot.replaceChildren(el("tr", {}, el("th", { text: t("sourcesColumnTotal") }),
      ...columns.map((x) => el("td", { class: "num total", "data-value": x, text: fmt(x, 3) })),
      el("td", { class: "num total", id: "sources-total", "data-value": total, text: fmt(total, 4) })));
    renderAgainstOthers(v, key, pieces, others);
  }

  // Against the other keys the query may see: how far the picked key's score is above their
  // mean, split by the key's pieces and by the query's
  function renderAgainstOthers(v, key, pieces, others) {
    $("sources-others-title").textContent = others ? t("sourcesOthersTitle", { key, count: v.query }) : "";
    $("sources-others-note").textContent = others ? t("sourcesOthersNote", { gap: fmt(others.gap, 3),
      best: pieceName(pieces[others.key.indexOf(Math.max(...others.key))]) }) : t("sourcesNoOthers");
    for (const [side, id] of [["key", "sources-by-key"], ["query", "sources-by-query"]]) {
      if (!others) { $(id).replaceChildren(); continue; }
      const biggest = Math.max(...others[side].map(Math.abs), 1e-12);
      $(id).replaceChildren(el("h4", { text: t(side === "key" ? "sourcesByKey" : "sourcesByQuery") }),
        ...others[side].map((x, p) => {
          const bar = el("span", { class: "bar" });
          bar.style.width = `${(80 * Math.abs(x)) / biggest}px`;
          bar.style.background = diverging(Math.sign(x));
          return el("p", { class: "source-bar", "data-side": side, "data-piece": pieces[p], "data-value": x },
            el("span", { class: "key", text: pieceName(pieces[p]) }), bar, el("span", { class: "num", text: fmt(x, 3) }));
        }));
    }
  }

  return { renderEmbedding, renderGrid, renderQueryGrid, renderMap, renderQKV, renderSteps, renderSources, mapCell,
    showReadout, layerData, residualOut, pieceName };
})();
