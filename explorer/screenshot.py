"""Pictures of an explorer page, taken by headless Chromium (Debian's, through Playwright),
for the README and the docs:

    python explore.py --prompt "ROMEO:..." --out explorer.html
    python -m explorer.screenshot explorer.html docs/images/explorer.png --layer 1 --head 2 --query 40 [--lang zh]

It opens the page from file:// with every other request blocked, clicks the chosen
head, query token, key, coordinate, experiment, head to switch off, training step of the
timeline and the patching panel's button (as a learner would), and saves one panel
(--panel), or --height pixels of the page from --top on.
"""

from __future__ import annotations

import argparse
from contextlib import contextmanager
from pathlib import Path

CHROMIUM = "/usr/bin/chromium"


@contextmanager
def chromium_page(width: int = 1280, height: int = 1500):
    """A page of headless Chromium that may load file:// addresses only."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            context = browser.new_context(viewport={"width": width, "height": height})
            context.route("**/*", lambda r: r.continue_() if r.request.url.startswith("file:") else r.abort())
            yield context.new_page()
        finally:
            browser.close()


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("page", type=Path, help="an HTML file written by explore.py")
    p.add_argument("out", type=Path, help="the PNG to write")
    p.add_argument("--layer", type=int, default=0)
    p.add_argument("--head", type=int, default=0)
    p.add_argument("--query", type=int, help="token index (default: the middle one)")
    p.add_argument("--key", type=int, help="a key whose score's terms to show")
    p.add_argument("--coordinate", type=int, help="a coordinate of q to show as its sum of products")
    p.add_argument("--experiment", choices=["no-scale", "no-mask"], help="switch an experiment on")
    p.add_argument("--ablate", help="LAYER,HEAD: switch that head off in the prediction panel")
    p.add_argument("--step", type=int, help="the timeline at this training step (one of the run's snapshots)")
    p.add_argument("--patch", action="store_true", help="press the patching panel's button (the lesson's run)")
    p.add_argument("--lang", choices=["en", "zh"], default="en")
    p.add_argument("--panel", help="picture only this element (e.g. #qkv-panel) instead of --top and --height")
    p.add_argument("--top", default="#heads-panel", help="the part of the page the picture starts at")
    p.add_argument("--height", type=int, default=1400, help="pixels to keep from there")
    args = p.parse_args(argv)
    with chromium_page() as page:
        page.goto(args.page.resolve().as_uri())
        # every panel laid out (the page leaves those out of sight for later), so that where a
        # panel is and how tall it is are known before the picture is taken
        page.add_style_tag(content="#explorer section { content-visibility: visible; }")
        page.click(f'#grid canvas.thumb[data-layer="{args.layer}"][data-head="{args.head}"]')
        if args.query is not None:
            page.click(f'.token[data-index="{args.query}"]')
        if args.key is not None:
            page.click(f'#steps td[data-step="1"][data-key="{args.key}"]')
        if args.coordinate is not None:
            page.click(f'#qkv [data-which="q"] button.coordinate[data-dim="{args.coordinate}"]')
        if args.experiment:
            page.check(f"#{args.experiment}")
        if args.ablate:
            layer, head = args.ablate.split(",")
            page.click(f'.ablate[data-layer="{layer}"][data-head="{head}"]')
        if args.step is not None:
            steps = page.evaluate("Page.data.timeline ? Page.data.timeline.steps : []")
            if args.step not in steps:
                raise SystemExit(f"--step {args.step}: the page's snapshots are at steps {steps}")
            page.eval_on_selector("#timeline-step", "(slider, k) => { slider.value = String(k); "
                                  "slider.dispatchEvent(new Event('input')); }", steps.index(args.step))
        if args.patch:
            page.click("#patch-run")
            page.wait_for_selector("#patching-grid td")
        if args.lang != page.evaluate("document.documentElement.lang.slice(0, 2)"):
            page.click("#lang")
        args.out.parent.mkdir(parents=True, exist_ok=True)
        if args.panel:
            # (the model's map stays at the top of the window as the page scrolls: over a panel taller than the window)
            page.locator(args.panel).screenshot(path=str(args.out), style="#model-map { position: static; }")
        else:
            top = page.eval_on_selector(args.top, "node => node.getBoundingClientRect().top + window.scrollY")
            page.screenshot(path=str(args.out), full_page=True, clip={"x": 0, "y": top, "width": 1280, "height": args.height})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
