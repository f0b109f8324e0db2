// The explorer: one token followed through the whole model, with the model's own numbers
// (explorer/data.py's, or for a text typed into the page, data.js's from model.js's forward
// pass). This script draws them; what it computes is in numbers.js. Text always goes in
// through textContent, never innerHTML.
"use strict";

const STRINGS = JSON.parse(document.getElementById("explorer-strings").textContent);
const SETTINGS = JSON.parse(document.getElementById("explorer-settings").textContent);
let DATA = JSON.parse(document.getElementById("explorer-data").textContent);
const EXAMPLE = DATA; // the prompt the file was written for, computed by torch (with its timeline)
// the weights and tokenizer, where the page runs the model itself (explorer/data.py's page_model)
const MODEL = JSON.parse(document.getElementById("explorer-model").textContent);
const TOKENIZER = MODEL && new PageTokenizer(MODEL.tokenizer);
// such a page carries W_Q, W_K, W_V once, among the weights (explorer/page.py's render)
if (MODEL && DATA) DATA.layers.forEach((layer, l) => { layer.c_attn ??= cAttnOf(MODEL, l); });
let dataVersion = 0; // counts the data the page has shown (typed texts and the server bring new data)

const state = { lang: SETTINGS.lang, layer: 0, head: 0, query: 0, key: null, locked: false, preview: null,
  noScale: false, noMask: false, ablate: null, coordinate: null, snapshot: null };

// ---- small helpers --------------------------------------------------------------------

// A string of the page's language. Chinese counts from 1 (第 1 层): every number n passed
// in is also there as {n1} = n + 1; English counts from 0, as the code does, and says so.
// A string of the page in its language; a key with a "_one" variant takes it when the count is 1
// ("1 token", not "1 tokens").
function t(key, values = {}) {
  const one = values.count === 1 ? STRINGS[state.lang][`${key}_one`] ?? STRINGS.en[`${key}_one`] : undefined;
  const text = one ?? STRINGS[state.lang][key] ?? STRINGS.en[key] ?? key;
  return text.replace(/\{(\w+)\}/g, (_, name) => String(values[name] ?? ""));
}

const word = (group, name) => STRINGS.words[state.lang][group][name]; // inspection/words.json

function el(tag, attributes = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes)) {
    if (name === "class") node.className = value;
    else if (name === "text") node.textContent = value;
    else node.setAttribute(name, value);
  }
  for (const child of children) node.append(child);
  return node;
}

const $ = (id) => document.getElementById(id);
const count = (n) => n.toLocaleString(state.lang === "zh" ? "zh-CN" : "en");
// a number as the page writes it: a true minus sign, and no "−0.000" for a tiny negative number
const fmt = (x, digits = 4) => (x === -Infinity ? "−∞" : x === Infinity ? "∞"
  : x.toFixed(digits).replace(/^-(?=0\.?0*$)/, "").replace("-", "−"));
// spaces, newlines and tabs made visible, so that every token can be seen; the other control
// characters as their Unicode pictures (U+0017 as ␗), C1 controls and invisible format
// characters (a zero-width space, a right-to-left override) as escapes
const visible = (text) => text.replace(/ /g, "␣").replace(/\n/g, "↵").replace(/\t/g, "⇥").replace(/\r/g, "␍")
  .replace(/[\u0000-\u001f\u007f]/g, (c) => String.fromCharCode(c === "\u007f" ? 0x2421 : 0x2400 + c.charCodeAt(0)))
  .replace(/[\u0080-\u009f]|\p{Cf}/gu, (c) => `\\u{${c.codePointAt(0).toString(16)}}`);
const tokenLabel = (token) => (token.bytes ? `⟨${token.bytes}⟩` : visible(token.text));
// where there is room for a few characters only (the maps' axes): a token that holds part of
// a character shows that character, in brackets, instead of its bytes
const axisLabel = (i) => `${index(i)} ${DATA.tokens[i].bytes ? `⟨${visible(DATA.tokens[i].joined)}⟩` : tokenLabel(DATA.tokens[i])}`;
const textOf = (id) => visible(DATA.texts[String(id)] ?? `#${id}`);
const index = (i) => t("tokenIndex", { i }); // a token's index, the code's: from 0 in both languages

// A vector on screen: its numbers as text, the exact values in data-values (tests read them).
function vectorBox(vector, name, digits = 3) {
  return el("p", { class: "vector mono", "data-name": name, "data-values": JSON.stringify(vector),
    text: vector.map((x) => fmt(x, digits)).join("  ") });
}

// The same vector as a strip of colours, so that a pattern shows before it is read: blue
// below 0, white at 0, red above, scaled to the largest magnitude in the vector; each cell
// says its number on hover.
function vectorStrip(vector, name) {
  const largest = Math.max(...vector.map(Math.abs), 1e-12);
  return el("div", { class: "strip-cells", "data-strip": name, "aria-hidden": "true" },
    ...vector.map((x, i) => el("span", { title: `[${i}] ${fmt(x, 4)}`, style: `background:${diverging(x / largest)}` })));
}

function diverging(x) { // x in [-1, 1] -> blue, white, red
  const a = Math.min(1, Math.abs(x));
  const [r, g, b] = x < 0 ? [59, 82, 139] : [214, 40, 40];
  return `rgb(${Math.round(255 + (r - 255) * a)}, ${Math.round(255 + (g - 255) * a)}, ${Math.round(255 + (b - 255) * a)})`;
}

function vectorRow(label, shape, vector, name) {
  return el("div", { class: "vector-row" }, el("h4", {}, el("span", { text: label }), " ",
    el("span", { class: "shape mono", text: shape })), vectorStrip(vector, name), vectorBox(vector, name));
}

// ---- the picked token's numbers, from the data -----------------------------------------

function view() {
  return state.preview ? { ...state, ...state.preview } : state;
}

const layerData = (l) => DATA.layers[l];
const residualOut = (l) => rowOf(l + 1 < DATA.layers.length ? layerData(l + 1).residual_in : layerData(l).residual_out,
  view().query);

// what the attention layer projects to q, k and v: LN(x) with pre-LN; x itself with post-LN
// (inputName: how the page writes it)
const inputName = () => (DATA.config.norm_position === "post" ? "x" : "LN(x)");
const attentionInput = (layer, position) => rowOf(DATA.config.norm_position === "post" ? layer.residual_in : layer.ln_1,
  position);

function headVectors(l, h) { // q, k, v and weights of one head, as rows
  const head = layerData(l).heads[h];
  return { q: rows(head.q), k: rows(head.k), v: rows(head.v), weights: rows(head.weights), output: rows(head.output) };
}

// ---- drawing ------------------------------------------------------------------------------

function colour(weight) {
  if (weight === null) return "rgb(205, 205, 205)"; // masked: a future key
  const stops = DATA.colormap;
  const position = Math.sqrt(Math.min(Math.max(weight, 0), 1)) * (stops.length - 1); // √w: weak links stay visible
  const low = Math.min(Math.floor(position), stops.length - 2);
  const frac = position - low;
  const rgb = stops[low].map((c, i) => Math.round(255 * (c * (1 - frac) + stops[low + 1][i] * frac)));
  return `rgb(${rgb.join(", ")})`;
}

const masked = (weights) => weights.map((row, i) => row.map((w, j) => (j > i ? null : w)));

function drawMap(canvas, weights, cell, query, margin = 0) {
  const T = weights.length;
  canvas.width = canvas.height = T * cell + margin;
  const ctx = canvas.getContext("2d");
  ctx.fillStyle = "white";
  ctx.fillRect(0, 0, canvas.width, canvas.height);
  masked(weights).forEach((row, i) => row.forEach((w, j) => {
    ctx.fillStyle = colour(w);
    ctx.fillRect(margin + j * cell, margin + i * cell, cell, cell);
  }));
  if (query !== null) { // the query row that the steps below explain
    ctx.strokeStyle = "rgb(230, 40, 40)";
    ctx.lineWidth = Math.max(1, cell / 4);
    ctx.strokeRect(margin, margin + query * cell, T * cell, cell);
  }
  return ctx;
}

// Token labels on both axes, every `every`-th one where they would overlap; the readout
// below the map names the token under the mouse whatever its label.
function drawLabels(ctx, cell, margin) {
  const T = DATA.tokens.length;
  const every = Math.max(1, Math.ceil(12 / cell));
  ctx.fillStyle = "#5f6368";
  ctx.font = `${Math.min(11, Math.max(8, cell))}px monospace`;
  for (let i = 0; i < T; i += every) {
    const label = axisLabel(i).slice(0, 8);
    ctx.textAlign = "right";
    ctx.fillText(label, margin - 3, margin + i * cell + cell * 0.8); // the query's row
    ctx.save();
    ctx.translate(margin + i * cell + cell * 0.8, margin - 3);
    ctx.rotate(-Math.PI / 2);
    ctx.textAlign = "left";
    ctx.fillText(label, 0, 0); // the key's column
    ctx.restore();
  }
  return every;
}

// ---- the header, the tokens, the model switch ---------------------------------------------

function renderHeader() {
  const c = DATA ? DATA.config : null;
  const why = SETTINGS.why_not;
  $("prompt-note").textContent = SETTINGS.server ? "" : MODEL ? t("inPageNote", { parameters: count(MODEL.parameters) })
    : why ? t(`whyNot_${why.code}`, { count: count(why.values.count ?? 0), limit: count(why.values.limit ?? 0) }) : "";
  $("lang").textContent = t("switchLanguage");
  $("lock-state").textContent = state.locked ? t("locked") : t("unlocked");
  $("model-line").textContent = c ? t("modelLine", {
    layers: c.n_layer, heads: c.n_head, width: c.n_embd, dk: c.head_size, block: c.block_size,
    vocab: c.vocab_size, positions: word("positions", c.pos_encoding), norm: word("norms", c.norm) }) : "";
  renderRun(DATA ? DATA.run : null);
  const init = DATA && DATA.model === "init";
  $("model-state").textContent = DATA ? t(init ? "showingInit" : "showingTrained") : "";
  $("model-switch").textContent = t(init ? "switchToTrained" : "switchToInit");
  $("model-switch").hidden = !DATA || !(SETTINGS.server || SETTINGS.counterpart);
  document.documentElement.lang = state.lang === "zh" ? "zh-CN" : "en";
  document.title = t("title");
  for (const node of document.querySelectorAll("[data-i18n]")) node.textContent = t(node.dataset.i18n);
}

// The run that trained this model, from its summary.json: how long it trained, and a warning
// when the run itself found the model barely trained.
function renderRun(run) {
  const known = (x, write) => (x === null || x === undefined ? "—" : write(x)); // (a run of an earlier version)
  $("run-line").textContent = run ? t("runLine", { iterations: count(run.iteration), tokens: known(run.tokens, count),
    loss: known(run.val_loss, (x) => fmt(x, 4)), weights: t({ average: "weightsAverage", trained: "weightsTrained" }[run.weights]
      ?? "weightsSaved") }) : "";
  const why = run && run.barely_trained;
  $("run-warning").hidden = !why;
  $("run-warning").textContent = !why ? "" : why.reason === "warmup"
    ? t("barelyWarmup", { iteration: why.iteration, warmup: why.warmup })
    : t("barelyLoss", { loss: fmt(why.val_loss, 2), initial: fmt(why.initial_loss, 2) });
}

function renderTokens() {
  const box = $("tokens");
  box.replaceChildren();
  const v = view();
  DATA.tokens.forEach((token, i) => {
    const chip = el("button", { type: "button", class: "token", "data-index": i, title: `id ${token.id}` },
      el("span", { class: "index", text: index(i) }), el("span", { class: "piece", text: tokenLabel(token) }));
    if (token.joined) chip.append(el("span", { class: "joined", text: `→ ${visible(token.joined)}` }));
    if (i === v.query) chip.classList.add("selected");
    chip.addEventListener("mouseenter", () => preview({ query: i, key: null }));
    chip.addEventListener("mouseleave", () => preview(null));
    chip.addEventListener("click", () => choose({ query: i, key: null, coordinate: null }));
    box.append(chip);
  });
  $("tokens-note").textContent = t("tokensNote", { count: DATA.tokens.length })
    + (DATA.truncated ? t("sentenceGap") + t("truncated", { count: DATA.truncated }) : "");
}

// ---- 1. from token to vector ---------------------------------------------------------------

function renderEmbedding() {
  const v = view();
  const c = DATA.config;
  const token = DATA.tokens[v.query];
  const wte = rowOf(DATA.embedding.token, v.query);
  const box = $("embedding");
  $("embedding-title").textContent = t("embeddingTitle", { query: v.query, text: tokenLabel(token) });
  box.replaceChildren(el("p", { class: "note", text: t("embeddingId", { id: token.id, vocab: c.vocab_size }) }),
    vectorRow(t("wteRow", { id: token.id }), `[C] = [${c.n_embd}]`, wte, "wte"));
  if (DATA.embedding.position === null) {
    const angles = ropeAngles(v.query, c.rope_frequencies);
    box.append(el("p", { class: "note", id: "rope-angle", "data-value": angles[0], text: t("ropeEmbedding", {
      query: v.query, first: fmt(angles[0], 4), last: fmt(angles[angles.length - 1], 6), half: angles.length - 1 }) }));
  } else {
    box.append(vectorRow(t("positionRow", { query: v.query, kind: word("positions", c.pos_encoding) }),
      `[C] = [${c.n_embd}]`, rowOf(DATA.embedding.position, v.query), "position"));
  }
  box.append(vectorRow(t(DATA.embedding.position === null ? "streamInRope" : "streamIn"), `[C] = [${c.n_embd}]`,
    rowOf(layerData(0).residual_in, v.query), "sum"));
}

// ---- every layer and head; one query across them all ------------------------------------------

let gridDrawn = null; // the data and language the grid was drawn for: redrawn only when they change

function renderGrid() {
  const grid = $("grid");
  const v = view();
  if (gridDrawn !== `${dataVersion} ${state.lang}`) {
    gridDrawn = `${dataVersion} ${state.lang}`;
    grid.replaceChildren();
    const cell = Math.max(1, Math.floor(96 / DATA.tokens.length));
    grid.style.gridTemplateColumns = `auto repeat(${DATA.config.n_head}, auto)`;
    grid.append(el("span"));
    for (let h = 0; h < DATA.config.n_head; h++) grid.append(el("span", { class: "axis", text: t("headN", { n: h }) }));
    DATA.layers.forEach((layer, l) => {
      grid.append(el("span", { class: "axis", text: t("layerN", { n: l }) }));
      layer.heads.forEach((head, h) => {
        const canvas = el("canvas", { class: "thumb", "data-layer": l, "data-head": h,
          title: t("layerHead", { layer: l, head: h }) });
        drawMap(canvas, rows(head.weights), cell, null);
        canvas.addEventListener("mouseenter", () => preview({ layer: l, head: h }));
        canvas.addEventListener("mouseleave", () => preview(null));
        canvas.addEventListener("click", () => choose({ layer: l, head: h, coordinate: null }));
        grid.append(canvas);
      });
    });
  }
  for (const canvas of grid.querySelectorAll("canvas")) {
    canvas.classList.toggle("selected", Number(canvas.dataset.layer) === v.layer && Number(canvas.dataset.head) === v.head);
  }
}

function renderQueryGrid() { // the picked query's row of weights in every layer and head at once
  const v = view();
  const T = DATA.tokens.length;
  const box = $("query-grid");
  $("query-title").textContent = t("queryTitle", { query: v.query, text: tokenLabel(DATA.tokens[v.query]) });
  box.replaceChildren();
  box.style.gridTemplateColumns = `auto repeat(${DATA.config.n_head}, auto)`;
  box.append(el("span"));
  for (let h = 0; h < DATA.config.n_head; h++) box.append(el("span", { class: "axis", text: t("headN", { n: h }) }));
  const cell = Math.max(2, Math.floor(160 / T));
  DATA.layers.forEach((layer, l) => {
    box.append(el("span", { class: "axis", text: t("layerN", { n: l }) }));
    layer.heads.forEach((head, h) => {
      const weights = rowOf(head.weights, v.query);
      const strip = el("canvas", { class: "strip", "data-layer": l, "data-head": h, "data-values": JSON.stringify(weights),
        title: t("layerHead", { layer: l, head: h }) });
      strip.width = T * cell;
      strip.height = 14;
      const ctx = strip.getContext("2d");
      weights.forEach((w, j) => { ctx.fillStyle = colour(j > v.query ? null : w); ctx.fillRect(j * cell, 0, cell, 14); });
      strip.addEventListener("click", () => choose({ layer: l, head: h, coordinate: null }));
      box.append(strip);
    });
  });
}

// ---- the picked head: its map, with token labels, and its lines ------------------------------

const MAP_MARGIN = 64; // pixels of the map's canvas left for the token labels

function mapCellSize() {
  return Math.max(2, Math.min(24, Math.floor(480 / DATA.tokens.length)));
}

function renderMap() {
  const v = view();
  const { weights } = headVectors(v.layer, v.head);
  const cell = mapCellSize();
  $("map-title").textContent = t("mapTitle", { layer: v.layer, head: v.head });
  const ctx = drawMap($("map"), weights, cell, v.query, MAP_MARGIN);
  const every = drawLabels(ctx, cell, MAP_MARGIN);
  $("labels-note").textContent = every > 1 ? t("labelsEvery", { every }) : "";
  const c = DATA.config;
  $("position-note").textContent = c.pos_encoding === "rope" ? t("ropeNote")
    : t("additiveNote", { kind: word("positions", c.pos_encoding) });
  renderHeadView(weights, v.query);
}

function mapCell(event) {
  const canvas = $("map");
  const T = DATA.tokens.length;
  const box = canvas.getBoundingClientRect();
  const scale = canvas.width / box.width; // CSS pixels to canvas pixels
  const cell = mapCellSize();
  const i = Math.floor(((event.clientY - box.top) * scale - MAP_MARGIN) / cell);
  const j = Math.floor(((event.clientX - box.left) * scale - MAP_MARGIN) / cell);
  return i >= 0 && i < T && j >= 0 && j < T ? { query: i, key: j } : null;
}

function showReadout(cell) {
  const v = view();
  if (!cell) { $("map-readout").textContent = ""; return; }
  const w = headVectors(v.layer, v.head).weights[cell.query][cell.key];
  $("map-readout").textContent = t("readout", {
    query: cell.query, qtext: tokenLabel(DATA.tokens[cell.query]), key: cell.key,
    ktext: tokenLabel(DATA.tokens[cell.key]), weight: cell.key > cell.query ? t("maskedWord") : fmt(w, 6) });
}

const SVG = "http://www.w3.org/2000/svg";

function svg(tag, attributes = {}) {
  const node = document.createElementNS(SVG, tag);
  for (const [name, value] of Object.entries(attributes)) node.setAttribute(name, value);
  return node;
}

// bertviz's "head view": the tokens twice, queries on the left and keys on the right, a line
// from each query to each key it may see, as thick as its weight; the picked query's in red.
function renderHeadView(weights, query) {
  const T = DATA.tokens.length;
  const step = 16, width = 300, height = T * step + 8;
  const box = svg("svg", { width, height, viewBox: `0 0 ${width} ${height}`, id: "head-lines" });
  DATA.tokens.forEach((token, i) => {
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
  const v = view();
  const c = DATA.config;
  const layer = layerData(v.layer);
  const x = attentionInput(layer, v.query); // what this layer projects, for the query token
  const stats = normStatistics(rowOf(layer.residual_in, v.query), c.norm, c.norm_eps ?? 1e-5);
  const key = v.key ?? v.query;
  const head = headVectors(v.layer, v.head);
  const box = $("qkv");
  $("qkv-title").textContent = t("qkvTitle", { layer: v.layer, head: v.head, query: v.query, key });
  $("qkv-note").textContent = t("qkvNote", { input: inputName() });
  const normNote = c.norm_position === "post" ? t("postNormNote")
    : stats.rms !== undefined ? t("rmsNote", { rms: fmt(stats.rms, 6) })
      : t("layerNormNote", { mean: fmt(stats.mean, 6), std: fmt(stats.std, 6) });
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
  const v = view();
  const c = DATA.config;
  const row = el("div", { class: "vector-row", "data-which": which });
  row.append(el("h4", { text: t(`${which}Row`, { position, text: tokenLabel(DATA.tokens[position]) }) }));
  const rotated = c.pos_encoding === "rope" && which !== "v";
  const layer = layerData(v.layer);
  if (!layer.c_attn) { // too large to embed: the model's vector alone
    row.append(vectorBox(traced, `${which}-model`));
  } else if (rotated) { // RoPE: computed from the weights before the rotation, the model's after it
    const before = projected(layer.c_attn, which, v.head, attentionInput(layer, position), c);
    row.append(el("p", { class: "note", text: t("beforeRotation", { position, input: inputName() }) }),
      coordinates(before, which, position, `${which}-before`),
      el("p", { class: "note", text: t("afterRotation", { position }) }), vectorBox(traced, `${which}-model`));
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
    button.addEventListener("click", () => choose({ coordinate: { which, position, dim: d } }));
    box.append(button);
  });
  return box;
}

function renderTermsOfProjection(layer, v) {
  const box = $("projection-terms");
  box.replaceChildren();
  const c = DATA.config;
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
  const v = view();
  const head = headVectors(v.layer, v.head);
  const s = fiveSteps(head.q[v.query], head.k, head.v, v.query);
  const experiment = v.noScale || v.noMask ? fiveSteps(head.q[v.query], head.k, head.v, v.query,
    { scale: !v.noScale, mask: !v.noMask }) : null;
  const future = DATA.tokens.length - 1 - v.query;
  $("steps-title").textContent = t("stepsTitle", { layer: v.layer, head: v.head, query: v.query,
    text: tokenLabel(DATA.tokens[v.query]) });
  const name = (step) => word("steps", step);
  $("step-1").textContent = t("step1", { name: name("similarity"), dk: s.dk,
    rotated: DATA.config.pos_encoding === "rope" ? t("rotatedQK") : "" });
  $("step-2").textContent = t("step2", { name: name("scale"), dk: s.dk, scale: s.factor.toFixed(6) });
  $("step-3").textContent = future ? t("step3", { name: name("mask"), count: future }) : t("step3none", { name: name("mask") });
  $("step-4").textContent = t("step4", { name: name("softmax"), total: fmt(s.total, 6), sum: s.weights.reduce((a, b) => a + b, 0).toFixed(6) });
  $("step-5").textContent = t("step5", { name: name("weighted_sum"), dk: s.dk });
  $("experiment-head").textContent = experiment ? t("colExperiment") : "";
  const contributions = head.v.map((vector, j) => vector.map((x) => s.weights[j] * x)); // step 5's terms, w_j v_j
  stepRows(s, contributions, experiment, v);
  $("weights-sum").textContent = `Σ = ${s.weights.reduce((a, b) => a + b, 0).toFixed(6)}`;
  $("exps-sum").textContent = `Σ = ${fmt(s.total, 6)}`;
  $("exps-sum").dataset.value = s.total;
  renderTerms(head, v, s);
  renderOutput(head, v, s, contributions, experiment);
}

function stepRows(s, contributions, experiment, v) {
  const largest = Math.max(...contributions.map(norm), 1e-12);
  const body = $("steps").tBodies[0];
  body.replaceChildren();
  for (let j = 0; j < s.scores.length; j++) {
    const isMasked = j > v.query;
    const scoreCell = el("td", { class: "num score", "data-step": "1", "data-key": j, "data-value": s.scores[j],
      tabindex: "0", title: t("clickScore"), text: fmt(s.scores[j]) });
    scoreCell.addEventListener("click", () => choose({ key: j }));
    scoreCell.addEventListener("keydown", (e) => { if (e.key === "Enter") choose({ key: j }); });
    const share = norm(contributions[j]);
    const bar = el("span", { class: "bar" });
    bar.style.width = `${(60 * share) / largest}px`;
    const row = el("tr", { "data-key": j, class: isMasked ? "masked" : "" },
      el("td", { class: "key", text: `${index(j)} ${tokenLabel(DATA.tokens[j])}` }), scoreCell,
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

// ---- 4. after attention: the rest of the block, layer by layer --------------------------------

function blockPieces(l, position) { // the picked token's vectors through block l, in the order they are made
  const layer = layerData(l);
  const c = DATA.config;
  const heads = layer.heads.map((head) => rowOf(head.output, position));
  const pieces = [
    ["concat", t("concatRow", { H: c.n_head, dk: c.head_size }), heads.flat()],
    ["attn", t("attnRow"), rowOf(layer.attn, position)],
  ];
  if (c.norm_position === "post") {
    pieces.push(["ln_1", t("postResidualRow", { norm: word("norms", c.norm), which: word("pieces", "attention") }),
      rowOf(layer.ln_1, position)]);
  } else {
    pieces.push(["mid", t("residualRow"), add(rowOf(layer.residual_in, position), rowOf(layer.attn, position))],
      ["ln_2", t("ln2Row", { norm: word("norms", c.norm) }), rowOf(layer.ln_2, position)]);
  }
  pieces.push(["mlp", t("mlpRow"), rowOf(layer.mlp, position)], ["residual_out", t("outRow"), residualOut(l)]);
  return pieces;
}

function renderBlock() {
  const v = view();
  const c = DATA.config;
  const layer = layerData(v.layer);
  $("block-title").textContent = t("blockTitle", { layer: v.layer, query: v.query, text: tokenLabel(DATA.tokens[v.query]) });
  const box = $("block");
  box.replaceChildren();
  for (const [name, label, vector] of blockPieces(v.layer, v.query)) {
    box.append(vectorRow(label, `[C] = [${c.n_embd}]`, vector, name));
    if (name === "ln_2" || (name === "ln_1" && c.norm_position === "post")) box.append(hiddenUnits(layer, v.query));
  }
  if (v.layer === c.n_layer - 1) {
    box.append(vectorRow(t("lnfRow", { norm: word("norms", c.norm) }), `[C] = [${c.n_embd}]`,
      rowOf(DATA.ln_f, v.query), "ln_f"), el("p", { class: "note", text: t("logitsNote", { vocab: c.vocab_size }) }));
  } else {
    box.append(el("p", { class: "note", text: t("nextLayerNote", { next: v.layer + 1 }) }));
  }
  renderNormChart(v.query);
}

function hiddenUnits(layer, position) {
  const top = layer.mlp_top;
  const list = el("ol", { class: "units mono", "data-name": "mlp_top" });
  top.ids[position].forEach((unit, i) => list.append(el("li", { "data-unit": unit, "data-value": top.values[position][i],
    text: `${t("unit", { unit })}: ${fmt(top.values[position][i], 4)}` })));
  return el("div", { class: "vector-row" }, el("h4", {}, el("span", { text: t("hiddenRow", { count: top.ids[position].length }) }),
    " ", el("span", { class: "shape mono", text: `[F] = [${top.width}]` })), list);
}

function renderNormChart(position) { // each step's vector norm along the layers, for the picked token
  const names = ["residual_in", "attn", "mlp", "residual_out"];
  const norms = DATA.layers.map((layer, l) => [rowOf(layer.residual_in, position), rowOf(layer.attn, position),
    rowOf(layer.mlp, position), residualOut(l)].map(norm));
  const largest = Math.max(...norms.flat(), 1e-9);
  const chart = svg("svg", { width: 60 + norms.length * 110, height: 150, id: "norms-chart" });
  const colours = ["#8a8a8a", "#d62828", "#2a9d3f", "#1d1d1f"];
  norms.forEach((values, l) => values.forEach((value, i) => {
    const height = (110 * value) / largest;
    chart.append(svg("rect", { x: 60 + l * 110 + i * 22, y: 120 - height, width: 18, height, fill: colours[i],
      "data-layer": l, "data-name": names[i], "data-value": value }));
  }));
  norms.forEach((_, l) => {
    const label = svg("text", { x: 60 + l * 110, y: 140 });
    label.textContent = t("layerN", { n: l });
    chart.append(label);
  });
  $("norm-chart").replaceChildren(chart);
  $("norm-legend").replaceChildren(...names.map((name, i) => el("span", { class: "legend" },
    el("span", { class: "swatch", style: `background:${colours[i]}` }), ` ${t(`norm_${name}`)}`)));
}

// ---- 5. what each layer would predict: the logit lens ---------------------------------------

function renderLens() {
  const v = view();
  $("lens-title").textContent = t("lensTitle", { query: v.query, text: tokenLabel(DATA.tokens[v.query]) });
  const body = $("lens").tBodies[0];
  body.replaceChildren(...DATA.layers.map((layer, l) => el("tr", { "data-layer": l },
    el("th", { text: t("layerN", { n: l }) }),
    ...layer.lens.ids[v.query].map((id, r) => el("td", { "data-id": id, "data-value": layer.lens.probs[v.query][r] },
      el("span", { class: "piece mono", text: textOf(id) }), ` ${fmt(layer.lens.probs[v.query][r], 3)}`)))));
}

// ---- the prediction, and the heads switched off one at a time ---------------------------------

function readSampling() {
  const temperature = Number($("temperature").value);
  const topK = $("top-k").value === "" ? null : Number($("top-k").value);
  const topP = $("top-p").value === "" ? null : Number($("top-p").value);
  if (!(temperature >= 0)) return { error: t("error_bad_temperature") };
  if (topK !== null && !(Number.isInteger(topK) && topK >= 1)) return { error: t("error_bad_top_k") };
  if (topP !== null && !(topP > 0 && topP <= 1)) return { error: t("error_bad_top_p") };
  return { temperature, topK, topP, suppress: DATA ? DATA.prediction.suppressed : [] };
}

function renderPrediction() {
  const sampling = readSampling();
  $("sampling-error").textContent = sampling.error ?? "";
  if (sampling.error) return;
  const { suppressed } = DATA.prediction;
  const logits = Array.from(values(DATA.prediction.logits));
  const probs = nextTokenProbabilities(logits, sampling);
  const ids = logits.map((_, i) => i).filter((id) => !suppressed.includes(id))
    .sort((a, b) => logits[b] - logits[a]).slice(0, 20);
  const off = state.ablate && DATA.ablation && DATA.ablation[state.ablate[0]][state.ablate[1]];
  // the head switched off, by the same rule as the model's column where its logits are here;
  // a large model's page keeps only its likeliest tokens at temperature 1, and says so
  const offProbs = !off ? {} : off.logits ? nextTokenProbabilities(Array.from(values(off.logits)), sampling)
    : Object.fromEntries(off.ids.map((id, i) => [id, off.probs[i]]));
  $("prediction-note").textContent = t("predictionNote", { text: tokenLabel(DATA.tokens[DATA.tokens.length - 1]) });
  $("ablation-head").textContent = !off ? "" : t(off.logits ? "colAblated" : "colAblatedPlain",
    { layer: state.ablate[0], head: state.ablate[1] });
  const whole = wholeExperiment(); // the experiment in every head of the model, where the page runs it
  const wholeProbs = whole && nextTokenProbabilities(whole.logits, sampling);
  $("whole-experiment-head").textContent = whole ? t(whole.title) : "";
  $("prediction").tBodies[0].replaceChildren(...ids.map((id) => {
    const bar = el("span", { class: "bar" });
    bar.style.width = `${120 * probs[id]}px`;
    const cut = probs[id] === 0 ? cutBy(logits, sampling, id) : null;
    return el("tr", { "data-id": id },
      el("td", { class: "key", text: textOf(id) }),
      el("td", { class: "num", text: fmt(logits[id], 3) }),
      el("td", { class: "num probability", "data-value": probs[id], "data-cut": cut ?? "",
        text: cut ? `0 (${t(`cut_${cut}`)})` : fmt(probs[id]) }),
      el("td", { class: "contribution" }, bar),
      el("td", { class: "num ablated", "data-value": off ? offProbs[id] ?? "" : "",
        text: off ? (id in offProbs ? fmt(offProbs[id]) : t("notInTop", { count: off.ids.length })) : "" }),
      el("td", { class: "num whole-experiment", "data-value": whole ? wholeProbs[id] : "",
        text: whole ? fmt(wholeProbs[id]) : "" }));
  }));
  $("suppressed").textContent = suppressed.length
    ? t("suppressedNote", { tokens: suppressed.map(textOf).join(" ") }) : "";
}

// Without 1/√d_k or without the mask in every head of every layer: the model's next-token
// logits, run in the page (null where it does not run the model, or with no experiment on).
// One pass for each data and experiment, kept.
let wholeRun = { key: null, logits: null };

function wholeExperiment() {
  if (!MODEL || !(state.noScale || state.noMask)) return null;
  const key = `${dataVersion} ${state.noScale} ${state.noMask}`;
  if (wholeRun.key !== key) {
    const ids = DATA.tokens.map((token) => token.id);
    const logits = forward(MODEL, ids, { scale: !state.noScale, mask: !state.noMask }).logits;
    wholeRun = { key, logits: Array.from(logits.subarray(logits.length - DATA.config.vocab_size)) };
  }
  const title = state.noScale && state.noMask ? "colWholeBoth" : state.noMask ? "colWholeMask" : "colWholeScale";
  return { title, logits: wholeRun.logits };
}

function renderAblation() {
  const grid = $("ablation-grid");
  const c = DATA.config;
  grid.replaceChildren();
  // a text typed into the page: every head switched off is one more pass each, run on request
  $("ablate-all").hidden = DATA.ablation !== null;
  $("ablate-all").textContent = t("ablateAll", { count: c.n_layer * c.n_head });
  $("ablation-ranking").textContent = "";
  if (DATA.ablation === null) return;
  grid.style.gridTemplateColumns = `auto repeat(${c.n_head}, auto)`;
  grid.append(el("span"));
  for (let h = 0; h < c.n_head; h++) grid.append(el("span", { class: "axis", text: t("headN", { n: h }) }));
  DATA.ablation.forEach((heads, l) => {
    grid.append(el("span", { class: "axis", text: t("layerN", { n: l }) }));
    heads.forEach((head, h) => {
      const on = state.ablate && state.ablate[0] === l && state.ablate[1] === h;
      const button = el("button", { type: "button", class: on ? "ablate selected" : "ablate", "data-layer": l,
        "data-head": h, "data-kl": head.kl, "aria-pressed": String(!!on), title: t("ablateTitle", { layer: l, head: h }),
        text: `KL ${head.kl.toFixed(3)}` });
      button.addEventListener("click", () => { state.ablate = on ? null : [l, h]; render(); });
      grid.append(button);
    });
  });
  const ranked = DATA.ablation.flatMap((heads, l) => heads.map((head, h) => ({ l, h, kl: head.kl })))
    .sort((a, b) => b.kl - a.kl);
  const best = ranked[0];
  $("ablation-ranking").textContent = t("ablationRanking", { layer: best.l, head: best.h, kl: fmt(best.kl, 4),
    next: ranked.slice(1, 4).map((r) => t("layerHead", { layer: r.l, head: r.h })).join(t("listSeparator")) });
}

// ---- watching it learn: the prompt through the model at each snapshot of training ----------

const TIMELINE_KINDS = [["previous_token", "scorePrevious"], ["induction", "scoreInduction"]];

function timelineStep() { // the picked snapshot's index (the last, the trained model, at first)
  const count = DATA.timeline.steps.length;
  if (state.snapshot === null || state.snapshot >= count) state.snapshot = count - 1;
  return state.snapshot;
}

function timelineMap(s, l, h) { // the weights of snapshot s, layer l, head h as rows [T][T]
  const c = DATA.config;
  const T = DATA.tokens.length;
  const all = values(DATA.timeline.maps);
  const start = (((s * c.n_layer) + l) * c.n_head + h) * T * T;
  return Array.from({ length: T }, (_, i) => Array.from(all.subarray(start + i * T, start + (i + 1) * T)));
}

// A line chart over the snapshots (x: log of step + 1, as they are spaced), one line per series.
function stepChart(series, picked, label) {
  const steps = DATA.timeline.steps;
  const width = 360, height = 150, left = 44, bottom = 22, top = 8;
  const all = series.flatMap((line) => line.values).filter((v) => v !== null);
  const low = Math.min(...all), high = Math.max(...all), span = high - low || 1;
  const x = (i) => left + (width - left - 8) * Math.log10(steps[i] + 1) / Math.log10(steps[steps.length - 1] + 1);
  const y = (v) => top + (height - top - bottom) * (1 - (v - low) / span);
  const chart = svg("svg", { width, height, class: "timeline-chart", role: "img", "aria-label": label });
  chart.append(svg("text", { x: 2, y: top + 8 }), svg("text", { x: 2, y: height - bottom }));
  chart.children[0].textContent = fmt(high, 3);
  chart.children[1].textContent = fmt(low, 3);
  const axis = svg("text", { x: left, y: height - 4 });
  axis.textContent = `${t("timelineStep")} ${steps[0]} … ${steps[steps.length - 1]} (log)`;
  chart.append(axis, svg("line", { x1: x(picked), x2: x(picked), y1: top, y2: height - bottom, class: "picked",
    "stroke-width": 1 }));
  series.forEach((line) => {
    const points = line.values.map((v, i) => (v === null ? null : `${x(i).toFixed(1)},${y(v).toFixed(1)}`));
    chart.append(svg("polyline", { points: points.filter(Boolean).join(" "), fill: "none", stroke: line.colour,
      "stroke-width": 1.5, "data-name": line.name }));
    if (line.values[picked] !== null) {
      chart.append(svg("circle", { cx: x(picked), cy: y(line.values[picked]), r: 3, fill: line.colour,
        "data-name": line.name, "data-value": line.values[picked] }));
    }
  });
  return chart;
}

function crossing(values) { // the first step from which a score stays above half of its last value
  const half = values[values.length - 1] / 2;
  let from = values.length - 1;
  while (from > 0 && values[from - 1] > half) from -= 1;
  return DATA.timeline.steps[from];
}

function renderTimeline() {
  const timeline = DATA.timeline;
  $("timeline-panel").hidden = !timeline;
  if (!timeline) return;
  const s = timelineStep();
  const step = timeline.steps[s];
  const c = DATA.config;
  const slider = $("timeline-step");
  slider.max = String(timeline.steps.length - 1);
  slider.value = String(s);
  slider.setAttribute("aria-valuetext", t("timelineStepValue", { step }));
  const loss = timeline.loss[s];
  $("timeline-readout").textContent = t("timelineReadout", { step, number: s + 1, count: timeline.steps.length,
    loss: loss === null ? "" : t("timelineLossValue", { loss: fmt(loss, 4) }) });
  $("timeline-loss").replaceChildren(timeline.loss[0] === null ? el("p", { class: "note", text: t("timelineNoLoss") })
    : stepChart([{ name: "loss", values: timeline.loss, colour: "rgb(59, 82, 139)" }], s, t("timelineLoss")));
  $("timeline-sample-title").textContent = t("timelineSampleTitle", { step, seed: timeline.sample_seed });
  $("timeline-sample").textContent = DATA.tokens.map((token) => token.joined ?? token.text).join("") + timeline.samples[s];
  const maps = $("timeline-maps");
  maps.style.gridTemplateColumns = `auto repeat(${c.n_head}, auto)`;
  maps.replaceChildren(el("span"));
  for (let h = 0; h < c.n_head; h++) maps.append(el("span", { class: "axis", text: t("headN", { n: h }) }));
  const cell = Math.max(1, Math.floor(72 / DATA.tokens.length));
  for (let l = 0; l < c.n_layer; l++) {
    maps.append(el("span", { class: "axis", text: t("layerN", { n: l }) }));
    for (let h = 0; h < c.n_head; h++) {
      const canvas = el("canvas", { class: "timeline-map", "data-layer": l, "data-head": h });
      drawMap(canvas, timelineMap(s, l, h), cell, null);
      maps.append(canvas);
    }
  }
  const last = tokenLabel(DATA.tokens[DATA.tokens.length - 1]);
  $("timeline-prediction-title").textContent = t("timelinePredictionTitle", { text: last, step });
  const prediction = timeline.prediction[s];
  $("timeline-prediction").tBodies[0].replaceChildren(...prediction.ids.map((id, i) => {
    const bar = el("span", { class: "bar" });
    bar.style.width = `${120 * prediction.values[i]}px`;
    return el("tr", { "data-id": id }, el("td", { class: "key", text: textOf(id) }),
      el("td", { class: "num", "data-value": prediction.values[i], text: fmt(prediction.values[i]) }),
      el("td", { class: "contribution" }, bar));
  }));
  const query = view().query;
  $("timeline-lens-title").textContent = t("timelineLensTitle", { text: tokenLabel(DATA.tokens[query]), step });
  $("timeline-lens").tBodies[0].replaceChildren(...timeline.lens[s].map((layer, l) => el("tr", { "data-layer": l },
    el("th", { text: t("layerN", { n: l }) }),
    ...layer.ids[query].map((id, r) => el("td", { "data-id": id },
      el("span", { class: "piece mono", text: textOf(id) }), ` ${fmt(layer.values[query][r], 3)}`)))));
  $("timeline-scores-note").textContent = t(timeline.scores_text === "val" ? "timelineScoresNote"
    : "timelineScoresNoteRandom");
  const best = {};
  for (const [kind, name] of TIMELINE_KINDS) {
    const lines = [];
    for (let l = 0; l < c.n_layer; l++) {
      for (let h = 0; h < c.n_head; h++) {
        const hue = Math.round(360 * (l * c.n_head + h) / (c.n_layer * c.n_head));
        lines.push({ name: t("layerHeadShort", { layer: l, head: h }), layer: l, head: h, colour: `hsl(${hue}, 65%, 45%)`,
          values: timeline.scores[kind].map((perStep) => perStep[l][h]) });
      }
    }
    $(`timeline-${kind}`).replaceChildren(el("h4", { text: t(name) }), stepChart(lines, s, t(name)));
    best[kind] = lines.reduce((a, b) => (b.values[b.values.length - 1] > a.values[a.values.length - 1] ? b : a));
  }
  $("timeline-best").replaceChildren(...TIMELINE_KINDS.map(([kind, name]) => el("span", { "data-kind": kind,
    text: bestHead(best[kind], t(name)) + t("sentenceGap") })));
}

// The head that scores highest at the last step, and from which step it stayed above half
// of that score; or, where no head scores twice what it did at initialisation, that none has
// learnt it yet.
function bestHead(line, name) {
  const first = line.values[0], last = line.values[line.values.length - 1];
  const values = { name, layer: line.layer, head: line.head, score: fmt(last, 3), first: fmt(first, 3) };
  return last > 2 * first ? t("timelineBest", { ...values, step: crossing(line.values) }) : t("timelineBestNone", values);
}

$("ablate-all").addEventListener("click", () => {
  const start = performance.now();
  DATA.ablation = ablationOf(MODEL, DATA.tokens.map((token) => token.id));
  render();
  $("ablate-all").dataset.ms = (performance.now() - start).toFixed(1);
});

$("timeline-step").addEventListener("input", () => {
  state.snapshot = Number($("timeline-step").value);
  renderTimeline();
});

// ---- all of it ------------------------------------------------------------------------------

// ---- the map of the whole model, and each panel's formula ----------------------------------

// The model's pieces in the order it runs them, each a link to the panel that shows it and lit
// while one of the panels in `lit` is the one being read.
function mapPieces(c) {
  const norm = word("norms", c.norm);
  const piece = (label, panel, lit = [panel]) => ({ label, panel, lit });
  const attention = piece(word("pieces", "attention"), "steps-panel",
    ["heads-panel", "query-panel", "map-panel", "head-view-panel", "qkv-panel", "steps-panel"]);
  const ffn = piece(word("pieces", "feed_forward"), "block-panel");
  const add = piece("+", "block-panel");
  const block = c.norm_position === "post"
    ? [attention, add, piece(norm, "block-panel"), ffn, add, piece(norm, "block-panel")]
    : [piece(norm, "qkv-panel"), attention, add, piece(norm, "block-panel"), ffn, add];
  return {
    before: [piece(t("mapToken"), "tokens-panel"),
      piece(t(c.pos_encoding === "rope" ? "mapEmbeddingRope" : "mapEmbedding"), "embedding-panel")],
    block,
    after: [piece(t("mapFinalNorm", { norm }), "lens-panel"), piece(word("pieces", "lm_head"), "prediction-panel",
      ["lens-panel", "prediction-panel"]), piece(t("mapProbabilities"), "prediction-panel")],
  };
}

function renderModelMap() {
  const c = DATA.config;
  const { before, block, after } = mapPieces(c);
  const link = (p) => el("a", { href: `#${p.panel}`, "data-panel": p.panel, "data-lit": p.lit.join(" "), text: p.label });
  const arrow = () => el("span", { class: "arrow", text: "→" });
  const chain = (pieces) => pieces.flatMap((p, i) => (i ? [arrow(), link(p)] : [link(p)]));
  $("model-map").setAttribute("aria-label", t("mapLabel"));
  $("model-map").replaceChildren(...chain(before), arrow(),
    el("span", { class: "layers" }, ...chain(block),
      el("span", { class: "repeat", text: t("mapLayers", { count: c.n_layer, layer: view().layer }) })),
    arrow(), ...chain(after));
  lightMap();
}

// The panel being read: the last one whose top has passed a third of the way down the window.
function lightMap() {
  const line = window.innerHeight / 3;
  const panels = [...document.querySelectorAll("#explorer section:not([hidden])")];
  const reading = panels.filter((p) => p.getBoundingClientRect().top <= line).pop() ?? panels[0];
  for (const a of document.querySelectorAll("#model-map a")) {
    const lit = reading !== undefined && a.dataset.lit.split(" ").includes(reading.id);
    a.classList.toggle("current", lit);
    if (lit) a.setAttribute("aria-current", "location"); else a.removeAttribute("aria-current");
  }
}
let mapFrame = null;
window.addEventListener("scroll", () => { mapFrame ??= requestAnimationFrame(() => { mapFrame = null; lightMap(); }); });

// What each panel computes, in the code's notation, for this model's pieces.
function panelFormulas(c) {
  const norm = c.norm === "rmsnorm" ? "RMSNorm" : "LN";
  const input = c.norm_position === "post" ? "x" : `${norm}(x)`;
  const bias = (name) => (c.bias ? ` + b_${name}` : "");
  const position = { learned: " + wpe[position]", sinusoidal: " + PE(position)", rope: "" }[c.pos_encoding];
  const ffn = c.mlp === "swiglu" ? "(SiLU(h W_gate) ⊙ h W_up) W_2"
    : `${c.activation === "gelu_tanh" ? "GELU_tanh" : "GELU"}(h W_1${bias(1)}) W_2${bias(2)}`;
  const block = c.norm_position === "post"
    ? `x = ${norm}(x + Attention(x));  x = ${norm}(x + FFN(x));  FFN(h) = ${ffn}`
    : `x = x + concat(heads) W_O${bias("O")};  x = x + FFN(${norm}(x));  FFN(h) = ${ffn}`;
  const weights = "w = softmax(q kᵀ / √d_k + mask)";
  return {
    tokens: "ids = tokenizer.encode(text)",
    embedding: `x = wte[id]${position}` + (c.pos_encoding === "rope" ? ";  q, k rotated by position × θ_i in every layer" : ""),
    heads: weights, query: weights, map: weights, "head-view": weights,
    qkv: ["Q", "K", "V"].map((m) => `${m.toLowerCase()} = ${input} W_${m}${(c.qkv_bias ?? c.bias) ? ` + b_${m}` : ""}`)
      .join(";  "),
    steps: "Attention(q, K, V) = softmax(q Kᵀ / √d_k + mask) V",
    block,
    lens: "p_ℓ = softmax(lm_head(ln_f(x_ℓ)))",
    prediction: "p = softmax(lm_head(ln_f(x_L)) / temperature), then top-k and top-p",
  };
}

function renderFormulas() {
  const formulas = panelFormulas(DATA.config);
  for (const node of document.querySelectorAll("[data-formula]")) node.textContent = formulas[node.dataset.formula];
}

function render() {
  renderHeader();
  $("empty").hidden = DATA !== null;
  $("explorer").hidden = DATA === null;
  if (DATA === null) return;
  renderModelMap();
  renderFormulas();
  renderTokens();
  renderTimeline();
  renderEmbedding();
  renderGrid();
  renderQueryGrid();
  renderMap();
  renderQKV();
  renderSteps();
  renderBlock();
  renderLens();
  renderPrediction();
  renderAblation();
}

// ---- interaction: hover previews, click locks, Esc unlocks ------------------------------

function preview(change) {
  if (state.locked || JSON.stringify(change) === JSON.stringify(state.preview)) return;
  state.preview = change;
  render();
}

function choose(change) {
  Object.assign(state, change);
  state.preview = null;
  state.locked = true;
  render();
}

function reset() { // a new text: its middle token, where the causal mask has something to hide
  state.layer = 0;
  state.head = 0;
  state.query = DATA ? Math.floor((DATA.tokens.length - 1) / 2) : 0;
  state.key = null;
  state.coordinate = null;
  state.ablate = null;
  state.preview = null;
}

const PICKED = ["layer", "head", "query", "key"]; // what the model switch carries to the other page

function restoreFromAddress() { // #layer=1&head=0&query=5&lang=zh: where the other page left off
  const fields = new URLSearchParams(location.hash.slice(1));
  for (const name of PICKED) {
    const value = Number(fields.get(name));
    if (fields.has(name) && Number.isInteger(value) && value >= 0) state[name] = value;
  }
  if (["en", "zh"].includes(fields.get("lang"))) state.lang = fields.get("lang");
  if (MODEL && fields.get("text")) {
    $("prompt").value = fields.get("text");
    showTyped(); // keeping the picks the address names
  }
  if (state.layer >= DATA.layers.length || state.head >= DATA.config.n_head || state.query >= DATA.tokens.length
      || (state.key !== null && state.key >= DATA.tokens.length)) reset();
}

document.addEventListener("keydown", (event) => {
  if (event.key === "Escape") {
    state.locked = false;
    state.preview = null;
    render();
  }
});

$("lang").addEventListener("click", () => {
  state.lang = state.lang === "en" ? "zh" : "en";
  render();
});

$("map").addEventListener("mousemove", (event) => {
  const cell = mapCell(event);
  showReadout(cell);
  if (cell) preview({ query: cell.query, key: cell.key });
});
$("map").addEventListener("mouseleave", () => { showReadout(null); preview(null); });
$("map").addEventListener("click", (event) => { const cell = mapCell(event); if (cell) choose(cell); });
for (const id of ["temperature", "top-k", "top-p"]) $(id).addEventListener("input", renderPrediction);
for (const [id, name] of [["no-scale", "noScale"], ["no-mask", "noMask"]]) {
  $(id).addEventListener("change", () => { state[name] = $(id).checked; render(); });
}

// ---- trained or at initialisation --------------------------------------------------------

async function switchModel() {
  const which = DATA.model === "init" ? "trained" : "init";
  if (!SETTINGS.server) { // the other page, written beside this one by explore.py
    const fields = new URLSearchParams({ lang: state.lang });
    for (const name of PICKED) if (state[name] !== null) fields.set(name, state[name]);
    if (DATA !== EXAMPLE) fields.set("text", $("prompt").value); // the other page runs its model on it
    location.href = `${SETTINGS.counterpart}#${fields}`;
    return;
  }
  busy(true, t("working"));
  try {
    const answer = await ask("api/explore", { prompt: $("prompt").value, ids: textIds, model: which });
    DATA = answer.data;
    dataVersion += 1;
    render();
    busy(false);
  } catch (error) {
    busy(false, error.message);
  }
}

$("model-switch").addEventListener("click", switchModel);

// ---- server mode: type a prompt, let the model continue it token by token ---------------

async function ask(path, body) {
  const response = await fetch(path, { method: "POST", headers: { "Content-Type": "application/json" },
    body: JSON.stringify(body) });
  const answer = await response.json();
  if (!response.ok) { // the server's reason, in the page's language where the page has its words
    throw new Error(answer.code && STRINGS.en[`error_${answer.code}`] ? t(`error_${answer.code}`, answer.values ?? {})
      : answer.error);
  }
  return answer;
}

function busy(on, message = "") {
  for (const id of ["show", "continue", "model-switch"]) $(id).disabled = on;
  $("status").textContent = message;
}

let textIds = null; // the tokens of the text being continued, as the server gave them

async function show() {
  busy(true, t("working"));
  try {
    const answer = await ask("api/explore", { prompt: $("prompt").value, model: DATA ? DATA.model : "trained" });
    textIds = answer.ids;
    DATA = answer.data;
    dataVersion += 1;
    reset();
    render();
    busy(false);
  } catch (error) {
    busy(false, error.message);
  }
}

async function continueText() {
  const sampling = readSampling();
  if (sampling.error) { busy(false, sampling.error); return; }
  const count = Math.min(64, Math.max(1, Number($("continue-count").value) || 1));
  busy(true);
  try {
    for (let n = 1; n <= count; n++) {
      $("status").textContent = t("generating", { n, count }); // (n counts from 1: it is a count)
      const answer = await ask("api/next", { prompt: $("prompt").value, ids: textIds, model: DATA.model,
        temperature: sampling.temperature, top_k: sampling.topK, top_p: sampling.topP });
      $("prompt").value = answer.prompt;
      textIds = answer.ids;
      DATA = answer.data;
      dataVersion += 1;
      state.query = DATA.tokens.length - 1;
      state.key = null;
      render();
    }
    busy(false);
  } catch (error) {
    busy(false, error.message);
  }
}

// ---- a file that runs the model: type any text, the page computes every panel -------------

// The text's token ids, or an Error worded for the page: empty, or holding a character the
// model never saw (a char tokenizer's), as the server and explore.py refuse them
function encodeTyped(text) {
  if (!text) throw new Error(t("error_empty"));
  const unknown = TOKENIZER.unknown(text);
  if (unknown.length) throw new Error(t("error_unknown", { characters: unknown.slice(0, 10).map((c) => `'${visible(c)}'`).join(" ") }));
  return TOKENIZER.encode(text);
}

// The ids' last max_tokens (at most block_size) through the model in the page: the new data.
// Returns the milliseconds it took.
function runInPage(ids) {
  const limit = Math.min(SETTINGS.max_tokens, MODEL.config.block_size);
  const start = performance.now();
  DATA = pageDataOf(MODEL, TOKENIZER, ids.slice(-limit), Math.max(0, ids.length - limit), EXAMPLE);
  const ms = performance.now() - start;
  dataVersion += 1;
  $("example").hidden = false;
  return ms;
}

function showTyped() { // the typed text's panels, keeping the picks that still exist
  try {
    textIds = encodeTyped($("prompt").value);
  } catch (error) {
    $("status").textContent = error.message;
    return;
  }
  const ms = runInPage(textIds);
  if (state.query >= DATA.tokens.length || state.key >= DATA.tokens.length) reset();
  render();
  $("status").textContent = t("ranInPage", { count: DATA.tokens.length, ms: ms.toFixed(0) });
  $("status").dataset.ms = ms.toFixed(1);
}

// The model continues the text token by token in the page, with the KV cache (model.js's
// generate), by the page's sampling rule; the panels follow the new text at the end.
async function continueInPage() {
  const sampling = readSampling();
  if (sampling.error) { $("status").textContent = sampling.error; return; }
  const count = Math.min(64, Math.max(1, Number($("continue-count").value) || 1));
  try {
    textIds ??= encodeTyped($("prompt").value);
  } catch (error) {
    $("status").textContent = error.message;
    return;
  }
  busy(true);
  let computing = 0, n = 0;
  const tokens = generate(MODEL, textIds, count, sampling);
  for (;;) {
    const start = performance.now();
    const next = tokens.next();
    computing += performance.now() - start;
    if (next.done) break;
    n += 1;
    textIds = [...textIds, next.value];
    $("prompt").value = TOKENIZER.decode(textIds);
    $("status").textContent = t("generating", { n, count });
    await new Promise((resolve) => setTimeout(resolve)); // let the page show the text so far
  }
  runInPage(textIds);
  state.query = DATA.tokens.length - 1;
  state.key = null;
  render();
  busy(false, t("generatedInPage", { count: n, rate: (n / (computing / 1000)).toFixed(0), ms: computing.toFixed(0) }));
  $("status").dataset.rate = (n / (computing / 1000)).toFixed(1);
}

function showExample() {
  DATA = EXAMPLE;
  dataVersion += 1;
  textIds = null;
  $("prompt").value = SETTINGS.prompt;
  $("example").hidden = true;
  $("status").textContent = "";
  reset();
  render();
}

let typing = null; // the pause after the last keystroke before the page runs the model

if (SETTINGS.server) {
  $("prompt-panel").hidden = false;
  $("prompt").value = SETTINGS.prompt ?? "";
  $("show").addEventListener("click", show);
  $("prompt").addEventListener("input", () => { textIds = null; }); // edited: encode the text again
  $("continue").addEventListener("click", continueText);
} else if (MODEL) {
  $("prompt-panel").hidden = false;
  $("prompt").value = SETTINGS.prompt;
  $("show").addEventListener("click", showTyped);
  $("prompt").addEventListener("input", () => {
    textIds = null;
    clearTimeout(typing);
    typing = setTimeout(showTyped, 300);
  });
  $("continue").addEventListener("click", continueInPage);
  $("example").addEventListener("click", showExample);
} else if (SETTINGS.why_not) { // the example only: say why, and how to type a text
  $("prompt-panel").hidden = false;
  $("prompt").hidden = $("prompt-controls").hidden = true;
}
reset();
if (DATA) restoreFromAddress();
render();
document.documentElement.dataset.ready = performance.now().toFixed(1); // ms to the first full page (bench/explorer.py)
