// The top of the page: which model and run it shows, the map of the whole model (each piece a
// link to its panel, lit while that panel is read), each panel's formula, and the text's
// tokens with each one's loss: how surprised the model was by it.
const Overview = (() => {
  "use strict";
  const { t, word } = Page;
  const { el, $, count, fmt, visible, tokenLabel, index, lossColour } = View;

  // A char model reads the characters its training text held, and no other: said before the
  // learner types one it never saw (the page refuses those, naming them)
  function knownCharacters() {
    if (Page.TOKENIZER.kind !== "char") return "";
    const known = [...Page.TOKENIZER.vocab.keys()].filter((piece) => [...piece].length === 1)
      .sort((a, b) => a.codePointAt(0) - b.codePointAt(0));
    return t("sentenceGap") + t("charsKnown", { count: known.length, characters: known.map(visible).join(" ") });
  }

  function renderHeader() {
    const data = Page.data;
    const c = data ? data.config : null;
    const why = Page.SETTINGS.why_not;
    $("prompt-note").textContent = Page.SETTINGS.server ? "" : Page.MODEL ? t("inPageNote", { parameters: count(Page.MODEL.parameters) })
      + knownCharacters() : why ? t(`whyNot_${why.code}`, { count: count(why.values.count ?? 0), limit: count(why.values.limit ?? 0) }) : "";
    $("lang").textContent = t("switchLanguage");
    $("lock-state").textContent = Page.state.locked ? t("locked") : t("unlocked");
    $("model-line").textContent = c ? t("modelLine", {
      layers: c.n_layer, heads: c.n_head, width: c.n_embd, dk: c.head_size, block: c.block_size,
      vocab: c.vocab_size, positions: word("positions", c.pos_encoding), norm: word("norms", c.norm) }) : "";
    renderRun(data ? data.run : null);
    const init = data && data.model === "init";
    $("model-state").textContent = data ? t(init ? "showingInit" : "showingTrained") : "";
    $("model-switch").textContent = t(init ? "switchToTrained" : "switchToInit");
    $("model-switch").hidden = !data || !(Page.SETTINGS.server || Page.SETTINGS.counterpart);
    // (set only when they change: setting them makes the browser restyle the page there and then)
    const lang = Page.state.lang === "zh" ? "zh-CN" : "en";
    if (document.documentElement.lang !== lang) document.documentElement.lang = lang;
    if (document.title !== t("title")) document.title = t("title");
    for (const node of document.querySelectorAll("[data-i18n]")) node.textContent = t(node.dataset.i18n);
  }

  // The run that trained this model, from its summary.json: how long it trained, and a warning
  // when the run itself found the model barely trained.
  function renderRun(run) {
    const known = (x, write) => (x === null || x === undefined ? "—" : write(x)); // (a run of an earlier version)
    $("run-line").textContent = run ? t("runLine", { iterations: count(run.iteration), tokens: known(run.tokens, count),
      loss: known(run.val_loss, (x) => fmt(x, 4)), weights: t({ average: "weightsAverage", trained: "weightsTrained" }[run.weights]
        ?? "weightsSaved") }) : "";
    const pace = run && run.pace;
    if (pace) { // (a run of fixed length trained its steps whatever the pace: only how busy the machine was)
      const budgeted = pace.budget ?? true;
      $("run-line").textContent += (budgeted ? t("sentenceGap") + t("runPace", { ms: fmt(1000 * pace.best_pace, 0),
        held: count(pace.timed_iterations), best: count(pace.at_best_pace) }) : "")
        + (pace.busy_share >= 0.25 ? t("sentenceGap") + t(budgeted ? "runBusy" : "runBusyFixed",
          { share: fmt(100 * pace.busy_share, 0) }) : "");
    }
    const why = run && run.barely_trained;
    $("run-warning").hidden = !why;
    $("run-warning").textContent = !why ? "" : why.reason === "warmup"
      ? t("barelyWarmup", { iteration: why.iteration, warmup: why.warmup })
      : t("barelyLoss", { loss: fmt(why.val_loss, 2), initial: fmt(why.initial_loss, 2) });
  }

  // The tokens, each with its loss under it (the first has none: nothing comes before it);
  // with a head switched off (the ablation panel), a second row of losses without it
  function renderTokens() {
    const data = Page.data;
    const v = Page.view();
    const { losses, what, step } = Timeline.tokenLosses();
    const off = Page.state.ablate && data.ablation && data.ablation[Page.state.ablate[0]][Page.state.ablate[1]];
    const high = Math.log(data.config.vocab_size); // a uniform guess: the darkest colour
    const lossCell = (loss, row) => (loss === undefined ? el("span", { class: "loss none", text: "·" })
      : el("span", { class: `loss ${row}`, "data-value": loss, style: `background:${lossColour(loss, high)}`,
        title: t("tokenLossTitle", { loss: fmt(loss, 3), p: fmt(Math.exp(-loss), 3) }), text: fmt(loss, 1) }));
    const box = $("tokens");
    box.replaceChildren();
    data.tokens.forEach((token, i) => {
      const chip = el("button", { type: "button", class: "token", "data-index": i, title: `id ${token.id}` },
        el("span", { class: "index", text: index(i) }), el("span", { class: "piece", text: tokenLabel(token) }));
      if (token.joined) chip.append(el("span", { class: "joined", text: `→ ${visible(token.joined)}` }));
      chip.append(lossCell(i ? losses[i - 1] : undefined, "on"));
      if (off) chip.append(lossCell(i ? off.losses[i - 1] : undefined, "off"));
      if (i === v.query) chip.classList.add("selected");
      chip.addEventListener("mouseenter", () => Page.preview({ query: i, key: null }));
      chip.addEventListener("mouseleave", () => Page.preview(null));
      chip.addEventListener("click", () => Page.choose({ query: i, key: null, coordinate: null }));
      box.append(chip);
    });
    const mean = (xs) => xs.reduce((a, b) => a + b, 0) / Math.max(xs.length, 1);
    $("tokens-note").textContent = t("tokensNote", { count: data.tokens.length })
      + (data.truncated ? t("sentenceGap") + t("truncated", { count: data.truncated }) : "")
      + (data.tokens.length < SHORT_TEXT ? t("sentenceGap") + t("shortText", { count: SHORT_TEXT }) : "");
    $("losses-note").textContent = losses.length ? t(what, { mean: fmt(mean(losses), 3), high: fmt(high, 2), step })
      + (off ? t("sentenceGap") + t("lossesOff", { layer: Page.state.ablate[0], head: Page.state.ablate[1],
        mean: fmt(mean(off.losses), 3) }) : "") : "";
  }

  const SHORT_TEXT = 16; // fewer tokens than this, and the maps are too small to show a pattern

  // ---- the map of the whole model, and each panel's formula --------------------------------

  // The model's pieces in the order it runs them, each a link to the panel that shows it and lit
  // while one of the panels in `lit` is the one being read.
  function mapPieces(c) {
    const norm = word("norms", c.norm);
    const piece = (label, panel, lit = [panel]) => ({ label, panel, lit });
    const attention = piece(word("pieces", "attention"), "steps-panel",
      ["heads-panel", "query-panel", "map-panel", "head-view-panel", "qkv-panel", "steps-panel"]);
    const ffn = piece(word("pieces", "feed_forward"), "block-panel");
    const plus = piece("+", "block-panel");
    const block = c.norm_position === "post"
      ? [attention, plus, piece(norm, "block-panel"), ffn, plus, piece(norm, "block-panel")]
      : [piece(norm, "qkv-panel"), attention, plus, piece(norm, "block-panel"), ffn, plus];
    return {
      before: [piece(t("mapToken"), "tokens-panel"),
        piece(t(c.pos_encoding === "rope" ? "mapEmbeddingRope" : "mapEmbedding"), "embedding-panel")],
      block,
      after: [piece(t("mapFinalNorm", { norm }), "lens-panel"), piece(word("pieces", "lm_head"), "prediction-panel",
        ["lens-panel", "prediction-panel"]), piece(t("mapProbabilities"), "prediction-panel")],
    };
  }

  function renderModelMap() {
    const c = Page.data.config;
    const { before, block, after } = mapPieces(c);
    const link = (p) => el("a", { href: `#${p.panel}`, "data-panel": p.panel, "data-lit": p.lit.join(" "), text: p.label });
    const arrow = () => el("span", { class: "arrow", text: "→" });
    const chain = (pieces) => pieces.flatMap((p, i) => (i ? [arrow(), link(p)] : [link(p)]));
    $("model-map").setAttribute("aria-label", t("mapLabel"));
    $("model-map").replaceChildren(...chain(before), arrow(),
      el("span", { class: "layers" }, ...chain(block),
        el("span", { class: "repeat", text: t("mapLayers", { count: c.n_layer, layer: Page.view().layer }) })),
      arrow(), ...chain(after));
    lightSoon();
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
  // Lit at the next frame, once the panels are drawn: reading where they are while the page is
  // being redrawn would make the browser lay it out twice (a slider's move redraws every panel).
  let mapFrame = null;
  const lightSoon = () => { mapFrame ??= requestAnimationFrame(() => { mapFrame = null; lightMap(); }); };
  window.addEventListener("scroll", lightSoon);

  // What each panel computes, in the code's notation, for this model's pieces (the words
  // between the symbols in the page's language).
  function panelFormulas(c) {
    const norm = c.norm === "rmsnorm" ? "RMSNorm" : "LN";
    const input = c.norm_position === "post" ? "x" : `${norm}(x)`;
    const bias = (name) => (c.bias ? ` + b_${name}` : "");
    const position = { learned: " + wpe[position]", sinusoidal: " + PE(position)", rope: "" }[c.pos_encoding];
    const ffn = c.mlp === "swiglu" ? "(SiLU(h W_gate) ⊙ h W_up) W_2"
      : `${c.activation === "gelu_tanh" ? "GELU_tanh" : "GELU"}(h W_1${bias(1)}) W_2${bias(2)}`;
    const block = c.mlp === "none" ? (c.norm_position === "post" ? `x = ${norm}(x + Attention(x))${t("formulaNoFfn")}`
      : `x = x + concat(heads) W_O${bias("O")}${t("formulaNoFfn")}`)
      : c.norm_position === "post"
        ? `x = ${norm}(x + Attention(x));  x = ${norm}(x + FFN(x));  FFN(h) = ${ffn}`
        : `x = x + concat(heads) W_O${bias("O")};  x = x + FFN(${norm}(x));  FFN(h) = ${ffn}`;
    const weights = "w = softmax(q kᵀ / √d_k + mask)";
    return {
      tokens: "ids = tokenizer.encode(text)",
      embedding: `x = wte[id]${position}` + (c.pos_encoding === "rope" ? t("formulaRope") : ""),
      heads: weights, query: weights, map: weights, "head-view": weights,
      qkv: ["Q", "K", "V"].map((m) => `${m.toLowerCase()} = ${input} W_${m}${(c.qkv_bias ?? c.bias) ? ` + b_${m}` : ""}`)
        .join(";  "),
      steps: "Attention(q, K, V) = softmax(q Kᵀ / √d_k + mask) V",
      block,
      lens: "p_ℓ = softmax(lm_head(ln_f(x_ℓ)))",
      prediction: `p = softmax(lm_head(ln_f(x_L)) / temperature)${t("formulaSampling")}`,
      // ln_f is taken at the whole stream's statistics, so each piece's share is linear in it
      logit: c.norm === "rmsnorm" ? "logit(t) = Σ_pieces γ ⊙ piece / rms(x) · W_U[t]"
        : `logit(t) = Σ_pieces γ ⊙ (piece − mean(piece)) / σ(x) · W_U[t]${c.bias ? " + β · W_U[t]" : ""}`,
      patching: "restored = (L_corrupt − L_patched) / (L_corrupt − L_clean)",
    };
  }

  function renderFormulas() {
    const formulas = panelFormulas(Page.data.config);
    for (const node of document.querySelectorAll("[data-formula]")) node.textContent = formulas[node.dataset.formula];
  }

  return { renderHeader, renderTokens, renderModelMap, renderFormulas };
})();
