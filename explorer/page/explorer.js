// The explorer: one token followed through the whole model, with the model's own numbers
// (explorer/data.py's, or for a text typed into the page or a step of the timeline, data.js's
// from model.js's forward pass). This script puts the page together: it draws every panel
// (overview.js, attention.js, output.js, timeline.js) from Page.data and what is picked,
// and answers the learner: hover and click, the language, the experiments, the slider, a
// text typed into the page (or, with --serve, sent to the server), the model continuing it,
// and the switch to the model at initialisation.
const Explorer = (() => {
  "use strict";
  const { t } = Page;
  const { $, visible } = View;
  const { renderHeader, renderTokens, renderModelMap, renderFormulas } = Overview;
  const { renderEmbedding, renderGrid, renderQueryGrid, renderMap, renderQKV, renderSteps, renderSources, mapCell,
    showReadout } = AttentionPanels;
  const { renderBlock, renderLens, renderPrediction, renderAblation, readSampling } = OutputPanels;

  function render() {
    renderHeader();
    $("empty").hidden = Page.data !== null;
    $("explorer").hidden = Page.data === null;
    if (Page.data === null) return;
    renderModelMap();
    renderFormulas();
    renderTokens();
    Timeline.render();
    renderEmbedding();
    renderGrid();
    renderQueryGrid();
    renderMap();
    renderQKV();
    renderSteps();
    renderSources();
    CircuitPanels.renderLogit();
    CircuitPanels.renderPatching();
    CircuitPanels.renderOverTraining();
    renderBlock();
    renderLens();
    renderPrediction();
    renderAblation();
  }
  Page.render = render;

  // The text the panels show: its ids (the last block_size), how many were cut from its start,
  // and whether it is the example the file was written for
  const idsOf = (data) => data.tokens.map((token) => token.id);
  Page.text = { ids: Page.EXAMPLE ? idsOf(Page.EXAMPLE) : [], truncated: Page.EXAMPLE ? Page.EXAMPLE.truncated : 0,
    example: true };

  function reset() { // a new text: its middle token, where the causal mask has something to hide
    Object.assign(Page.state, { layer: 0, head: 0, key: null, coordinate: null, ablate: null, preview: null,
      query: Page.data ? Math.floor((Page.data.tokens.length - 1) / 2) : 0 });
  }

  const PICKED = ["layer", "head", "query", "key", "snapshot"]; // what the model switch carries to the other page

  function restoreFromAddress() { // #layer=1&head=0&query=5&lang=zh: where the other page left off
    const fields = new URLSearchParams(location.hash.slice(1));
    for (const name of PICKED) {
      const value = Number(fields.get(name));
      if (fields.has(name) && Number.isInteger(value) && value >= 0) Page.state[name] = value;
    }
    if (["en", "zh"].includes(fields.get("lang"))) Page.state.lang = fields.get("lang");
    if (Page.MODEL && fields.get("text")) {
      $("prompt").value = fields.get("text");
      showTyped(); // keeping the picks the address names
    } else if (Timeline.timeline() && Page.state.snapshot !== null) {
      Timeline.pick(Timeline.picked());
    }
    const data = Page.data;
    if (Page.state.layer >= data.layers.length || Page.state.head >= data.config.n_head
        || Page.state.query >= data.tokens.length || (Page.state.key !== null && Page.state.key >= data.tokens.length)) reset();
  }

  // ---- hover, click, Esc, the language, the experiments, the slider -------------------------

  document.addEventListener("keydown", (event) => {
    if (event.key === "Escape") {
      Page.state.locked = false;
      Page.state.preview = null;
      render();
    }
  });

  $("lang").addEventListener("click", () => {
    Page.state.lang = Page.state.lang === "en" ? "zh" : "en";
    render();
  });

  $("map").addEventListener("mousemove", (event) => {
    const cell = mapCell(event);
    showReadout(cell);
    if (cell) Page.preview({ query: cell.query, key: cell.key });
  });
  $("map").addEventListener("mouseleave", () => { showReadout(null); Page.preview(null); });
  $("map").addEventListener("click", (event) => { const cell = mapCell(event); if (cell) Page.choose(cell); });
  for (const id of ["temperature", "top-k", "top-p"]) $(id).addEventListener("input", renderPrediction);
  for (const [id, name] of [["no-scale", "noScale"], ["no-mask", "noMask"]]) {
    $(id).addEventListener("change", () => { Page.state[name] = $(id).checked; render(); });
  }

  $("ablate-all").addEventListener("click", () => {
    const start = performance.now();
    Page.data.ablation = PageData.ablated(Page.model, idsOf(Page.data));
    render();
    $("ablate-all").dataset.ms = (performance.now() - start).toFixed(1);
  });

  $("timeline-step").addEventListener("input", async () => {
    const s = Number($("timeline-step").value);
    const start = performance.now();
    if (Page.SETTINGS.server) {
      Page.state.snapshot = s;
      await show({ keep: true });
    } else {
      Timeline.pick(s);
      if (Page.state.ablate && !Page.data.ablation) Page.state.ablate = null;
      render();
    }
    $("timeline-step").dataset.ms = (performance.now() - start).toFixed(1); // (bench/explorer.py reads it)
  });

  // ---- trained or at initialisation --------------------------------------------------------

  async function switchModel() {
    const which = Page.data.model === "init" ? "trained" : "init";
    if (!Page.SETTINGS.server) { // the other page, written beside this one by explore.py
      const fields = new URLSearchParams({ lang: Page.state.lang });
      for (const name of PICKED) if (Page.state[name] !== null && name !== "snapshot") fields.set(name, Page.state[name]);
      if (!Page.text.example) fields.set("text", $("prompt").value); // the other page runs its model on it
      location.href = `${Page.SETTINGS.counterpart}#${fields}`;
      return;
    }
    busy(true, t("working"));
    try {
      const answer = await ask("api/explore", { prompt: $("prompt").value, ids: textIds, model: which });
      Page.show(answer.data);
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
      throw new Error(answer.code && Page.STRINGS.en[`error_${answer.code}`] ? t(`error_${answer.code}`, answer.values ?? {})
        : answer.error);
    }
    return answer;
  }

  function busy(on, message = "") {
    for (const id of ["show", "continue", "model-switch"]) $(id).disabled = on;
    $("status").textContent = message;
  }

  let textIds = null; // the tokens of the text being continued, as the server gave them

  // Where one head's score for (query, key) comes from (sources.js): the page computes it where
  // it runs the model; with --serve the server does, once a pick (the panel waits, then draws
  // again); a file page that cannot run its model carries the last token's alone.
  const fromServer = new Map();
  Page.sourcesOf = (layer, head, query, key) => {
    if (Page.model) return Sources.scoreSources(Page.model, Page.data, layer, head, query, key);
    if (Page.SETTINGS.server) {
      const pick = `${Page.version} ${layer} ${head} ${query} ${key}`;
      if (!fromServer.has(pick)) {
        fromServer.set(pick, { why: "sourcesWaiting" });
        const timeline = Page.data.timeline;
        const step = timeline && Page.state.snapshot !== null ? timeline.steps[Page.state.snapshot] : undefined;
        const ids = Page.data.tokens.map((token) => token.id); // (the text the panels show)
        ask("api/sources", { ids, model: Page.data.model, step, layer, head, query, key })
          .then((found) => fromServer.set(pick, found), (error) => fromServer.set(pick, { why: "sourcesFailed",
            error: error.message }))
          .then(() => AttentionPanels.renderSources());
      }
      return fromServer.get(pick);
    }
    const carried = Page.data.sources && Page.data.sources[`${layer}.${head}`];
    if (!carried || carried.query !== query || carried.key !== key) return null;
    return { ...carried, contributions: Numbers.rows(carried.contributions) };
  };

  // The server's data for the text (at the picked step of the timeline, where it has one);
  // keep: the same text, so the picks stay
  async function show({ keep = false } = {}) {
    busy(true, t("working"));
    try {
      const timeline = Page.data && Page.data.timeline;
      const step = timeline && Page.state.snapshot !== null ? timeline.steps[Page.state.snapshot] : undefined;
      const answer = await ask("api/explore", { prompt: $("prompt").value, ids: keep ? textIds : undefined,
        model: Page.data ? Page.data.model : "trained", step });
      textIds = answer.ids;
      Page.show(answer.data);
      if (!keep) reset();
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
        const answer = await ask("api/next", { prompt: $("prompt").value, ids: textIds, model: Page.data.model,
          temperature: sampling.temperature, top_k: sampling.topK, top_p: sampling.topP });
        $("prompt").value = answer.prompt;
        textIds = answer.ids;
        Page.show(answer.data);
        Page.state.query = Page.data.tokens.length - 1;
        Page.state.key = null;
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
    const unknown = Page.TOKENIZER.unknown(text);
    if (unknown.length) throw new Error(t("error_unknown", { characters: unknown.slice(0, 10).map((c) => `'${visible(c)}'`).join(" ") }));
    return Page.TOKENIZER.encode(text);
  }

  // The ids' last max_tokens (at most block_size) through the model of the picked step in the
  // page: the new data. Returns the milliseconds it took.
  function runInPage(ids) {
    const limit = Math.min(Page.SETTINGS.max_tokens, Page.MODEL.config.block_size);
    const start = performance.now();
    Page.text = { ids: ids.slice(-limit), truncated: Math.max(0, ids.length - limit), example: false };
    Page.show(Timeline.dataAt(Page.text.ids, Page.text.truncated, false));
    $("example").hidden = false;
    return performance.now() - start;
  }

  function showTyped() { // the typed text's panels, keeping the picks that still exist
    try {
      textIds = encodeTyped($("prompt").value);
    } catch (error) {
      $("status").textContent = error.message;
      return;
    }
    const ms = runInPage(textIds);
    if (Page.state.query >= Page.data.tokens.length || Page.state.key >= Page.data.tokens.length) reset();
    Page.state.ablate = null;
    render();
    $("status").textContent = t("ranInPage", { count: Page.data.tokens.length, ms: ms.toFixed(0) });
    $("status").dataset.ms = ms.toFixed(1);
  }

  // The model of the picked step continues the text token by token in the page, with the KV
  // cache (model.js's generate), by the page's sampling rule; the panels follow the new text.
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
    const tokens = Model.generate(Page.model, textIds, count, sampling);
    for (;;) {
      const start = performance.now();
      const next = tokens.next();
      computing += performance.now() - start;
      if (next.done) break;
      n += 1;
      textIds = [...textIds, next.value];
      $("prompt").value = Page.TOKENIZER.readableDecode(textIds); // (no U+FFFD for a cut character, no raw control)
      $("status").textContent = t("generating", { n, count });
      await new Promise((resolve) => setTimeout(resolve)); // let the page show the text so far
    }
    runInPage(textIds);
    Page.state.query = Page.data.tokens.length - 1;
    Page.state.key = null;
    render();
    busy(false, t("generatedInPage", { count: n, rate: (n / (computing / 1000)).toFixed(0), ms: computing.toFixed(0) }));
    $("status").dataset.rate = (n / (computing / 1000)).toFixed(1);
  }

  function showExample() {
    textIds = null;
    Page.text = { ids: idsOf(Page.EXAMPLE), truncated: Page.EXAMPLE.truncated, example: true };
    Page.show(Timeline.dataAt(Page.text.ids, Page.text.truncated, true));
    $("prompt").value = Page.SETTINGS.prompt;
    $("example").hidden = true;
    $("status").textContent = "";
    reset();
    render();
  }

  let typing = null; // the pause after the last keystroke before the page runs the model

  if (Page.SETTINGS.server) {
    $("prompt-panel").hidden = false;
    $("prompt").value = Page.SETTINGS.prompt ?? "";
    $("show").addEventListener("click", () => show());
    $("prompt").addEventListener("input", () => { textIds = null; }); // edited: encode the text again
    $("continue").addEventListener("click", continueText);
  } else if (Page.MODEL) {
    $("prompt-panel").hidden = false;
    $("prompt").value = Page.SETTINGS.prompt;
    $("show").addEventListener("click", showTyped);
    $("prompt").addEventListener("input", () => {
      textIds = null;
      clearTimeout(typing);
      typing = setTimeout(showTyped, 300);
    });
    $("continue").addEventListener("click", continueInPage);
    $("example").addEventListener("click", showExample);
  } else if (Page.SETTINGS.why_not) { // the example only: say why, and how to type a text
    $("prompt-panel").hidden = false;
    $("prompt").hidden = $("prompt-controls").hidden = true;
  }
  reset();
  if (Page.data) restoreFromAddress();
  render();
  document.documentElement.dataset.ready = performance.now().toFixed(1); // ms to the first full page (bench/explorer.py)

  return { render };
})();
