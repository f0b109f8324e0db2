// From the key to the logit: the copying half of the lesson's circuit, with the model's own
// numbers. Three panels and three charts:
//   where the logit comes from  the picked position's logit of a token (the one that follows, by
//                               default) split by what wrote the final stream (sources.js)
//   patching                    each component's clean output put back into the run of the text
//                               with its first copies corrupted, at every position and at each
//                               one, and on one path (straight to the logits, or through its own
//                               block's feed-forward network): how much of the second copies'
//                               loss it restores (patching.js)
//   over training               where the induction head's weight goes from the second copies'
//                               queries; which pieces push the right token's logit; what each
//                               piece carries (the current token, the token before): from
//                               explorer/data.py's timeline (inspection/in_context.py,
//                               circuits.py, readout.py), one value a snapshot
const CircuitPanels = (() => {
  "use strict";
  const { t } = Page;
  const { el, $, fmt, tokenLabel, textOf, lineChart, legend, diverging } = View;

  // A piece of the stream in the page's words (as the score's split names them)
  const pieceName = (name) => AttentionPanels.pieceName(name);

  // A row of bars: one a piece, its value's sign in its colour, scaled to the largest
  function bars(pieces, values, side) {
    const biggest = Math.max(...values.map(Math.abs), 1e-12);
    return values.map((x, p) => {
      const bar = el("span", { class: "bar" });
      bar.style.width = `${(80 * Math.abs(x)) / biggest}px`;
      bar.style.background = diverging(Math.sign(x));
      return el("p", { class: "source-bar", "data-side": side, "data-piece": pieces[p], "data-value": x },
        el("span", { class: "key", text: pieceName(pieces[p]) }), bar, el("span", { class: "num", text: fmt(x, 3) }));
    });
  }

  // ---- where the logit comes from -------------------------------------------------------------

  // The token whose logit is split: the learner's pick (#logit-token), else the one that follows
  // the query in the text, else (at the text's end) the likeliest
  function logitToken(query) {
    const data = Page.data;
    const picked = Page.state.logitToken; // {query, token}: the pick holds for the position it was made at
    if (picked && picked.query === query && picked.token < data.config.vocab_size) return picked.token;
    if (query < data.tokens.length - 1) return data.tokens[query + 1].id;
    const lens = data.layers[data.layers.length - 1].lens;
    return lens.ids[query][0];
  }

  function renderLogit() {
    const v = Page.view();
    const data = Page.data;
    const panel = $("logit-panel");
    panel.hidden = !Page.model || data.config.norm_position !== "pre";
    if (panel.hidden) return;
    const token = logitToken(v.query);
    const found = Sources.logitSources(Page.model, data, v.query, token);
    const total = found.contributions.reduce((a, b) => a + b, 0);
    $("logit-title").textContent = t("logitTitle", { query: v.query, text: tokenLabel(data.tokens[v.query]),
      token: textOf(token) });
    const next = v.query < data.tokens.length - 1 ? data.tokens[v.query + 1].id : null;
    const choices = [...new Set([next, ...data.layers[data.layers.length - 1].lens.ids[v.query]].filter((id) => id !== null))];
    $("logit-token").replaceChildren(...choices.map((id) => el("option", { value: String(id),
      text: id === next ? t("logitNext", { token: textOf(id) }) : textOf(id) })));
    $("logit-token").value = String(token);
    $("logit-note").textContent = t("logitNote", { count: found.pieces.length - 1, logit: fmt(found.logit, 6),
      total: fmt(total, 6) });
    $("logit-bars").replaceChildren(...bars(found.pieces, found.contributions, "logit"));
  }

  // ---- patching -------------------------------------------------------------------------------

  let patched = null; // {version: Page.version when it ran, result, ms}

  const circuit = () => (Page.data.timeline && Page.data.timeline.circuit) || null;
  const textOfPage = () => Page.TOKENIZER.decode(Page.data.tokens.map((token) => token.id));

  function canPatch() { // the page runs a char model on lines written twice, and knows the lesson's alphabet
    return !!(Page.model && circuit() && Page.TOKENIZER && Page.MODEL.tokenizer.kind === "char"
      && Page.data.config.norm_position === "pre" && Patching.scoredTargets(textOfPage()).some(Boolean));
  }

  function runPatching() {
    const start = performance.now();
    const result = Patching.run(Page.model, Page.TOKENIZER, textOfPage(), circuit().symbols);
    patched = { version: Page.version, result, ms: performance.now() - start };
    renderPatching();
    $("patch-run").dataset.ms = patched.ms.toFixed(1); // (bench/explorer.py reads it)
  }

  function renderPatching() {
    const panel = $("patching-panel");
    panel.hidden = !Page.model || !circuit();
    if (panel.hidden) return;
    const able = canPatch();
    $("patch-run").disabled = !able;
    $("patching-note").textContent = able ? t("patchingNote") : t("patchingNone");
    const fresh = patched && patched.version === Page.version ? patched.result : null;
    $("patching-corrupted").textContent = able ? Patching.corrupted(textOfPage(), circuit().symbols) : "";
    if (!fresh) {
      $("patching-result").textContent = able ? t("patchingAsk") : "";
      $("patching-grid").replaceChildren();
      $("patching-paths").replaceChildren();
      return;
    }
    $("patching-result").textContent = t("patchingResult", { clean: fmt(fresh.clean, 3), corrupt: fmt(fresh.corrupt, 3),
      ms: patched.ms.toFixed(0) });
    const tokens = Page.data.tokens;
    const scored = Patching.scoredTargets(textOfPage()); // (target p − 1 is token p: a second copy's symbol)
    const cell = (value, attributes = {}) => el("td", { class: "num patch", "data-value": value, ...attributes,
      style: `background:${diverging(Math.max(-1, Math.min(1, value)))}`, title: fmt(value, 3), text: fmt(value, 2) });
    $("patching-grid").replaceChildren(
      el("thead", {}, el("tr", {}, el("th", { text: t("patchingComponent") }), el("th", { text: t("patchingEvery") }),
        ...tokens.map((token, p) => el("th", { class: p > 0 && scored[p - 1] ? "mono second" : "mono", title: `${p}`,
          text: tokenLabel(token) })))),
      el("tbody", {}, ...fresh.components.map((name, k) => el("tr", { "data-component": name },
        el("th", { text: pieceName(name) }), cell(fresh.all[k], { "data-every": "1" }),
        ...fresh.positions[k].map((value, p) => cell(value, { "data-position": p }))))));
    const paths = fresh.paths;
    $("patching-paths").replaceChildren(
      el("thead", {}, el("tr", {}, el("th", { text: t("patchingHead") }), el("th", { text: t("patchingAll") }),
        el("th", { text: t("patchingDirect") }), ...(paths.ffn ? [el("th", { text: t("patchingFfn") })] : []))),
      el("tbody", {}, ...paths.heads.map((name, h) => el("tr", { "data-component": name }, el("th", { text: pieceName(name) }),
        cell(paths.all[h], { "data-path": "all" }), cell(paths.direct[h], { "data-path": "direct" }),
        ...(paths.ffn ? [cell(paths.ffn[h], { "data-path": "ffn" })] : [])))));
  }

  // ---- the copying half over training -----------------------------------------------------------

  function renderOverTraining() {
    const tl = Page.data.timeline;
    const found = tl && tl.circuit;
    $("timeline-circuit").hidden = !found;
    if (!found) return;
    const s = Timeline.picked();
    const [layer, head] = found.head;
    const stages = found.stages;
    const where = [["right", "stageRight", "rgb(214, 40, 40)"], ["same", "stageSame", "rgb(59, 82, 139)"],
      ["rest", "stageRest", "rgb(120, 120, 120)"]].map(([key, name, colour]) => ({ name: t(name), key, colour,
      picked: key === "right", values: stages.map((step) => step[key]) }));
    const turned = tl.steps.find((_, i) => stages[i].right > stages[i].same && stages[i].right > 0.5);
    const sameLead = tl.steps.filter((_, i) => stages[i].same > stages[i].right && stages[i].same > 0.3);
    $("timeline-stages-note").textContent = t("stagesNote", { layer, head, right: fmt(stages[s].right, 3),
      same: fmt(stages[s].same, 3), step: tl.steps[s] }) + t("sentenceGap")
      + (sameLead.length ? t("stagesSameFirst", { from: sameLead[0], to: sameLead[sameLead.length - 1] }) : t("stagesNoSame"))
      + (turned !== undefined ? t("sentenceGap") + t("stagesTurned", { step: turned }) : "");
    $("timeline-stages-chart").replaceChildren(lineChart({ steps: tl.steps, series: where, picked: s,
      label: t("stagesTitle", { layer, head }), low: 0, high: 1 }), legend(where, s, null));
    const names = found.logit[0].pieces;
    const colourOf = (name, i) => `hsl(${Math.round((360 * i) / names.length)}, 60%, 42%)`;
    const logitLines = names.map((name, i) => ({ name: pieceName(name), key: name, colour: colourOf(name, i),
      picked: name.endsWith("FFN") && name.startsWith(`L${Page.data.config.n_layer - 1}`),
      values: found.logit.map((step) => step.values[i]) }));
    const every = logitLines.flatMap((line) => line.values);
    const biggest = logitLines.reduce((a, b) => (Math.abs(b.values[s]) > Math.abs(a.values[s]) ? b : a));
    $("timeline-logit-note").textContent = t("logitOverNote", { step: tl.steps[s], best: biggest.name,
      value: fmt(biggest.values[s], 3) });
    $("timeline-logit-chart").replaceChildren(lineChart({ steps: tl.steps, series: logitLines, picked: s,
      label: t("logitOverTitle"), low: Math.min(0, ...every), high: Math.max(...every) }),
    legend(logitLines.slice().sort((a, b) => Math.abs(b.values[s]) - Math.abs(a.values[s])).slice(0, 8), s, null));
    const readNames = found.readout[0].pieces;
    const chance = 1 / Page.data.config.vocab_size;
    const readout = (which) => readNames.map((name, i) => ({ name: pieceName(name), key: name, colour: colourOf(name, i),
      picked: name === "L0 FFN", values: found.readout.map((step) => step[which][i]) }));
    const ffn = readNames.indexOf("L0 FFN");
    $("timeline-readout-note").textContent = ffn < 0 ? t("readoutNoteNoFfn", { step: tl.steps[s] })
      : t("readoutNote", { step: tl.steps[s], previous: fmt(found.readout[s].previous[ffn], 3),
        current: fmt(found.readout[s].current[ffn], 3) });
    $("timeline-readout-charts").replaceChildren(...["previous", "current"].map((which) => {
      const lines = readout(which);
      return el("div", { "data-which": which }, el("h4", { text: t(which === "previous" ? "readoutPrevious" : "readoutCurrent") }),
        lineChart({ steps: tl.steps, series: lines, picked: s, label: t(which === "previous" ? "readoutPrevious"
          : "readoutCurrent"), low: 0, high: 1, uniform: chance, uniformLabel: t("chanceLine") }),
        legend(lines.slice().sort((a, b) => b.values[s] - a.values[s]).slice(0, 6), s, null));
    }));
  }

  $("logit-token").addEventListener("change", () => {
    Page.state.logitToken = { query: Page.view().query, token: Number($("logit-token").value) };
    Page.render();
  });
  $("patch-run").addEventListener("click", runPatching);

  return { renderLogit, renderPatching, renderOverTraining };
})();
