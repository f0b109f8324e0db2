"""train.py end to end on a micro model: run directory, TensorBoard, resume, faults, DDP."""

import json
import math
import os
import re
import signal
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file

import train
from runs.folder import RunDir
from conftest import ROOT, Lines, run_cli
from model import GPT
from training.config import ConfigError, TrainConfig, load_config
from training.optim import make_optimizers
from training.trained import AllWeights

TINY = str(ROOT / "configs" / "tiny.yaml")


def scalars(run_dir, tag):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    return {e.step: e.value for e in events.Scalars(tag)}


def test_end_to_end_micro_run(tmp_path, micro, capsys):
    assert train.main(["--config", TINY, *micro()]) == 0
    run = tmp_path / "run"
    names = {p.name for p in run.iterdir()}
    assert {"model.safetensors", "config.json", "tokenizer.json", "config.yaml", "trainer_state.pt"} <= names
    assert any(n.startswith("events.out.tfevents") for n in names)
    assert not any(".tmp" in n for n in names)
    out = capsys.readouterr().out
    assert "done: 30 iterations" in out and "python generate.py --checkpoint" in out
    assert "| cpu, float32, 1 threads, 1 process(es)" in out  # the header: where and how it trains
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run), size_guidance={"scalars": 0, "tensors": 0, "images": 0})
    events.Reload()
    # attention maps of both layers at every evaluation, heads side by side
    for layer in (0, 1):
        images = events.Images(f"attention/layer_{layer}")
        assert [i.step for i in images] == [0, 10, 20, 30]  # the snapshots' steps (every 10) and the evaluations
        # 2 heads in a row, 32 tokens each scaled up 3× (cells of 96 pixels), 2-pixel gaps
        assert (images[-1].width, images[-1].height) == (2 * 98 + 2, 98 + 2)
    assert "attention/text/text_summary" in events.Tags()["tensors"]
    tags = set(events.Tags()["scalars"])
    for tag in ("train/loss", "val/loss", "val/perplexity", "train/lr", "train/grad_norm",
                "train/tokens_per_sec", "train/mfu", "val/bits_per_char", "train/threads"):
        assert tag in tags, tag
    assert {e.value for e in events.Scalars("train/threads")} == {1}  # (micro: train.threads=1)
    assert {"samples/text_summary", "config/text_summary"} <= set(events.Tags()["tensors"])
    val = scalars(run, "val/loss")
    assert sorted(val) == [10, 20, 30] and val[30] < val[10] < math.log(70)
    resolved = (run / "config.yaml").read_text()
    assert "n_embd: 32" in resolved and "max_iters: 30" in resolved
    state = torch.load(run / "trainer_state.pt", weights_only=True)
    assert state["iteration"] == 30
    assert state["best_val_loss"] == pytest.approx(min(val.values()), rel=1e-6)  # TensorBoard logs float32
    summary = json.loads((run / "summary.json").read_text())  # what an export's model card reports
    assert summary["iteration"] == 30 and summary["val_loss"] == pytest.approx(val[30], rel=1e-6)
    assert summary["val_bits_per_char"] == pytest.approx(scalars(run, "val/bits_per_char")[30], rel=1e-6)
    assert summary["best_val_loss"] == pytest.approx(min(val.values()), rel=1e-6) and summary["prompt"] == "ROMEO:"


def test_rerun_of_finished_run_exits_at_once(tmp_path, micro, capsys):
    assert train.main(["--config", TINY, *micro("train.max_iters=10")]) == 0
    before = (tmp_path / "run" / "model.safetensors").read_bytes()
    capsys.readouterr()
    assert train.main(["--config", TINY, *micro("train.max_iters=10")]) == 0
    assert (f"{tmp_path / 'run'} already holds a finished run of 10 iterations; add --fresh to start over "
            "or raise train.max_iters to continue\n") in capsys.readouterr().out
    assert (tmp_path / "run" / "model.safetensors").read_bytes() == before
    # raising max_iters continues the same run
    assert train.main(["--config", TINY, *micro("train.max_iters=20")]) == 0
    assert sorted(scalars(tmp_path / "run", "val/loss")) == [10, 20]


def test_changed_model_refuses_to_resume_and_fresh_starts_over(tmp_path, micro, capsys):
    assert train.main(["--config", TINY, *micro("train.max_iters=10")]) == 0
    assert train.main(["--config", TINY, *micro("train.max_iters=20", "model.n_layer=1")]) == 2
    err = capsys.readouterr().err
    assert "different setup (model.n_layer: checkpoint 2, requested 1)" in err and "--fresh" in err
    old_curves = sorted((tmp_path / "run").glob("events.out.tfevents.*"))
    assert train.main(["--config", TINY, "--fresh", *micro("train.max_iters=10", "model.n_layer=1")]) == 0
    assert json.loads((tmp_path / "run" / "config.json").read_text())["n_layer"] == 1
    curves = sorted((tmp_path / "run").glob("events.out.tfevents.*"))
    assert old_curves and len(curves) == 1 and curves[0] not in old_curves  # the old run's curves are gone
    assert train.main(["--config", TINY, "--fresh", *micro("train.max_iters=2", out="new")]) == 0  # nothing to forget


def weights(run_dir):
    return load_file(str(run_dir / "model.safetensors"))


@pytest.mark.slow
@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signal_saves_and_exits(tmp_path, micro, sig, code):
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "train.py", "--config", TINY,
                             *micro("train.max_iters=100000", "train.checkpoint_interval=100000")],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = Lines(proc.stdout), Lines(proc.stderr)
    try:
        out.wait_for("model: ")  # the header: the loop has begun, its signal handlers are in place
        proc.send_signal(sig)
        assert proc.wait(timeout=60) == code, err.rest()
    finally:
        proc.kill()
    assert "checkpoint saved" in out.rest()
    state = torch.load(run_dir / "trainer_state.pt", weights_only=True)
    assert 0 < state["iteration"] < 100000


@pytest.mark.parametrize("good_steps", [3, 0])  # 0: the first step read in an interval is the bad one
def test_non_finite_loss_stops_and_keeps_last_checkpoint(tmp_path, micro, monkeypatch, capsys, good_steps):
    assert train.main(["--config", TINY, *micro("train.max_iters=10")]) == 0
    before = {p.name: p.read_bytes() for p in (tmp_path / "run").iterdir() if p.is_file() and "events" not in p.name}
    real_forward = GPT.forward
    calls = {"n": 0}

    def poisoned(self, idx, targets=None, **kw):
        logits, loss = real_forward(self, idx, targets, **kw)
        calls["n"] += 1
        if self.training and calls["n"] > good_steps:
            loss = loss * float("nan")
        return logits, loss

    monkeypatch.setattr(GPT, "forward", poisoned)
    assert train.main(["--config", TINY, *micro("train.max_iters=20", "train.eval_interval=100")]) == 1
    err = capsys.readouterr().err
    assert "loss became nan" in err and f"iteration {11 + good_steps}" in err and "last good checkpoint" in err
    assert err.endswith(". Try a lower train.lr, train.grad_clip=1.0 or train.dtype=float32\n")
    after = {p.name: p.read_bytes() for p in (tmp_path / "run").iterdir() if p.is_file() and "events" not in p.name}
    assert {k: v for k, v in after.items() if k != "config.yaml"} == {k: v for k, v in before.items() if k != "config.yaml"}


def test_weight_decay_skips_norms_biases_embeddings():
    from model import GPTConfig

    model = GPT(GPTConfig(vocab_size=20, block_size=8, n_layer=1, n_head=2, n_embd=16))
    opt = make_optimizers(AllWeights(model).groups(), TrainConfig(beta2=0.95), torch.device("cpu"))[-1]  # AdamW alone
    assert opt.defaults["betas"] == (0.9, 0.95)  # the run's betas (torch's default beta2 is 0.999)
    decayed = {id(p) for g in opt.param_groups if g["weight_decay"] > 0 for p in g["params"]}
    names = {n for n, p in model.named_parameters() if id(p) in decayed}
    assert names == {"transformer.h.0.attn.c_attn.weight", "transformer.h.0.attn.c_proj.weight",
                     "transformer.h.0.mlp.c_fc.weight", "transformer.h.0.mlp.c_proj.weight"}


@pytest.mark.parametrize("text, overrides, message", [
    ("model:\n  n_layer: 2\n", ["train.lrr=1"], "unknown key train.lrr; did you mean 'lr'"),
    ("model:\n  n_layers: 2\n", [], "unknown key model.n_layers; did you mean 'n_layer'"),
    ("train:\n  lr: -1\n", [], "train.lr=-1.0: must be positive"),
    ("train:\n  max_iters: ten\n", [], "train.max_iters='ten': must be an integer"),
    ("model:\n  n_embd: 30\n  n_head: 4\n", [], "model.n_embd=30 is not divisible by n_head=4"),
    ("model: [1, 2\n", [], "not valid YAML at line 2, column 1: expected ',' or ']', but got '<stream end>'"),
    ("model:\n  n_layer: 2\x07\n", [], "not valid YAML: unacceptable character #x0007: special characters are not allowed"),
    ("train: 5\n", [], "train: must be a mapping of keys to values, not 5"),
    ("train: 5\n", ["train.lr=1"], "bad.yaml: section train: must be a mapping"),
    ("", [], "is empty"),
    ("- a\n- b\n", [], "must be a mapping"),
    ("modle:\n  n_layer: 2\n", [], "unknown key 'modle'; did you mean 'model'"),
    ("model:\n  vocab_size: 10\n", [], "model.vocab_size is set from the tokenizer"),
    ("{}", ["train.max_iters"], "must look like section.key=value"),
    ("{}", ["trian.lr=1"], "unknown section 'trian'; did you mean 'train'"),
])
def test_config_errors_name_key_value_and_file(tmp_path, text, overrides, message):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("[", r"\[")) as e:
        load_config(path, overrides)
    assert str(path) in str(e.value) or "override" in str(e.value)


# every rule of TrainConfig at its edge: the values just outside it, with the message
# each gets, and the value at the edge, which is allowed
TRAIN_LIMITS = [
    ("max_iters", [0], 1, "must be at least 1"),
    ("max_minutes", [0.0], 0.01, "must be positive (or unset)"),
    ("batch_size", [0], 1, "must be at least 1"),
    ("grad_accum", [0], 1, "must be at least 1"),
    ("optimizer", ["sgd"], "muon", "must be one of adamw, muon"),
    ("lr", [0.0], 1e-4, "must be positive, e.g. 1e-3"),
    ("muon_lr", [0.0], 1e-6, "must be positive, e.g. 0.02"),
    ("muon_momentum", [-0.01, 1.0], 0.0, "must be in [0, 1)"),
    ("muon_momentum_warmup", [-1], 0, "must be 0 (none) or more"),
    ("min_lr", [-1e-9, 0.0011], 0.0, "must be between 0 and train.lr"),
    ("warmup_iters", [-1], 0, "must be 0 or more"),
    ("lr_schedule", ["linear"], "wsd", "must be one of cosine, wsd"),
    ("cooldown", [0.0, 1.01], 1.0, "must be in (0, 1], e.g. 0.4"),
    ("lr_decay_iters", [0], 1, "must be at least 1 (or unset: max_iters)"),
    ("weight_decay", [-0.1], 0.0, "must be 0 or more"),
    ("beta1", [-0.1, 1.0], 0.0, "must be in [0, 1)"),
    ("beta2", [-0.1, 1.0], 0.0, "must be in [0, 1)"),
    ("ema", [-0.1, 1.0], 0.0, "must be in [0, 1), e.g. 0.99 (0: off)"),
    ("grad_clip", [-1.0], 0.0, "must be 0 (off) or more"),
    ("eval_interval", [0], 1, "must be at least 1"),
    ("eval_iters", [0], 1, "must be at least 1"),
    ("eval_windows", [0], 1, "must be at least 1 (or unset)"),
    ("checkpoint_interval", [0], 1, "must be at least 1 (or unset)"),
    ("log_interval", [0], 1, "must be at least 1"),
    ("sample_tokens", [-1], 0, "must be 0 or more"),
    ("dtype", ["fp8"], "float16", "must be one of auto, float32, bfloat16, float16"),
    ("threads", [-1], 0, "must be 0 (torch's default) or more"),
]


@pytest.mark.parametrize("key, bad_values, edge, message", TRAIN_LIMITS, ids=[t[0] for t in TRAIN_LIMITS])
def test_every_train_setting_is_checked_at_its_edge(key, bad_values, edge, message):
    extra = {"lr": 1e-3} if key == "min_lr" else {}
    for bad in bad_values:
        with pytest.raises(ValueError) as e:
            TrainConfig(**extra, **{key: bad})
        assert str(e.value) == f"train.{key}={bad!r}: {message}"
    assert getattr(TrainConfig(**extra, **{key: edge}), key) == edge


def test_overrides_are_typed_as_yaml_and_out_dir_defaults_to_stem(tmp_path):
    path = tmp_path / "exp.yaml"
    path.write_text("train:\n  lr: 1.0e-3\n")
    cfg = load_config(path, ["train.max_iters=7", "model.bias=false", "data.source=my.txt", "train.lr=3e-4"])
    assert cfg.train.max_iters == 7 and cfg.model.bias is False and cfg.train.lr == 3e-4
    assert cfg.data.source == "my.txt" and cfg.out_dir == "out/exp"


def test_cli_bad_input_is_one_line_exit_2(tmp_path, micro):
    result = run_cli("train.py", "--config", str(tmp_path / "missing.yaml"))
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert "does not exist" in result.stderr
    result = run_cli("train.py", "--config", TINY, *micro("train.device=cuda:7" if torch.cuda.is_available()
                                                           else "train.device=cuda"))
    assert result.returncode == 2 and "CUDA" in result.stderr and result.stderr.count("\n") == 1
    assert not (tmp_path / "run" / "trainer_state.pt").exists()


def test_a_refused_run_leaves_no_folder_behind_and_keeps_one_it_did_not_make(tmp_path, micro, capsys):
    """A missing data source is refused after the run folder was claimed (and locked): the
    folder it made goes again; a folder that was there before stays, with what it held."""
    missing = [f"data.source={tmp_path / 'missing.txt'}"]
    assert train.main(["--config", TINY, *micro(*missing)]) == 2
    assert not (tmp_path / "run").exists()
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("kept")
    assert train.main(["--config", TINY, *micro(*missing, out="mine")]) == 2
    assert (tmp_path / "mine" / "notes.txt").read_text() == "kept"
    assert "does not exist" in capsys.readouterr().err


def test_a_text_too_short_for_one_window_leaves_no_token_files(tmp_path, micro, capsys):
    """Two characters: the token files are made, then no window of block_size + 1 tokens
    fits; the run is refused in one line and the cache keeps nothing of it (files an
    earlier run made are kept)."""
    short = tmp_path / "short.txt"
    short.write_text("ab")
    cache = tmp_path.parent / "token-cache"  # (micro's)
    before = set(cache.iterdir()) if cache.exists() else set()
    assert train.main(["--config", TINY, *micro(f"data.source={short}")]) == 2
    assert "fewer than block_size + 1" in capsys.readouterr().err
    assert set(cache.iterdir()) == before and not (tmp_path / "run").exists()


def test_second_run_into_same_out_dir_is_refused(tmp_path, micro):
    from runs.folder import RunDir

    (tmp_path / "run").mkdir()
    lock = RunDir(tmp_path / "run").lock()
    assert lock.acquire()
    try:
        result = run_cli("train.py", "--config", TINY, *micro())
        assert result.returncode == 2 and "is in use by another training run" in result.stderr
    finally:
        lock.release()


def test_lock_is_released_when_its_holder_is_killed(tmp_path):
    from runs.folder import RunDir

    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; sys.path.insert(0, sys.argv[1]); "
                               "from runs.folder import RunDir; "
                               "lock = RunDir(sys.argv[2]).lock(); assert lock.acquire(); print('locked', flush=True); "
                               "time.sleep(60)", str(ROOT), str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "locked\n"
        lock = RunDir(tmp_path).lock()
        assert not lock.acquire() and lock.holder() == str(holder.pid)
    finally:
        holder.kill()
        holder.wait()
    assert lock.acquire()  # SIGKILL released it
    lock.release()


@pytest.mark.slow
@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_ddp_two_processes_matches_one_process_global_batch(tmp_path, micro, optimizer):
    common = ["train.max_iters=3", "train.log_interval=1", "train.eval_interval=3", "train.sample_tokens=0",
              f"train.optimizer={optimizer}"]
    single = run_cli("train.py", "--config", TINY, *micro(*common, "train.batch_size=8", out="single"))
    assert single.returncode == 0, single.stderr
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    ddp = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                          "train.py", "--config", TINY, *micro(*common, "train.batch_size=4", out="ddp")],
                         cwd=ROOT, capture_output=True, text=True, timeout=180, env=env)
    assert ddp.returncode == 0, ddp.stderr[-2000:]
    assert "2 process(es)" in ddp.stdout
    a, b = scalars(tmp_path / "single", "train/loss"), scalars(tmp_path / "ddp", "train/loss")
    assert a[1] == pytest.approx(b[1], abs=1e-5)
    assert a[3] == pytest.approx(b[3], abs=1e-4)
    # the same validation windows, split over the two processes: the same figure
    assert scalars(tmp_path / "single", "val/loss")[3] == pytest.approx(scalars(tmp_path / "ddp", "val/loss")[3], abs=1e-5)
    wa, wb = weights(tmp_path / "single"), weights(tmp_path / "ddp")
    # the two ways of averaging gradients differ in the last bits: 1.2e-7 at most after 3
    # steps, with AdamW and with Muon (whose Newton-Schulz runs in the weights' float32)
    assert all(torch.allclose(wa[k], wb[k], atol=1e-6) for k in wa)


@pytest.mark.parametrize("largest, what", [(200_000, "checkpoint of iteration 20"), (100_000, "snapshot of step 20")])
def test_disk_full_while_saving_keeps_the_previous_checkpoint(tmp_path, micro, monkeypatch, capsys, largest, what):
    """The disk fills up while the trainer state (the largest file) or a snapshot of the
    model (the next largest) is written: the run stops with exit code 1, the previous
    checkpoint whole, and resumes once there is room."""
    import errno

    from storage import atomic as files

    assert train.main(["--config", TINY, *micro("train.max_iters=10")]) == 0
    run = tmp_path / "run"
    before = (run / "trainer_state.pt").read_bytes()
    real_fsync = files.os.fsync

    def full_disk(fd):
        if os.fstat(fd).st_size > largest:
            raise OSError(errno.ENOSPC, "No space left on device")
        real_fsync(fd)

    monkeypatch.setattr(files.os, "fsync", full_disk)
    assert train.main(["--config", TINY, *micro("train.max_iters=20")]) == 1
    err = capsys.readouterr().err
    assert f"could not write the {what} in {run} (No space left on device)" in err
    assert "previous checkpoint is kept" in err and sum(line.startswith("error: ") for line in err.splitlines()) == 1
    fix = " (or set train.snapshots=0)" if "snapshot" in what else ""
    assert err.endswith(f"Free some space{fix} and run the same command to continue\n")
    assert (run / "trainer_state.pt").read_bytes() == before
    assert not list(run.glob("*.tmp*")) and not list(run.glob("snapshots/*.tmp*"))
    monkeypatch.setattr(files.os, "fsync", real_fsync)
    assert train.main(["--config", TINY, *micro("train.max_iters=20")]) == 0  # and it resumes


def test_a_device_that_is_no_device_is_named():
    from cli.program import UserError
    from machine.device import resolve_device

    with pytest.raises(UserError, match="device='gpu0' is not a device; use auto, cpu, cuda, cuda:N or mps"):
        resolve_device("gpu0")
    assert resolve_device("cpu:0") == torch.device("cpu:0")  # an index is checked against CUDA's devices only


@pytest.mark.parametrize("amx, avx512_bf16, fast", [(True, False, True), (False, True, True), (False, False, False)])
def test_auto_dtype_on_the_cpu_follows_its_bf16_units(monkeypatch, amx, avx512_bf16, fast):
    """bfloat16 autocast for training where the CPU has AMX or AVX512-BF16 (either one), float32
    elsewhere, and float32 for decoding in any case."""
    from machine.device import cpu_has_fast_bf16, resolve_dtype

    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
    cpu = torch.device("cpu")
    assert cpu_has_fast_bf16() == fast
    assert resolve_dtype("auto", cpu, training=True) == (torch.bfloat16 if fast else torch.float32)
    assert resolve_dtype("auto", cpu, training=False) == torch.float32


@pytest.mark.parametrize("bf16", [True, False])
def test_auto_dtype_on_a_gpu_and_the_dtypes_refused(monkeypatch, bf16):
    """On a GPU, bfloat16 where it has it, else float16 for training (with a gradient
    scaler) and float32 for decoding; a name that is no dtype, and float16 on the CPU, are
    refused by name. (No GPU is needed: the checks are on the device's kind.)"""
    from cli.program import UserError
    from machine.device import resolve_dtype

    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: bf16)
    cuda = torch.device("cuda")
    assert resolve_dtype("auto", cuda, training=True) == (torch.bfloat16 if bf16 else torch.float16)
    assert resolve_dtype("auto", cuda, training=False) == (torch.bfloat16 if bf16 else torch.float32)
    with pytest.raises(UserError) as e:
        resolve_dtype("fp8", cuda, training=True)
    assert str(e.value) == "dtype='fp8': must be one of auto, float32, bfloat16, float16"
    with pytest.raises(UserError, match="^dtype=float16 is for GPUs; on the CPU use bfloat16 or float32$"):
        resolve_dtype("float16", torch.device("cpu"), training=True)


def test_a_device_index_is_checked_against_the_gpus_there_are(monkeypatch):
    from cli.program import UserError
    from machine.device import resolve_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert resolve_device("cuda:0") == torch.device("cuda:0")
    with pytest.raises(UserError) as e:
        resolve_device("cuda:1")
    assert str(e.value) == "device='cuda:1' but this machine has 1 CUDA device(s)"
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    assert resolve_device("mps") == torch.device("mps")  # Apple's GPUs


def test_a_terminal_shows_a_progress_bar_to_max_iters(micro, monkeypatch, capsys):
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    assert train.main(["--config", TINY, *micro("train.max_iters=12", "train.sample_tokens=0")]) == 0
    err = capsys.readouterr().err
    assert re.search(r"12/12 \[[^]]*loss=\d\.\d{4}, lr=\d\.\d\de-\d\d, tok_s=[\d,]+\]", err), err


def test_hyperparameters_reach_tensorboard_with_their_types(tmp_path):
    """The HParams tab can sort and filter by a number only if it arrives as one."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    from training.logger import RunLogger

    logger = RunLogger(RunDir(tmp_path), True, 0, 10, 5)
    logger.hparams({"out_dir": "out/x", "train": {"lr": 0.002, "max_iters": 30, "dtype": "auto",
                                                  "init_from": None}}, {"val/loss": 1.5})
    logger.close()
    events = EventAccumulator(str(tmp_path))
    events.Reload()
    content = events.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    hparams = plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info.hparams
    assert {name: value.WhichOneof("kind") for name, value in hparams.items()} == {
        "train.lr": "number_value", "train.max_iters": "number_value", "train.dtype": "string_value",
        "train.init_from": "string_value"}
    assert hparams["train.lr"].number_value == 0.002 and hparams["train.init_from"].string_value == "None"


def test_log_lines_reach_a_pipe_at_once_and_text_keeps_its_layout(tmp_path, monkeypatch):
    """Without a terminal (nohup, | tee) each line is flushed as it is written, so a log
    file shows the run as it goes; TensorBoard's text tab gets a fenced block, which keeps
    the line breaks and spaces of a sample."""
    import io

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from training.logger import RunLogger

    class Pipe(io.StringIO):
        def flush(self):
            flushed.append(self.getvalue())

    flushed = []
    monkeypatch.setattr(sys, "stdout", Pipe())
    logger = RunLogger(RunDir(tmp_path), True, 0, 10, 5)
    logger.message("model: ...")
    logger.progress(5, 2.5, 1e-3, 1234.0)
    logger.text("samples", "ROMEO:\n  But soft", 5)
    logger.close()
    assert flushed[:2] == ["model: ...\n", "model: ...\niter 5 | loss 2.5000 | lr 1.00e-03 | 1,234 tok/s\n"]
    events = EventAccumulator(str(tmp_path), size_guidance={"tensors": 0})
    events.Reload()
    sample = events.Tensors("samples/text_summary")[0]
    assert sample.tensor_proto.string_val == [b"```\nROMEO:\n  But soft\n```"] and sample.step == 5


def test_the_peak_is_measured_on_square_matrices_in_the_dtype_asked_for(monkeypatch):
    """MFU's denominator: what the machine does with size × size matrices in this dtype
    (the FLOP/s themselves are a speed, measured in bench/, never asserted)."""
    from machine.device import measure_peak_flops

    made, real_randn = [], torch.randn
    monkeypatch.setattr(torch, "randn", lambda *shape, **kw: (made.append((shape, kw["dtype"], kw.get("device"))),
                                                              real_randn(*shape, **kw))[1])
    cpu = torch.device("cpu")
    rng = torch.get_rng_state()
    assert measure_peak_flops(cpu, torch.bfloat16, size=64, seconds=0) > 0  # one round at least, however short
    assert torch.equal(torch.get_rng_state(), rng)  # its own generator: a run's dropout masks stay as seeded
    assert made == [((64, 64), torch.bfloat16, cpu)] * 2
    # rounds of 4 products until `seconds` have passed, on a clock that moves 1 s a reading:
    # started at 0, 4 products, 1 s < 1.5 s, 4 more, 2 s: done at 3 s
    clock = iter(range(100))
    monkeypatch.setattr(sys.modules["machine.device"], "time", SimpleNamespace(perf_counter=lambda: next(clock)))
    assert measure_peak_flops(cpu, torch.float32, size=64, seconds=1.5) == 2 * 64**3 * 8 / 3


def test_the_trainer_measures_the_peak_once_per_process_and_setting(monkeypatch):
    """Each trainer start used to spend 1.5 s on 2048² products at 1 thread; a process that
    trains several runs (tests, bench.learning) measures each device, dtype and thread count once."""
    from machine import device

    calls = []
    monkeypatch.setattr(device, "measure_peak_flops", lambda dev, dtype, size: calls.append((dev.type, dtype, size)) or 1e9)
    device.peak_flops.cache_clear()
    cpu = torch.device("cpu")
    assert device.peak_flops(cpu, torch.float32, 1) == device.peak_flops(cpu, torch.float32, 1) == 1e9
    device.peak_flops(cpu, torch.float32, 2)
    device.peak_flops(cpu, torch.bfloat16, 2)
    device.peak_flops(torch.device("cuda"), torch.bfloat16, 2)  # not run: the measurement is replaced
    assert calls == [("cpu", torch.float32, 1024), ("cpu", torch.float32, 1024), ("cpu", torch.bfloat16, 1024),
                     ("cuda", torch.bfloat16, 8192)]
    device.peak_flops.cache_clear()  # the other tests measure for real


def test_autocast_runs_the_matmuls_in_the_dtype_asked_for():
    from machine.device import autocast

    a = torch.ones(2, 2)
    for dtype in (torch.bfloat16, torch.float16):  # (float16 on a CPU only to show it is passed on)
        with autocast(torch.device("cpu"), dtype):
            assert (a @ a).dtype == dtype
    with autocast(torch.device("cpu"), torch.float32):
        assert (a @ a).dtype == torch.float32
