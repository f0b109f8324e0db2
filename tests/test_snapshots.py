"""Watching a model form: snapshots on an even grid of steps that thins itself (training/snapshots.py),
and each head's previous-token and induction scores (inspection/head_scores.py), in the
run folder and in TensorBoard."""

import math
import signal

import pytest
import torch
from safetensors.torch import load_file

import train
from runs.folder import RunDir
from conftest import ROOT, make_trainer
from inspection.head_scores import (current_token_scores, head_scores, induction_probe, induction_scores,
                                    induction_targets, previous_token_scores, uniform_scores)
from model import GPT, GPTConfig
from training.snapshots import Snapshots, spacing

TINY = str(ROOT / "configs" / "tiny.yaml")


def kept_by(last: int, every: int, limit: int) -> list[int]:
    """The steps a run of `last` steps keeps, by the rule alone: each due step saved, the
    grid thinned after each save."""
    kept = []
    for step in range(last + 1):
        if step == 0 or step == last or step % spacing(step, every, limit) == 0:
            kept = [k for k in kept if k == 0 or k % spacing(step, every, limit) == 0] + [step]
    return kept


def test_the_grid_thins_itself_and_depends_on_the_step_reached_alone():
    assert kept_by(100, 10, 16) == list(range(0, 101, 10))  # room for all: every 10
    assert kept_by(1800, 10, 16) == [0, *range(160, 1800, 160), 1800]  # the quick start's length: evenly spread
    assert all(len(kept_by(last, 3, 5)) <= 5 for last in range(1, 300)) and len(kept_by(5000, 25, 64)) <= 64
    assert kept_by(1000, 25, 64) == list(range(0, 1001, 25))  # the induction lesson: every 25 steps
    for longer in (1300, 1800, 5000):  # where the run will end changes nothing about the steps kept so far
        before = [k for k in kept_by(longer, 10, 16) if k < 1000]
        assert set(before) <= set(kept_by(999, 10, 16))
    assert spacing(1, 10, 16) == spacing(150, 10, 16) == 10 and spacing(151, 10, 16) == spacing(300, 10, 16) == 20


def snapshot_steps(run) -> list[int]:
    return list(RunDir(run).snapshot_paths())


def test_a_run_keeps_its_model_at_the_scheduled_steps_and_its_last(tmp_path, micro):
    """Step 0 is the model the run started from, parameter for parameter; the last is the
    saved model, byte for byte; with train.ema each is the average the run evaluates."""
    assert train.main(["--config", TINY, *micro("train.max_iters=30", "train.ema=0.9", "train.snapshots=16",
                                                "train.snapshot_every=5")]) == 0
    run = tmp_path / "run"
    assert snapshot_steps(run) == [0, 5, 10, 15, 20, 25, 30]
    paths = RunDir(run).snapshot_paths()
    assert paths[30].read_bytes() == (run / "model.safetensors").read_bytes()
    model, _ = RunDir(run).load_model()
    initial = GPT.initialised(model.config, 1337).state_dict()
    first = RunDir(run).load_snapshot(0, model).state_dict()
    assert all(torch.equal(initial[name], first[name]) for name in initial)
    assert not torch.equal(load_file(paths[5])["lm_head.weight"], load_file(paths[0])["lm_head.weight"])


def test_a_run_from_other_weights_starts_its_snapshots_with_them(tmp_path, micro):
    assert train.main(["--config", TINY, *micro("train.max_iters=4", "train.snapshots=16", out="base")]) == 0
    assert train.main(["--config", TINY, *micro("train.max_iters=3", "train.snapshots=16",
                                                f"train.init_from={tmp_path / 'base'}", out="tuned")]) == 0
    base = load_file(tmp_path / "base" / "model.safetensors")
    start = load_file(RunDir(tmp_path / "tuned").snapshot_paths()[0])
    assert base.keys() == start.keys() and all(torch.equal(base[name], start[name]) for name in base)


def test_a_cap_thins_the_grid_and_keeps_the_first_step_and_the_last(tmp_path, micro):
    settings = ("train.max_iters=30", "train.snapshots=4", "train.snapshot_every=5")
    assert train.main(["--config", TINY, *micro(*settings)]) == 0
    assert snapshot_steps(tmp_path / "run") == [0, 10, 20, 30] == kept_by(30, 5, 4)
    assert train.main(["--config", TINY, *micro("train.max_iters=30", "train.snapshots=0", out="none")]) == 0
    assert snapshot_steps(tmp_path / "none") == []


def test_by_default_only_small_models_keep_snapshots(tmp_path):
    run = RunDir(tmp_path)
    small = GPT(GPTConfig(vocab_size=100, block_size=16, n_layer=1, n_head=2, n_embd=32))
    with torch.device("meta"):
        large = GPT(GPTConfig(vocab_size=50_000, block_size=64, n_layer=2, n_head=2, n_embd=128))  # 6.7 M
    middling = GPT(GPTConfig(vocab_size=512, block_size=64, n_layer=4, n_head=4, n_embd=128))  # the quick start's size
    limits = [Snapshots.for_run(run, None, 10, model, True).limit for model in (small, middling, large)]
    assert limits == [64, 64 * 2**20 // (4 * middling.num_parameters()), 0] and 16 <= limits[1] < 64
    assert Snapshots.for_run(run, 5, 10, large, True).limit == 5 and Snapshots.for_run(run, 0, 10, small, True).limit == 0


def test_snapshots_survive_a_resume_and_fresh_removes_them(tmp_path, micro, monkeypatch):
    """A run stopped at 7 and resumed keeps its snapshots up to 7; one written after its
    checkpoint by a process that was then killed (a 10 with other weights here) is taken
    again; every snapshot ends equal to those of a run never stopped."""
    settings = ["train.max_iters=20", "train.checkpoint_interval=5", "model.dropout=0.1", "train.snapshots=5",
                "train.snapshot_every=2", "train.sample_tokens=0"]
    assert train.main(["--config", TINY, *micro(*settings, out="straight")]) == 0
    stopped = make_trainer(micro(*settings, out="stopped"))
    monkeypatch.setattr(stopped.losses, "add", lambda it, loss, norm, figures=None: (
        type(stopped.losses).add(stopped.losses, it, loss, norm), it == 7 and signal.raise_signal(signal.SIGINT)))
    assert stopped.fit() == 128 + signal.SIGINT
    run = RunDir(tmp_path / "stopped")
    assert list(run.snapshot_paths()) == [0, 2, 4, 6]  # (at 7, the grid of 2 still holds them)
    run.snapshot_path(8).write_bytes(run.snapshot_path(6).read_bytes())  # as if left by a killed process
    monkeypatch.undo()
    assert train.main(["--config", TINY, *micro(*settings, out="stopped")]) == 0
    straight = RunDir(tmp_path / "straight").snapshot_paths()
    assert list(straight) == list(run.snapshot_paths()) == kept_by(20, 2, 5) == [0, 8, 16, 20]
    assert all(path.read_bytes() == run.snapshot_path(step).read_bytes() for step, path in straight.items())
    assert train.main(["--config", TINY, *micro(*settings, "train.max_iters=2", out="stopped"), "--fresh"]) == 0
    assert list(run.snapshot_paths()) == [0, 2]


def test_head_scores_of_hand_built_maps():
    T, n = 10, 5
    previous = torch.zeros(T, T)
    previous[0, 0] = 1
    previous[torch.arange(1, T), torch.arange(T - 1)] = 1  # each query on the token just before it
    induction = torch.eye(T)
    induction[n:] = 0
    induction[torch.arange(n, T), torch.arange(1, n + 1)] = 1  # the token after the earlier occurrence
    uniform = torch.ones(T, T).tril()
    uniform /= uniform.sum(-1, keepdim=True)  # each query spreads its weight over the keys it may see
    probe = torch.tensor([3, 1, 4, 5, 9, 3, 1, 4, 5, 9])  # five distinct tokens, twice
    scores = lambda maps: (current_token_scores(maps).item(), previous_token_scores(maps).item(),  # noqa: E731
                           induction_scores(maps, probe).item())
    assert scores(previous) == pytest.approx((0.1, 1.0, 0.0)) and scores(induction) == (0.5, 0.0, 1.0)  # (query 0: itself)
    assert scores(torch.eye(T)) == (1.0, 0.0, 0.0)
    expected = (sum(1 / (t + 1) for t in range(T)) / T, sum(1 / (t + 1) for t in range(1, T)) / (T - 1),
                sum(1 / (t + 1) for t in range(n, T)) / n)
    assert scores(uniform) == pytest.approx(expected)
    assert tuple(uniform_scores(T, probe).values()) == pytest.approx(expected)


def test_a_token_that_recurs_in_the_probe_splits_nothing_from_a_perfect_induction_head():
    """With fewer tokens than the probe needs, a token recurs: every key after an earlier
    occurrence of the query's token is a target, and a head that spreads its weight over
    them scores 1 (counted on key t - n + 1 alone it would score less)."""
    probe = torch.tensor([7, 2, 7, 5, 7, 2, 7, 5])  # 7 twice in each copy
    targets = induction_targets(probe)
    assert targets[0].nonzero().flatten().tolist() == [1, 3]  # query 4 (a 7): after each earlier 7
    assert targets[1].nonzero().flatten().tolist() == [2]  # query 5 (a 2): after the 2 at 1
    assert targets[2].nonzero().flatten().tolist() == [1, 3, 5]  # query 6 (a 7): after the 7s at 0, 2 and 4
    perfect = torch.zeros(8, 8)
    perfect[4:] = targets.float() / targets.sum(-1, keepdim=True)
    perfect[:4, 0] = 1
    assert induction_scores(perfect, probe).item() == pytest.approx(1.0)
    assert perfect[4:].diagonal(offset=1).mean().item() == pytest.approx((1 / 2 + 1 + 1 / 3 + 1) / 4)  # the one key's


def test_the_probe_draws_distinct_tokens_from_inside_a_line():
    """No newline (where text starts afresh), no special token, nothing never generated; each
    token once in each copy where the tokenizer has enough of them."""
    from data.tokenizer import train_tokenizer

    char = train_tokenizer("char", ["ab cd\nef gh\n" * 20], 0)
    ids = induction_probe(char, char.get_vocab_size(), 64)[0]
    assert ids.shape == (64,) and torch.equal(ids[:32], ids[32:])
    assert "\n" not in char.decode(ids.tolist()) and char.token_to_id("<unk>") not in ids
    assert induction_probe(char, char.get_vocab_size(), 500).shape == (1, 128)  # at most 64 tokens, twice
    bpe = train_tokenizer("bpe", ["hello world\nthe end\n" * 50], 300)
    probe = induction_probe(bpe, bpe.get_vocab_size(), 64)[0]
    text = bpe.decode(probe.tolist(), skip_special_tokens=False)
    assert "\n" not in text and "<|endoftext|>" not in text
    assert len(set(probe[:32].tolist())) == 32  # 300 tokens to draw from: no repeat inside a copy


def test_a_head_that_cannot_tell_keys_apart_scores_what_uniform_attention_scores():
    """The scores come from the model's own forward pass: a head whose queries are zero
    gives every key it may see the same weight."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=30, block_size=16, n_layer=2, n_head=2, n_embd=16, pos_encoding="rope"))
    with torch.no_grad():
        model.transformer.h[1].attn.c_attn.weight[8:16] = 0  # layer 1, head 1: W_Q's rows of that head
        model.transformer.h[1].attn.c_attn.bias[8:16] = 0
        model.transformer.h[1].attn.c_attn.weight[0:8] *= 300  # and head 0 with sharp preferences
    text = torch.randint(30, (1, 12))
    probe = torch.randperm(30)[:6].repeat(2)[None]
    scores = head_scores(model, text, probe)
    assert scores["previous_token"].shape == scores["induction"].shape == (2, 2)
    assert scores["previous_token"][1, 1].item() == pytest.approx(sum(1 / (t + 1) for t in range(1, 12)) / 11, abs=1e-6)
    assert scores["current_token"][1, 1].item() == pytest.approx(sum(1 / (t + 1) for t in range(12)) / 12, abs=1e-6)
    assert scores["induction"][1, 1].item() == pytest.approx(sum(1 / (t + 1) for t in range(6, 12)) / 6, abs=1e-6)
    assert abs(scores["previous_token"][1, 0].item() - scores["previous_token"][1, 1].item()) > 0.02


def test_tensorboard_shows_every_heads_scores_at_the_snapshots_and_evaluations(tmp_path, micro):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    assert train.main(["--config", TINY, *micro("train.max_iters=30", "train.snapshots=16", "train.snapshot_every=4")]) == 0
    events = EventAccumulator(str(tmp_path / "run"), size_guidance={"scalars": 0, "images": 0, "tensors": 0})
    events.Reload()
    tags = events.Tags()["scalars"]
    for kind in ("current_token", "previous_token", "induction"):
        assert {f"heads/{kind}/layer{layer}_head{head}" for layer in (0, 1) for head in (0, 1)} <= set(tags)
        steps = [e.step for e in events.Scalars(f"heads/{kind}/layer1_head0")]
        assert steps == [0, 4, 8, 10, 12, 16, 20, 24, 28, 30]  # the snapshots' steps and the evaluations (10, 20, 30)
        assert all(0 <= e.value <= 1 for e in events.Scalars(f"heads/{kind}/layer1_head0"))
    assert [i.step for i in events.Images("attention/layer_0")] == [0, 4, 8, 10, 12, 16, 20, 24, 28, 30]
    assert "custom_scalars__config__" in events.Tags()["tensors"]
    first = events.Scalars("heads/previous_token/layer0_head0")[0].value
    assert 0 < first < 1 and math.isfinite(first)
