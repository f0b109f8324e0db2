// What the page holds: its words, its settings, the data it shows (explorer/data.py's, or
// data.js's for a text typed into it or a snapshot of training), the model it runs where it
// carries one, and what the learner has picked. Every panel reads them from here; picking
// something (a token, a head, a step) goes through preview and choose, which draw the page
// again (render, set by explorer.js).
const Page = (() => {
  "use strict";

  const embedded = (id) => JSON.parse(document.getElementById(id).textContent);
  const STRINGS = embedded("explorer-strings");
  const SETTINGS = embedded("explorer-settings");
  const EXAMPLE = embedded("explorer-data"); // the text the file was written for, computed by torch
  // the weights and tokenizer, where the page runs the model itself (explorer/data.py's page_model)
  const MODEL = embedded("explorer-model");
  const TOKENIZER = MODEL && new PageTokenizer(MODEL.tokenizer);
  // such a page carries W_Q, W_K, W_V once, among the weights (explorer/page.py's render)
  if (MODEL && EXAMPLE) EXAMPLE.layers.forEach((layer, l) => { layer.c_attn ??= Model.cAttnOf(MODEL, l); });

  const page = {
    STRINGS, SETTINGS, EXAMPLE, MODEL, TOKENIZER,
    data: EXAMPLE, // what the panels show now
    model: MODEL, // the model that data comes from where the page runs it: the trained one, or a snapshot's
    version: 0, // counts the data the page has shown (a typed text, a step, the server's answer)
    state: { lang: SETTINGS.lang, layer: 0, head: 0, query: 0, key: null, locked: false, preview: null,
      noScale: false, noMask: false, ablate: null, coordinate: null, snapshot: null },
    render: () => {}, // explorer.js's: draws every panel from data and state
  };

  // A string of the page in its language; a key with a "_one" variant takes it when the count
  // is 1 ("1 token", not "1 tokens"). Numbers are the code's: from 0 in both languages.
  page.t = (key, values = {}) => {
    const lang = page.state.lang;
    const one = values.count === 1 ? STRINGS[lang][`${key}_one`] ?? STRINGS.en[`${key}_one`] : undefined;
    const text = one ?? STRINGS[lang][key] ?? STRINGS.en[key] ?? key;
    return text.replace(/\{(\w+)\}/g, (_, name) => String(values[name] ?? ""));
  };

  page.word = (group, name) => STRINGS.words[page.state.lang][group][name]; // inspection/words.json

  // What is picked, with what the mouse hovers over laid on top until it leaves
  page.view = () => (page.state.preview ? { ...page.state, ...page.state.preview } : page.state);

  page.preview = (change) => { // hover: show, without locking
    if (page.state.locked || JSON.stringify(change) === JSON.stringify(page.state.preview)) return;
    page.state.preview = change;
    page.render();
  };

  page.choose = (change) => { // click: lock
    Object.assign(page.state, change);
    page.state.preview = null;
    page.state.locked = true;
    page.render();
  };

  page.show = (data) => { // new data for every panel
    page.data = data;
    page.version += 1;
  };

  return page;
})();
