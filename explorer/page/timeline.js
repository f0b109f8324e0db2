// Watching it learn: the model at each snapshot the run kept (training/snapshots.py). Where
// the page carries every snapshot's weights (a small model: explorer/data.py's
// carries_snapshots), the slider swaps the model the page runs and every panel shows that
// step's model on the current text, typed or not. Where it does not (a larger model), the
// timeline holds the example text's maps, prediction, logit lens and tokens' losses at each
// step, which follow the slider; the other panels show the trained model, and say so.
// Above the slider: the validation loss and every head's scores over the run (current token,
// previous token, induction, copying), each a line named on hover and in the legend, against
// what attention spread evenly (or chance) scores; how the heads compose (Q-, K- and
// V-composition of every pair of heads in different layers: inspection/circuits.py), the
// lesson's pair lit; and how the loss depends on the context: on the lesson's text the
// first and second copies parting (the docs' table read off the run), for any run the loss
// by position in the window and the in-context learning score (inspection/in_context.py).
const Timeline = (() => {
  "use strict";
  const { t } = Page;
  const { values } = Numbers;
  const { el, $, fmt, tokenLabel, textOf, drawMap, lineChart, legend } = View;

  const timeline = () => Page.data && Page.data.timeline; // (the same for every text and step of a page)
  const carried = () => !!(timeline() && timeline().weights && Page.MODEL);
  // every panel shows the picked step: the page runs it, or (--serve) the server sends it
  const everyPanel = () => carried() || Page.SETTINGS.server;
  const lastIndex = () => timeline().steps.length - 1;

  function picked() { // the picked snapshot's index (the last, the trained model, at first)
    const s = Page.state.snapshot;
    return s === null || s > lastIndex() ? lastIndex() : s;
  }

  const atLast = () => picked() === lastIndex();

  function pick(s) { // the slider moved: the picked step's model, on the text being shown
    Page.state.snapshot = s;
    Page.show(dataAt(Page.text.ids, Page.text.truncated, Page.text.example));
  }

  // The model of snapshot s: the trained one (the page's own, float32) at the last; before it,
  // the same model with that step's weights (float16, decoded once)
  const snapshotModels = new Map();
  function modelAt(s) {
    if (s === lastIndex()) return Page.MODEL;
    if (!snapshotModels.has(s)) snapshotModels.set(s, Model.withWeights(Page.MODEL, timeline().weights[s]));
    return snapshotModels.get(s);
  }

  // The data of the picked step for the text ids (the example's when `example`): torch's own
  // at the last step of the example, else the page's pass through that step's model
  function dataAt(ids, truncated, example) {
    if (!carried() || (atLast() && example)) {
      Page.model = Page.MODEL;
      return example ? Page.EXAMPLE : PageData.pageData(Page.MODEL, Page.TOKENIZER, ids, truncated, Page.EXAMPLE);
    }
    Page.model = modelAt(picked());
    return PageData.pageData(Page.model, Page.TOKENIZER, ids, truncated, Page.EXAMPLE);
  }

  // Each token's loss as the panels show it, and what the note says of it: the picked step's
  // (the page's own pass, or for a larger model the example's from the timeline), or for a
  // text typed into a larger model's page, the trained model's
  function tokenLosses() {
    const tl = timeline();
    if (!tl) return { losses: Page.data.losses, what: "lossesNote" };
    const step = tl.steps[picked()];
    if (everyPanel()) return { losses: Page.data.losses, what: "lossesNoteStep", step };
    if (Page.data === Page.EXAMPLE) return { losses: tl.losses[picked()], what: "lossesNoteStep", step };
    return { losses: Page.data.losses, what: "lossesNoteTrained", step };
  }

  function mapOf(s, l, h) { // a larger model's: the example's weights at snapshot s, layer l, head h, as rows [T][T]
    const c = Page.data.config;
    const T = Page.data.tokens.length;
    const all = values(timeline().maps);
    const start = (((s * c.n_layer) + l) * c.n_head + h) * T * T;
    return Array.from({ length: T }, (_, i) => Array.from(all.subarray(start + i * T, start + (i + 1) * T)));
  }

  // Each head's scores over the run: [key, its name, what a head high on it does]
  const KINDS = [["current_token", "scoreCurrent", "lookCurrent"], ["previous_token", "scorePrevious", "lookPrevious"],
    ["induction", "scoreInduction", "lookInduction"], ["copying", "scoreCopying", "lookCopying"],
    ["copying_text", "scoreCopyingText", "lookCopyingText"]];
  const COPYING = ["copying", "copying_text"]; // (the timeline's own fields; the others are in its scores)
  const scoresOf = (kind) => (COPYING.includes(kind) ? timeline()[kind] : timeline().scores[kind]); // [step][layer][head]
  // what a head that spreads its weight evenly scores (copying: chance, one token in the vocabulary)
  const uniformOf = (kind) => (COPYING.includes(kind) ? 1 / Page.data.config.vocab_size : timeline().uniform[kind]);

  function render() {
    const tl = timeline();
    $("timeline-panel").hidden = !tl;
    if (!tl) return;
    const s = picked();
    const step = tl.steps[s];
    const c = Page.data.config;
    const slider = $("timeline-step");
    slider.max = String(lastIndex());
    slider.value = String(s);
    slider.setAttribute("aria-valuetext", t("timelineStepValue", { step }));
    const loss = tl.loss[s];
    const lossName = t(tl.loss_is_runs ? "runLoss" : "windowsLoss", { count: tl.loss_windows });
    $("timeline-readout").textContent = t("timelineReadout", { step, last: tl.steps[lastIndex()],
      loss: loss === null || loss === undefined ? "" : t("timelineLossValue", { name: lossName, loss: fmt(loss, 4) }) });
    $("timeline-follows").textContent = everyPanel() ? t("followsAll")
      : t("followsSome") + (Page.data === Page.EXAMPLE ? "" : t("sentenceGap") + t("followsTyped"));
    $("timeline-loss-title").textContent = t("timelineLoss", { name: lossName });
    const known = tl.loss.filter((x) => x !== null && x !== undefined);
    $("timeline-loss").replaceChildren(!known.length ? el("p", { class: "note", text: t("timelineNoLoss") })
      : lineChart({ steps: tl.steps, series: [{ name: lossName, values: tl.loss, colour: "rgb(59, 82, 139)" }], picked: s,
        label: lossName, low: Math.min(...known), high: Math.max(...known) }));
    renderSample(s, step);
    renderThumbnails(s, c);
    renderStepTables(s, step);
    renderScores(s, c);
    renderComposition(s, c);
    renderContext(s);
  }

  function renderSample(s, step) {
    const tl = timeline();
    $("timeline-sample-box").hidden = !tl.samples; // (--serve: the panels of each step come on request)
    if (!tl.samples) return;
    const shown = Page.SETTINGS.server || Page.text.example;
    $("timeline-sample-title").textContent = t("timelineSampleTitle", { step, seed: tl.sample_seed });
    $("timeline-sample").textContent = tl.sample_prompt + tl.samples[s] + (shown ? "" : `\n(${t("sampleOfExample")})`);
  }

  // Every head's map at this step, small; a click opens that head in the panels below
  function renderThumbnails(s, c) {
    const ownMaps = !everyPanel() && Page.data === Page.EXAMPLE; // (a larger model's example: the timeline's)
    const followed = everyPanel() || ownMaps;
    $("timeline-maps-note").textContent = followed ? t("thumbnailsNote") : t("thumbnailsTrained");
    const maps = $("timeline-maps");
    maps.style.gridTemplateColumns = `auto repeat(${c.n_head}, auto)`;
    maps.replaceChildren(el("span"));
    for (let h = 0; h < c.n_head; h++) maps.append(el("span", { class: "axis", text: t("headN", { n: h }) }));
    const T = Page.data.tokens.length;
    const cell = Math.max(1, Math.floor(96 / T));
    const v = Page.view();
    for (let l = 0; l < c.n_layer; l++) {
      maps.append(el("span", { class: "axis", text: t("layerN", { n: l }) }));
      for (let h = 0; h < c.n_head; h++) {
        const canvas = el("canvas", { class: "timeline-map thumb", "data-layer": l, "data-head": h,
          title: t("openHead", { layer: l, head: h }), tabindex: "0" });
        drawMap(canvas, ownMaps ? mapOf(s, l, h) : Numbers.rows(Page.data.layers[l].heads[h].weights), cell, null);
        canvas.classList.toggle("selected", v.layer === l && v.head === h);
        const open = () => {
          Page.choose({ layer: l, head: h, coordinate: null });
          $("map-panel").scrollIntoView({ block: "start" });
        };
        canvas.addEventListener("click", open);
        canvas.addEventListener("keydown", (event) => { if (event.key === "Enter") open(); });
        maps.append(canvas);
      }
    }
  }

  // A larger model's example text at this step: the next token and the logit lens (a small
  // model's follow in their own panels below)
  function renderStepTables(s, step) {
    const tl = timeline();
    const own = !everyPanel() && Page.data === Page.EXAMPLE;
    $("timeline-tables").hidden = !own;
    if (!own) return;
    const tokens = Page.data.tokens;
    $("timeline-prediction-title").textContent = t("timelinePredictionTitle", { text: tokenLabel(tokens[tokens.length - 1]), step });
    const prediction = tl.prediction[s];
    $("timeline-prediction").tBodies[0].replaceChildren(...prediction.ids.map((id, i) => {
      const bar = el("span", { class: "bar" });
      bar.style.width = `${120 * prediction.values[i]}px`;
      return el("tr", { "data-id": id }, el("td", { class: "key", text: textOf(id) }),
        el("td", { class: "num", "data-value": prediction.values[i], text: fmt(prediction.values[i]) }),
        el("td", { class: "contribution" }, bar));
    }));
    const query = Page.view().query;
    $("timeline-lens-title").textContent = t("timelineLensTitle", { text: tokenLabel(tokens[query]), step });
    $("timeline-lens").tBodies[0].replaceChildren(...tl.lens[s].map((layer, l) => el("tr", { "data-layer": l },
      el("th", { text: t("layerN", { n: l }) }),
      ...layer.ids[query].map((id, r) => el("td", { "data-id": id },
        el("span", { class: "piece mono", text: textOf(id) }), ` ${fmt(layer.values[query][r], 3)}`)))));
  }

  // The two scores of every head over the run: one line a head (the picked head's lit), a
  // fixed axis from 0 to 1, a dashed line at what even attention scores, and what to look for
  function renderScores(s, c) {
    const tl = timeline();
    const v = Page.view();
    $("timeline-scores-note").textContent = t(tl.scores_text === "val" ? "timelineScoresNote" : "timelineScoresNoteRandom");
    const best = [];
    for (const [kind, name, look] of KINDS) {
      const lines = [];
      for (let l = 0; l < c.n_layer; l++) {
        for (let h = 0; h < c.n_head; h++) {
          lines.push({ name: t("layerHead", { layer: l, head: h }), key: `${l}.${h}`, layer: l, head: h,
            colour: headColour(c, l, h), picked: v.layer === l && v.head === h,
            values: scoresOf(kind).map((perStep) => perStep[l][h]) });
        }
      }
      const uniform = uniformOf(kind);
      const pick = (line) => Page.choose({ layer: line.layer, head: line.head, coordinate: null });
      const top = lines.reduce((a, b) => (b.values[b.values.length - 1] > a.values[a.values.length - 1] ? b : a));
      const rising = lines.some((line) => line.values.some((x) => x > 2 * uniform));
      $(`timeline-${kind}`).replaceChildren(el("h4", { text: t(name) }),
        el("p", { class: "note", text: rising ? t(look) : t("nothingAbove", { name: t(name), uniform: fmt(uniform, 3) }) }),
        lineChart({ steps: tl.steps, series: lines, picked: s, label: t(name), low: 0, high: 1, uniform, onPick: pick,
          uniformLabel: COPYING.includes(kind) ? t("chanceLine") : null }),
        legend(lines, s, pick));
      best.push(el("span", { "data-kind": kind, text: bestHead(top, t(name), uniform) + t("sentenceGap") }));
    }
    $("timeline-best").replaceChildren(...best);
  }

  const headColour = (c, l, h) => `hsl(${Math.round(360 * (l * c.n_head + h) / (c.n_layer * c.n_head))}, 65%, 42%)`;

  // The head of layers from..below−1 that scores `kind` highest at the last step: [layer, head]
  function bestOf(kind, from, below) {
    const last = scoresOf(kind)[lastIndex()];
    let found = [from, 0];
    for (let l = from; l < below; l++) last[l].forEach((x, h) => { if (x > last[found[0]][found[1]]) found = [l, h]; });
    return found;
  }

  // How much each head reads what an earlier head wrote (Q-, K-, V-composition), over the run:
  // one line a pair (writer → reader), against what heads of random weights of the same shapes
  // score (the timeline's composition_baseline: the mean and twice the spread); lit,
  // the lesson's pairs: into the best induction head, from the best previous-token head (K)
  // and the best current-token head (Q), and from the head it reads most through its values (V)
  function renderComposition(s, c) {
    const tl = timeline();
    const box = $("timeline-composition");
    box.hidden = c.n_layer < 2;
    if (c.n_layer < 2) return;
    const reader = bestOf("induction", 1, c.n_layer); // (an induction head reads an earlier layer's: from layer 1)
    const lit = { q: bestOf("current_token", 0, reader[0]), k: bestOf("previous_token", 0, reader[0]) };
    const L = c.n_layer, H = c.n_head;
    const at = (kind, step, [l1, h1], [l2, h2]) => Numbers.values(tl.composition[kind])[(((step * L + l1) * H + h1) * L + l2) * H + h2];
    const into = (kind) => { // (V: the writer the reader reads most at the last step)
      let found = [0, 0];
      for (let l = 0; l < reader[0]; l++) for (let h = 0; h < H; h++) {
        if (at(kind, lastIndex(), [l, h], reader) > at(kind, lastIndex(), found, reader)) found = [l, h];
      }
      return found;
    };
    lit.v = into("v");
    const charts = ["q", "k", "v"].map((kind) => {
      const lines = [];
      for (let l1 = 0; l1 < L; l1++) for (let h1 = 0; h1 < H; h1++) for (let l2 = l1 + 1; l2 < L; l2++) for (let h2 = 0; h2 < H; h2++) {
        const picked = lit[kind][0] === l1 && lit[kind][1] === h1 && reader[0] === l2 && reader[1] === h2;
        lines.push({ name: t("pairName", { l1, h1, l2, h2 }), key: `${l1}.${h1}>${l2}.${h2}`, picked,
          colour: headColour(c, l1, h1), values: tl.steps.map((_, step) => at(kind, step, [l1, h1], [l2, h2])) });
      }
      const shown = lines.filter((line) => line.picked).concat(lines.filter((line) => !line.picked)
        .sort((a, b) => b.values[lastIndex()] - a.values[lastIndex()]).slice(0, 7)); // (the legend: the lit pair and the 7 highest)
      const random = tl.composition_baseline[kind];
      return el("div", { "data-kind": kind }, el("h4", { text: t(`composition_${kind}`) }),
        lineChart({ steps: tl.steps, series: lines, picked: s, label: t(`composition_${kind}`), low: 0,
          high: Math.max(0.5, ...lines.flatMap((line) => line.values)), uniform: random.mean,
          band: [random.mean - 2 * random.sd, random.mean + 2 * random.sd],
          uniformLabel: t("randomLine", { mean: fmt(random.mean, 3) }) }),
        legend(shown, s, null));
    });
    const [kl, kh] = lit.k;
    const random = tl.composition_baseline.k;
    $("timeline-composition-note").textContent = t("compositionNote", { layer: reader[0], head: reader[1], pl: kl, ph: kh,
      score: fmt(at("k", s, lit.k, reader), 3), first: fmt(at("k", 0, lit.k, reader), 3), init: fmt(random.mean, 3),
      high: fmt(random.mean + 2 * random.sd, 3), sd: fmt((at("k", s, lit.k, reader) - random.mean) / random.sd, 1) });
    $("timeline-composition-charts").replaceChildren(...charts);
  }

  // How the loss depends on the context: the lesson's first and second copies over the run,
  // with the docs' table read off it; and for any run, the loss by position in the window at
  // the picked step (and at the first), and the in-context learning score over the run
  function renderContext(s) {
    const tl = timeline();
    const copies = tl.copies;
    $("timeline-copies").hidden = !copies;
    if (copies) {
      const change = copies.phase_change;
      $("timeline-copies-note").textContent = change.start === null ? t("copiesNoChange")
        : t("copiesNote", { start: change.start, end: change.end ?? "…", count: change.snapshots });
      const high = Math.max(...copies.first, ...copies.second);
      $("timeline-copies-chart").replaceChildren(lineChart({ steps: tl.steps, picked: s, label: t("copiesTitle"), low: 0, high,
        series: [{ name: t("firstCopies"), key: "first", colour: "rgb(120, 120, 120)", values: copies.first },
          { name: t("secondCopies"), key: "second", colour: "rgb(214, 40, 40)", values: copies.second, picked: true }] }),
        legend([{ name: t("firstCopies"), key: "first", colour: "rgb(120, 120, 120)", values: copies.first },
          { name: t("secondCopies"), key: "second", colour: "rgb(214, 40, 40)", values: copies.second }], s, null));
      renderCopiesTable(s, change);
    }
    const byPosition = tl.position_loss;
    $("timeline-context").hidden = !byPosition;
    if (!byPosition) return;
    const T = byPosition.shape[1];
    const row = (step) => Array.from(Numbers.values(byPosition).subarray(step * T, (step + 1) * T));
    const positions = Array.from({ length: T }, (_, i) => i);
    const known = Array.from(Numbers.values(byPosition)); // (one axis for every step: the lines move, not the axis)
    // inspection/in_context.py's in_context_score: positions T/2 … T − 1 against T/20 … T/10
    $("timeline-context-note").textContent = t("contextNote", { score: fmt(tl.in_context[s], 3), first: fmt(tl.in_context[0], 3),
      step: tl.steps[s], firstStep: tl.steps[0], early: Math.max(1, Math.floor(T / 20)),
      earlyEnd: Math.max(2, Math.floor(T / 10) + 1) - 1, late: Math.floor(T / 2), last: T - 1 });
    const lines = [{ name: t("atStep", { step: tl.steps[0] }), key: "first", colour: "rgb(120, 120, 120)", values: row(0) },
      { name: t("atStep", { step: tl.steps[s] }), key: "picked", colour: "rgb(59, 82, 139)", values: row(s), picked: true }];
    $("timeline-context-charts").replaceChildren(
      el("div", {}, el("h4", { text: t("contextByPosition", { step: tl.steps[s] }) }),
        lineChart({ steps: positions, picked: positions.length - 1, label: t("contextByPosition", { step: tl.steps[s] }),
          low: Math.min(...known), high: Math.max(...known), xLabel: t("positionWord"), series: lines }),
        legend(lines, positions.length - 1, null)),
      el("div", {}, el("h4", { text: t("contextScore") }),
        lineChart({ steps: tl.steps, picked: s, label: t("contextScore"), low: Math.min(0, ...tl.in_context),
          high: Math.max(0, ...tl.in_context), series: [{ name: t("contextScore"), key: "icl", colour: "rgb(59, 82, 139)",
            values: tl.in_context, picked: true }] })));
  }

  // The docs' table, read off the run: the first snapshot, those of the phase change, the last;
  // each head of the circuit the run ends with followed through every step (not each step's best)
  function renderCopiesTable(s, change) {
    const tl = timeline();
    const rows = tl.steps.map((step, i) => i).filter((i) => i === 0 || i === lastIndex()
      || (change.start !== null && tl.steps[i] >= change.start && tl.steps[i] <= (change.end ?? tl.steps[lastIndex()])));
    const heads = finalCircuit();
    const columns = [["induction", "scoreInduction"], ["previous_token", "scorePrevious"], ["current_token", "scoreCurrent"]];
    $("timeline-copies-table").tHead.rows[0].replaceChildren(...["colStep", "firstCopies", "secondCopies"]
      .map((key) => el("th", { text: t(key) })),
    ...columns.map(([kind, name]) => el("th", { "data-kind": kind,
      text: t("scoreOfHead", { score: t(name), head: `L${heads[kind][0]}H${heads[kind][1]}` }) })));
    $("timeline-copies-table").tBodies[0].replaceChildren(...rows.map((i) => el("tr", { "data-step": tl.steps[i],
      class: i === s ? "selected" : "" },
    el("td", { class: "num", text: String(tl.steps[i]) }), el("td", { class: "num", text: fmt(tl.copies.first[i], 3) }),
    el("td", { class: "num", text: fmt(tl.copies.second[i], 3) }),
    ...columns.map(([kind]) => el("td", { class: "num", text: fmt(scoresOf(kind)[i][heads[kind][0]][heads[kind][1]], 3) })))));
  }

  // The circuit the run ends with (bench/induction.py's final_circuit): the induction head (the
  // best past layer 0 at the last step), and the best previous-token and current-token heads
  // of the layers before it; [layer, head] each
  function finalCircuit() {
    const last = (kind) => scoresOf(kind)[lastIndex()];
    const best = (rows, from) => { // [layer, head] of the largest score in rows from layer `from`
      let found = [from, 0];
      for (let l = from; l < rows.length; l++) {
        for (let h = 0; h < rows[l].length; h++) if (rows[l][h] > rows[found[0]][found[1]]) found = [l, h];
      }
      return found;
    };
    const layers = Page.data.config.n_layer;
    const induction = layers > 1 ? best(last("induction"), 1) : best(last("induction"), 0);
    const before = (kind) => best(last(kind).slice(0, Math.max(1, induction[0])), 0);
    return { induction, previous_token: before("previous_token"), current_token: before("current_token") };
  }

  // The head that scores highest at the last step, and the first step from which it stays
  // above half of that score; or, where no head scores twice what even attention gives, that
  // none has learnt it.
  function bestHead(line, name, uniform) {
    const last = line.values[line.values.length - 1];
    const values = { name, layer: line.layer, head: line.head, score: fmt(last, 3), uniform: fmt(uniform, 3) };
    if (last <= 2 * uniform) return t("timelineBestNone", values);
    let from = line.values.length - 1;
    while (from > 0 && line.values[from - 1] > last / 2) from -= 1;
    return t("timelineBest", { ...values, step: timeline().steps[from] });
  }

  return { timeline, picked, pick, dataAt, tokenLosses, render };
})();
