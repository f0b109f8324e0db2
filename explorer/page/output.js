// The panels after attention: the rest of the block for the picked token (the residual
// stream, the norms, the feed-forward network and its largest units), the vectors' sizes
// along the layers, what each layer would predict (the logit lens), the prediction under the
// learner's sampling settings, and the heads switched off one at a time.
const OutputPanels = (() => {
  "use strict";
  const { t, word } = Page;
  const { rowOf, values, add, norm, nextTokenProbabilities, cutBy, lastRow } = Numbers;
  const { el, $, fmt, tokenLabel, textOf, vectorRow, svg } = View;
  const { layerData, residualOut } = AttentionPanels;

  // ---- 4. after attention: the rest of the block, layer by layer --------------------------------

  function blockPieces(l, position) { // the picked token's vectors through block l, in the order they are made
    const layer = layerData(l);
    const c = Page.data.config;
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
    const v = Page.view();
    const c = Page.data.config;
    const layer = layerData(v.layer);
    $("block-title").textContent = t("blockTitle", { layer: v.layer, query: v.query, text: tokenLabel(Page.data.tokens[v.query]) });
    const box = $("block");
    box.replaceChildren();
    for (const [name, label, vector] of blockPieces(v.layer, v.query)) {
      box.append(vectorRow(label, `[C] = [${c.n_embd}]`, vector, name));
      if (name === "ln_2" || (name === "ln_1" && c.norm_position === "post")) box.append(hiddenUnits(layer, v.query));
    }
    if (v.layer === c.n_layer - 1) {
      box.append(vectorRow(t("lnfRow", { norm: word("norms", c.norm) }), `[C] = [${c.n_embd}]`,
        rowOf(Page.data.ln_f, v.query), "ln_f"), el("p", { class: "note", text: t("logitsNote", { vocab: c.vocab_size }) }));
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
    const norms = Page.data.layers.map((layer, l) => [rowOf(layer.residual_in, position), rowOf(layer.attn, position),
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
    const v = Page.view();
    $("lens-title").textContent = t("lensTitle", { query: v.query, text: tokenLabel(Page.data.tokens[v.query]) });
    const body = $("lens").tBodies[0];
    body.replaceChildren(...Page.data.layers.map((layer, l) => el("tr", { "data-layer": l },
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
    return { temperature, topK, topP, suppress: Page.data ? Page.data.prediction.suppressed : [] };
  }

  function renderPrediction() {
    const sampling = readSampling();
    $("sampling-error").textContent = sampling.error ?? "";
    if (sampling.error) return;
    const { suppressed } = Page.data.prediction;
    const logits = Array.from(values(Page.data.prediction.logits));
    const probs = nextTokenProbabilities(logits, sampling);
    const ids = logits.map((_, i) => i).filter((id) => !suppressed.includes(id))
      .sort((a, b) => logits[b] - logits[a]).slice(0, 20);
    const off = Page.state.ablate && Page.data.ablation && Page.data.ablation[Page.state.ablate[0]][Page.state.ablate[1]];
    // the head switched off, by the same rule as the model's column where its logits are here;
    // a large model's page keeps only its likeliest tokens at temperature 1, and says so
    const offProbs = !off ? {} : off.logits ? nextTokenProbabilities(Array.from(values(off.logits)), sampling)
      : Object.fromEntries(off.ids.map((id, i) => [id, off.probs[i]]));
    $("prediction-note").textContent = t("predictionNote", { text: tokenLabel(Page.data.tokens[Page.data.tokens.length - 1]) });
    $("ablation-head").textContent = !off ? "" : t(off.logits ? "colAblated" : "colAblatedPlain",
      { layer: Page.state.ablate[0], head: Page.state.ablate[1] });
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
    renderWholeLoss(whole);
  }

  // What the experiment does to the whole text: the loss training scores (each token predicted
  // from the positions before it), with the model as it is and in the experiment. The last
  // token's prediction alone hides the mask's point (no key comes after the last query).
  function renderWholeLoss(whole) {
    const box = $("whole-experiment-loss");
    const ours = Page.data.losses;
    if (!whole || !ours || ours.length === 0) {
      box.textContent = "";
      return;
    }
    const mean = (xs) => xs.reduce((a, b) => a + b, 0) / xs.length;
    const what = Page.state.noScale && Page.state.noMask ? "Both" : Page.state.noMask ? "Mask" : "Scale";
    box.dataset.with = String(mean(ours));
    box.dataset.without = String(mean(whole.losses));
    box.textContent = t(`wholeLoss${what}`, { count: ours.length, with: fmt(mean(ours), 4), without: fmt(mean(whole.losses), 4) });
  }

  // Without 1/√d_k or without the mask in every head of every layer: the model's next-token
  // logits, run in the page (null where it does not run the model, or with no experiment on).
  // One pass for each data and experiment, kept, with each token's loss in it.
  let wholeRun = { key: null, logits: null, losses: null };

  function wholeExperiment() {
    if (!Page.model || !(Page.state.noScale || Page.state.noMask)) return null;
    const key = `${Page.version} ${Page.state.noScale} ${Page.state.noMask}`;
    if (wholeRun.key !== key) { // (the model the panels show: the trained one, or a snapshot's)
      const ids = Page.data.tokens.map((token) => token.id);
      const logits = Model.forward(Page.model, ids, { scale: !Page.state.noScale, mask: !Page.state.noMask }).logits;
      const V = Page.data.config.vocab_size;
      wholeRun = { key, logits: lastRow(logits, V), losses: PageData.tokenLosses(logits, ids, V) };
    }
    const title = Page.state.noScale && Page.state.noMask ? "colWholeBoth" : Page.state.noMask ? "colWholeMask" : "colWholeScale";
    return { title, logits: wholeRun.logits, losses: wholeRun.losses };
  }

  function renderAblation() {
    const grid = $("ablation-grid");
    const c = Page.data.config;
    grid.replaceChildren();
    // a text typed into the page: every head switched off is one more pass each, run on request
    $("ablate-all").hidden = Page.data.ablation !== null;
    $("ablate-all").textContent = t("ablateAll", { count: c.n_layer * c.n_head });
    $("ablation-ranking").textContent = "";
    if (Page.data.ablation === null) return;
    grid.style.gridTemplateColumns = `auto repeat(${c.n_head}, auto)`;
    grid.append(el("span"));
    for (let h = 0; h < c.n_head; h++) grid.append(el("span", { class: "axis", text: t("headN", { n: h }) }));
    const mean = (xs) => xs.reduce((a, b) => a + b, 0) / Math.max(xs.length, 1);
    const base = mean(Page.data.losses);
    Page.data.ablation.forEach((heads, l) => {
      grid.append(el("span", { class: "axis", text: t("layerN", { n: l }) }));
      heads.forEach((head, h) => {
        const on = Page.state.ablate && Page.state.ablate[0] === l && Page.state.ablate[1] === h;
        const rise = mean(head.losses) - base; // the mean loss over the text's tokens, with the head off
        const button = el("button", { type: "button", class: on ? "ablate selected" : "ablate", "data-layer": l,
          "data-head": h, "data-kl": head.kl, "data-rise": rise, "aria-pressed": String(!!on),
          title: t("ablateTitle", { layer: l, head: h }), text: `KL ${head.kl.toFixed(3)} · Δ ${fmt(rise, 3)}` });
        button.addEventListener("click", () => { Page.state.ablate = on ? null : [l, h]; Page.render(); });
        grid.append(button);
      });
    });
    const every = Page.data.ablation.flatMap((heads, l) => heads.map((head, h) => ({ l, h, kl: head.kl,
      rise: mean(head.losses) - base })));
    const byKl = [...every].sort((a, b) => b.kl - a.kl);
    const byRise = [...every].sort((a, b) => b.rise - a.rise);
    // ranked by the text's loss, which every token of it scores; the next token's prediction alone
    // (KL) says little on a text whose last token nothing can predict (a random symbol)
    $("ablation-ranking").textContent = t("ablationLossRanking", { layer: byRise[0].l, head: byRise[0].h,
      from: fmt(base, 3), to: fmt(base + byRise[0].rise, 3),
      next: byRise.slice(1, 4).map((r) => t("layerHead", { layer: r.l, head: r.h })).join(t("headListSeparator")) })
      + t("sentenceGap") + t("ablationRanking", { layer: byKl[0].l, head: byKl[0].h, kl: fmt(byKl[0].kl, 4) });
  }

  return { renderBlock, renderLens, renderPrediction, renderAblation, readSampling };
})();
