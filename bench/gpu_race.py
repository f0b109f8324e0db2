"""The GPU race: nanoGPT's baby GPT against this project's recipes, on one device, in one
script, scored by one rule.

    python -m bench.gpu_race --nanogpt DIR --data tinyshakespeare.txt --out $OUT/race.json
        [--budget 180] [--cap 300] [--recipes CONFIG,key=value,... ...] [--quick]

1. nanoGPT's own train.py with config/train_shakespeare_char.py (DIR: its source, e.g.
   `git archive` of karpathy/nanoGPT; never part of this repository), changed in its data
   path only (the given file copied in as its input.txt; its prepare.py makes the 90/10
   split) and in its evaluation cadence: every EVERY iterations, one batch per split (its
   own estimate is not the score), and a checkpoint at each (always_save_checkpoint=True),
   kept under its iteration rather than written over ckpt.pt, and without the optimizer
   state, which nothing scores (so nanoGPT writes less than its standard run).
2. This project's recipes (RECIPES, or --recipes): train.py with the recipe's config and
   overrides, the same cadence, a hard link to the weights kept at each checkpoint (the
   run writes every file by renaming a new one into place, so a link is a copy that
   costs nothing).
3. Every kept checkpoint of both, scored after the runs by evaluate.py's own function in
   float32 on the validation text (the file's last 10%, nanoGPT's split): every character
   once, windows of block_size moved by block_size // 2; nats per character.

Wall time counts from the launch of each training process: Python's start, imports, this
project's data preparation and nanoGPT's compilation are in it; nanoGPT's prepare.py, run
once before, is not. The target is the best score of nanoGPT's 5,000-iteration run; each
side's time to the target is that of its first checkpoint at or below it. Each side's
best score within --budget seconds is reported too. This project's runs are stopped when
nanoGPT's time to its best has passed (a slower side is out of the race; at least MIN_CAP
seconds). One run at a time: none shares the device. The JSON file is written again after
each run, so a stop keeps what was done.
--quick: tiny sizes on any device, seconds (a test runs it).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import runpy
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from bench.common import ROOT, save, table

# (No import of this project's model at the top: the nanoGPT child imports nanoGPT's own
# `model` module, which ours would shadow.)

LAUNCHED = "GPU_RACE_LAUNCHED"  # the launch time (time.time()) handed to each training process
TIMES = "times.jsonl"  # one line per kept checkpoint: {"iter": ..., "seconds": ...}
EVERY = 100  # iterations between checkpoints, for both sides
MIN_CAP = 60  # seconds: this project's runs stop once nanoGPT's time to its best, or this, has passed
NANOGPT_CONFIG = "config/train_shakespeare_char.py"
NANOGPT_SETTINGS = [f"--eval_interval={EVERY}", "--eval_iters=1", "--always_save_checkpoint=True"]
OURS = [f"train.eval_interval={EVERY}", "train.eval_iters=1", "train.sample_tokens=0", "train.max_minutes=null",
        "--fresh"]
RECIPES = [  # the candidates, in bench.learning's form (a config, or tiny, then overrides), likeliest first
    # nanoGPT's baby GPT (configs/small.yaml) with the optimizer, average and positions of tiny.yaml
    "configs/small.yaml,train.optimizer=muon,train.muon_lr=0.01,train.ema=0.99,model.pos_encoding=rope,"
    "train.max_iters=2000",
    "tiny,model.dropout=0.1,train.max_iters=2866",  # 30 TFLOPs: 1.4389 nats/char on this file on a CPU
    "configs/small.yaml,train.optimizer=muon,train.muon_lr=0.01,train.ema=0.99,model.pos_encoding=rope,"
    "data.tokenizer=bpe,data.vocab_size=512,train.max_iters=1500",  # the same at tiny.yaml's BPE
]
QUICK_NANOGPT = ["--device=cpu", "--compile=False", "--dtype=float32", "--n_layer=1", "--n_head=2", "--n_embd=32",
                 "--block_size=32", "--batch_size=4", "--max_iters=20", "--lr_decay_iters=20", "--eval_interval=10"]
QUICK_OURS = ["train.device=cpu", "model.n_layer=1", "model.n_head=2", "model.n_embd=32", "model.block_size=32",
              "train.batch_size=4", "train.max_iters=20", "train.eval_interval=10", "train.threads=1"]


# ---- inside the training processes ------------------------------------------------


def record(snapshots: Path, iteration: int) -> None:
    """Note that the checkpoint of `iteration` is kept, and when (seconds since launch)."""
    seconds = time.time() - float(os.environ[LAUNCHED])
    with open(snapshots / TIMES, "a") as f:
        f.write(json.dumps({"iter": iteration, "seconds": seconds}) + "\n")


def run_nanogpt(nanogpt: Path, snapshots: Path, argv: list[str]) -> None:
    """nanoGPT's train.py as `python train.py ARGV` in its folder, each checkpoint it saves
    kept as snapshots/ITER.pt (its weights and model_args) instead of out_dir/ckpt.pt."""
    save = torch.save

    def keep(obj, f, *args, **kwargs):
        if not (isinstance(obj, dict) and "model_args" in obj):
            return save(obj, f, *args, **kwargs)
        save({k: v for k, v in obj.items() if k != "optimizer"}, snapshots / f"{obj['iter_num']:06d}.pt")
        record(snapshots, obj["iter_num"])

    torch.save = keep
    os.chdir(nanogpt)
    sys.path.insert(0, str(nanogpt))  # its model.py, not ours
    sys.argv = ["train.py", *argv]
    runpy.run_path("train.py", run_name="__main__")


def run_ours(snapshots: Path, argv: list[str]) -> int:
    """train.py ARGV, a hard link to the weights it saves kept at each checkpoint, as
    snapshots/ITER/ (config.json, model.safetensors, tokenizer.json: a run folder)."""
    import train
    from runs.folder import RunDir
    from training.trainer import Trainer

    save = Trainer.save

    def save_and_keep(trainer: Trainer) -> None:
        save(trainer)
        if trainer.dist.is_main:
            kept = snapshots / f"{trainer.iteration:06d}"
            kept.mkdir(exist_ok=True)
            for name in RunDir.MODEL_FILES:
                try:
                    os.link(trainer.run_dir.path / name, kept / name)
                except OSError:  # a file system without hard links
                    shutil.copyfile(trainer.run_dir.path / name, kept / name)
            record(snapshots, trainer.iteration)

    Trainer.save = save_and_keep
    return train.main(argv)


# ---- the race ---------------------------------------------------------------------


def run_training(command: list[str], cap: float) -> dict:
    """Run one training process to its end or for `cap` seconds; its wall time and log."""
    env = {**os.environ, LAUNCHED: repr(time.time()), "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    start = time.perf_counter()
    try:
        done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=cap)
        code, log = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as e:
        code, log = f"stopped at the cap of {cap:.0f} s", (e.stdout or b"").decode(errors="replace")
    return {"command": command, "returncode": code, "wall_seconds": time.perf_counter() - start,
            "log_tail": log[-2000:]}


def prepare_nanogpt(source: Path, data: Path, work: Path) -> Path:
    """A copy of nanoGPT's source with the file as its input.txt, split by its prepare.py."""
    folder = work / "nanoGPT"
    shutil.copytree(source, folder, ignore=shutil.ignore_patterns(".git", "out*"))
    prepared = folder / "data" / "shakespeare_char"
    shutil.copyfile(data, prepared / "input.txt")
    subprocess.run([sys.executable, "prepare.py"], cwd=prepared, check=True, capture_output=True)
    return folder


def scores(snapshots: Path, text: str, val: Path, scratch: Path) -> list[dict]:
    """Each kept checkpoint's score on `val`, in order: evaluate.py's rule, in float32."""
    from bench.nanogpt import read_checkpoint, to_run_folder
    from evaluate import evaluate, parse_args

    rows = []
    for line in (snapshots / TIMES).read_text().splitlines() if (snapshots / TIMES).exists() else []:
        row = json.loads(line)
        folder = snapshots / f"{row['iter']:06d}"
        if not folder.is_dir():  # nanoGPT's
            folder = to_run_folder(read_checkpoint(folder.with_suffix(".pt")), text, scratch)
        _, r = evaluate(parse_args(["--checkpoint", str(folder), "--text", str(val), "--batch-size", "32",
                                 "--dtype", "float32"]))
        rows.append({**row, "nats_per_char": r["bits_per_char"] * math.log(2), "bits_per_char": r["bits_per_char"]})
    return rows


def time_to(rows: list[dict], target: float) -> float | None:
    """Seconds to the first checkpoint scoring at most `target` (None: never)."""
    return next((r["seconds"] for r in rows if r["nats_per_char"] <= target), None)


def best_within(rows: list[dict], seconds: float) -> float | None:
    return min((r["nats_per_char"] for r in rows if r["seconds"] <= seconds), default=None)


def cap_for_ours(nanogpt: list[dict], cap: float) -> float:
    """This project's runs stop once nanoGPT's time to its best has passed (at least
    MIN_CAP seconds, at most `cap`): a side slower than that is out of the race."""
    if not nanogpt:
        return cap
    return min(cap, max(MIN_CAP, time_to(nanogpt, min(r["nats_per_char"] for r in nanogpt))))


def summary(payload: dict, budget: float) -> list[list]:
    """One row per side: time to nanoGPT's best score, the ratio, the best within budget."""
    nanogpt = payload["sides"]["nanoGPT"]["scores"]
    target = min(r["nats_per_char"] for r in nanogpt)
    payload["target_nats_per_char"] = target
    rows, theirs = [], time_to(nanogpt, target)
    for name, side in payload["sides"].items():
        seconds = time_to(side["scores"], target)
        side.update({"seconds_to_target": seconds, "best_within_budget": best_within(side["scores"], budget),
                     "speedup": theirs / seconds if seconds else None})
        best = min((r["nats_per_char"] for r in side["scores"]), default=float("nan"))
        rows.append([name, f"{best:.4f}", "-" if seconds is None else f"{seconds:.1f}",
                     "-" if side["speedup"] is None else f"{side['speedup']:.2f}×",
                     "-" if side["best_within_budget"] is None else f"{side['best_within_budget']:.4f}"])
    return rows


def race(args) -> dict:
    from bench.learning import recipe_args

    work = Path(tempfile.mkdtemp(prefix="gpu-race-"))
    text = args.data.read_text(encoding="utf-8")
    val = work / "val.txt"
    val.write_text(text[int(len(text) * 0.9):], encoding="utf-8")  # nanoGPT's split, and our .txt source's
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    payload = {"machine": {"device": device, "torch": torch.__version__, "date": time.strftime("%Y-%m-%d")},
               "data": str(args.data), "every": EVERY, "budget_seconds": args.budget, "sides": {}}
    nanogpt = prepare_nanogpt(args.nanogpt, args.data, work)
    sides = {"nanoGPT": [sys.executable, "-m", "bench.gpu_race", "nanogpt", str(nanogpt), "{snapshots}", "--",
                         NANOGPT_CONFIG, *NANOGPT_SETTINGS, *(QUICK_NANOGPT if args.quick else [])]}
    for i, recipe in enumerate(args.recipes):
        config, overrides = recipe_args(recipe)
        sides[recipe] = [sys.executable, "-m", "bench.gpu_race", "ours", "{snapshots}", "--", "--config", str(config),
                         *OURS, f"data.source={args.data.resolve()}", f"data.cache_dir={work / f'{i}' / 'cache'}",
                         f"out_dir={work / f'{i}' / 'run'}", *overrides, *(QUICK_OURS if args.quick else [])]
    cap = args.cap
    for i, (name, command) in enumerate(sides.items()):
        snapshots = work / f"{i}" / "snapshots"
        snapshots.mkdir(parents=True, exist_ok=True)
        run = run_training([part.replace("{snapshots}", str(snapshots)) for part in command], cap)
        run["scores"] = scores(snapshots, text, val, work / "scratch")
        payload["sides"][name] = run
        print(f"{name}: {len(run['scores'])} checkpoints in {run['wall_seconds']:.0f} s, "
              f"exit {run['returncode']}", flush=True)
        save("gpu_race", payload, args.out)
        if name == "nanoGPT":
            cap = cap_for_ours(run["scores"], args.cap)
    if payload["sides"]["nanoGPT"]["scores"]:
        print(table(["side", "best nats/char", "seconds to nanoGPT's best", "speed-up",
                     f"best within {args.budget:.0f} s"], summary(payload, args.budget)))
    shutil.rmtree(work, ignore_errors=True)
    print(f"wrote {save('gpu_race', payload, args.out)}")
    return payload


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["nanogpt"]:  # inside a training process (race() launches these)
        run_nanogpt(Path(argv[1]), Path(argv[2]), argv[4:])
        return 0
    if argv[:1] == ["ours"]:
        return run_ours(Path(argv[1]), argv[3:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nanogpt", type=Path, required=True, help="a folder of nanoGPT's source")
    parser.add_argument("--data", type=Path, required=True, help="the text file, e.g. tinyshakespeare.txt")
    parser.add_argument("--budget", type=float, default=180.0, help="seconds for the best-within-budget column")
    parser.add_argument("--cap", type=float, default=300.0, help="seconds after which a training run is stopped")
    parser.add_argument("--recipes", nargs="+", default=RECIPES,
                        help="this project's sides, as bench.learning takes them: CONFIG,key=value,...")
    parser.add_argument("--quick", action="store_true", help="tiny sizes, seconds, any device")
    parser.add_argument("--out", help="JSON path (default bench/results/gpu_race.json)")
    race(parser.parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
