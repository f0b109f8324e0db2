// How the page draws: elements made with textContent (never innerHTML), numbers written one
// way, tokens made visible, vectors as numbers and as colour strips, attention maps on a
// canvas, and line charts over the snapshots of training.
const View = (() => {
  "use strict";
  const { t } = Page;

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
  const count = (n) => n.toLocaleString(Page.state.lang === "zh" ? "zh-CN" : "en");
  // a number as the page writes it: a true minus sign, and no "−0.000" for a tiny negative number
  const fmt = (x, digits = 4) => (x === -Infinity ? "−∞" : x === Infinity ? "∞"
    : x.toFixed(digits).replace(/^-(?=0\.?0*$)/, "").replace("-", "−"));
  // spaces, newlines and tabs made visible, so that every token can be seen; a character that
  // draws nothing (another control character, an invisible format character such as a
  // zero-width space) as its bytes, ⟨03⟩, as bytes of no whole character are: one rule, in
  // signs every font has (Debian's fonts have no control pictures such as ␃)
  const visible = (text) => PageTokenizer.readable(text.replace(/ /g, "␣").replace(/\n/g, "↵").replace(/\t/g, "⇥"));
  const tokenLabel = (token) => (token.bytes ? `⟨${token.bytes}⟩` : visible(token.text));
  const index = (i) => t("tokenIndex", { i }); // a token's index, the code's: from 0 in both languages
  // where there is room for a few characters only (the maps' axes): a token that holds part of
  // a character shows that character, in brackets, instead of its bytes
  const axisLabel = (i) => {
    const token = Page.data.tokens[i];
    return `${index(i)} ${token.bytes ? `⟨${visible(token.joined)}⟩` : tokenLabel(token)}`;
  };
  const textOf = (id) => visible(Page.data.texts[String(id)] ?? `#${id}`);

  // A vector on screen: its numbers as text, the exact values in data-values (tests read them).
  function vectorBox(vector, name, digits = 3) {
    return el("p", { class: "vector mono", "data-name": name, "data-values": JSON.stringify(vector),
      text: vector.map((x) => fmt(x, digits)).join("  ") });
  }

  // The same vector as a strip of colours, so that a pattern shows before it is read: blue
  // below 0, white at 0, red above, scaled to the largest magnitude in the vector; each cell
  // says its number on hover.
  function vectorStrip(vector, name) {
    const biggest = Math.max(...vector.map(Math.abs), 1e-12);
    return el("div", { class: "strip-cells", "data-strip": name, "aria-hidden": "true" },
      ...vector.map((x, i) => el("span", { title: `[${i}] ${fmt(x, 4)}`, style: `background:${diverging(x / biggest)}` })));
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

  // ---- attention maps ----------------------------------------------------------------------

  function colourOf(weight) { // [r, g, b] of an attention weight (null: masked, a future key)
    if (weight === null) return [205, 205, 205];
    const stops = Page.data.colormap;
    const position = Math.sqrt(Math.min(Math.max(weight, 0), 1)) * (stops.length - 1); // √w: weak links stay visible
    const low = Math.min(Math.floor(position), stops.length - 2);
    const frac = position - low;
    return stops[low].map((c, i) => Math.round(255 * (c * (1 - frac) + stops[low + 1][i] * frac)));
  }

  const colour = (weight) => `rgb(${colourOf(weight).join(", ")})`;

  // One pixel a (query, key) cell, then scaled up without smoothing: a map of T² cells is one
  // image, not T² rectangles (the slider redraws every map of the page at each step)
  function drawMap(canvas, weights, cell, query, margin = 0) {
    const T = weights.length;
    canvas.width = canvas.height = T * cell + margin;
    const ctx = canvas.getContext("2d");
    ctx.fillStyle = "white";
    ctx.fillRect(0, 0, canvas.width, canvas.height);
    const image = new ImageData(T, T);
    const masked = colourOf(null);
    weights.forEach((row, i) => row.forEach((w, j) => {
      const rgb = j > i ? masked : colourOf(w);
      const at = 4 * (i * T + j);
      image.data[at] = rgb[0];
      image.data[at + 1] = rgb[1];
      image.data[at + 2] = rgb[2];
      image.data[at + 3] = 255;
    }));
    const pixels = document.createElement("canvas");
    pixels.width = pixels.height = T;
    pixels.getContext("2d").putImageData(image, 0, 0);
    ctx.imageSmoothingEnabled = false;
    ctx.drawImage(pixels, margin, margin, T * cell, T * cell);
    if (query !== null) { // the query row that the steps below explain
      ctx.strokeStyle = "rgb(230, 40, 40)";
      ctx.lineWidth = Math.max(1, cell / 4);
      ctx.strokeRect(margin, margin + query * cell, T * cell, cell);
    }
    return ctx;
  }

  // Token labels on both axes, every `every`-th one where they would overlap; the readout
  // below the map names the token under the mouse whatever its label. They are written on a
  // canvas outside the page, then copied: text on a canvas in the page makes the browser restyle
  // the whole page there and then, and the slider redraws every panel.
  function drawLabels(ctx, cell, margin) {
    const T = Page.data.tokens.length;
    const every = Math.max(1, Math.ceil(12 / cell));
    const labels = document.createElement("canvas");
    labels.width = ctx.canvas.width;
    labels.height = ctx.canvas.height;
    const text = labels.getContext("2d");
    text.fillStyle = "#5f6368";
    text.font = `${Math.min(11, Math.max(8, cell))}px monospace`;
    for (let i = 0; i < T; i += every) {
      const label = axisLabel(i).slice(0, 8);
      text.textAlign = "right";
      text.fillText(label, margin - 3, margin + i * cell + cell * 0.8); // the query's row
      text.save();
      text.translate(margin + i * cell + cell * 0.8, margin - 3);
      text.rotate(-Math.PI / 2);
      text.textAlign = "left";
      text.fillText(label, 0, 0); // the key's column
      text.restore();
    }
    ctx.drawImage(labels, 0, 0);
    return every;
  }

  const SVG = "http://www.w3.org/2000/svg";

  function svg(tag, attributes = {}, text = null) {
    const node = document.createElementNS(SVG, tag);
    for (const [name, value] of Object.entries(attributes)) node.setAttribute(name, value);
    if (text !== null) node.textContent = text;
    return node;
  }

  // A token's loss as a colour: white at 0, dark red at `high` nats and above
  function lossColour(loss, high) {
    const a = Math.min(1, Math.max(0, loss / high));
    return `rgb(${Math.round(255 - 115 * a)}, ${Math.round(255 - 235 * a)}, ${Math.round(255 - 225 * a)})`;
  }

  // ---- line charts over the snapshots ------------------------------------------------------

  // x: the snapshots' steps, evenly as they are spaced; y: from `low` to `high` (a score's
  // fixed 0 to 1, or a loss's own range). series: [{name, values, colour, picked, key}];
  // `uniform`, where given, a dashed line (what attention spread evenly scores); `picked` the
  // step's index (a vertical line). Each line says its name and value on hover (a <title>),
  // and `onPick(series)` runs when one is clicked.
  // band: [from, to], a shaded stretch of the y axis (what random heads score, say)
  function lineChart({ steps, series, picked, label, low, high, uniform = null, onPick = null, xLabel = null,
    uniformLabel = null, band = null }) {
    const width = 380, height = 170, left = 40, right = 10, top = 8, bottom = 26;
    const span = high - low || 1;
    const last = steps[steps.length - 1] || 1;
    const x = (i) => left + (width - left - right) * (steps[i] / last);
    const y = (v) => top + (height - top - bottom) * (1 - (v - low) / span);
    const chart = svg("svg", { width, height, class: "timeline-chart", role: "img", "aria-label": label });
    chart.append(svg("text", { x: 2, y: top + 8 }, fmt(high, 2)), svg("text", { x: 2, y: height - bottom }, fmt(low, 2)),
      svg("text", { x: left, y: height - 6 }, `${xLabel ?? t("timelineStep")} ${steps[0]} … ${last}`),
      svg("line", { x1: left, x2: width - right, y1: height - bottom, y2: height - bottom, class: "axis-line" }),
      svg("line", { x1: x(picked), x2: x(picked), y1: top, y2: height - bottom, class: "picked", "stroke-width": 1 }));
    if (band !== null) {
      const [from, to] = band.map((v) => Math.min(high, Math.max(low, v)));
      chart.append(svg("rect", { x: left, width: width - left - right, y: y(to), height: Math.max(0, y(from) - y(to)),
        class: "band", "data-from": band[0], "data-to": band[1] }));
    }
    if (uniform !== null) {
      chart.append(svg("line", { x1: left, x2: width - right, y1: y(uniform), y2: y(uniform), class: "uniform",
        "stroke-dasharray": "4 3", "data-value": uniform }, null),
      svg("text", { x: width - right, y: y(uniform) - 3, "text-anchor": "end", class: "uniform-label" },
        uniformLabel ?? t("uniformLine")));
    }
    const ordered = [...series].sort((a, b) => Number(!!a.picked) - Number(!!b.picked)); // the picked one on top
    for (const line of ordered) {
      const points = line.values.map((v, i) => (v === null ? null : `${x(i).toFixed(1)},${y(v).toFixed(1)}`));
      const value = line.values[picked];
      const polyline = svg("polyline", { points: points.filter(Boolean).join(" "), fill: "none", stroke: line.colour,
        "stroke-width": line.picked ? 3 : 1.5, "stroke-opacity": line.picked || !series.some((s) => s.picked) ? 1 : 0.45,
        "data-name": line.name, "data-key": line.key ?? line.name, class: line.picked ? "line picked-line" : "line" });
      polyline.append(svg("title", {}, `${line.name}: ${value === null ? "—" : fmt(value, 3)}`));
      if (onPick) polyline.addEventListener("click", () => onPick(line));
      chart.append(polyline);
      if (value !== null) {
        chart.append(svg("circle", { cx: x(picked), cy: y(value), r: line.picked ? 4 : 2.5, fill: line.colour,
          "data-name": line.name, "data-key": line.key ?? line.name, "data-value": value }));
      }
    }
    return chart;
  }

  // The chart's legend: each line's name in its colour, with its value at the picked step; a
  // click picks it
  function legend(series, picked, onPick) {
    return el("p", { class: "legend-row" }, ...series.map((line) => {
      const item = el("button", { type: "button", class: line.picked ? "legend picked" : "legend",
        "data-key": line.key ?? line.name },
      el("span", { class: "swatch", style: `background:${line.colour}` }),
      ` ${line.name} ${line.values[picked] === null ? "—" : fmt(line.values[picked], 3)}`);
      if (onPick) item.addEventListener("click", () => onPick(line));
      return item;
    }));
  }

  return { el, $, count, fmt, visible, tokenLabel, index, axisLabel, textOf, vectorBox, vectorRow, colour, diverging,
    drawMap, drawLabels, svg, lossColour, lineChart, legend };
})();
