"""The induction lesson, measured: configs/induction.yaml trained from a fresh process, then
every snapshot read back for what the docs say of it.

For each snapshot: the loss on the validation text's first copies (unpredictable: about
ln 64 = 4.16) and on its second copies (only those whose first copy lies inside the window,
so that a model could copy it), and every head's previous-token and induction scores
(inspection/head_scores.py). From those: the phase change (where the second copies' loss
leaves its plateau, falling below 90% of the first copies', and where it has come within
10% of its final drop), how many snapshots fall inside it, the circuit (the best induction
head, and the best previous-token head in an earlier layer), and what switching each head of
the last model off does to the loss on the second copies.

    python -m bench.induction                      # the lesson as the docs quote it
    python -m bench.induction --twice              # two fresh runs: are they bit-identical?
    python -m bench.induction --set train.threads=1 model.n_embd=32   # a variant of the recipe
    python -m bench.induction --quick              # a shortened lesson (a test runs this)
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

import train
from bench.common import ROOT, machine, save, table
from runs.folder import RunDir
from data import copies
from inspection.head_scores import head_scores, induction_probe, uniform_scores
from inspection.in_context import copy_losses, copy_marks, copy_windows, phase_change

LESSON = ROOT / "configs" / "induction.yaml"
WINDOWS = 64  # validation windows each snapshot is scored on


def analyse(run: Path) -> dict:
    """Every snapshot of the lesson's run in `run`, read back."""
    run_dir = RunDir(run)
    model, tokenizer = run_dir.load_model()
    block = model.config.block_size
    _, val = copies.splits(run_dir.data_config().val_fraction)
    ids = np.asarray(tokenizer.encode(val).ids)
    x, y, part, back = copy_windows(ids, copy_marks(val), block)
    text = torch.from_numpy(ids[:block].astype(np.int64))[None]
    probe = induction_probe(tokenizer, model.config.vocab_size, block)
    steps, first, second, current, previous, induction = [], [], [], [], [], []
    for step in run_dir.snapshot_paths():
        snapshot = run_dir.load_snapshot(step, model).eval()
        a, b = copy_losses(snapshot, x, y, part)
        scores = head_scores(snapshot, text, probe)
        steps.append(step)
        first.append(a)
        second.append(b)
        current.append(scores["current_token"].tolist())
        previous.append(scores["previous_token"].tolist())
        induction.append(scores["induction"].tolist())
    last_induction, last_previous = torch.tensor(induction[-1]), torch.tensor(previous[-1])
    layer, head = divmod(int(last_induction.argmax()), last_induction.size(1))
    earlier = last_previous[:layer] if layer else last_previous[:0]
    circuit = {"induction": {"layer": layer, "head": head, "score": last_induction[layer, head].item(),
                             "formed_at": next((s for s, i in zip(steps, induction) if i[layer][head] >= 0.5), None)}}
    for kind, over_steps in (("previous_token", previous), ("current_token", current)):
        earlier = torch.tensor(over_steps[-1])[:layer]
        if earlier.numel():
            p_layer, p_head = divmod(int(earlier.argmax()), earlier.size(1))
            circuit[kind] = {"layer": p_layer, "head": p_head, "score": earlier[p_layer, p_head].item(),
                             "formed_at": next((s for s, p in zip(steps, over_steps) if p[p_layer][p_head] >= 0.3), None)}
    trained = run_dir.load_snapshot(steps[-1], model).eval()
    ablation = []
    for l in range(model.config.n_layer):
        for h in range(model.config.n_head):
            mask = torch.ones(model.config.n_layer, model.config.n_head)
            mask[l, h] = 0
            ablation.append({"layer": l, "head": h, "second_copies": copy_losses(trained, x, y, part, head_mask=mask)[1]})
    return {"steps": steps, "first_copies": first, "second_copies": second, "current_token": current,
            "previous_token": previous, "sources": lead_sources(trained, tokenizer, val, layer, head),
            "induction": induction, "uniform": uniform_scores(block, probe[0]), "phase_change": phase_change(steps, first, second),
            "circuit": circuit, "ablation": ablation}


SOURCE_LINES = 8  # lines of the validation text whose second copies the induction head's lead is split on


def lead_sources(model, tokenizer, val: str, layer: int, head: int) -> dict:
    """Where the induction head's lead comes from (inspection/circuits.py): for the second
    copy's queries of SOURCE_LINES validation lines, the right key's score less the other
    keys' mean, split by the key's pieces and by the query's, averaged: {"gap", "key": {piece:
    share}, "query": {piece: share}}."""
    from inspection.circuits import score_sources

    gaps, keys, queries = [], [], []
    for line in val.split("\n")[1:SOURCE_LINES + 1]:
        ids = tokenizer.encode(line + "\n").ids
        n = len(line) // 2
        with torch.no_grad():
            trace = model.trace(torch.tensor([ids]))
            for query in range(n + 1, 2 * n - 1):  # the token at query - n came before: the right key is the next one
                found = score_sources(model, trace, layer, head, query, query - n + 1)
                gaps.append(found["others"]["gap"])
                keys.append(found["others"]["key"])
                queries.append(found["others"]["query"])
    mean = lambda rows: dict(zip(found["pieces"], np.mean(rows, 0).round(2).tolist()))  # noqa: E731
    return {"gap": float(np.mean(gaps)), "key": mean(keys), "query": mean(queries)}


def train_lesson(out: Path, overrides: list[str]) -> float:
    """A fresh run of the lesson into `out`; its seconds, data preparation included."""
    started = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        code = train.main(["--config", str(LESSON), f"out_dir={out}", *overrides, "--fresh"])
    if code != 0:
        raise SystemExit(f"the lesson's run failed (exit {code})")
    return time.perf_counter() - started


def digest(run: Path) -> str:
    return hashlib.sha256((run / RunDir.WEIGHTS).read_bytes()).hexdigest()[:16]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--set", nargs="*", default=[], metavar="section.key=value", help="a variant of the recipe")
    p.add_argument("--twice", action="store_true", help="train twice and compare the weights bit for bit")
    p.add_argument("--run", help="analyse this run folder instead of training one")
    p.add_argument("--quick", action="store_true", help="a shortened lesson (60 steps: a smoke test of the script)")
    p.add_argument("--out", help="JSON results (default bench/results/induction.json)")
    args = p.parse_args()
    overrides = [*args.set, *(["train.max_iters=60", "train.eval_interval=30", "train.snapshot_every=30"]
                               if args.quick else [])]
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(args.run) if args.run else Path(tmp) / "run"
        seconds = None if args.run else train_lesson(run, overrides)
        result = {"overrides": overrides, "seconds": seconds, "weights": digest(run), **analyse(run)}
        if args.twice:
            result["second_run"] = {"seconds": train_lesson(Path(tmp) / "again", overrides),
                                    "weights": digest(Path(tmp) / "again")}
            result["bit_identical"] = result["second_run"]["weights"] == result["weights"]
    change, circuit = result["phase_change"], result["circuit"]
    rows = [[s, a, b, max(max(layer) for layer in i), max(max(layer) for layer in pv), max(max(layer) for layer in c)]
            for s, a, b, i, pv, c in zip(result["steps"], result["first_copies"], result["second_copies"],
                                         result["induction"], result["previous_token"], result["current_token"])]
    print(table(["step", "loss, first copies", "loss, second copies", "best induction score",
                 "best previous-token score", "best current-token score"], rows))
    print(f"\nuniform attention scores: previous token {result['uniform']['previous_token']:.3f}, "
          f"induction {result['uniform']['induction']:.3f}")
    print(f"phase change: steps {change['start']} to {change['end']}, {change['snapshots']} snapshots in it")
    for kind, head in circuit.items():
        print(f"{kind} head: layer {head['layer']}, head {head['head']}, score {head['score']:.3f} "
              f"(reached {'0.5' if kind == 'induction' else '0.3'} at step {head['formed_at']})")
    sources = result["sources"]
    print(f"the induction head's right key against the others: {sources['gap']:.1f} higher, on average over the "
          f"second copies of {SOURCE_LINES} lines; of it, by the key's pieces: "
          + ", ".join(f"{name} {value:.1f}" for name, value in sources["key"].items())
          + "; by the query's: " + ", ".join(f"{name} {value:.1f}" for name, value in sources["query"].items()))
    print("switching one head of the last model off, the loss on the second copies "
          f"(all on: {result['second_copies'][-1]:.3f}):")
    print(table(["layer", "head", "loss, second copies"], [[a["layer"], a["head"], a["second_copies"]]
                                                             for a in result["ablation"]]))
    if seconds is not None:
        print(f"trained in {seconds:.1f} s, data preparation included")
    if args.twice:
        print(f"two fresh runs bit-identical: {result['bit_identical']}")
    path = save("induction", {"machine": machine(torch.get_num_threads()), "results": [result]}, args.out)
    print(f"saved {path}")


if __name__ == "__main__":
    main()
