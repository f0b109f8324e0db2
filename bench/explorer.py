"""The attention explorer page: its size and its time to interactive in Chromium.

For tiny.yaml's model (from --checkpoint, e.g. the quick start's out/tiny, or with
random weights) and a 64-token prompt: the bytes of the HTML file, the seconds
explore.py takes to build it, and the milliseconds from opening the file to the first
complete page (the page's script writes that moment into data-ready), median of
--rounds loads in headless Chromium.

    python -m bench.explorer [--quick] [--checkpoint out/tiny] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
import yaml

from bench.common import ROOT, machine, save, table
from common.run_dir import RunDir
from data import shakespeare
from data.tokenizer import train_tokenizer
from explorer.data import page_data
from explorer.page import render
from explorer.screenshot import chromium_page
from model import GPT, GPTConfig

PROMPT = "ROMEO:\nBut soft, what light through yonder window breaks?\nIt is the east"  # its last 64 tokens


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
    ids = tokenizer.encode(PROMPT).ids[-64:]
    start = time.perf_counter()
    html = render(page_data(model.eval(), tokenizer, ids))
    build = time.perf_counter() - start
    loads = []
    with tempfile.TemporaryDirectory() as tmp, chromium_page() as page:
        path = Path(tmp) / "explorer.html"
        path.write_text(html, encoding="utf-8")
        for _ in range(1 if args.quick else args.rounds):
            page.goto(path.as_uri())
            page.wait_for_selector("html[data-ready]")
            loads.append(float(page.get_attribute("html", "data-ready")))
    result = {"tokens": len(ids), "html_bytes": len(html.encode()), "build_seconds": build,
              "interactive_ms": statistics.median(loads), "model": str(args.checkpoint or "tiny.yaml, random weights")}
    print(table(["model", "tokens", "HTML (MB)", "build (s)", "interactive (ms, median)"],
                [[result["model"], len(ids), result["html_bytes"] / 1e6, build, result["interactive_ms"]]]))
    path = save("explorer", {"machine": machine(torch.get_num_threads()), "results": [result]}, args.out)
    print(f"saved {path}")


if __name__ == "__main__":
    main()
