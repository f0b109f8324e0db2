"""The training loop (training/trainer.py) and its pieces: gradient accumulation (and
DDP's no_sync), clipping, bf16 autocast, compile, the learning-rate schedule and the
optimizers, the average of the weights, the time budget, a stop signal, and a fast
bit-identical resume. The loop is run as train.py runs it (Trainer.fit); what a step did
is read through torch's optimizer hooks and the losses the loop hands to StepLosses."""

import dataclasses
import json
import math
import os
import re
import signal
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file

import generate
import train
import training.optim
import training.preparation
import training.trainer
from machine.device import resolve_dtype
from runs.folder import RunDir
from conftest import ROOT, favour_token, make_trainer as trainer_for
from data.tokenizer import UNK
from model import GPT, GPTConfig
from training import budget
from training.average import decay_after
from training.config import TrainConfig
from training.distributed import Distributed
from training.state import TrainerState
from training.evaluation import Evaluator, StepLosses
from training.budget import refitted
from training.optim import Muon, orthogonalize
from training.schedule import Schedule
from training.trainer import Trainer

TINY = str(ROOT / "configs" / "tiny.yaml")


def make_trainer(micro, *extra: str, dtype=torch.float32, out: str = "run") -> Trainer:
    return trainer_for(micro(*extra, out=out), dtype)


def run_steps(trainer: Trainer, n: int) -> list[dict]:
    """n more iterations through the loop (Trainer.fit, which ends them with an evaluation
    and a checkpoint). For each step: the gradients and the learning rates and momenta the
    optimizers stepped with, then its iteration, loss and gradient norm."""
    steps = []

    def before_step(optimizer, args, kwargs):
        if optimizer is trainer.optimizers[0]:
            groups = [group for o in trainer.optimizers for group in o.param_groups]
            steps.append({"grads": {name: p.grad.clone() for name, p in trainer.model.named_parameters()},
                          "lrs": [group["lr"] for group in groups],
                          "momenta": [group.get("momentum") for group in groups]})

    def add(iteration, loss, grad_norm, figures=None):
        steps[-1].update(iteration=iteration, loss=loss.item(), grad_norm=grad_norm.item(),
                         figures={name: value.item() for name, value in (figures or {}).items()})
        StepLosses.add(trainer.losses, iteration, loss, grad_norm, figures)

    hooks = [optimizer.register_step_pre_hook(before_step) for optimizer in trainer.optimizers]
    trainer.losses.add = add
    trainer.budget.stop_at(trainer.iteration + n)
    try:
        assert trainer.fit() == 0
    finally:
        for hook in hooks:
            hook.remove()
        del trainer.losses.add
    return steps


def norm(tensors) -> float:
    return torch.cat([t.flatten() for t in tensors]).norm().item()


def test_gradient_accumulation_equals_one_big_batch(micro):
    """4 × 2 micro-batches give the gradients of one batch of 8 (the sampler draws the
    same 8 windows either way)."""
    whole = run_steps(make_trainer(micro, "train.batch_size=8", out="whole"), 1)[0]
    split = run_steps(make_trainer(micro, "train.batch_size=4", "train.grad_accum=2", out="split"), 1)[0]
    assert whole["loss"] == pytest.approx(split["loss"], abs=1e-5)
    for name, grad in whole["grads"].items():
        torch.testing.assert_close(split["grads"][name], grad, atol=1e-6, rtol=1e-4)


class FakeDDP:
    """Stands in for DistributedDataParallel: records, for each backward, whether the
    gradients would be averaged across processes (outside no_sync)."""

    def __init__(self, module: torch.nn.Module):
        self.module, self.syncing, self.backwards = module, True, []
        next(module.parameters()).register_hook(lambda grad: self.backwards.append(self.syncing))

    def __call__(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    @contextmanager
    def no_sync(self):
        self.syncing = False
        try:
            yield
        finally:
            self.syncing = True


def test_ddp_averages_gradients_only_after_the_last_micro_batch(micro):
    trainer = make_trainer(micro, "train.grad_accum=3")
    ddp = FakeDDP(trainer.model)
    trainer.setup = dataclasses.replace(trainer.setup, forward=ddp, no_sync=ddp.no_sync)  # (as the trainer takes DDP's)
    run_steps(trainer, 2)
    assert ddp.backwards == [False, False, True] * 2


def test_grad_clip(micro):
    free = run_steps(make_trainer(micro, "train.grad_clip=0", out="free"), 1)[0]  # 0: no clipping
    assert free["grad_norm"] == pytest.approx(norm(free["grads"].values()), rel=1e-5)
    clipped = run_steps(make_trainer(micro, "train.grad_clip=0.01", out="clipped"), 1)[0]
    assert clipped["grad_norm"] == pytest.approx(free["grad_norm"], rel=1e-5)  # the norm before clipping
    assert norm(clipped["grads"].values()) == pytest.approx(0.01, rel=1e-4)  # what the optimizer stepped with


def test_bfloat16_autocast_on_cpu(micro):
    assert resolve_dtype("bfloat16", torch.device("cpu"), training=True) == torch.bfloat16
    trainer = make_trainer(micro, "train.eval_interval=100", dtype=torch.bfloat16)
    outputs = []
    trainer.model.lm_head.register_forward_hook(lambda module, args, out: outputs.append(out.dtype)
                                                if module.training else None)  # (the training steps')
    losses = [step["loss"] for step in run_steps(trainer, 20)]
    assert set(outputs) == {torch.bfloat16}  # the matmuls ran in bf16 ...
    assert trainer.model.lm_head.weight.dtype == torch.float32  # ... on float32 weights
    assert losses[-1] < losses[0] - 0.5


def test_the_step_uses_the_schedule(micro):
    trainer = make_trainer(micro, "train.warmup_iters=5", "train.lr=0.01")
    for it, step in enumerate(run_steps(trainer, 3)):
        assert step["lrs"] == pytest.approx([0.01 * (it + 1) / 6] * len(step["lrs"]))  # the warm-up's line


def rates(cfg: TrainConfig, schedule: Schedule, *its: int) -> list[float]:
    return [cfg.lr * schedule(it) for it in its]


def test_learning_rate_schedule_exact_values():
    cfg = TrainConfig(max_iters=100, lr=2.0, min_lr=0.2, warmup_iters=10)
    schedule = Schedule.of(cfg, cfg.max_iters)
    assert rates(cfg, schedule, 0, 9, 10) == pytest.approx([2 / 11, 20 / 11, 2.0])
    assert rates(cfg, schedule, 55) == pytest.approx([1.1])  # half way: cos(π/2) = 0
    assert rates(cfg, schedule, 100, 150) == pytest.approx([0.2, 0.2])
    lrs = rates(cfg, schedule, *range(10, 120))
    assert all(a >= b for a, b in zip(lrs, lrs[1:]))  # after warmup, only down
    early = TrainConfig(max_iters=100, lr=1.0, min_lr=0.1, warmup_iters=10, lr_decay_iters=50)
    assert rates(early, Schedule.of(early, 100), 30, 50, 80) == pytest.approx([0.55, 0.1, 0.1])


def test_warmup_stable_decay_schedule_exact_values():
    cfg = TrainConfig(max_iters=100, lr=1.0, min_lr=0.1, warmup_iters=10, lr_schedule="wsd", cooldown=0.4)
    schedule = Schedule.of(cfg, 100)
    assert rates(cfg, schedule, 5) == pytest.approx([6 / 11])  # the same warmup
    assert rates(cfg, schedule, 10, 60) == [1.0, 1.0]  # stable until the last 40%
    assert rates(cfg, schedule, 80, 99) == pytest.approx([0.55, 0.1225])  # down a straight line to 0.1
    assert rates(cfg, schedule, 100, 130) == pytest.approx([0.1, 0.1])
    whole = TrainConfig(max_iters=100, lr=1.0, min_lr=0.0, warmup_iters=10, lr_schedule="wsd", cooldown=1.0)
    assert rates(whole, Schedule.of(whole, 100), 10, 55) == pytest.approx([1.0, 0.5])  # decays after warmup


def retargeted(schedule: Schedule, it: int, decay_iters: int) -> Schedule:
    return refitted(schedule, it, decay_iters)


@pytest.mark.parametrize("shape", ["cosine", "wsd"])
def test_a_longer_or_shorter_decay_goes_on_from_where_the_rate_stands(shape):
    """Retargeted in the middle (a time budget's refit, a raised max_iters), the rate goes
    on from its value there along the rest of the curve, down to the floor at the new end;
    during the warmup nothing has decayed, and the new length simply replaces the old."""
    cfg = TrainConfig(max_iters=100, lr=1.0, min_lr=0.1, warmup_iters=10, lr_schedule=shape)
    schedule = Schedule.of(cfg, 100)
    for it, new_end in ((70, 150), (70, 80), (85, 200)):
        longer = retargeted(schedule, it, new_end)
        assert longer(it) == pytest.approx(schedule(it), abs=1e-12)  # no jump
        assert longer(new_end) == pytest.approx(0.1) and longer(new_end - 1) > 0.1
        later = [longer(i) for i in range(it, new_end + 1)]
        assert all(a >= b for a, b in zip(later, later[1:]))
        restored = Schedule.of(cfg, 100).loaded(longer.state_dict())  # saved and restored whole
        assert [restored(i) for i in range(it, new_end + 1)] == later
    in_warmup = retargeted(schedule, 5, 300)  # in the warmup: the new length from the start
    assert [in_warmup(i) for i in range(0, 300, 7)] == [Schedule.of(cfg, 300)(i) for i in range(0, 300, 7)]
    finished = retargeted(schedule, 100, 200)  # a finished run given more iterations: at the floor
    assert [finished(i) for i in (100, 150, 199)] == pytest.approx([0.1, 0.1, 0.1])


def test_a_run_fitted_shorter_than_its_warmup_still_reaches_the_peak_rate_early():
    """A busy machine fits 73 iterations to a run whose warm-up is 100: the rest of the
    warm-up is cut to a tenth of what is left of the run, rising from where the rate stands,
    so the run never ends still warming up; a long enough run keeps the configured warm-up."""
    cfg = TrainConfig(max_iters=5000, lr=1.0, min_lr=0.1, warmup_iters=100)
    schedule = Schedule.of(cfg, 5000)
    short = retargeted(schedule, 12, 73)
    assert short.warmup == 18  # 12 + a tenth of the 61 iterations left
    assert short(12) == pytest.approx(schedule(12), abs=1e-12)  # no jump
    ramp = [short(i) for i in range(12, 19)]
    assert all(a < b for a, b in zip(ramp, ramp[1:])) and ramp[-1] == 1.0
    assert short(73) == pytest.approx(0.1)  # and the decay still ends at the floor
    restored = Schedule.of(cfg, 5000).loaded(short.state_dict())
    assert [restored(i) for i in range(12, 74)] == [short(i) for i in range(12, 74)]
    early = retargeted(schedule, 3, 300)  # 3 + a tenth of the 297 left
    assert early.warmup == 33 and early(3) == pytest.approx(schedule(3))
    assert retargeted(schedule, 12, 1671).warmup == 100  # the configured warm-up fits: kept
    assert retargeted(short, 14, 400).warmup == 18  # it only ever gets shorter
    assert retargeted(schedule, 98, 99).warmup == 99  # at least one iteration on


def test_muon_momentum_rises_over_its_warmup(micro):
    trainer = make_trainer(micro, "train.optimizer=muon", "train.muon_momentum_warmup=10", "train.muon_momentum=0.95")
    steps = run_steps(trainer, 12)
    momenta = [step["momenta"][0] for step in steps]  # Muon's group
    assert momenta[:2] == pytest.approx([0.85, 0.86]) and momenta[5] == pytest.approx(0.90)
    assert momenta[10:] == [0.95, 0.95] == [trainer.schedule.momentum(i) for i in (10, 11)]
    assert all(momentum is None for momentum in steps[0]["momenta"][1:])  # AdamW's betas stay


def test_the_weights_average_is_what_is_evaluated_sampled_and_saved(micro, tmp_path):
    trainer = make_trainer(micro, "train.ema=0.9")
    for n in range(5):
        average = [p.detach().clone() for p in trainer.average.model.parameters()]
        run_steps(trainer, 1)
        decay = decay_after(0.9, n)  # 0.1, 0.18, 0.25, ...: warmed up with the number of updates
        for old, weight, new in zip(average, trainer.model.parameters(), trainer.average.model.parameters()):
            assert torch.allclose(new, decay * old + (1 - decay) * weight, atol=1e-7)
    x, y = (t[:8] for t in trainer.evaluator.val)
    with torch.no_grad():
        averaged, trained = trainer.average.model(x, y)[1].item(), trainer.model(x, y)[1].item()
    assert averaged != trained
    assert trainer.evaluator.loss(trainer.eval_model, (x, y)) == pytest.approx(averaged)
    saved = run_weights(tmp_path / "run")  # (the last fit ended with a checkpoint)
    assert all(torch.equal(saved[n], p) for n, p in trainer.average.model.state_dict().items() if n in saved)
    state = saved_state(tmp_path / "run")
    assert all(torch.equal(state.model[n], p) for n, p in trainer.model.state_dict().items())  # resumes these
    assert all(torch.equal(state.average[n], p) for n, p in trainer.average.model.state_dict().items())


@pytest.mark.parametrize("optimizer", ["adamw", "muon train.ema=0.9 train.muon_momentum_warmup=15"])
def test_resume_after_a_stop_is_bit_identical(tmp_path, micro, monkeypatch, optimizer):
    """A run that dies right after its checkpoint of iteration 10, with dropout on, and
    is run again ends with exactly the weights of a run never stopped: the batch
    sampler, every RNG, the optimizers' states and the weights' average are restored."""
    settings = ["train.max_iters=20", "train.checkpoint_interval=5", "train.eval_interval=10",
                "model.dropout=0.1", "train.sample_tokens=0", *f"train.optimizer={optimizer}".split()]
    assert train.main(["--config", TINY, *micro(*settings, out="straight")]) == 0
    real_save = RunDir.save_checkpoint

    def save_then_die(run_dir, model, tokenizer, summary, state):
        real_save(run_dir, model, tokenizer, summary, state)
        if state["iteration"] == 10:
            raise KeyboardInterrupt  # as if killed right after writing it

    monkeypatch.setattr(RunDir, "save_checkpoint", save_then_die)
    assert train.main(["--config", TINY, *micro(*settings, out="stopped")]) == 130
    monkeypatch.undo()
    assert torch.load(tmp_path / "stopped" / "trainer_state.pt", weights_only=True)["iteration"] == 10
    assert train.main(["--config", TINY, *micro(*settings, out="stopped")]) == 0
    straight, resumed = run_weights(tmp_path / "straight"), run_weights(tmp_path / "stopped")
    assert all(torch.equal(straight[name], resumed[name]) for name in straight)


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_a_resume_applies_the_optimizer_settings_of_the_config_and_says_so(tmp_path, micro, capsys, optimizer):
    """The peak rates, betas and weight decay come from the config as it is now, not from
    the checkpoint: the rate a resumed step uses is the one the log shows."""
    first = ["train.max_iters=10", "train.sample_tokens=0", "train.lr=1e-3", f"train.optimizer={optimizer}"]
    assert train.main(["--config", TINY, *micro(*first)]) == 0
    changed = ["train.max_iters=20", "train.sample_tokens=0", "train.lr=1e-4", "train.min_lr=1e-5",
               "train.beta2=0.95", "train.muon_lr=0.005", f"train.optimizer={optimizer}", "train.log_interval=1"]
    trainer = make_trainer(micro, *changed)
    step = run_steps(trainer, 1)[0]
    factor = trainer.schedule(10)
    adamw = trainer.optimizers[-1]
    assert step["lrs"][-1] == pytest.approx(1e-4 * factor) and adamw.param_groups[0]["betas"] == (0.9, 0.95)
    if optimizer == "muon":
        assert step["lrs"][0] == pytest.approx(0.005 * factor)
    out = capsys.readouterr().out
    assert "resuming with the optimizer settings of the config as it is now: " in out
    assert "AdamW peak lr 0.001 -> 0.0001" in out and "AdamW betas (0.9, 0.99) -> (0.9, 0.95)" in out
    assert ("Muon peak lr 0.01 -> 0.005" in out) == (optimizer == "muon")
    assert scalars(tmp_path / "run", "train/lr")[11] == pytest.approx(1e-4 * factor)  # the rate shown is the one used
    unchanged = make_trainer(micro, *changed, "train.max_iters=22")  # saved with these settings: nothing to say
    assert not any("optimizer settings" in change for change in unchanged.changes)


def test_muon_trains_the_block_matrices_and_adamw_the_rest(micro):
    trainer = make_trainer(micro, "train.optimizer=muon", "train.muon_lr=0.05", "train.weight_decay=0",
                           "train.eval_interval=100")
    muon, adamw = trainer.optimizers
    assert isinstance(muon, Muon) and isinstance(adamw, torch.optim.AdamW)
    names = {id(p): n for n, p in trainer.model.named_parameters()}
    in_muon = {names[id(p)] for g in muon.param_groups for p in g["params"]}
    in_adamw = {names[id(p)] for g in adamw.param_groups for p in g["params"]}
    assert in_muon == {n for n, p in trainer.model.named_parameters() if p.dim() == 2 and ".h." in n}
    assert in_muon | in_adamw == set(names.values()) and not in_muon & in_adamw
    assert "transformer.wte.weight" in in_adamw  # the embedding, and through tying the LM head
    steps = run_steps(trainer, 15)
    assert steps[-1]["loss"] < steps[0]["loss"] - 0.5
    assert steps[-1]["lrs"][0] == pytest.approx(0.05 * trainer.schedule(14))  # the same schedule


def test_compiled_training_matches_eager(micro, monkeypatch):
    """train.compile: the loop trains through torch.compile's graph of the model (with
    the aot_eager backend here: the same graph capture, without inductor's minute of C++
    compilation; tests/test_cuda.py compiles with inductor on a GPU)."""
    real_compile = torch.compile
    monkeypatch.setattr(torch, "compile", lambda model: real_compile(model, backend="aot_eager", fullgraph=True))
    eager = make_trainer(micro, out="eager")
    compiled = make_trainer(micro, "train.compile=true", out="compiled")
    assert compiled.setup.forward is not compiled.model
    for a, b in zip(run_steps(eager, 3), run_steps(compiled, 3)):
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-5)


class Clock:
    """A clock that says what it is told: its `now`."""

    def __init__(self, now: float = 0.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_the_first_estimate_times_ten_iterations_after_two_and_forces_no_evaluation():
    """The pace is that of iterations 3 to 12, evaluations left out; no evaluation is forced
    to learn what one costs: an estimate stands in (expect_overhead, from a few of the
    evaluation's own batches) until one is timed, its cost shared by the eval_interval
    iterations between evaluations and kept for the last one."""
    clock = Clock()
    timed = budget.TimeBudget(1, cap=1000, eval_interval=10, clock=clock)
    timed.begin(0)
    for it in range(1, 13):
        clock.now = float(it)  # 1 s an iteration
        timed.step_done(it)
        assert timed.needs_overhead(it) == (it == 12)
    assert timed.fit(12) is None  # (waiting for the estimate)
    timed.expect_overhead(5.0)
    # 12 s spent and 5 s kept for the last evaluation: 43 s at 1 + 5 / 10 s an iteration buy 28 more
    assert timed.fit(12) == 40 and timed.pace == 1.0 and timed.mark == (12.0, 12, 0.0)
    timed.spent_on_evaluation(3.0)  # the first real one: it replaces the estimate
    timed.expect_overhead(9.0)
    assert timed.overhead == 3.0
    clock = Clock()
    capped = budget.TimeBudget(1, cap=20, eval_interval=10, clock=clock)
    capped.begin(0)
    capped.step_done(2)
    clock.now = 10.0
    capped.expect_overhead(1.0)
    assert capped.fit(12) == 20  # max_iters stays at most the cap


def test_the_time_budget_refits_from_the_pace_since_the_last_fit():
    clock = Clock()
    timed = budget.TimeBudget(1, cap=100000, eval_interval=100, clock=clock)
    clock.now = 20.0
    assert timed.fit(112) is None  # no estimate before the first fit
    timed.spent_on_evaluation(2.0)
    timed.pace, timed.mark = 0.5, budget.Mark(10.0, 12, 2.0)  # a first estimate at iteration 12, at 10 s
    # 100 iterations in the 10 s since: 0.1 s each, smoothed with the 0.5 before: 0.3; with the
    # evaluation's 2 s per 100 iterations, 0.32 s an iteration; 38 s left after 20 spent and 2 kept
    assert timed.fit(112) == 112 + int(38 / 0.32)
    assert timed.pace == pytest.approx(0.3)
    assert timed.fit(112) is None  # nothing measured since
    clock.now = 25.0
    timed.spent_on_evaluation(4.0)  # 4 of the 5 s since were an evaluation: 1 s for 10 iterations
    assert timed.fit(122) is not None and timed.pace == pytest.approx(0.5 * 0.1 + 0.5 * 0.3)
    report = timed.report()  # the best pace measured, 0.1 s, and what the two stretches would have done at it
    assert report["best_pace"] == pytest.approx(0.1) and report["timed_iterations"] == 110
    assert report["at_best_pace"] == 110 and report["busy_share"] == 0.0
    timed.max_iters = 300
    assert timed.fit(300) is None  # the run has ended: its last evaluation is done
    assert budget.stop_iteration(50, -5.0, 1.0, cap=100) == 51  # a spent budget: one more, to end cleanly
    assert budget.stop_iteration(50, 9.99, 1.0, cap=100) == 59
    assert budget.stop_iteration(50, 1000, 1.0, cap=100) == 100


def test_the_pace_settles_when_three_estimates_agree_and_the_report_says_how_busy_the_machine_was():
    clock = Clock()
    timed = budget.TimeBudget(10, cap=100000, eval_interval=100, clock=clock)
    timed.expect_overhead(0.0)
    timed.mark = budget.Mark(0.0, 0, 0.0)
    timed.pace = 1.0
    settled = []
    for seconds in (1, 1, 1, 3, 1, 1, 1, 1, 1, 1):  # each fit after 10 iterations at this many seconds each
        clock.now += 10 * seconds
        timed.fit(10 * (len(settled) + 1))
        settled.append(timed.settled())
    # three estimates that agree settle it; a slow stretch unsettles it until the estimates agree again
    assert settled == [False, False, True, False, False, False, False, True, True, True]
    report = timed.report()
    assert report["best_pace"] == 1.0 and report["timed_iterations"] == 100 and report["at_best_pace"] == 120
    assert report["busy_share"] == pytest.approx(30 / 120)  # the stretch at 3 s an iteration


class FakeClock:
    """The trainer's clock, handed to it as train.py hands it time.perf_counter, advanced by
    the work the model does instead of by wall time, on any machine (read off torch's own
    hooks): each optimizer step takes 1 s (or step_seconds(iteration)); each batch of
    validation windows the model scores in eval mode takes 1.25 s, so an evaluation of the
    micro run's four batches takes 5 s; nothing else takes time. stop_at: a real SIGINT reaches
    the process during that iteration."""

    def __init__(self, stop_at: int | None = None, step_seconds=lambda iteration: 1.0, now: float = 0.0):
        self.now, self.stop_at, self.step_seconds = now, stop_at, step_seconds

    def __call__(self) -> float:
        return self.now

    def trainer(self, micro, *extra: str, out: str = "run") -> Trainer:
        """A trainer of the micro run with `extra` settings, on this clock."""
        from training.config import load_config
        from training.preparation import prepare_run

        run = prepare_run(load_config(TINY, micro(*extra, out=out)), clock=self)
        trainer = Trainer(run, torch.device("cpu"), torch.float32, clock=self)
        batch = trainer.settings.batch_size

        def stepped(optimizer, args, kwargs):
            iteration = trainer.iteration + 1
            self.now += self.step_seconds(iteration)
            if iteration == self.stop_at:
                os.kill(os.getpid(), signal.SIGINT)

        def scoring(module, args):
            if not module.training and args[0].size(0) == batch:  # (a batch of evaluation windows)
                self.now += 1.25

        trainer.optimizers[-1].register_step_post_hook(stepped)
        trainer.model.register_forward_pre_hook(scoring)
        return trainer


def saved_state(run_dir) -> TrainerState:
    return TrainerState.from_dict(RunDir(run_dir).load_state(), str(run_dir))


def test_time_budget_sets_max_iters_from_the_measured_pace(tmp_path, micro, capsys):
    settings = ["train.max_minutes=1", "train.max_iters=1000000", "train.sample_tokens=0"]
    clock = FakeClock()  # 1 s a step, 5 s an evaluation
    assert clock.trainer(micro, *settings).fit() == 0
    out = capsys.readouterr().out
    state = saved_state(tmp_path / "run")
    assert 12 < state.budget["max_iters"] == state.iteration < 1000000
    # the first estimate, at the first read after the timed iterations 3 to 12 (log_interval=5: at 15),
    # the evaluation at 10 having measured what one costs: 1 s an iteration, plus the evaluation's 5 s
    # shared by the 10 iterations between evaluations: 1.5 s; 20 s spent (15 steps, the evaluation at 10)
    # and 5 s kept for the last evaluation: 35 s buy 23 more (eval_interval is 10 here: no estimate needed)
    assert ("time budget 1 min: 1000 ms per iteration, 5.0 s per evaluation and checkpoint; training to "
            "iteration 38\n") in out
    assert 55 <= state.budget["seconds"] <= 60 and f"done: {state.iteration} iterations" in out
    assert "at the best pace this run measured on this machine (1000 ms an iteration)" in out and "busy" not in out
    assert clock.trainer(micro, *settings).fit() == 0  # the measured max_iters is kept
    assert f"already holds a finished run of {state.iteration} iterations" in capsys.readouterr().out


def test_a_terminals_progress_bar_ends_at_the_iterations_the_budget_allows(tmp_path, micro, capsys, monkeypatch):
    import sys

    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    settings = ["train.max_minutes=1", "train.max_iters=1000000", "train.sample_tokens=0"]
    assert FakeClock().trainer(micro, *settings).fit() == 0  # 1 s a step, 5 s an evaluation
    done = saved_state(tmp_path / "run").iteration
    assert f" {done}/{done} [" in capsys.readouterr().err  # not 1000000, not a bar without an end


def test_the_budget_follows_a_machine_that_slows_down(tmp_path, micro, capsys):
    """Another program takes the cores: from iteration 30 each step takes 4 s instead of 1.
    The budget is refit at every read of the losses, so the run still ends within it."""
    clock = FakeClock(step_seconds=lambda iteration: 4.0 if iteration > 30 else 1.0)
    settings = ["train.max_minutes=2", "train.max_iters=1000000", "train.sample_tokens=0", "train.eval_interval=50"]
    assert clock.trainer(micro, *settings).fit() == 0
    state = saved_state(tmp_path / "run")
    # within the 2 minutes but for a slowed step (4 s) and the batch the first estimate timed (1.25 s)
    assert 110 <= state.budget["seconds"] <= 120 + 4 + 1.25 and 30 < state.iteration < 60


def test_a_run_of_fixed_length_on_a_busy_machine_says_what_its_steps_would_have_taken(micro, capsys):
    """No time budget: the run takes its 60 steps whatever the pace, but from iteration 30
    each takes 4 s instead of 1, and the done line says so; a quiet run says nothing of it.
    Either way it points to the explorer, which shows its snapshots."""
    clock = FakeClock(step_seconds=lambda iteration: 4.0 if iteration > 30 else 1.0)
    settings = ["train.max_iters=60", "train.sample_tokens=0", "train.eval_interval=60", "train.snapshots=8",
                "train.snapshot_every=10", "train.log_interval=5"]
    trainer = clock.trainer(micro, *settings)
    trainer.fit()
    said = capsys.readouterr().out
    assert trainer.iteration == 60 and not trainer.summary()["pace"]["budget"]
    assert "the machine was busy (other work on its cores) for 78% of the training time" in said, said
    assert "(1000 ms an iteration) its timed training would have taken 53 s, not 128 s" in said  # (30 at 4 s, 23 at 1)
    assert f"watch it form: python explore.py --checkpoint {trainer.run_dir.path}" in said
    quiet = FakeClock()
    quiet.trainer(micro, *settings, out="quiet").fit()
    assert "busy" not in capsys.readouterr().out and quiet.now > 0


BUDGET = ["train.max_minutes=2", "train.max_iters=400", "train.eval_interval=20", "train.sample_tokens=0"]


@pytest.mark.parametrize("stop_at", [5, 15, 30], ids=["before-the-estimate", "before-its-checkpoint", "after-it"])
def test_a_time_budget_covers_the_whole_run_across_a_resume(tmp_path, micro, stop_at):
    """The first estimate comes at iteration 12 (and saves), the next checkpoint at 20. A run
    stopped anywhere and resumed ends within the same 2 minutes as a run never stopped,
    after about as many iterations; the checkpoint carries the seconds used."""
    assert FakeClock().trainer(micro, *BUDGET).fit() == 0
    whole = saved_state(tmp_path / "run")
    assert 60 < whole.iteration < 120 and 110 <= whole.budget["seconds"] <= 125

    stopped = [*BUDGET, f"out_dir={tmp_path / 'stopped'}"]
    clock = FakeClock(stop_at=stop_at)
    assert clock.trainer(micro, *stopped).fit() == 128 + signal.SIGINT
    state = saved_state(tmp_path / "stopped")
    assert state.iteration == stop_at and state.budget["seconds"] == clock.now
    resumed_clock = FakeClock(now=clock.now)  # the resumed process: the clock goes on
    assert resumed_clock.trainer(micro, *stopped).fit() == 0
    resumed = saved_state(tmp_path / "stopped")
    assert 110 <= resumed.budget["seconds"] == resumed_clock.now <= 125  # both processes' seconds, within the budget
    assert abs(resumed.iteration - whole.iteration) <= 12
    assert FakeClock(now=resumed_clock.now).trainer(micro, *stopped).fit() == 0  # finished: nothing more to train
    assert saved_state(tmp_path / "stopped").iteration == resumed.iteration
    longer = FakeClock(now=resumed_clock.now)
    assert longer.trainer(micro, *stopped, "train.max_minutes=3").fit() == 0  # a raised budget: a minute more
    state = saved_state(tmp_path / "stopped")
    assert state.iteration > resumed.iteration
    assert resumed.budget["seconds"] < state.budget["seconds"] == longer.now <= 185


def test_the_done_line_says_when_a_busy_machine_cost_the_run_its_iterations(tmp_path, micro, capsys):
    """From iteration 20 on, another program makes each step take 3 s instead of 1: the run
    says how many iterations its training time would have held at its best pace, that the
    machine was busy for most of it, and how to train on; summary.json keeps the figures."""
    settings = ["train.max_minutes=2", "train.max_iters=1000000", "train.sample_tokens=0"]
    assert FakeClock(step_seconds=lambda iteration: 1.0 if iteration < 20 else 3.0).trainer(micro, *settings).fit() == 0
    out = capsys.readouterr().out
    pace = json.loads((tmp_path / "run" / "summary.json").read_text())["pace"]
    assert pace["best_pace"] == 1.0 and pace["busy_share"] >= 0.7 and pace["at_best_pace"] > 2 * pace["timed_iterations"]
    assert (f"its timed training would have held {pace['at_best_pace']} iterations; it held {pace['timed_iterations']}; "
            f"the machine was busy (other work on its cores) for {pace['busy_share']:.0%} of the training time") in out
    assert "to train on, python train.py --config" in out


def test_a_resume_whose_budget_is_spent_trains_no_more(tmp_path, micro, capsys):
    settings = [*BUDGET, "train.checkpoint_interval=5"]
    assert FakeClock(stop_at=30).trainer(micro, *settings).fit() == 128 + signal.SIGINT
    state = saved_state(tmp_path / "run")
    state.budget["seconds"] = 121.0  # the stopped run had used the whole 2 minutes
    torch.save(state.to_dict(), tmp_path / "run" / "trainer_state.pt")
    assert FakeClock().trainer(micro, *settings).fit() == 0
    assert saved_state(tmp_path / "run").iteration == 30
    assert "raise train.max_minutes to continue" in capsys.readouterr().out


def test_a_run_that_ended_where_its_budget_said_is_finished():
    """Under train.max_minutes a checkpoint at its fitted max_iters is a finished run, even
    when it used less than the budget, unless the budget was raised; one at the configured
    max_iters, or out of time, is finished too. Otherwise it trains on, to its fitted
    length until the pace is measured again."""
    def resumed(it, max_iters=50, minutes=2.0, seconds=90.0, now=2.0) -> int:
        timed = budget.TimeBudget(now, cap=400, eval_interval=10, clock=Clock())
        timed.load_state_dict({"seconds": seconds, "max_iters": max_iters, "minutes": minutes}, it)
        return timed.max_iters

    assert resumed(50) == 50
    assert resumed(50, max_iters=51) == 51
    assert resumed(50, minutes=1.0) == 400  # the budget was raised: measured again, up to the cap
    assert resumed(400, max_iters=400) == 400
    assert resumed(50, max_iters=51, seconds=120.0) == 50  # its time is spent
    assert resumed(50, max_iters=1000) == 400  # never past the cap


def test_a_stop_saves_and_says_how_to_continue(tmp_path, micro, capsys):
    assert FakeClock(stop_at=7).trainer(micro, "train.eval_interval=100").fit() == 128 + signal.SIGINT
    assert saved_state(tmp_path / "run").iteration == 7
    assert (f"stopped at iteration 7; checkpoint saved in {tmp_path / 'run'}. Run the same command to continue.\n"
            in capsys.readouterr().out)


def test_the_done_line_reports_the_whole_run_and_this_process(tmp_path, micro, capsys):
    clock = FakeClock(stop_at=7)  # 1 s a step, 5 s an evaluation
    settings = ["train.max_iters=20", "train.eval_interval=10", "train.sample_tokens=0"]
    assert clock.trainer(micro, *settings).fit() == 128 + signal.SIGINT
    resumed = FakeClock(now=clock.now)
    assert resumed.trainer(micro, *settings).fit() == 0
    # the first process: 7 steps; the second: 13 steps and 2 evaluations
    assert "done: 20 iterations in 0.5 min (30 s), 0.4 min (23 s) of them in this process; val loss" \
        in capsys.readouterr().out
    assert RunDir(tmp_path / "run").summary()["tokens"] == 20 * 8 * 32  # both processes' steps of 8 windows of 32
    assert FakeClock(now=resumed.now).trainer(micro, *settings, "train.max_iters=21").fit() == 0
    assert "done: 21 iterations in 0.6 min (36 s), 0.1 min (6 s) of them in this process;" in capsys.readouterr().out


def test_a_budget_shorter_than_the_warmup_shortens_it_and_says_so(tmp_path, micro, capsys):
    """A busy machine: the budget fits about 38 iterations to a run whose warm-up is 100.
    The warm-up is cut when the length is first fitted, the rate reaches its peak, and the
    run does not end inside its warm-up."""
    settings = ["train.max_minutes=1", "train.max_iters=1000000", "train.sample_tokens=0", "train.warmup_iters=100"]
    trainer = FakeClock().trainer(micro, *settings)  # 1 s a step, 5 s an evaluation
    lrs = []
    trainer.optimizers[0].register_step_pre_hook(lambda optimizer, *_: lrs.append(optimizer.param_groups[0]["lr"]))
    assert trainer.fit() == 0
    warmup = trainer.schedule.warmup
    assert warmup < trainer.iteration < 100
    assert max(lrs) == pytest.approx(trainer.settings.muon_lr) and lrs.index(max(lrs)) == warmup  # (Muon's group)
    out = capsys.readouterr().out
    assert f"the learning-rate warm-up now ends at iteration {warmup} instead of 100" in out
    assert (trainer.barely_trained() or {}).get("reason") != "warmup"


def test_a_barely_trained_model_is_said_at_the_end_with_the_command_that_trains_it_on(tmp_path, micro, capsys):
    run = tmp_path / "run"
    assert train.main(["--config", TINY, *micro("train.max_iters=4", "train.warmup_iters=100")]) == 0
    out = capsys.readouterr().out
    command = f"python train.py --config {run / 'config.yaml'} train.max_iters=8"
    assert (f"the model is barely trained: the run stopped inside its learning-rate warm-up, at iteration 4 of 100. "
            f"Its samples will read as noise. Train it on: {command}\n") in out
    summary = RunDir(run).summary()
    assert summary["barely_trained"]["reason"] == "warmup" and summary["barely_trained"]["warmup"] == 100
    assert summary["tokens"] == 4 * 8 * 32 and summary["weights"] == "trained"  # 4 steps of 8 windows of 32
    assert generate.main(["--checkpoint", str(run), "--prompt", "RO", "--max-new-tokens", "2"]) == 0
    assert "note: this model is barely trained (the run stopped inside" in capsys.readouterr().err
    assert train.main(command.split()[2:]) == 0  # the command it gives trains the same run on
    assert saved_state(run).iteration == 8
    assert ("the learning-rate warm-up now ends at iteration 5 instead of 100, so that it takes at most a tenth of "
            "what is left of a run of 8 iterations\n") in capsys.readouterr().out


def test_a_model_whose_loss_barely_fell_is_said_to_be_barely_trained(tmp_path, micro, capsys):
    """Past its warm-up, but at a rate too low to learn: the validation loss stays within a
    quarter of the first step's loss. The same run at a rate that learns is not flagged."""
    still = make_trainer(micro, "train.optimizer=adamw", "train.lr=1e-7", "train.min_lr=1e-8", "train.warmup_iters=0",
                         out="still")
    assert still.fit() == 0
    assert still.losses.initial == pytest.approx(still.val_loss, rel=0.05)
    assert still.barely_trained()["text"] == (f"its validation loss {still.val_loss:.2f} is less than 25% below "
                                              f"{still.losses.initial:.2f}, the loss at initialisation")
    assert still.barely_trained()["reason"] == "loss"
    learnt = make_trainer(micro, "train.lr=1e-2", "train.warmup_iters=0", "train.max_iters=60", out="learnt")
    assert learnt.fit() == 0
    assert learnt.val_loss < 0.75 * learnt.losses.initial and learnt.barely_trained() is None
    resumed = make_trainer(micro, "train.optimizer=adamw", "train.lr=1e-7", "train.min_lr=1e-8", "train.warmup_iters=0",
                           "train.max_iters=31", out="still")
    assert resumed.losses.initial == still.losses.initial  # kept through the checkpoint
    capsys.readouterr()


def test_metrics_jsonl_holds_the_curves_and_a_resume_repeats_no_step(tmp_path, micro, monkeypatch, capsys):
    """Beside the TensorBoard events, one JSON line a step; a resume drops what a killed
    process wrote past its checkpoint (and a line it cut short); --fresh starts it over."""
    import json

    settings = ["train.max_iters=20", "train.eval_interval=10", "train.sample_tokens=0"]
    assert FakeClock(stop_at=7).trainer(micro, *settings).fit() == 128 + signal.SIGINT
    metrics = tmp_path / "run" / "metrics.jsonl"
    with open(metrics, "a") as f:  # as if the killed process had gone on past its checkpoint at 7
        f.write(json.dumps({"step": 9, "train/loss": 9.9}) + "\n" + '{"step": 10, "train/lo')
    assert FakeClock().trainer(micro, *settings).fit() == 0
    lines = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [line["step"] for line in lines if "train/loss" in line] == [5, 10, 15, 20]
    assert [line["step"] for line in lines if "val/loss" in line] == [10, 20]
    assert all(math.isfinite(line["train/lr"]) for line in lines if "train/lr" in line) and "9.9" not in str(lines)
    assert train.main(["--config", TINY, *micro(*settings, "train.max_iters=5"), "--fresh"]) == 0
    assert [json.loads(line)["step"] for line in metrics.read_text().splitlines()] == [5, 5]  # train/ and val/
    capsys.readouterr()


def test_keep_best_keeps_the_model_of_the_lowest_validation_loss(tmp_path, micro, monkeypatch, capsys):
    """train.keep_best: out_dir/best holds the model of the best evaluation so far, a run
    folder of its own; a later, worse evaluation leaves it; a resume beats what it holds
    (a killed process may have kept a better one after its checkpoint); --fresh clears it."""
    losses = iter([3.0, 2.0, 2.5])
    monkeypatch.setattr(Evaluator, "log", lambda *args, **kwargs: next(losses))
    settings = ["train.keep_best=true", "train.max_iters=30", "train.eval_interval=10", "train.sample_tokens=0"]
    trainer = make_trainer(micro, *settings)
    kept = {}
    real_save_best = RunDir.save_best
    monkeypatch.setattr(RunDir, "save_best", lambda run_dir, model, tokenizer, summary: kept.update(
        {summary["iteration"]: {k: v.clone() for k, v in model.state_dict().items()}})
        or real_save_best(run_dir, model, tokenizer, summary))
    assert trainer.fit() == 0
    best = RunDir(tmp_path / "run").best()
    assert sorted(kept) == [10, 20] and best.summary()["iteration"] == 20 and best.summary()["val_loss"] == 2.0
    model, _ = best.load_model()
    assert all(torch.equal(model.state_dict()[k], v) for k, v in kept[20].items())  # iteration 20's weights
    assert (best.path / "config.yaml").is_file() and generate.main(["--checkpoint", str(best.path), "--prompt", "R",
                                                                    "--max-new-tokens", "2"]) == 0
    summary = json.loads((best.path / "summary.json").read_text())
    (best.path / "summary.json").write_text(json.dumps({**summary, "val_loss": 1.0}))  # a better one, kept late
    resumed = make_trainer(micro, *settings, "train.max_iters=40")
    assert resumed.best_val_loss == 1.0
    monkeypatch.undo()
    assert train.main(["--config", TINY, *micro(*settings, "train.max_iters=5", "train.keep_best=false"),
                       "--fresh"]) == 0
    assert RunDir(tmp_path / "run").best() is None and not (tmp_path / "run" / "best").exists()
    capsys.readouterr()


def test_training_samples_never_show_unk(micro):
    trainer = make_trainer(micro)
    unk = trainer.run.data.tokenizer.token_to_id(UNK)
    favour_token(trainer.model, unk)
    prompt = torch.tensor([[0]])
    assert trainer.model.generate(prompt, 1, temperature=0.8)[0, -1] == unk  # what an unguarded sampler picks
    text = trainer.evaluator.sample(trainer.eval_model)
    assert UNK not in text and len(text) == len(trainer.settings.sample_prompt) + trainer.settings.sample_tokens


def test_throughput_and_mfu_count_every_process_since_the_last_report(micro):
    trainer = make_trainer(micro, "train.grad_accum=2")
    logged = []
    log = SimpleNamespace(progress=lambda *args: None, scalars=lambda it, values: logged.append(values))
    trainer.dist = Distributed(rank=0, world_size=2)  # (report itself exchanges nothing)
    trainer.peak_flops = 1e9
    for _ in range(5 * 2):  # 5 steps before the last report
        trainer.sampler.next_batch()
    before = trainer.sampler.drawn
    for _ in range(10 * 2):  # 10 steps of 2 micro-batches each since the last report
        trainer.sampler.next_batch()
    trainer.tick, trainer.iteration = (100.0, before), 30
    trainer.clock = lambda: 105.0
    trainer.report(log, 2.0, 1.0, 1e-3, {})
    tokens_per_sec = 8 * 32 * 2 * 2 * 10 / 5  # batch × T × grad_accum × processes, 10 steps in 5 s
    assert logged[0]["train/tokens_per_sec"] == tokens_per_sec
    assert logged[0]["train/mfu"] == pytest.approx(trainer.model.flops_per_token(32) * tokens_per_sec / 2 / 1e9)
    assert trainer.tick == (105.0, 8 * 32 * 2 * 15)


def test_only_the_main_process_measures_the_peak_that_mfu_divides_by(micro, monkeypatch):
    monkeypatch.setattr(training.trainer, "peak_flops", lambda device, dtype, threads: 4.2e9)
    trainer = make_trainer(micro)
    log = SimpleNamespace(text=lambda *args: None, message=lambda line: None, layout_heads=lambda: None,
                          attention=lambda *args: None, head_scores=lambda *args: None)
    trainer.run_dir.path.mkdir(parents=True)
    trainer.begin(log)
    assert trainer.peak_flops == 4.2e9
    trainer.dist = Distributed(rank=1, world_size=2)  # the others log no MFU and need no measurement
    trainer.begin(log)
    assert trainer.peak_flops == 1.0


def two_processes(rank: int, overrides: list[str], store: str, out: str) -> None:
    """One of two real processes (a gloo group over a file store, as torchrun's would be): its
    trainer, whose time budget estimates another end than the other's (rank 0: 40, rank 1: 77),
    refits; and its evaluator scores its half of the validation windows. Writes what it got."""
    import torch.distributed as torch_dist

    from training.config import load_config
    from training.distributed import Distributed
    from training.preparation import prepare_run

    torch.set_num_threads(1)
    torch_dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    try:
        group = Distributed(rank=rank, local_rank=rank, world_size=2)
        trainer = Trainer(prepare_run(load_config(TINY, overrides), group), torch.device("cpu"), torch.float32, group)
        val_loss = trainer.evaluator.loss(trainer.model, trainer.evaluator.val)  # (DDP gave both rank 0's weights)
        trainer.iteration = 10
        trainer.budget.fit = lambda it: 40 if rank == 0 else 77  # each process's own estimate
        trainer.refit(SimpleNamespace(retarget=lambda max_iters: None, message=lambda line: None))
        Path(f"{out}.{rank}").write_text(json.dumps({"max_iters": trainer.max_iters, "val_loss": val_loss,
                                                     "decay_iters": trainer.schedule.decay_iters}))
    finally:
        torch_dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.xdist_group("processes")  # (one such test at a time: tests/test_distributed.py)
def test_two_processes_train_to_rank_0s_end_and_score_the_windows_of_one(micro, tmp_path):
    """Two real processes: after a refit both train to rank 0's max_iters (a rank that stopped
    sooner would hang the others) and the learning rate's decay ends there; the validation
    loss they score together, each its half of the windows, is one process's over all of them."""
    import torch.multiprocessing as mp

    overrides = micro("train.max_minutes=1", "train.max_iters=100000")
    # one process with the two's global batch: the same windows (it prepares the token files the two then find)
    alone = trainer_for(micro("train.max_minutes=1", "train.max_iters=100000", "train.batch_size=16", out="alone"))
    expected = alone.evaluator.loss(alone.model, alone.evaluator.val)
    mp.spawn(two_processes, args=(overrides, str(tmp_path / "store"), str(tmp_path / "got")), nprocs=2)
    got = [json.loads((tmp_path / f"got.{rank}").read_text()) for rank in (0, 1)]
    assert [g["max_iters"] for g in got] == [40, 40] == [g["decay_iters"] for g in got]
    assert got[0]["val_loss"] == got[1]["val_loss"] == pytest.approx(expected, abs=1e-6)
    assert alone.settings.max_iters == 100000  # the config is not rewritten


def test_a_one_process_checkpoint_resumed_by_two_restores_its_sampler(micro, tmp_path, capsys):
    from training import resume

    settings = ("train.max_iters=4", "train.sample_tokens=0", "train.grad_accum=2")
    assert train.main(["--config", TINY, *micro(*settings)]) == 0
    state = saved_state(tmp_path / "run")
    two = Distributed(rank=0, world_size=2)  # rank 0 of 2, before it draws anything
    assert resume.grad_accum_for(state, two, SimpleNamespace(batch_size=8, grad_accum=2)) == 1  # 2 micro-batches of one process over two
    assert "resuming a 1-process run with 2: train.grad_accum 2 -> 1 keeps the global batch of 16" \
        in capsys.readouterr().err
    trainer = make_trainer(micro, "train.max_iters=8")  # built as one process; then rank 0 of 2 takes the state
    trainer.dist = two
    trainer.sampler = type(trainer.sampler)(trainer.run.data.train, 32, 8, 1337, rank=0, world_size=2)
    trainer.resume(state)
    assert trainer.sampler.generator.get_state().equal(state.ranks[0]["sampler"]["generator"])
def test_the_average_warms_up_to_its_decay():
    assert [decay_after(0.99, n) for n in (0, 1, 10, 890, 5000)] == pytest.approx([0.1, 2 / 11, 11 / 20, 0.99, 0.99])


def test_a_short_run_saves_an_average_as_good_as_its_weights(tmp_path, micro, capsys):
    """tiny.yaml's average (ema 0.99) after a 100-iteration run: a fixed decay would keep
    37% of the random initialisation (4.07 against 3.40 in the issue's run); warmed up, the
    saved model is within 0.05 of the trained weights, and the log says which is which."""
    assert train.main(["--config", TINY, *micro("train.ema=0.99", "train.max_iters=100", "train.eval_interval=50",
                                                 "train.lr=0.01")]) == 0
    out = capsys.readouterr().out
    final = re.search(r"iter 100: train [\d.]+, val ([\d.]+) \(perplexity [\d.]+, [\d.]+ bits/char; the average of the "
                      r"weights; the trained weights: val ([\d.]+)\)", out)
    assert final, out
    average, trained = map(float, final.groups())
    assert average <= trained + 0.05 and average < 3.0
    assert "iter 50: train" in out and "bits/char; the average of the weights)\n" in out  # at 50 the raw weights are not scored
    assert scalars(tmp_path / "run", "val/loss_raw_weights") == {100: pytest.approx(trained, abs=1e-4)}


def test_muon_matches_torch_muon():
    """Our Muon is torch's (match_rms_adamw) with the Newton-Schulz iterations in float32:
    the same update up to torch's bfloat16 rounding."""
    g = torch.Generator().manual_seed(0)
    weights = [torch.randn(96, 32, generator=g), torch.randn(32, 128, generator=g)]
    ours = [w.clone().requires_grad_() for w in weights]
    theirs = [w.clone().requires_grad_() for w in weights]
    ours_opt = Muon(ours, lr=0.02, momentum=0.9, weight_decay=0.1)
    theirs_opt = torch.optim.Muon(theirs, lr=0.02, momentum=0.9, weight_decay=0.1, adjust_lr_fn="match_rms_adamw")
    for _ in range(3):
        grads = [torch.randn(w.shape, generator=g) for w in weights]
        for params, opt in ((ours, ours_opt), (theirs, theirs_opt)):
            for p, grad in zip(params, grads):
                p.grad = grad.clone()
            opt.step()
    for w, a, b in zip(weights, ours, theirs):
        ours_step, theirs_step = (a - w).detach(), (b - w).detach()
        assert (ours_step - theirs_step).norm() < 0.02 * theirs_step.norm()


def test_muon_orthogonalizes_the_matrices_of_one_shape_together(monkeypatch):
    """One Newton-Schulz batch per shape, giving each matrix the step it would get alone."""
    g = torch.Generator().manual_seed(0)
    shapes = [(96, 32), (32, 128), (96, 32), (96, 32), (32, 128)]
    weights = [torch.randn(shape, generator=g) for shape in shapes]
    params = [w.clone().requires_grad_() for w in weights]
    opt = Muon(params, lr=0.02, momentum=0.9, weight_decay=0.1)
    batches = []
    monkeypatch.setattr(training.optim, "orthogonalize", lambda x: (batches.append(tuple(x.shape)), orthogonalize(x))[1])
    expected, buffers = [w.clone() for w in weights], [torch.zeros_like(w) for w in weights]
    for _ in range(2):
        grads = [torch.randn(w.shape, generator=g) for w in weights]
        for p, grad in zip(params, grads):
            p.grad = grad.clone()
        opt.step()
        for i, grad in enumerate(grads):  # each matrix on its own, as the algorithm is written
            buffers[i].lerp_(grad, 1 - 0.9)
            update = orthogonalize(grad.lerp(buffers[i], 0.9))
            expected[i] = expected[i] * (1 - 0.02 * 0.1) - 0.02 * 0.2 * math.sqrt(max(shapes[i])) * update
    assert batches == [(3, 96, 32), (2, 32, 128)] * 2
    for p, e in zip(params, expected):
        torch.testing.assert_close(p.detach(), e, atol=1e-6, rtol=1e-5)


def test_orthogonalize_flattens_the_singular_values():
    g = torch.randn(64, 16, generator=torch.Generator().manual_seed(0)) @ torch.diag(torch.logspace(-1, 1, 16))
    assert torch.linalg.svdvals(g).max() / torch.linalg.svdvals(g).min() > 50  # spread over 2 decades
    s = torch.linalg.svdvals(orthogonalize(g))
    assert s.min() > 0.6 and s.max() < 1.25  # all of them brought near 1 (the quintic's band)
    u, _, vt = torch.linalg.svd(g, full_matrices=False)
    cosine = (orthogonalize(g) * (u @ vt)).sum() / (orthogonalize(g).norm() * (u @ vt).norm())
    assert cosine > 0.95  # and close to U Vᵀ


def test_a_resume_may_keep_its_token_files_elsewhere(tmp_path, micro, capsys):
    """data.cache_dir says where the token files are kept, not what they hold: moving them
    does not make another run."""
    assert train.main(["--config", TINY, *micro("train.max_iters=4", "train.sample_tokens=0")]) == 0
    moved = micro("train.max_iters=6", "train.sample_tokens=0", f"data.cache_dir={tmp_path / 'elsewhere'}")
    assert train.main(["--config", TINY, *moved]) == 0
    assert "resuming at iteration 4" in capsys.readouterr().out


def test_training_samples_are_drawn_at_temperature_0_8_in_the_runs_dtype(micro, monkeypatch):
    trainer = make_trainer(micro, dtype=torch.bfloat16)
    seen, real_generate = [], GPT.generate
    monkeypatch.setattr(GPT, "generate", lambda self, idx, n, **kw: (
        seen.append((kw["temperature"], torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu"))),
        real_generate(self, idx, n, **kw))[1])
    trainer.evaluator.sample(trainer.eval_model)
    assert seen == [(0.8, torch.bfloat16)]


def test_training_samples_are_the_same_at_every_evaluation_of_the_same_weights(micro):
    """Samples draw from their own generator (seed 0), so a change in the text between two
    evaluations comes from the weights, not from the random stream."""
    trainer = make_trainer(micro)
    first = trainer.evaluator.sample(trainer.eval_model)
    torch.rand(1000)  # the training step's random numbers come from the global stream
    assert trainer.evaluator.sample(trainer.eval_model) == first


def test_a_checkpoint_without_a_recorded_setup_is_refused_by_name(tmp_path, micro, capsys):
    """A trainer_state.pt of another program (or an older one) lacks the setup it trained
    with, or a part of it: the run stops with the one-line message, naming what is missing."""
    assert train.main(["--config", TINY, *micro("train.max_iters=2", "train.sample_tokens=0")]) == 0
    capsys.readouterr()  # (the data preparation's lines, when this test is the first to use the corpus)
    state_file = tmp_path / "run" / "trainer_state.pt"
    state = torch.load(state_file, weights_only=True)
    for identity, named in ((None, "lacks identity: it is damaged"), ({"model": state["identity"]["model"]},
                                                                      "data.source: checkpoint None")):
        if identity is None:
            del state["identity"]
        else:
            state["identity"] = identity
        torch.save(state, state_file)
        assert train.main(["--config", TINY, *micro("train.max_iters=4")]) == 2
        err = capsys.readouterr().err
        assert named in err and err.count("\n") == 1


def test_the_validation_figure_is_the_same_for_any_layout_of_the_batch(micro):
    """One process of batch 16, one of 8 × grad_accum 2, and each of two processes of 8:
    the same validation windows, so the same figure (before, the sample was eval_iters ×
    the per-process batch: two processes of 8 printed 6.0986 where one of 16 printed 5.9997)."""
    whole = make_trainer(micro, "train.batch_size=16", "train.eval_iters=3")
    accumulated = make_trainer(micro, "train.batch_size=8", "train.grad_accum=2", "train.eval_iters=3")
    a, b = whole.evaluator, accumulated.evaluator
    assert len(a.val[0]) == len(b.val[0]) == 48 and torch.equal(a.val[0], b.val[0])
    expected = a.loss(whole.model, a.val)
    assert b.loss(accumulated.model, b.val) == pytest.approx(expected, abs=1e-6)
    # (two real processes, each scoring its half: test_two_processes_train_to_rank_0s_end_and_...)
    assert make_trainer(micro, "train.eval_windows=5").evaluator.val[0].shape == (5, 32)


def test_the_suggested_prompt_is_one_the_model_can_read(tmp_path, capsys):
    """A char model of a Chinese text never saw "ROMEO:": the last line suggests the start
    of its validation text, which generate.py takes, and the export's model card does too."""
    import export
    import generate

    text = "".join(f"第{i}天：今天天气很好，我们去公园散步。\n" for i in range(1, 400))
    (tmp_path / "zh.txt").write_text(text, encoding="utf-8")
    args = [f"data.source={tmp_path / 'zh.txt'}", f"data.cache_dir={tmp_path / 'cache'}", "data.tokenizer=char",
            "model.n_layer=1", "model.n_head=2", "model.n_embd=16", "model.block_size=16", "train.batch_size=4",
            "train.max_iters=4", "train.eval_interval=4", "train.eval_iters=1", "train.sample_tokens=0",
            "train.max_minutes=null", "train.dtype=float32", "train.threads=1", f"out_dir={tmp_path / 'zh'}"]
    assert train.main(["--config", TINY, *args]) == 0
    hint = capsys.readouterr().out.splitlines()[-1]
    prompt = re.fullmatch(rf'try it: python generate.py --checkpoint {tmp_path / "zh"} --prompt "(.+)"', hint).group(1)
    assert prompt.startswith("第") and prompt in text and "ROMEO" not in prompt
    assert generate.main(["--checkpoint", str(tmp_path / "zh"), "--prompt", prompt, "--max-new-tokens", "3"]) == 0
    assert export.main(["--checkpoint", str(tmp_path / "zh"), "--out", str(tmp_path / "hf")]) == 0
    assert f'({prompt!r}, max_new_tokens=100)' in (tmp_path / "hf" / "README.md").read_text(encoding="utf-8")


def test_raising_max_iters_continues_at_the_floor_and_says_so(tmp_path, micro, capsys):
    """A finished run whose max_iters is raised trains on at min_lr (before, the cosine
    was stretched again and the rate jumped up: 2.0e-4 at 200, 3.1e-4 at 210)."""
    settings = ["train.lr=0.01", "train.min_lr=0.001", "train.log_interval=1", "train.sample_tokens=0"]
    assert train.main(["--config", TINY, *micro("train.max_iters=20", *settings)]) == 0
    capsys.readouterr()
    assert train.main(["--config", TINY, *micro("train.max_iters=30", *settings)]) == 0
    out = capsys.readouterr().out
    assert ("continuing: the learning rate's decay now ends at iteration 30 (it ended at 20); it goes on from "
            "1.00e-03 along the rest of its curve, so it does not jump (docs/usage.md)") in out
    lrs = scalars(tmp_path / "run", "train/lr")
    assert [lrs[i] for i in range(21, 31)] == pytest.approx([0.001] * 10)


def scalars(run_dir, tag):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    events.Reload()
    return {e.step: e.value for e in events.Scalars(tag)}


def run_weights(run_dir):
    return load_file(str(run_dir / "model.safetensors"))


def test_weight_decay_falls_on_the_matrices_alone(micro):
    adamw = make_trainer(micro, "train.weight_decay=0.3", "train.optimizer=adamw", out="adamw")
    assert [group["weight_decay"] for group in adamw.optimizers[0].param_groups] == [0.3, 0.0]  # (torch's default: 0.01)
    muon = make_trainer(micro, "train.weight_decay=0.3", "train.optimizer=muon", out="muon")
    assert [[group["weight_decay"] for group in o.param_groups] for o in muon.optimizers] == [[0.3], [0.0]]


def test_a_trainer_state_of_an_earlier_layout_is_refused_by_name(tmp_path, micro, capsys):
    """A checkpoint of an earlier version of the project cannot be resumed (its model still
    generates and exports): one line says so and how to start over."""
    assert train.main(["--config", TINY, *micro("train.max_iters=2", "train.sample_tokens=0")]) == 0
    state_file = tmp_path / "run" / "trainer_state.pt"
    state = torch.load(state_file, weights_only=True)
    del state["format"]
    torch.save(state, state_file)
    capsys.readouterr()
    assert train.main(["--config", TINY, *micro("train.max_iters=4")]) == 2
    err = capsys.readouterr().err
    assert err == (f"error: {state_file} was written by an earlier version of this project and cannot be resumed "
                   "(its model still generates and exports); add --fresh to start over, or set out_dir=PATH\n")
    # layout 2 (before the run's state was a type) holds the same fields, and resumes
    state["format"] = 2
    del state["threads"]  # (added with layout 3, with a default)
    torch.save(state, state_file)
    assert train.main(["--config", TINY, *micro("train.max_iters=4")]) == 0
    assert "resuming at iteration 2" in capsys.readouterr().out
    # a state that lacks a field without a default is damaged: said by name
    state = torch.load(state_file, weights_only=True)
    del state["losses"], state["tokens_seen"]
    torch.save(state, state_file)
    assert train.main(["--config", TINY, *micro("train.max_iters=6")]) == 2
    assert capsys.readouterr().err == (f"error: {state_file} lacks losses, tokens_seen: it is damaged; add --fresh "
                                       "to start over, or set out_dir=PATH\n")


def test_one_step_with_its_defaults_is_the_five_steps_written_out():
    """training/step.train_step with its defaults (one micro-batch, the gradient's norm
    clipped to 1.0, the model itself called, no loss scaling): the weights after it are
    those of the steps written out by hand, bit for bit."""
    import copy

    from training.step import StepSetup, train_step

    def Constant():  # (a schedule: the same rate at every iteration, 0.5 of the optimizer's peak of 1.0)
        return Schedule(warmup=0, decay_iters=100, floor=1.0, momentum_peak=0.0)  # (SGD has a momentum: none)

    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=20, block_size=8, n_layer=1, n_head=2, n_embd=16))
    by_hand = copy.deepcopy(model)
    batches = [(torch.randint(0, 20, (4, 8)), torch.randint(0, 20, (4, 8)), None) for _ in range(2)]
    drawn = iter(batches)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    optimizer.param_groups[0]["initial_lr"] = 0.5  # (the peak the schedule scales)
    result = train_step(0, Constant(), StepSetup(model, lambda: next(drawn), [optimizer]))

    _, loss = by_hand(*batches[0])
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(by_hand.parameters(), 1.0)
    assert norm > 1  # (a norm the clip changes)
    torch.optim.SGD(by_hand.parameters(), lr=0.5).step()
    assert result.lr == 0.5 and result.loss == loss.detach() and result.grad_norm == norm
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), by_hand.parameters()))
    # two micro-batches, no clip: the gradient of the mean of their losses
    drawn = iter(batches)
    result = train_step(1, Constant(), StepSetup(model, lambda: next(drawn), [optimizer], grad_accum=2, grad_clip=0.0))
    by_hand.zero_grad()
    loss = sum(by_hand(*batch)[1] for batch in batches) / 2
    loss.backward()
    torch.optim.SGD(by_hand.parameters(), lr=0.5).step()
    torch.testing.assert_close(result.loss, loss.detach(), atol=1e-6, rtol=0)
    for a, b in zip(model.parameters(), by_hand.parameters()):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)


def test_a_resume_that_turns_the_average_on_starts_it_from_the_weights(micro):
    """train.ema set on a resume of a run that kept no average: the average starts as the
    weights the run resumes with."""
    assert train.main(["--config", TINY, *micro("train.max_iters=2", "train.ema=0", "train.sample_tokens=0")]) == 0
    trainer = make_trainer(micro, "train.max_iters=4", "train.ema=0.9", "train.sample_tokens=0")
    assert trainer.iteration == 2 and trainer.average is not None
    assert all(torch.equal(trainer.eval_model.state_dict()[name], weight)
               for name, weight in trainer.model.state_dict().items())


@pytest.mark.parametrize("ema, weights", [("0", "trained"), ("0.9", "average")])
def test_the_summary_says_the_seconds_the_threads_and_which_weights(micro, monkeypatch, ema, weights):
    """summary.json: the training's seconds (to 0.1 s), the thread count and the seconds lost
    to trying the other (to 0.01 s), and whether the saved weights are the average."""
    trainer = make_trainer(micro, "train.max_iters=2", f"train.ema={ema}", "train.sample_tokens=0")
    assert trainer.fit() == 0
    monkeypatch.setattr(trainer.budget, "seconds_used", lambda: 12.3456)
    trainer.threads.lost = 0.98765
    summary = trainer.summary()
    assert (summary["seconds"], summary["weights"]) == (12.3, weights)
    assert summary["threads"] == {"count": torch.get_num_threads(), "tried_seconds": 0.99}


def test_the_time_budget_counts_what_preparing_the_run_took(micro):
    """The quick start's five minutes include data preparation: the budget starts with the
    seconds prepare_run measured."""
    import dataclasses

    from training.config import load_config

    run = training.preparation.prepare_run(load_config(ROOT / "configs" / "tiny.yaml", micro()))
    trainer = Trainer(dataclasses.replace(run, seconds=100.0), torch.device("cpu"), torch.float32)
    assert 100.0 <= trainer.budget.seconds_used() < 160.0


def test_an_infinite_gradient_stops_a_float32_run(micro):
    """In float32 there is no loss scaling to skip a bad step: a gradient norm that is not
    finite, under a finite loss, stops the run with the last good checkpoint kept."""
    trainer = make_trainer(micro, "train.max_iters=4", "train.sample_tokens=0")
    assert not trainer.setup.scaler.is_enabled()
    trainer.model.lm_head.weight.register_hook(lambda grad: grad * math.inf)
    with pytest.raises(training.trainer.TrainingError, match=r"\(gradient norm (inf|nan)\) at iteration 1"):
        trainer.fit()


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_a_head_held_off_writes_nothing_from_the_first_step_to_the_saved_model(micro, tmp_path, optimizer):
    """train.heads_off: the head's columns of W_O are zero at step 0 and stay zero through
    AdamW's and Muon's steps (with weight decay), so the saved model is the one trained; the
    other heads train; a resume goes on exactly; a resume with other heads off is refused."""
    held = ["train.heads_off=[L1H0]", f"train.optimizer={optimizer}", "train.weight_decay=0.1"]
    trainer = make_trainer(micro, *held)
    d = trainer.model.config.head_size
    w_o = lambda model, l: model.transformer.h[l].attn.c_proj.weight  # noqa: E731
    assert not w_o(trainer.model, 1)[:, :d].any()
    steps = run_steps(trainer, 4)
    assert not steps[-1]["grads"]["transformer.h.1.attn.c_proj.weight"][:, :d].any()
    saved = run_weights(tmp_path / "run")
    assert not saved["transformer.h.1.attn.c_proj.weight"][:, :d].any()
    assert saved["transformer.h.1.attn.c_proj.weight"][:, d:].abs().min() > 0  # (the others trained)
    assert saved["transformer.h.0.attn.c_proj.weight"][:, :d].abs().min() > 0
    assert train.main(["--config", TINY, *micro(*held, "train.max_iters=8", out="straight")]) == 0
    assert train.main(["--config", TINY, *micro(*held, "train.max_iters=4", out="resumed")]) == 0
    assert train.main(["--config", TINY, *micro(*held, "train.max_iters=8", out="resumed")]) == 0
    straight, resumed = run_weights(tmp_path / "straight"), run_weights(tmp_path / "resumed")
    assert all(torch.equal(straight[name], resumed[name]) for name in straight)
    other = [*held[1:], "train.heads_off=[L1H1]", "train.max_iters=12"]
    assert train.main(["--config", TINY, *micro(*other, out="resumed")]) == 2


@pytest.mark.parametrize("heads, said", [("[L9H0]", "names L9H0, but the model has 2 layers of 2 heads (L0H0 to L1H1)"),
                                         ("[0.1]", "train.heads_off=[0.1]: must be a list of heads, each L<layer>H<head>")])
def test_heads_held_off_are_named_as_the_model_has_them(micro, capsys, heads, said):
    assert train.main(["--config", TINY, *micro(f"train.heads_off={heads}")]) == 2
    assert said in capsys.readouterr().err


def test_a_run_with_heads_held_off_is_not_told_to_train_on_as_if_it_failed(micro, capsys):
    """A run whose loss barely fell with heads held off (train.heads_off) may be measuring what
    those heads are for: the done line says which were held off, and does not tell it to train on."""
    still = ["train.optimizer=adamw", "train.lr=1e-7", "train.min_lr=1e-8", "train.warmup_iters=0", "train.max_iters=10",
             "train.sample_tokens=0"]
    assert make_trainer(micro, *still, "train.heads_off=[L0H1]").fit() == 0
    said = capsys.readouterr().out
    assert "with L0H1 held off from step 0 (train.heads_off)" in said and "Train it on" not in said
    assert make_trainer(micro, *still, out="plain").fit() == 0
    assert "Train it on: python train.py" in capsys.readouterr().out
