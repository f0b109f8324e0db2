"""Faults during training: SIGKILL at many points, inside checkpoint writes too, and a
double Ctrl-C. After every fault each file in the run directory must load, and the
re-run must end with exactly the weights of a run that was never interrupted."""

import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import load_file

from runs.folder import RunDir
from conftest import ROOT, Lines, run_cli
from data.tokenizer import load_tokenizer
from model import GPT

TINY = str(ROOT / "configs" / "tiny.yaml")

# Runs train.py with os.replace patched: once the first checkpoint is complete, the
# process SIGKILLs itself when it is about to put KILL_FILE in place, with the new file
# written in full (KILL_MODE=before-rename) or cut in half (KILL_MODE=partial, as if the
# process died in the middle of writing it).
KILLER = """
import os, signal, sys
sys.path.insert(0, {root!r})
kill_file, mode, state_file = os.environ["KILL_FILE"], os.environ["KILL_MODE"], {state!r}
real_replace, armed = os.replace, [False]

def replace(src, dst):
    if armed[0] and os.path.basename(dst) == kill_file:
        if mode == "partial":
            size = os.path.getsize(src)
            with open(src, "r+b") as f:
                f.truncate(size // 2)
        os.kill(os.getpid(), signal.SIGKILL)
    real_replace(src, dst)
    if os.path.basename(dst) == state_file:
        armed[0] = True

os.replace = replace
import train
sys.exit(train.main(sys.argv[1:]))
"""


def assert_whole(run_dir) -> int:
    """Every file a run directory holds loads; returns the iteration of the resume point."""
    state = torch.load(run_dir / "trainer_state.pt", weights_only=True)
    model = GPT.from_pretrained(run_dir)  # config.json + model.safetensors
    model.load_state_dict(state["model"])
    load_tokenizer(run_dir / "tokenizer.json")
    json.loads((run_dir / "config.json").read_text())
    json.loads((run_dir / "summary.json").read_text())
    return state["iteration"]


def weights(run_dir):
    return load_file(str(run_dir / "model.safetensors"))


def assert_same_weights(a, b):
    a, b = weights(a), weights(b)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def kill_after_a_checkpoint(command: list[str], run_dir, delay: float = 0.0) -> None:
    """Start a training run, wait until it has written a checkpoint of its own, wait
    `delay` seconds more, then SIGKILL it."""
    state = run_dir / "trainer_state.pt"
    before = state.stat().st_mtime_ns if state.exists() else 0
    proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 60
    while time.time() < deadline and proc.poll() is None:
        if state.exists() and state.stat().st_mtime_ns != before:
            break
        time.sleep(0.002)
    time.sleep(delay)
    proc.kill()
    proc.wait()


@pytest.mark.slow
def test_resume_after_sigkill_is_bit_identical(tmp_path, micro):
    """Killed as soon as its first checkpoint exists, with dropout on."""
    settings = ["train.max_iters=150", "train.checkpoint_interval=10", "train.eval_interval=50",
                "model.dropout=0.1"]
    assert run_cli("train.py", "--config", TINY, *micro(*settings, out="straight")).returncode == 0
    interrupted = tmp_path / "interrupted"
    command = [sys.executable, "train.py", "--config", TINY, *micro(*settings, out="interrupted")]
    kill_after_a_checkpoint(command, interrupted)
    assert 10 <= assert_whole(interrupted) < 150
    assert run_cli("train.py", "--config", TINY, *micro(*settings, out="interrupted")).returncode == 0
    assert_same_weights(tmp_path / "straight", interrupted)


@pytest.mark.slow
def test_sigkill_inside_every_checkpoint_write(tmp_path, micro):
    """Killed while writing each file of a checkpoint in turn, whole or half written."""
    n = len(RunDir.checkpoint_files())
    settings = [f"train.max_iters={5 * (n + 2)}", "train.checkpoint_interval=5", "train.eval_interval=15",
                "model.dropout=0.1"]
    assert run_cli("train.py", "--config", TINY, *micro(*settings, out="straight")).returncode == 0
    script = tmp_path / "killer.py"
    script.write_text(KILLER.format(root=str(ROOT), state=RunDir.STATE))
    run_dir = tmp_path / "killed"
    resumed_from = []
    for i, name in enumerate(RunDir.checkpoint_files()):
        env = {**os.environ, "KILL_FILE": name, "KILL_MODE": "partial" if i % 2 == 0 else "before-rename"}
        out = subprocess.run([sys.executable, str(script), "--config", TINY, *micro(*settings, out="killed")],
                             cwd=ROOT, capture_output=True, text=True, env=env, timeout=120)
        assert out.returncode == -signal.SIGKILL, out.stderr
        resumed_from.append(assert_whole(run_dir))
    # each run completed one checkpoint and died in the next, at the i-th file: the
    # resume point moves on by one checkpoint each time, whichever file was cut
    assert resumed_from == [5 * (i + 1) for i in range(n)]
    assert run_cli("train.py", "--config", TINY, *micro(*settings, out="killed")).returncode == 0
    assert_same_weights(tmp_path / "straight", run_dir)


@pytest.mark.slow
def test_sigkill_at_random_moments(tmp_path, micro):
    """A checkpoint every iteration, so many kills land in the middle of a save."""
    settings = ["train.max_iters=60", "train.checkpoint_interval=1", "train.eval_interval=30",
                "model.dropout=0.1"]
    assert run_cli("train.py", "--config", TINY, *micro(*settings, out="straight")).returncode == 0
    run_dir = tmp_path / "killed"
    command = [sys.executable, "train.py", "--config", TINY, *micro(*settings, out="killed")]
    delays = random.Random(0)
    points = []
    for _ in range(5):
        kill_after_a_checkpoint(command, run_dir, delays.uniform(0, 0.3))
        points.append(assert_whole(run_dir))
        if points[-1] >= 60:
            break
    assert len(set(points)) >= 3 and points == sorted(points)  # the kills came at different points
    assert run_cli("train.py", "--config", TINY, *micro(*settings, out="killed")).returncode == 0
    assert_whole(run_dir)
    assert_same_weights(tmp_path / "straight", run_dir)


@pytest.mark.slow
def test_second_ctrl_c_exits_at_once_and_files_stay_whole(tmp_path, micro):
    run_dir = tmp_path / "run"
    # a model large enough that one iteration takes a while, so the second Ctrl-C
    # arrives while the first is still waiting for the iteration to end
    settings = ["model.n_layer=4", "model.n_embd=256", "model.n_head=4", "model.block_size=128",
                "train.batch_size=64", "train.checkpoint_interval=1", "train.eval_interval=100000"]
    proc = subprocess.Popen([sys.executable, "train.py", "--config", TINY, *micro(*settings, "train.max_iters=100000")],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while not (run_dir / "trainer_state.pt").exists() and time.time() < deadline:
        time.sleep(0.01)
    stderr = Lines(proc.stderr)
    try:
        proc.send_signal(signal.SIGINT)
        stderr.wait_for("stopping after this iteration")  # the first Ctrl-C was handled
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=30)
    finally:
        proc.kill()
    out, err = proc.stdout.read(), stderr.rest()
    assert code == 130, err
    assert "checkpoint saved" not in out and "Traceback" not in err  # it left at once, without saving
    done = assert_whole(run_dir)
    assert done > 0
    # the run continues from there
    out = run_cli("train.py", "--config", TINY, *micro(*settings, f"train.max_iters={done + 1}"))
    assert out.returncode == 0, out.stderr
    assert assert_whole(run_dir) == done + 1


@pytest.mark.skipif(sys.platform == "win32", reason="SIGTERM is a POSIX signal")
@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_while_the_data_is_prepared_cleans_up_as_ctrl_c_does(tmp_path, stop):
    """Ctrl-C and SIGTERM alike, while the token files are being written: one line, exit 130
    or 143, no run folder left (the run made it), no half-built token folder in the cache."""
    text = tmp_path / "big.txt"
    text.write_text("".join(f"line {i}: the quick brown fox jumps over the lazy dog, again and again\n"
                            for i in range(150_000)))
    cache = tmp_path / "cache"
    proc = subprocess.Popen([sys.executable, "train.py", "--config", TINY, f"data.source={text}", "data.tokenizer=bpe",
                             "data.vocab_size=300", f"data.cache_dir={cache}", f"out_dir={tmp_path / 'run'}"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stderr = Lines(proc.stderr)
    try:
        stderr.wait_for("tokenizing")  # (the tokenizer is trained: the token files are being written)
        proc.send_signal(stop)
        code = proc.wait(timeout=60)
    finally:
        proc.kill()
    err = stderr.rest()
    assert code == 128 + stop and "Traceback" not in err, err
    assert ("terminated" if stop == signal.SIGTERM else "interrupted") in err
    assert not (tmp_path / "run").exists()
    assert not [p for p in cache.rglob("*") if ".tmp-" in p.name or p.suffix == ".lock"]
