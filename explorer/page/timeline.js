// Watching it learn: the model at each snapshot the run kept (training/snapshots.py). Where
// the page carries every snapshot's weights (a small model: explorer/data.py's
// carries_snapshots), the slider swaps the model the page runs and every panel shows that
// step's model on the current text, typed or not. Where it does not (a larger model), the
// timeline holds the example text's maps, prediction, logit lens and tokens' losses at each
// step, which follow the slider; the other panels show the trained model, and say so.
// Above the slider: the validation loss and every head's two scores over the run, each a
// line named on hover and in the legend, against what attention spread evenly scores.
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

  const KINDS = [["previous_token", "scorePrevious", "lookPrevious"], ["induction", "scoreInduction", "lookInduction"]];

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
          const hue = Math.round(360 * (l * c.n_head + h) / (c.n_layer * c.n_head));
          lines.push({ name: t("layerHead", { layer: l, head: h }), key: `${l}.${h}`, layer: l, head: h,
            colour: `hsl(${hue}, 65%, 42%)`, picked: v.layer === l && v.head === h,
            values: tl.scores[kind].map((perStep) => perStep[l][h]) });
        }
      }
      const uniform = tl.uniform[kind];
      const pick = (line) => Page.choose({ layer: line.layer, head: line.head, coordinate: null });
      const top = lines.reduce((a, b) => (b.values[b.values.length - 1] > a.values[a.values.length - 1] ? b : a));
      const rising = lines.some((line) => line.values.some((x) => x > 2 * uniform));
      $(`timeline-${kind}`).replaceChildren(el("h4", { text: t(name) }),
        el("p", { class: "note", text: rising ? t(look) : t("nothingAbove", { name: t(name), uniform: fmt(uniform, 3) }) }),
        lineChart({ steps: tl.steps, series: lines, picked: s, label: t(name), low: 0, high: 1, uniform, onPick: pick }),
        legend(lines, s, pick));
      best.push(el("span", { "data-kind": kind, text: bestHead(top, t(name), uniform) + t("sentenceGap") }));
    }
    $("timeline-best").replaceChildren(...best);
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
