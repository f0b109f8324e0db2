"""The explorer page: its size, its time to interactive, how fast its timeline's slider
redraws, and how fast it runs the model itself on a typed text, in Chromium.

For tiny.yaml's model (from --checkpoint, e.g. the quick start's out/tiny, with the
snapshots it kept; or with random weights and 13 snapshots of them, at the steps a run of
about 1,700 iterations keeps) and a 64-token prompt: the bytes of the HTML file (split
into the weights it carries, the timeline and the rest), the seconds explore.py takes to
build it, the milliseconds from opening the file to the first complete page (the page's
script writes that moment into data-ready), median of --rounds loads in headless
Chromium, and the milliseconds the page takes to redraw when the timeline's slider moves
to each snapshot (median and slowest). Then, in the page: one 64-token pass with every
intermediate the panels show (data.js's pageData, median of 9 after a first), the same
with every panel drawn, the continuation's tokens per second (64 tokens, greedy, KV
cache), every head switched off (one pass each), where one score of the last layer comes
from (sources.js: the last query against the first key, median of 9), where one logit
comes from (the last position's, median of 9), on the induction lesson's run the patching
grid (patching.js: every part at every position and at each, every head on each path), and
the largest distance of the page's logits from torch's in float64.

    python -m bench.explorer [--quick] [--checkpoint out/tiny] [--rounds 5]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import tempfile
import time
from pathlib import Path

import torch
import yaml

from bench.common import ROOT, machine, save, table
from runs.folder import RunDir
from data import shakespeare
from data.tokenizer import train_tokenizer
from explorer.data import carries_snapshots, default_prompt, page_model, prompt_data, to_json
from explorer.page import render
from explorer.screenshot import chromium_page
from model import GPT, GPTConfig

PROMPT = ("ROMEO:\nBut soft, what light through yonder window breaks?\nIt is the east, and Juliet is the sun.\n"
          "Arise, fair sun, and kill the envious moon,\nWho is already sick and pale with grief")  # its last 64 tokens
# moves the timeline's slider to each snapshot in turn, as the keyboard would, with the slider in
# sight (where a learner drags it); the redraw's milliseconds, its layout included
SLIDE = """() => {
  const slider = document.getElementById("timeline-step");
  slider.scrollIntoView({ block: "center" });
  const times = [];
  for (let k = 0; k <= Number(slider.max); k++) {
    const start = performance.now();
    slider.value = String(k);
    slider.dispatchEvent(new Event("input"));
    document.body.getBoundingClientRect();  // layout done
    times.push(performance.now() - start);
  }
  return times;
}"""


# the page's own pass on the prompt's last 64 tokens, as typing runs it
IN_PAGE = """(prompt) => {
  const ids = Page.TOKENIZER.encode(prompt).slice(-64);
  const time = (f) => { const start = performance.now(); f(); return performance.now() - start; };
  time(() => PageData.pageData(Page.MODEL, Page.TOKENIZER, ids, 0, Page.EXAMPLE));  // the first: the JIT compiles
  const passes = Array.from({ length: 9 }, () => time(() => PageData.pageData(Page.MODEL, Page.TOKENIZER, ids, 0, Page.EXAMPLE)));
  document.getElementById("prompt").value = prompt;
  const drawn = time(() => { document.getElementById("show").click(); document.body.getBoundingClientRect(); });
  const greedy = { temperature: 0, topK: null, topP: null, suppress: [] };
  let count = 0;
  const generating = time(() => { for (const _ of Model.generate(Page.MODEL, Page.TOKENIZER.encode("ROMEO:"), 64, greedy)) count++; });
  // where one score comes from (sources.js): the last layer's first head, the last query against the first key
  const data = PageData.pageData(Page.MODEL, Page.TOKENIZER, ids, 0, Page.EXAMPLE);
  const split = () => Sources.scoreSources(Page.MODEL, data, Page.MODEL.config.n_layer - 1, 0, ids.length - 1, 0);
  time(split);
  const splits = Array.from({ length: 9 }, () => time(split));
  // where the logit of the last token's next comes from (sources.js), the last query
  const logit = () => Sources.logitSources(Page.MODEL, data, ids.length - 1, ids[0]);
  time(logit);
  const logits = Array.from({ length: 9 }, () => time(logit));
  // on the lesson's page: the patching grid, as its button runs it (every part, every position, every path)
  const patching = Page.data.timeline && Page.data.timeline.circuit
    ? time(() => Patching.run(Page.MODEL, Page.TOKENIZER, Page.TOKENIZER.decode(ids), Page.data.timeline.circuit.symbols))
    : null;
  return { ids, pass_ms: passes.sort((a, b) => a - b)[4], drawn_ms: drawn, tokens_per_second: count / (generating / 1000),
    sources_ms: splits.sort((a, b) => a - b)[4], logit_split_ms: logits.sort((a, b) => a - b)[4], patching_ms: patching,
    ablation_ms: time(() => PageData.ablated(Page.MODEL, ids)), logits: Array.from(Model.forward(Page.MODEL, ids).logits) };
}"""


def with_snapshots(model: GPT, folder: Path) -> RunDir:
    """A run folder holding the model at the steps a tiny.yaml run of 1,737 iterations keeps
    (random weights, moved a little at each, as training would)."""
    run = RunDir(folder)
    snapshot = copy.deepcopy(model)
    for step in (0, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 1737):
        with torch.no_grad():
            for p in snapshot.parameters():
                p.add_(0.01 * torch.randn_like(p))
        run.save_snapshot(step, snapshot)
    return run


def tiny_model(checkpoint: Path | None):
    if checkpoint is not None:
        return RunDir(checkpoint).load_model()
    text = "\n".join(shakespeare.markdown_to_speeches(next(iter(shakespeare.play_files())).read_text()))
    tokenizer = train_tokenizer("char", [text, PROMPT], 0)
    settings = yaml.safe_load((ROOT / "configs" / "tiny.yaml").read_text())["model"]
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=tokenizer.get_vocab_size(), **settings)), tokenizer


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", type=Path, help="a run directory of tiny.yaml (default: random weights)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--quick", action="store_true", help="one load")
    p.add_argument("--out", help="JSON results (default bench/results/explorer.json)")
    args = p.parse_args()
    model, tokenizer = tiny_model(args.checkpoint)
    with tempfile.TemporaryDirectory() as tmp, chromium_page() as page:
        run = RunDir(args.checkpoint) if args.checkpoint else with_snapshots(model, Path(tmp) / "run")
        # a run's page opens on the start of its validation text, as explore.py writes it
        prompt = (default_prompt(run, tokenizer, 64) if args.checkpoint else None) or PROMPT
        start = time.perf_counter()
        runnable, why_not = page_model(model, tokenizer)  # (as explore.py writes the page: the same data, the same model)
        data = prompt_data(model.eval(), tokenizer, prompt, 64, run=run,
                           carry_weights=carries_snapshots(model, len(run.snapshot_paths())), sources=runnable is None)
        html = render(data, prompt=prompt, model=runnable, why_not=why_not)
        build = time.perf_counter() - start
        path = Path(tmp) / "explorer.html"
        path.write_text(html, encoding="utf-8")
        loads = []
        for _ in range(1 if args.quick else args.rounds):
            page.goto(path.as_uri())
            page.wait_for_selector("html[data-ready]")
            loads.append(float(page.get_attribute("html", "data-ready")))
        redraws = page.evaluate(SLIDE)
        in_page = page.evaluate(IN_PAGE, prompt) if runnable is not None else None
    result = {"tokens": len(data["tokens"]), "snapshots": len(redraws), "html_bytes": len(html.encode()), "build_seconds": build,
              "weights_bytes": len(to_json(runnable).encode()) if runnable else 0,
              "timeline_bytes": len(to_json(data["timeline"]).encode()) if data["timeline"] else 0,
              "interactive_ms": statistics.median(loads), "slider_ms": statistics.median(redraws),
              "slider_slowest_ms": max(redraws), "model": str(args.checkpoint or "tiny.yaml, random weights")}
    print(table(["model", "tokens", "snapshots", "HTML (MB)", "weights (MB)", "timeline (MB)", "build (s)",
                 "interactive (ms, median)", "slider redraw (ms, median)", "slowest (ms)"],
                [[result["model"], 64, result["snapshots"], result["html_bytes"] / 1e6, result["weights_bytes"] / 1e6,
                  result["timeline_bytes"] / 1e6, build, result["interactive_ms"], result["slider_ms"],
                  result["slider_slowest_ms"]]]))
    if in_page is not None:
        ids = in_page.pop("ids")
        with torch.no_grad():
            reference = copy.deepcopy(model).double()(torch.tensor([ids]))[0][0]
        page_logits = torch.tensor(in_page.pop("logits"), dtype=torch.float64).view_as(reference)
        result["in_page"] = {**in_page, "tokens": len(ids), "logits_vs_float64": (page_logits - reference).abs().max().item()}
        print(table(["tokens", "pass with every intermediate (ms, median)", "and every panel drawn (ms)",
                     "continuation (tokens/s)", "every head off (ms)", "one score's sources (ms, median)",
                     "one logit's split (ms, median)", "patching grid (ms)", "logits vs float64 (max abs)"],
                    [[len(ids), in_page["pass_ms"], in_page["drawn_ms"], in_page["tokens_per_second"],
                      in_page["ablation_ms"], in_page["sources_ms"], in_page["logit_split_ms"],
                      in_page["patching_ms"] if in_page["patching_ms"] is not None else "(no lesson)",
                      result["in_page"]["logits_vs_float64"]]]))
    path = save("explorer", {"machine": machine(torch.get_num_threads()), "results": [result]}, args.out)
    print(f"saved {path}")


if __name__ == "__main__":
    main()
