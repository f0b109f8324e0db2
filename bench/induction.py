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
from explorer.data import circuit_at
from inspection.circuits import composition_baseline, copying_on_text, copying_scores
from inspection.head_scores import head_scores, induction_probe, uniform_scores
from inspection.in_context import copy_losses, copy_marks, copy_windows, phase_change

LESSON = ROOT / "configs" / "induction.yaml"
WINDOWS = 64  # validation windows each snapshot is scored on


def analyse(run: Path) -> dict:
    """Every snapshot of the lesson's run in `run`, read back; the circuit the run ends with
    (its induction head, and the previous-token and current-token heads of layer 0 that serve
    it) followed back through every snapshot, not each step's best head."""
    run_dir = RunDir(run)
    model, tokenizer = run_dir.load_model()
    block = model.config.block_size
    _, val = copies.splits(run_dir.data_config().val_fraction)
    ids = np.asarray(tokenizer.encode(val).ids)
    windows = copy_windows(ids, copy_marks(val), block)
    x, y, part, back = windows
    text = torch.from_numpy(ids[:block].astype(np.int64))[None]
    probe = induction_probe(tokenizer, model.config.vocab_size, block)
    steps, first, second, scores = [], [], [], {"current_token": [], "previous_token": [], "induction": []}
    for step in run_dir.snapshot_paths():
        snapshot = run_dir.load_snapshot(step, model).eval()
        a, b = copy_losses(snapshot, x, y, part)
        steps.append(step)
        first.append(a)
        second.append(b)
        for kind, values in head_scores(snapshot, text, probe).items():
            if kind in scores:
                scores[kind].append(values.tolist())
    uniform = uniform_scores(block, probe[0])
    circuit = final_circuit(steps, scores, uniform)
    trained = run_dir.load_snapshot(steps[-1], model).eval()
    result = {"steps": steps, "first_copies": first, "second_copies": second, **scores, "uniform": uniform,
              "phase_change": phase_change(steps, first, second), "circuit": circuit,
              "ablation": each_head_off(trained, windows), "copying": copying_scores(trained).tolist(),
              "copying_on_text": copying_on_text(trained, trained.trace(text), text).tolist(),
              "composition_baseline": composition_baseline(trained)}
    if "induction" not in circuit:
        return result
    head = [circuit["induction"]["layer"], circuit["induction"]["head"]]
    over = [circuit_at(run_dir.load_snapshot(step, model).eval(), windows, head) for step in steps]
    result.update(sources=lead_sources(trained, tokenizer, val, *head), over_training=over,
                  composition=composition_over(run_dir, model, steps, circuit),
                  patching=patched_lines(trained, tokenizer, val))
    return result


FORMED = 0.5  # an induction score the run's best head must reach for the docs to call it one


def final_circuit(steps: list[int], scores: dict, uniform: dict) -> dict:
    """The run's induction head (the best past layer 0 at the last step, where it reaches
    FORMED), and the previous-token and current-token heads before its layer; each with its score
    at the last step and the first step it held half of that score from."""
    def held(kind: str, layer: int, head: int) -> dict:
        values = [s[layer][head] for s in scores[kind]]
        last = values[-1]
        start = len(values) - 1
        while start > 0 and values[start - 1] > last / 2:
            start -= 1
        return {"layer": layer, "head": head, "score": last, "from": steps[start], "values": values}

    induction = torch.tensor(scores["induction"][-1])[1:]
    layer, head = divmod(int(induction.argmax()), induction.size(1))
    if induction[layer, head] < FORMED:
        return {"none": f"no head past layer 0 reached {FORMED} on induction (best: layer {layer + 1}, head {head}, "
                        f"{induction[layer, head]:.3f}; even attention {uniform['induction']:.3f})"}
    circuit = {"induction": held("induction", layer + 1, head)}
    for kind in ("previous_token", "current_token"):
        earlier = torch.tensor(scores[kind][-1])[:layer + 1]
        l, h = divmod(int(earlier.argmax()), earlier.size(1))
        circuit[kind] = held(kind, l, h)
    return circuit


def each_head_off(model, windows) -> list[dict]:
    """The loss on the second copies with each head of the trained model switched off."""
    x, y, part, _ = windows
    found = []
    for l in range(model.config.n_layer):
        for h in range(model.config.n_head):
            mask = torch.ones(model.config.n_layer, model.config.n_head)
            mask[l, h] = 0
            found.append({"layer": l, "head": h, "second_copies": copy_losses(model, x, y, part, head_mask=mask)[1]})
    return found


def composition_over(run_dir, model, steps: list[int], circuit: dict) -> dict:
    """The circuit's pairs over training: K (previous-token head into the induction head),
    Q (current-token head into it) and V (the head its values read most at the end)."""
    from inspection.circuits import composition_scores

    reader = (circuit["induction"]["layer"], circuit["induction"]["head"])
    over = [composition_scores(run_dir.load_snapshot(step, model).eval()) for step in steps]
    writers = {"k": circuit["previous_token"], "q": circuit["current_token"]}
    v = over[-1]["v"][:, :, reader[0], reader[1]]
    writers["v"] = dict(zip(("layer", "head"), divmod(int(v.argmax()), v.size(1))))
    return {kind: {"writer": [w["layer"], w["head"]],
                   "values": [step[kind][w["layer"], w["head"], reader[0], reader[1]].item() for step in over]}
            for kind, w in writers.items()}


def patched_lines(model, tokenizer, val: str) -> dict:
    """Activation and path patching (inspection/patching.py) on SOURCE_LINES validation lines,
    the shares each part restores averaged over them."""
    from inspection.patching import corrupted, path_patching, patching, scored_targets

    found, paths = [], []
    for line in val.split("\n")[1:SOURCE_LINES + 1]:
        text = line + "\n"
        clean, corrupt = (torch.tensor(tokenizer.encode(t).ids) for t in (text, corrupted(text, copies.SYMBOLS)))
        found.append(patching(model, clean, corrupt, scored_targets(text), positions=False))
        paths.append(path_patching(model, clean, corrupt, scored_targets(text)))
    mean = lambda key, rows: np.mean([r[key] for r in rows], 0).round(3).tolist()  # noqa: E731
    return {"components": found[0]["components"], "all": mean("all", found), "clean": mean("clean", found),
            "corrupt": mean("corrupt", found), "heads": paths[0]["heads"], "direct": mean("direct", paths),
            "ffn": mean("ffn", paths) if paths[0]["ffn"] is not None else None}


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


def train_lesson(out: Path, overrides: list[str], config: str = str(LESSON)) -> float:
    """A fresh run of the lesson into `out`; its seconds, data preparation included."""
    started = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        code = train.main(["--config", config, f"out_dir={out}", *overrides, "--fresh"])
    if code != 0:
        raise SystemExit(f"the lesson's run failed (exit {code})")
    return time.perf_counter() - started


def digest(run: Path) -> str:
    return hashlib.sha256((run / RunDir.WEIGHTS).read_bytes()).hexdigest()[:16]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default=str(LESSON), help="the lesson's config (default configs/induction.yaml; "
                   "configs/induction-attn-only.yaml: the attention-only model)")
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
        seconds = None if args.run else train_lesson(run, overrides, args.config)
        result = {"config": args.config, "overrides": overrides, "seconds": seconds, "weights": digest(run),
                  **analyse(run)}
        if args.twice:
            result["second_run"] = {"seconds": train_lesson(Path(tmp) / "again", overrides, args.config),
                                    "weights": digest(Path(tmp) / "again")}
            result["bit_identical"] = result["second_run"]["weights"] == result["weights"]
    say(result)
    if seconds is not None:
        print(f"trained in {seconds:.1f} s, data preparation included")
    if args.twice:
        print(f"two fresh runs bit-identical: {result['bit_identical']}")
    path = save("induction", {"machine": machine(torch.get_num_threads()), "results": [result]}, args.out)
    print(f"saved {path}")


def say(result: dict) -> None:
    """The tables and lines the docs quote."""
    change, circuit = result["phase_change"], result["circuit"]
    uniform = result["uniform"]
    print(f"uniform attention scores: current token {uniform.get('current_token', 0):.3f}, previous token "
          f"{uniform['previous_token']:.3f}, induction {uniform['induction']:.3f}")
    print("phase change: " + (f"steps {change['start']} to {change['end'] or 'beyond the last snapshot'}, "
                              f"{change['snapshots']} snapshots in it" if change["start"] is not None else
                              "none: the second copies never fell below 90% of the first copies"))
    if "none" in circuit:
        print(f"the circuit: {circuit['none']}")
        print(table(["step", "loss, first copies", "loss, second copies"],
                    list(zip(result["steps"], result["first_copies"], result["second_copies"]))))
        return
    heads = {kind: (circuit[kind]["layer"], circuit[kind]["head"]) for kind in ("induction", "previous_token",
                                                                               "current_token")}
    for kind, (layer, head) in heads.items():
        said = circuit[kind]
        print(f"{kind} head (the run's last): layer {layer}, head {head}, score {said['score']:.3f}, above half of it "
              f"from step {said['from']}")
    over = result["over_training"]
    pieces = over[0]["logit"]["pieces"]
    ffn0 = over[0]["readout"]["pieces"].index("L0 FFN") if "L0 FFN" in over[0]["readout"]["pieces"] else None
    names = ["step", "loss, first copies", "loss, second copies", *(f"{kind} L{l}H{h}" for kind, (l, h) in heads.items()),
             "weight: right key", "weight: same symbol", "right logit: biggest piece"]
    rows = []
    for i, step in enumerate(result["steps"]):
        logit = over[i]["logit"]["values"]
        biggest = max(range(len(pieces)), key=lambda p: abs(logit[p]))
        rows.append([step, result["first_copies"][i], result["second_copies"][i],
                     *(circuit[kind]["values"][i] for kind in heads), over[i]["stages"]["right"],
                     over[i]["stages"]["same"], f"{pieces[biggest]} {logit[biggest]:.2f}"])
    print(table(names, rows))
    last = over[-1]["logit"]
    print("the right token's logit over the second copies at the end, by piece: "
          + ", ".join(f"{n} {v:.2f}" for n, v in zip(last["pieces"], last["values"])))
    if ffn0 is not None:
        print("layer 0's FFN read by a linear probe (the token before / the token itself): "
              + ", ".join(f"step {s} {o['readout']['previous'][ffn0]:.2f} / {o['readout']['current'][ffn0]:.2f}"
                          for s, o in zip(result["steps"], over) if s in (0, result["steps"][len(over) // 2],
                                                                          result["steps"][-1])))
    baseline = result["composition_baseline"]
    for kind, pair in result["composition"].items():
        mean, sd = baseline[kind]["mean"], baseline[kind]["sd"]
        values = pair["values"]
        print(f"{kind.upper()}-composition L{pair['writer'][0]}H{pair['writer'][1]} -> L{heads['induction'][0]}H"
              f"{heads['induction'][1]}: {values[0]:.3f} at step 0, {values[-1]:.3f} at the end; random heads "
              f"{mean:.3f} ± {sd:.3f}: {(values[-1] - mean) / sd:.1f} standard deviations above")
    layer, head = heads["induction"]
    print(f"copying score of the induction head: {result['copying'][layer][head]:.3f} on the embedding alone (the "
          f"direct path), {result['copying_on_text'][layer][head]:.3f} on the text")
    patched = result["patching"]
    print(f"patching on {SOURCE_LINES} validation lines (loss on the second copies: clean {np.mean(patched['clean']):.3f}, "
          f"corrupted {np.mean(patched['corrupt']):.3f}), the share each part restores put back at every position: "
          + ", ".join(f"{n} {v:.2f}" for n, v in zip(patched["components"], patched["all"])))
    print("each head on one path: straight to the logits / through its block's FFN: "
          + ", ".join(f"{n} {d:.2f}" + (f" / {f:.2f}" if patched["ffn"] else "")
                      for n, d, f in zip(patched["heads"], patched["direct"], patched["ffn"] or patched["direct"])))
    sources = result["sources"]
    print(f"the induction head's right key against the others: {sources['gap']:.1f} higher, on average over the "
          f"second copies of {SOURCE_LINES} lines; of it, by the key's pieces: "
          + ", ".join(f"{name} {value:.1f}" for name, value in sources["key"].items())
          + "; by the query's: " + ", ".join(f"{name} {value:.1f}" for name, value in sources["query"].items()))
    print("switching one head of the last model off, the loss on the second copies "
          f"(all on: {result['second_copies'][-1]:.3f}):")
    print(table(["layer", "head", "loss, second copies"], [[a["layer"], a["head"], a["second_copies"]]
                                                             for a in result["ablation"]]))


if __name__ == "__main__":
    main()
