"""The explorer inline in a notebook (Jupyter, JupyterLab, Colab, VS Code):

    import explorer
    explorer.show("out/tiny", "ROMEO:")

shows the page explore.py writes, in the cell's output, inside an iframe of its own
(srcdoc, scripts allowed and nothing else), so that two cells' pages never share ids,
styles or scripts with each other or with the notebook. A model small enough for the page
travels with it, and typing into the box runs the model there, as in the file. Nothing
here needs IPython: a notebook shows any object with _repr_html_.
"""

from __future__ import annotations

import html
from pathlib import Path

from runs.folder import DEFAULT_RUN, RunDir
from storage.atomic import write_atomic

from .data import MAX_TOKENS, page_model, prompt_data
from .page import render


class InlinePage:
    """One explorer page for a notebook cell. page: the whole HTML file (explore.py's);
    html: the iframe that holds it, which _repr_html_ hands to the notebook."""

    def __init__(self, page: str, height: int):
        self.page = page
        self.height = height

    @property
    def html(self) -> str:
        # srcdoc holds the page as an attribute: html.escape makes every " and & in it text
        return (f'<iframe sandbox="allow-scripts" srcdoc="{html.escape(self.page, quote=True)}" '
                f'style="width: 100%; height: {self.height}px; border: 1px solid #ddd" '
                f'title="attention explorer"></iframe>')

    def _repr_html_(self) -> str:
        return self.html

    def save(self, path: str | Path) -> None:
        """The page as a file, as explore.py --out writes it."""
        write_atomic(Path(path), self.page.encode("utf-8"))


def show(checkpoint: str | Path = DEFAULT_RUN, prompt: str = "ROMEO:", lang: str = "en", height: int = 900,
         max_tokens: int = MAX_TOKENS) -> InlinePage:
    """The explorer's page for a run folder and a prompt (its last max_tokens tokens), in
    English ("en") or Chinese ("zh"), height pixels tall in the notebook."""
    if lang not in ("en", "zh"):
        raise ValueError(f"lang={lang!r}: the page speaks 'en' or 'zh'")
    run = RunDir(Path(checkpoint))
    model, tokenizer = run.load_model()
    data = prompt_data(model.eval(), tokenizer, prompt, max_tokens, run=run)
    runnable, why_not = page_model(model, tokenizer)
    return InlinePage(render(data, lang, prompt=prompt, model=runnable, why_not=why_not, max_tokens=max_tokens), height)
