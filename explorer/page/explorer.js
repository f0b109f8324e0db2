// The attention explorer. The data comes from the model's own forward pass (explorer/data.py);
// this script draws it, and computes only what the lesson is about: steps 1 to 5 of one head
// from its q, k and v, and the next-token distribution under the learner's sampling settings
// (the rule of model/sampling.py). Text always goes in through textContent, never innerHTML.
"use strict";

const STRINGS = JSON.parse(document.getElementById("explorer-strings").textContent);
const SETTINGS = JSON.parse(document.getElementById("explorer-settings").textContent);
let DATA = JSON.parse(document.getElementById("explorer-data").textContent);
let dataVersion = 0; // counts the data the page has shown (the server sends new data)

const state = { lang: SETTINGS.lang, layer: 0, head: 0, query: 0, key: null, locked: false, preview: null };

// ---- small helpers --------------------------------------------------------------------

function t(key, values = {}) {
  const text = STRINGS[state.lang][key] ?? STRINGS.en[key] ?? key;
  return text.replace(/\{(\w+)\}/g, (_, name) => String(values[name] ?? ""));
}

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
const fmt = (x, digits = 4) => (x === -Infinity ? "−∞" : x.toFixed(digits).replace("-", "−"));
// spaces, newlines and tabs made visible, so that every token can be seen
const visible = (text) => text.replace(/ /g, "␣").replace(/\n/g, "↵").replace(/\t/g, "⇥").replace(/\r/g, "␍");

function dot(a, b) {
  let sum = 0;
  for (let d = 0; d < a.length; d++) sum += a[d] * b[d];
  return sum;
}

function softmax(values) {
  const max = Math.max(...values);
  if (max === -Infinity) return values.map(() => 0);
  const exps = values.map((v) => Math.exp(v - max));
  const total = exps.reduce((a, b) => a + b, 0);
  return exps.map((e) => e / total);
}

// ---- the five steps, for one head and one query ----------------------------------------

function fiveSteps(head, query) {
  const q = head.q[query];
  const dk = q.length;
  const scale = 1 / Math.sqrt(dk);
  const scores = head.k.map((k) => dot(q, k)); // 1. similarity q·k for every key
  const scaled = scores.map((s) => s * scale); // 2. scale by 1/√d_k
  const masked = scaled.map((s, j) => (j > query ? -Infinity : s)); // 3. causal mask
  const weights = softmax(masked); // 4. softmax over the keys
  const contributions = head.v.map((v, j) => v.map((x) => weights[j] * x)); // 5. w_j v_j
  const output = q.map((_, d) => contributions.reduce((sum, c) => sum + c[d], 0));
  return { dk, scale, scores, scaled, masked, weights, contributions, output };
}

// ---- the next-token distribution: model/sampling.py's rule -----------------------------

function nextTokenProbabilities(logits, sampling) {
  let values = logits.slice();
  for (const id of sampling.suppress) values[id] = -Infinity;
  if (sampling.temperature === 0) { // greedy: all the mass on the likeliest allowed token
    const best = values.indexOf(Math.max(...values));
    return values.map((_, i) => (i === best ? 1 : 0));
  }
  values = values.map((v) => v / sampling.temperature);
  if (sampling.topK !== null && sampling.topK < values.length) {
    const kth = values.slice().sort((a, b) => b - a)[sampling.topK - 1];
    values = values.map((v) => (v < kth ? -Infinity : v));
  }
  if (sampling.topP !== null && sampling.topP < 1) {
    const order = values.map((_, i) => i).sort((a, b) => values[b] - values[a]);
    const probs = softmax(order.map((i) => values[i]));
    let before = 0; // probability of the tokens ranked above this one
    order.forEach((id, rank) => {
      if (before >= sampling.topP) values[id] = -Infinity; // the ones above already reach top_p
      before += probs[rank];
    });
  }
  return softmax(values);
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

function drawMap(canvas, weights, cell, query) {
  const T = weights.length;
  canvas.width = canvas.height = T * cell;
  const ctx = canvas.getContext("2d");
  weights.forEach((row, i) => row.forEach((w, j) => {
    ctx.fillStyle = colour(w);
    ctx.fillRect(j * cell, i * cell, cell, cell);
  }));
  if (query !== null) { // the query row that the steps below explain
    ctx.strokeStyle = "rgb(230, 40, 40)";
    ctx.lineWidth = Math.max(1, cell / 4);
    ctx.strokeRect(0, query * cell, T * cell, cell);
  }
}

// ---- the panels -----------------------------------------------------------------------

function view() {
  return state.preview ? { ...state, ...state.preview } : state;
}

function renderHeader() {
  const c = DATA ? DATA.config : null;
  $("lang").textContent = t("switchLanguage");
  $("lock-state").textContent = state.locked ? t("locked") : t("unlocked");
  $("model-line").textContent = c ? t("modelLine", {
    layers: c.n_layer, heads: c.n_head, width: c.n_embd, dk: c.head_size, block: c.block_size,
    vocab: c.vocab_size, positions: c.pos_encoding }) : "";
  document.documentElement.lang = state.lang === "zh" ? "zh-CN" : "en";
  document.title = t("title");
  for (const node of document.querySelectorAll("[data-i18n]")) node.textContent = t(node.dataset.i18n);
}

function tokenLabel(token) {
  return token.bytes ? `⟨${token.bytes}⟩` : visible(token.text);
}

function renderTokens() {
  const box = $("tokens");
  box.replaceChildren();
  const v = view();
  DATA.tokens.forEach((token, i) => {
    const chip = el("button", { type: "button", class: "token", "data-index": i, title: `id ${token.id}` },
      el("span", { class: "index", text: String(i) }), el("span", { class: "piece", text: tokenLabel(token) }));
    if (token.joined) chip.append(el("span", { class: "joined", text: `→ ${visible(token.joined)}` }));
    if (i === v.query) chip.classList.add("selected");
    chip.addEventListener("mouseenter", () => preview({ query: i, key: null }));
    chip.addEventListener("mouseleave", () => preview(null));
    chip.addEventListener("click", () => choose({ query: i, key: null }));
    box.append(chip);
  });
  $("tokens-note").textContent = t("tokensNote", { count: DATA.tokens.length })
    + (DATA.truncated ? " " + t("truncated", { count: DATA.truncated }) : "");
}

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
        drawMap(canvas, head.weights, cell, null);
        canvas.addEventListener("mouseenter", () => preview({ layer: l, head: h }));
        canvas.addEventListener("mouseleave", () => preview(null));
        canvas.addEventListener("click", () => choose({ layer: l, head: h }));
        grid.append(canvas);
      });
    });
  }
  for (const canvas of grid.querySelectorAll("canvas")) {
    canvas.classList.toggle("selected", Number(canvas.dataset.layer) === v.layer && Number(canvas.dataset.head) === v.head);
  }
}

function renderMap() {
  const v = view();
  const head = DATA.layers[v.layer].heads[v.head];
  const T = DATA.tokens.length;
  $("map-title").textContent = t("mapTitle", { layer: v.layer, head: v.head });
  drawMap($("map"), head.weights, Math.max(2, Math.min(24, Math.floor(480 / T))), v.query);
  const c = DATA.config;
  $("position-note").textContent = c.pos_encoding === "rope" ? t("ropeNote") : t("additiveNote", { kind: c.pos_encoding });
}

function mapCell(event) {
  const canvas = $("map");
  const T = DATA.tokens.length;
  const box = canvas.getBoundingClientRect();
  const i = Math.floor(((event.clientY - box.top) / box.height) * T);
  const j = Math.floor(((event.clientX - box.left) / box.width) * T);
  return i >= 0 && i < T && j >= 0 && j < T ? { query: i, key: j } : null;
}

function showReadout(cell) {
  const v = view();
  if (!cell) { $("map-readout").textContent = ""; return; }
  const w = DATA.layers[v.layer].heads[v.head].weights[cell.query][cell.key];
  $("map-readout").textContent = t("readout", {
    query: cell.query, qtext: tokenLabel(DATA.tokens[cell.query]), key: cell.key,
    ktext: tokenLabel(DATA.tokens[cell.key]), weight: w === null ? t("maskedWord") : fmt(w, 6) });
}

function renderSteps() {
  const v = view();
  const head = DATA.layers[v.layer].heads[v.head];
  const s = fiveSteps(head, v.query);
  const T = DATA.tokens.length;
  const future = T - 1 - v.query;
  const qtext = tokenLabel(DATA.tokens[v.query]);
  $("steps-title").textContent = t("stepsTitle", { layer: v.layer, head: v.head, query: v.query, text: qtext });
  $("step-1").textContent = t("step1", { dk: s.dk, rotated: DATA.config.pos_encoding === "rope" ? t("rotatedQK") : "" });
  $("step-2").textContent = t("step2", { dk: s.dk, scale: s.scale.toFixed(6) });
  $("step-3").textContent = future ? t("step3", { count: future }) : t("step3none");
  const total = s.weights.reduce((a, b) => a + b, 0);
  $("step-4").textContent = t("step4", { sum: total.toFixed(6) });
  $("step-5").textContent = t("step5", { dk: s.dk });
  const largest = Math.max(...s.contributions.map(norm), 1e-12);
  const body = $("steps").tBodies[0];
  body.replaceChildren();
  for (let j = 0; j < T; j++) {
    const isMasked = j > v.query;
    const scoreCell = el("td", { class: "num score", "data-step": "1", "data-key": j, "data-value": s.scores[j],
      tabindex: "0", title: t("clickScore"), text: fmt(s.scores[j]) });
    scoreCell.addEventListener("click", () => choose({ key: j }));
    scoreCell.addEventListener("keydown", (e) => { if (e.key === "Enter") choose({ key: j }); });
    const share = norm(s.contributions[j]);
    const bar = el("span", { class: "bar" });
    bar.style.width = `${(60 * share) / largest}px`;
    const row = el("tr", { "data-key": j, class: isMasked ? "masked" : "" },
      el("td", { class: "key", text: `${j} ${tokenLabel(DATA.tokens[j])}` }),
      scoreCell,
      el("td", { class: "num", "data-step": "2", "data-value": s.scaled[j], text: fmt(s.scaled[j]) }),
      el("td", { class: "num", "data-step": "3", "data-value": isMasked ? "-Infinity" : s.masked[j],
        text: isMasked ? `−∞ (${t("maskedWord")})` : fmt(s.masked[j]) }),
      el("td", { class: "num", "data-step": "4", "data-value": s.weights[j], text: fmt(s.weights[j]) }),
      el("td", { class: "contribution", "data-step": "5", "data-value": share },
        bar, el("span", { class: "num", text: isMasked ? "0" : fmt(share, 3) })));
    if (j === v.key) row.classList.add("selected");
    body.append(row);
  }
  $("weights-sum").textContent = `Σ = ${total.toFixed(6)}`;
  renderTerms(head, v, s);
  renderOutput(head, v, s);
}

function norm(vector) {
  return Math.sqrt(vector.reduce((sum, x) => sum + x * x, 0));
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

function renderOutput(head, v, s) {
  const box = $("output");
  const model = head.output[v.query];
  const gap = Math.max(...s.output.map((x, d) => Math.abs(x - model[d])));
  box.replaceChildren(
    el("h3", { text: t("outputTitle", { query: v.query, dk: s.dk }) }),
    el("p", { class: "vector mono", "data-values": JSON.stringify(s.output), text: s.output.map((x) => fmt(x, 3)).join("  ") }),
    el("p", { class: "note", text: t("outputCheck", { gap: gap.toExponential(1) }) }));
}

function renderBlock() {
  const c = DATA.config;
  const T = DATA.tokens.length;
  const lines = [
    t("blockConcat", { H: c.n_head, T, dk: c.head_size, C: c.n_embd }),
    t("blockWO", { T, C: c.n_embd }),
    t(c.norm_position === "pre" ? "blockResidualPre" : "blockResidualPost", { T, C: c.n_embd }),
    t("blockFFN", { T, C: c.n_embd, F: 4 * c.n_embd }),
    t("blockNext", { layers: c.n_layer }),
  ];
  $("block-lines").replaceChildren(...lines.map((line) => el("li", { text: line })));
}

function readSampling() {
  const temperature = Number($("temperature").value);
  const topK = $("top-k").value === "" ? null : Number($("top-k").value);
  const topP = $("top-p").value === "" ? null : Number($("top-p").value);
  if (!(temperature >= 0)) return { error: t("badTemperature") };
  if (topK !== null && !(Number.isInteger(topK) && topK >= 1)) return { error: t("badTopK") };
  if (topP !== null && !(topP > 0 && topP <= 1)) return { error: t("badTopP") };
  return { temperature, topK, topP, suppress: DATA ? DATA.prediction.suppressed : [] };
}

function renderPrediction() {
  const sampling = readSampling();
  $("sampling-error").textContent = sampling.error ?? "";
  if (sampling.error) return;
  const { logits, texts, suppressed } = DATA.prediction;
  const probs = nextTokenProbabilities(logits, sampling);
  const ids = Object.keys(texts).map(Number).filter((id) => !suppressed.includes(id))
    .sort((a, b) => logits[b] - logits[a]).slice(0, 20);
  const last = DATA.tokens[DATA.tokens.length - 1];
  $("prediction-note").textContent = t("predictionNote", { text: tokenLabel(last) });
  const body = $("prediction").tBodies[0];
  body.replaceChildren(...ids.map((id) => {
    const bar = el("span", { class: "bar" });
    bar.style.width = `${120 * probs[id]}px`;
    return el("tr", { "data-id": id },
      el("td", { class: "key", text: visible(texts[id]) }),
      el("td", { class: "num", text: fmt(logits[id], 3) }),
      el("td", { class: "num probability", "data-value": probs[id], text: fmt(probs[id]) }),
      el("td", { class: "contribution" }, bar));
  }));
  $("suppressed").textContent = suppressed.length
    ? t("suppressedNote", { tokens: suppressed.map((id) => texts[id]).join(" ") }) : "";
}

function render() {
  renderHeader();
  $("empty").hidden = DATA !== null;
  $("explorer").hidden = DATA === null;
  if (DATA === null) return;
  renderTokens();
  renderGrid();
  renderMap();
  renderSteps();
  renderBlock();
  renderPrediction();
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

function reset() {
  state.layer = 0;
  state.head = 0;
  state.query = DATA ? DATA.tokens.length - 1 : 0;
  state.key = null;
  state.preview = null;
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

// ---- server mode: type a prompt, let the model continue it token by token ---------------

async function ask(path, body) {
  const response = await fetch(path, { method: "POST", headers: { "Content-Type": "application/json" },
    body: JSON.stringify(body) });
  const answer = await response.json();
  if (!response.ok) throw new Error(answer.error);
  return answer;
}

function busy(on, message = "") {
  for (const id of ["show", "continue"]) $(id).disabled = on;
  $("status").textContent = message;
}

let textIds = null; // the tokens of the text being continued, as the server gave them

async function show() {
  busy(true, t("working"));
  try {
    const answer = await ask("api/explore", { prompt: $("prompt").value });
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
      $("status").textContent = t("generating", { n, count });
      const answer = await ask("api/next", { prompt: $("prompt").value, ids: textIds,
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

if (SETTINGS.server) {
  $("prompt-panel").hidden = false;
  $("prompt").value = SETTINGS.prompt ?? "";
  $("show").addEventListener("click", show);
  $("prompt").addEventListener("input", () => { textIds = null; }); // edited: encode the text again
  $("continue").addEventListener("click", continueText);
}
reset();
render();
document.documentElement.dataset.ready = performance.now().toFixed(1); // ms to the first full page (bench/explorer.py)
