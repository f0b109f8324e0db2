"""The page's half of issue 76, in Debian's Chromium: the logit's split and patching computed
by the page (explorer/page/sources.js, patching.js) equal inspection/circuits.py's and
inspection/patching.py's on the same weights; and the charts and panels of the lesson read
what the data holds, each against values set by hand (a matrix read the wrong way round, two
losses swapped, a stage misnamed: each shows as a wrong number)."""

import functools

import numpy as np
import pytest
import torch

from data.copies import SYMBOLS
from explorer.data import array, page_data, page_model, timeline_data
from explorer.page import render
from inspection.circuits import logit_sources
from inspection.patching import corrupted, path_patching, patching, scored_targets
from test_explorer_browser import browser, open_page  # noqa: F401 (fixtures)
from test_explorer_in_page import PLAIN
from test_patching import LINES, lesson_model

TEXT = LINES + "kQ3kQ3\n"


@pytest.fixture(scope="module", params=[
    pytest.param({}, id="lesson"),
    pytest.param({"qk_norm": True, "head_dim": 12, "norm": "rmsnorm"}, id="qwen3", marks=pytest.mark.slow)])
def lesson(request, tmp_path_factory):
    """A scrambled two-layer model over the lesson's alphabet (and one with Qwen3's attention:
    QK-norm, heads of 12), its page (running it), and a timeline of three snapshots whose
    lesson's numbers are then set by hand."""
    model, tokenizer = lesson_model(pos_encoding="rope", **request.param)
    ids = tokenizer.encode(TEXT).ids
    snapshots = {step: functools.partial(lambda m, scale: m, scale=step) for step in (0, 10, 20)}
    val = np.asarray(tokenizer.encode(TEXT * 8).ids)
    x = torch.from_numpy(np.stack([val[:31], val[1:32]]).astype(np.int64))
    part = torch.ones_like(x)
    back = torch.full_like(x, 4)
    timeline = timeline_data(model, tokenizer, snapshots, ids, val, windows=2, carry_weights=True,
                             copies=(x, x.roll(-1, 1), part, back))
    L, H = model.config.n_layer, model.config.n_head
    composition = torch.zeros(3, L, H, L, H)
    composition[:, 0, 1, 1, 2] = torch.tensor([0.1, 0.3, 0.6])  # L0H1 writes, L1H2 reads
    timeline["composition"] = {kind: array(composition, "float16") for kind in "qkv"}
    timeline["composition_baseline"] = {kind: {"mean": 0.125, "sd": 0.01} for kind in "qkv"}
    timeline["copies"] = {"first": [4.1, 4.2, 4.3], "second": [4.0, 2.0, 0.5],
                          "phase_change": {"start": 10, "end": 20, "snapshots": 2}}
    # each step's best head is another than the circuit's the run ends with (L1H2 over L0H3 and L0H1)
    scores = {"induction": [[0, 0, 0, 0], [0.5, 0, 0.2, 0]], "previous_token": [[0.6, 0, 0, 0.3], [0, 0, 0, 0]],
              "current_token": [[0, 0.4, 0.5, 0], [0, 0, 0, 0]]}
    final = {"induction": (1, 2, 0.9), "previous_token": (0, 3, 0.8), "current_token": (0, 1, 0.7)}
    for kind, rows in scores.items():
        timeline["scores"][kind] = [rows, rows, [row[:] for row in rows]]
        layer, head, score = final[kind]
        timeline["scores"][kind][2][layer][head] = score
    circuit = timeline["circuit"]
    circuit["head"] = [1, 2]
    circuit["stages"] = [{"right": 0.05, "same": 0.05, "rest": 0.9}, {"right": 0.2, "same": 0.7, "rest": 0.1},
                         {"right": 0.9, "same": 0.05, "rest": 0.05}]
    path = tmp_path_factory.mktemp("circuit") / "lesson.html"
    block, _ = page_model(model, tokenizer)
    path.write_text(render(page_data(model, tokenizer, ids, timeline=timeline), model=block, prompt=TEXT),
                    encoding="utf-8")
    return model, tokenizer, path, timeline


def test_the_pages_logit_split_is_torch_s(lesson, open_page):
    model, tokenizer, path, _ = lesson
    page = open_page(path.as_uri())
    page.page.wait_for_selector("html[data-ready]")
    ids = tokenizer.encode(TEXT).ids
    with torch.no_grad():
        split = logit_sources(model, model.trace(torch.tensor([ids])), torch.tensor([ids[1:] + ids[:1]]))
    for t in (3, 14, 22):
        found = page.page.evaluate("([t, token]) => { const d = Page.data; return Sources.logitSources(Page.MODEL, d, t, token); }",
                                   [t, ids[t + 1]])
        assert found["pieces"] == split["pieces"]
        assert found["contributions"] == pytest.approx(split["contributions"][:, 0, t].tolist(), abs=2e-5)
        assert sum(found["contributions"]) == pytest.approx(found["logit"], abs=1e-5)
    assert page.errors == []


def test_the_pages_patching_is_inspection_patchings(lesson, open_page):
    """Every part at every position and at each one, and each head on each path: the page's
    numbers (its shortcut for a position: one row, or the next block mended) are torch's."""
    model, tokenizer, path, _ = lesson
    page = open_page(path.as_uri())
    page.page.wait_for_selector("html[data-ready]")
    found = page.page.evaluate(f"([text, symbols]) => ({PLAIN})(Patching.run(Page.MODEL, Page.TOKENIZER, text, symbols))",
                               [TEXT, SYMBOLS])
    clean, corrupt = (torch.tensor(tokenizer.encode(text).ids) for text in (TEXT, corrupted(TEXT, SYMBOLS)))
    ours, paths = patching(model, clean, corrupt, scored_targets(TEXT)), path_patching(model, clean, corrupt,
                                                                                       scored_targets(TEXT))
    assert found["components"] == ours["components"]
    assert (found["clean"], found["corrupt"]) == pytest.approx((ours["clean"], ours["corrupt"]), abs=1e-5)
    assert found["all"] == pytest.approx(ours["all"], abs=5e-4)  # (shares of a gap: float32 rounding, divided)
    assert np.asarray(found["positions"]) == pytest.approx(np.asarray(ours["positions"]), abs=5e-4)
    for key in ("all", "direct", "ffn"):
        assert found["paths"][key] == pytest.approx(paths[key], abs=5e-4)
    assert page.page.evaluate("([text, symbols]) => Patching.corrupted(text, symbols)", [TEXT, SYMBOLS]) == \
        corrupted(TEXT, SYMBOLS)


def test_the_patching_panel_draws_what_the_run_gives(lesson, open_page):
    model, tokenizer, path, _ = lesson
    page = open_page(path.as_uri())
    page.page.wait_for_selector("html[data-ready]")
    assert page.text("#patching-corrupted") == corrupted(TEXT, SYMBOLS)
    page.page.click("#patch-run")
    page.page.wait_for_selector("#patching-grid td")
    clean, corrupt = (torch.tensor(tokenizer.encode(text).ids) for text in (TEXT, corrupted(TEXT, SYMBOLS)))
    ours = patching(model, clean, corrupt, scored_targets(TEXT))
    every = page.values('#patching-grid td[data-every="1"]')
    assert every == pytest.approx(ours["all"], abs=5e-4)  # (shares of a gap: float32 rounding, divided)
    row = page.values('#patching-grid tr[data-component="L1H2"] td[data-position]')
    assert row == pytest.approx(ours["positions"][6], abs=5e-4)
    assert f"{ours['clean']:.3f} in the clean run, {ours['corrupt']:.3f} in the corrupted one" in \
        page.text("#patching-result")
    assert page.errors == []


def test_the_lessons_charts_read_their_numbers_the_right_way_round(lesson, open_page):
    """Known values: one pair composes (L0H1 → L1H2: 0.1, 0.3, 0.6), every other pair 0; the
    random band at 0.125 ± 0.02; the first copies 4.1, 4.2, 4.3 and the second 4.0, 2.0, 0.5;
    the induction head at the same symbol (0.7) at step 10, the right key (0.9) at step 20."""
    _, _, path, timeline = lesson
    page = open_page(path.as_uri())
    page.page.wait_for_selector("html[data-ready]")
    for s, expected in ((2, 0.6), (1, 0.3), (0, 0.1)):
        page.page.focus("#timeline-step")
        page.page.keyboard.press("End" if s == 2 else "ArrowLeft")
        dots = page.page.eval_on_selector_all('#timeline-composition-charts [data-kind="k"] circle',
                                              "dots => dots.map(d => [d.dataset.key, Number(d.dataset.value)])")
        values = dict(dots)
        assert values["0.1>1.2"] == pytest.approx(expected, abs=1e-3)
        assert all(v == 0 for key, v in values.items() if key != "0.1>1.2")
        copies = dict(page.page.eval_on_selector_all("#timeline-copies-chart circle",
                                                     "dots => dots.map(d => [d.dataset.key, Number(d.dataset.value)])"))
        assert copies == pytest.approx({"first": timeline["copies"]["first"][s], "second": timeline["copies"]["second"][s]})
        stages = dict(page.page.eval_on_selector_all("#timeline-stages-chart circle",
                                                     "dots => dots.map(d => [d.dataset.key, Number(d.dataset.value)])"))
        assert stages == pytest.approx(timeline["circuit"]["stages"][s])
    band = page.page.eval_on_selector('#timeline-composition-charts [data-kind="k"] rect.band',
                                      "r => [Number(r.dataset.from), Number(r.dataset.to)]")
    assert band == pytest.approx([0.105, 0.145])
    axes = []
    for key in ("End", "Home"):  # the loss by position: one axis for every step, and the positions said as they are
        page.page.focus("#timeline-step")
        page.page.keyboard.press(key)
        axes.append(page.page.eval_on_selector_all("#timeline-context-charts div:first-child svg text",
                                                   "labels => labels.slice(0, 2).map(l => l.textContent)"))
        assert "the mean loss of positions 16 to 31 less that of positions 1 to 3" in page.text("#timeline-context-note")
    assert axes[0] == axes[1]
    headers = page.page.eval_on_selector_all("#timeline-copies-table th", "cells => cells.map(c => c.textContent)")
    assert headers[3:] == ["induction score, L1H2", "previous-token score, L0H3", "current-token score, L0H1"]
    table = page.page.eval_on_selector_all("#timeline-copies-table tbody tr",
                                           "rows => rows.map(r => [...r.cells].map(c => c.textContent))")
    assert [row[3:] for row in table] == [["0.200", "0.300", "0.400"]] * 2 + [["0.900", "0.800", "0.700"]]
    note = page.text("#timeline-stages-note")
    assert "From step 10 to 10 it looks at the same symbol more than at the next one" in note
    assert "From step 20 on the right key has more than half its weight" in note
    assert page.errors == []
