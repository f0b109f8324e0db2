"""The Trainer's pieces: gradient accumulation (and DDP's no_sync), clipping, bf16
autocast, compile, the learning-rate schedule, and a fast bit-identical resume."""

import signal
import sys
from contextlib import contextmanager
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file

import train
from common import checkpoint
from common.device import resolve_dtype
from data.tokenizer import UNK
from conftest import ROOT, favour_token
from model import GPT
from training.config import TrainConfig, load_config
from training.distributed import Distributed
from training.optim import Muon, learning_rate, lr_factor, muon_momentum, orthogonalize
from training.trainer import Trainer

TINY = str(ROOT / "configs" / "tiny.yaml")


def make_trainer(micro, *extra: str, dtype=torch.float32) -> Trainer:
    return Trainer(load_config(TINY, micro(*extra)), torch.device("cpu"), dtype)


def gradients(trainer: Trainer) -> dict[str, torch.Tensor]:
    return {name: p.grad.clone() for name, p in trainer.model.named_parameters()}


def test_gradient_accumulation_equals_one_big_batch(micro):
    """4 × 2 micro-batches give the gradients of one batch of 8 (the sampler draws the
    same 8 windows either way)."""
    whole = make_trainer(micro, "train.batch_size=8")
    split = make_trainer(micro, "train.batch_size=4", "train.grad_accum=2")
    assert whole.compute_gradients() == pytest.approx(split.compute_gradients(), abs=1e-5)
    expected, accumulated = gradients(whole), gradients(split)
    for name, grad in expected.items():
        torch.testing.assert_close(accumulated[name], grad, atol=1e-6, rtol=1e-4)


class FakeDDP:
    """Stands in for DistributedDataParallel: records, for each forward and backward,
    whether the gradients would be averaged across processes (outside no_sync)."""

    def __init__(self, module: torch.nn.Module):
        self.module, self.syncing, self.forwards, self.backwards = module, True, [], []
        next(module.parameters()).register_hook(lambda grad: self.backwards.append(self.syncing))

    def __call__(self, *args):
        self.forwards.append(self.syncing)
        return self.module(*args)

    @contextmanager
    def no_sync(self):
        self.syncing = False
        try:
            yield
        finally:
            self.syncing = True


def test_ddp_averages_gradients_only_after_the_last_micro_batch(micro):
    trainer = make_trainer(micro, "train.grad_accum=3")
    trainer.dist = Distributed(rank=0, world_size=2)
    trainer.train_model = ddp = FakeDDP(trainer.model)
    trainer.compute_gradients()
    assert ddp.forwards == ddp.backwards == [False, False, True]


def test_grad_clip(micro):
    free = make_trainer(micro, "train.grad_clip=0")  # 0: no clipping
    free.compute_gradients()
    before = gradients(free)
    norm = free.clip_gradients()
    assert norm == pytest.approx(torch.cat([g.flatten() for g in before.values()]).norm().item(), rel=1e-5)
    assert all(torch.equal(before[name], grad) for name, grad in gradients(free).items())
    clipped = make_trainer(micro, "train.grad_clip=0.01")
    clipped.compute_gradients()
    assert clipped.clip_gradients() == pytest.approx(norm, rel=1e-5)  # the norm before clipping
    after = torch.cat([g.flatten() for g in gradients(clipped).values()]).norm().item()
    assert after == pytest.approx(0.01, rel=1e-4)


def test_bfloat16_autocast_on_cpu(micro):
    assert resolve_dtype("bfloat16", torch.device("cpu"), training=True) == torch.bfloat16
    trainer = make_trainer(micro, dtype=torch.bfloat16)
    outputs = []
    trainer.model.lm_head.register_forward_hook(lambda module, args, out: outputs.append(out.dtype))
    losses = [trainer.step()[0] for _ in range(20)]
    assert set(outputs) == {torch.bfloat16}  # the matmuls ran in bf16 ...
    assert trainer.model.lm_head.weight.dtype == torch.float32  # ... on float32 weights
    assert losses[-1] < losses[0] - 0.5


def test_the_step_uses_the_schedule(micro):
    trainer = make_trainer(micro, "train.warmup_iters=5", "train.lr=0.01")
    for it in range(3):
        _, _, lr = trainer.step()
        assert lr == learning_rate(it, trainer.tc) == pytest.approx(0.01 * (it + 1) / 6)
        groups = [group for optimizer in trainer.optimizers for group in optimizer.param_groups]
        assert [group["lr"] for group in groups] == pytest.approx([group["initial_lr"] * lr / 0.01 for group in groups])


def test_learning_rate_schedule_exact_values():
    cfg = TrainConfig(max_iters=100, lr=2.0, min_lr=0.2, warmup_iters=10)
    assert [learning_rate(i, cfg) for i in (0, 9, 10)] == pytest.approx([2 / 11, 20 / 11, 2.0])
    assert learning_rate(55, cfg) == pytest.approx(1.1)  # half way: cos(π/2) = 0
    assert learning_rate(100, cfg) == learning_rate(150, cfg) == pytest.approx(0.2)
    early = TrainConfig(max_iters=100, lr=1.0, min_lr=0.1, warmup_iters=10, lr_decay_iters=50)
    assert learning_rate(30, early) == pytest.approx(0.55)
    assert learning_rate(50, early) == learning_rate(80, early) == 0.1


def test_warmup_stable_decay_schedule_exact_values():
    cfg = TrainConfig(max_iters=100, lr=1.0, min_lr=0.1, warmup_iters=10, lr_schedule="wsd", cooldown=0.4)
    assert learning_rate(5, cfg) == pytest.approx(6 / 11)  # the same warmup
    assert learning_rate(10, cfg) == learning_rate(60, cfg) == 1.0  # stable until the last 40%
    assert learning_rate(80, cfg) == pytest.approx(0.55)  # half way down a straight line to 0.1
    assert learning_rate(99, cfg) == pytest.approx(0.1225)
    assert learning_rate(100, cfg) == learning_rate(130, cfg) == 0.1
    whole = TrainConfig(max_iters=100, lr=1.0, min_lr=0.0, warmup_iters=10, lr_schedule="wsd", cooldown=1.0)
    assert learning_rate(10, whole) == 1.0 and learning_rate(55, whole) == pytest.approx(0.5)  # decays after warmup


def test_muon_momentum_rises_over_its_warmup(micro):
    trainer = make_trainer(micro, "train.optimizer=muon", "train.muon_momentum_warmup=10", "train.muon_momentum=0.95")
    momenta = []
    for _ in range(12):
        trainer.step()
        momenta.append(trainer.optimizers[0].param_groups[0]["momentum"])
    assert momenta[:2] == pytest.approx([0.85, 0.86]) and momenta[5] == pytest.approx(0.90)
    assert momenta[10:] == [0.95, 0.95] == [muon_momentum(i, trainer.tc) for i in (10, 11)]
    assert all("momentum" not in group for group in trainer.optimizers[1].param_groups)  # AdamW's betas stay


def test_the_weights_average_is_what_is_evaluated_sampled_and_saved(micro, tmp_path):
    trainer = make_trainer(micro, "train.ema=0.9")
    for _ in range(5):
        average = [p.detach().clone() for p in trainer.ema_model.parameters()]
        trainer.step()
        for old, weight, new in zip(average, trainer.model.parameters(), trainer.ema_model.parameters()):
            assert torch.allclose(new, 0.9 * old + 0.1 * weight, atol=1e-7)
    x, y = trainer.val_batches[0]
    with torch.no_grad():
        averaged, trained = trainer.ema_model(x, y)[1].item(), trainer.model(x, y)[1].item()
    assert averaged != trained
    assert trainer.evaluate(trainer.val_batches[:1]) == pytest.approx(averaged)
    (tmp_path / "run").mkdir()  # (fit() makes it)
    trainer.save()
    saved = run_weights(tmp_path / "run")
    assert all(torch.equal(saved[n], p) for n, p in trainer.ema_model.state_dict().items() if n in saved)
    state = torch.load(tmp_path / "run" / "trainer_state.pt", weights_only=True)
    assert all(torch.equal(state["model"][n], p) for n, p in trainer.model.state_dict().items())  # resumes these


def run_weights(run_dir):
    return load_file(str(run_dir / "model.safetensors"))


@pytest.mark.parametrize("optimizer", ["adamw", "muon train.ema=0.9 train.muon_momentum_warmup=15"])
def test_resume_after_a_stop_is_bit_identical(tmp_path, micro, monkeypatch, optimizer):
    """A run that dies right after its checkpoint of iteration 10, with dropout on, and
    is run again ends with exactly the weights of a run never stopped: the batch
    sampler, every RNG, the optimizers' states and the weights' average are restored."""
    settings = ["train.max_iters=20", "train.checkpoint_interval=5", "train.eval_interval=10",
                "model.dropout=0.1", "train.sample_tokens=0", *f"train.optimizer={optimizer}".split()]
    assert train.main(["--config", TINY, *micro(*settings, out="straight")]) == 0
    real_save = checkpoint.save_run

    def save_then_die(out_dir, model, tokenizer, state):
        real_save(out_dir, model, tokenizer, state)
        if state["iter"] == 10:
            raise KeyboardInterrupt  # as if killed right after writing it

    monkeypatch.setattr(checkpoint, "save_run", save_then_die)
    assert train.main(["--config", TINY, *micro(*settings, out="stopped")]) == 130
    monkeypatch.undo()
    assert torch.load(tmp_path / "stopped" / "trainer_state.pt", weights_only=True)["iter"] == 10
    assert train.main(["--config", TINY, *micro(*settings, out="stopped")]) == 0
    straight, resumed = run_weights(tmp_path / "straight"), run_weights(tmp_path / "stopped")
    assert all(torch.equal(straight[name], resumed[name]) for name in straight)


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


def test_orthogonalize_flattens_the_singular_values():
    g = torch.randn(64, 16, generator=torch.Generator().manual_seed(0)) @ torch.diag(torch.logspace(-1, 1, 16))
    assert torch.linalg.svdvals(g).max() / torch.linalg.svdvals(g).min() > 50  # spread over 2 decades
    s = torch.linalg.svdvals(orthogonalize(g))
    assert s.min() > 0.6 and s.max() < 1.25  # all of them brought near 1 (the quintic's band)
    u, _, vt = torch.linalg.svd(g, full_matrices=False)
    cosine = (orthogonalize(g) * (u @ vt)).sum() / (orthogonalize(g).norm() * (u @ vt).norm())
    assert cosine > 0.95  # and close to U Vᵀ


def test_muon_trains_the_block_matrices_and_adamw_the_rest(micro):
    trainer = make_trainer(micro, "train.optimizer=muon", "train.muon_lr=0.05", "train.weight_decay=0")
    muon, adamw = trainer.optimizers
    assert isinstance(muon, Muon) and isinstance(adamw, torch.optim.AdamW)
    names = {id(p): n for n, p in trainer.model.named_parameters()}
    in_muon = {names[id(p)] for g in muon.param_groups for p in g["params"]}
    in_adamw = {names[id(p)] for g in adamw.param_groups for p in g["params"]}
    assert in_muon == {n for n, p in trainer.model.named_parameters() if p.dim() == 2 and ".h." in n}
    assert in_muon | in_adamw == set(names.values()) and not in_muon & in_adamw
    assert "transformer.wte.weight" in in_adamw  # the embedding, and through tying the LM head
    losses = [trainer.step()[0] for _ in range(15)]
    assert losses[-1] < losses[0] - 0.5
    assert muon.param_groups[0]["lr"] == pytest.approx(0.05 * lr_factor(14, trainer.tc))  # the same schedule


@pytest.mark.slow
def test_compiled_training_matches_eager(micro):
    eager = make_trainer(micro)
    compiled = make_trainer(micro, "train.compile=true")
    assert compiled.train_model is not compiled.model
    for _ in range(3):
        assert compiled.step()[0] == pytest.approx(eager.step()[0], abs=1e-4)


def test_time_budget_is_refit_from_the_measured_pace(micro, monkeypatch):
    trainer = make_trainer(micro, "train.max_minutes=1", "train.max_iters=100000")
    trainer.log = SimpleNamespace(retarget=lambda max_iters: None)
    trainer.started, trainer.iteration_cap, trainer.eval_seconds = 0.0, 100000, 2.0
    trainer.budget_mark, trainer.it = (10.0, 12), 112  # 100 iterations in the 10 s since the first estimate
    monkeypatch.setattr(Trainer, "clock", lambda self: 20.0)
    trainer.refit_budget()
    assert trainer.tc.max_iters == 112 + (60 - 20 - 2) / 0.1  # 38 s left at 0.1 s per iteration
    trainer.iteration_cap = 300
    trainer.refit_budget()
    assert trainer.tc.max_iters == 300  # the configured max_iters stays an upper bound


def test_time_budget_sets_max_iters_once(tmp_path, micro, capsys, monkeypatch):
    settings = ["train.max_minutes=1", "train.max_iters=1000000", "train.sample_tokens=0"]
    refits, refit = [], Trainer.refit_budget
    FakeClock(monkeypatch)  # 1 s a step, 5 s an evaluation
    monkeypatch.setattr(Trainer, "refit_budget", lambda self: (refits.append(self.it), refit(self)))
    assert train.main(["--config", TINY, *micro(*settings)]) == 0
    assert refits and all(it % 10 == 0 for it in refits)  # at each evaluation (eval_interval=10)
    monkeypatch.undo()
    out = capsys.readouterr().out
    state = torch.load(tmp_path / "run" / "trainer_state.pt", weights_only=True)
    assert 12 < state["max_iters"] == state["iter"] < 1000000
    # the first estimate, at iteration 12: 10 steps and the evaluation at 10 took 15 s since
    # iteration 2 (1.5 s an iteration), plus an evaluation's 5 s shared by the 10 iterations
    # between evaluations: 2 s an iteration; 22 s are spent and 5 s kept for the last
    # evaluation, so 33 s buy 16 more iterations
    assert ("time budget 1 min: 1500 ms per iteration, 5.0 s per evaluation and checkpoint; training to "
            "iteration 28\n") in out
    assert f"done: {state['iter']} iterations" in out
    assert train.main(["--config", TINY, *micro(*settings)]) == 0  # the measured max_iters is kept
    assert f"already holds a finished run of {state['iter']} iterations" in capsys.readouterr().out


def test_a_terminals_progress_bar_ends_at_the_iterations_the_budget_allows(tmp_path, micro, capsys, monkeypatch):
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    FakeClock(monkeypatch)  # 1 s a step, 5 s an evaluation
    settings = ["train.max_minutes=1", "train.max_iters=1000000", "train.sample_tokens=0"]
    assert train.main(["--config", TINY, *micro(*settings)]) == 0
    done = torch.load(tmp_path / "run" / "trainer_state.pt", weights_only=True)["iter"]
    assert f" {done}/{done} [" in capsys.readouterr().err  # not 1000000, not a bar without an end


class FakeClock:
    """The trainer's clock, advanced by the work done instead of by wall time: each
    optimizer step takes 1 s and each evaluation 5 s, on any machine."""

    def __init__(self, monkeypatch, stop_at: int | None = None):
        self.now = 0.0
        step, evaluate = Trainer.step, Trainer.evaluate_and_log

        def timed_step(trainer):
            result = step(trainer)
            self.now += 1.0
            if trainer.it == stop_at:
                trainer.stop_signal = signal.SIGINT  # as a Ctrl-C after this iteration
            return result

        def timed_evaluation(trainer):
            evaluate(trainer)
            self.now += 5.0

        monkeypatch.setattr(Trainer, "clock", lambda trainer: self.now)
        monkeypatch.setattr(Trainer, "step", timed_step)
        monkeypatch.setattr(Trainer, "evaluate_and_log", timed_evaluation)



BUDGET = ["train.max_minutes=2", "train.max_iters=400", "train.eval_interval=20", "train.sample_tokens=0"]


@pytest.mark.parametrize("stop_at", [5, 15, 30], ids=["before-the-estimate", "before-its-checkpoint", "after-it"])
def test_a_time_budget_covers_the_whole_run_across_a_resume(tmp_path, micro, monkeypatch, stop_at):
    """The first estimate comes at iteration 12 (and saves), the next checkpoint at 20. A run
    stopped anywhere and resumed ends within the same 2 minutes as a run never stopped,
    after about as many iterations; the checkpoint carries the seconds used."""
    FakeClock(monkeypatch)
    assert make_trainer(micro, *BUDGET).fit() == 0
    whole = checkpoint.load_state(tmp_path / "run")
    assert 60 < whole["iter"] < 120 and 110 <= whole["seconds"] <= 125

    stopped = [*BUDGET, f"out_dir={tmp_path / 'stopped'}"]
    clock = FakeClock(monkeypatch, stop_at=stop_at)
    assert make_trainer(micro, *stopped).fit() == 128 + signal.SIGINT
    state = checkpoint.load_state(tmp_path / "stopped")
    assert state["iter"] == stop_at and state["seconds"] == clock.now
    resumed_clock = FakeClock(monkeypatch)
    resumed_clock.now = clock.now  # the resumed process: the clock goes on
    assert make_trainer(micro, *stopped).fit() == 0
    resumed = checkpoint.load_state(tmp_path / "stopped")
    assert 110 <= resumed["seconds"] == resumed_clock.now <= 125  # both processes' seconds, within the budget
    assert abs(resumed["iter"] - whole["iter"]) <= 12
    assert make_trainer(micro, *stopped).fit() == 0  # finished: nothing more to train
    assert checkpoint.load_state(tmp_path / "stopped")["iter"] == resumed["iter"]
    longer = FakeClock(monkeypatch)
    longer.now = resumed_clock.now
    assert make_trainer(micro, *stopped, "train.max_minutes=3").fit() == 0  # a raised budget: a minute more
    state = checkpoint.load_state(tmp_path / "stopped")
    assert state["iter"] > resumed["iter"] and resumed["seconds"] < state["seconds"] == longer.now <= 185


def test_a_resume_whose_budget_is_spent_trains_no_more(tmp_path, micro, monkeypatch, capsys):
    settings = [*BUDGET, "train.checkpoint_interval=5"]
    FakeClock(monkeypatch, stop_at=30)
    assert make_trainer(micro, *settings).fit() == 128 + signal.SIGINT
    state = checkpoint.load_state(tmp_path / "run")
    state["seconds"] = 121.0  # the stopped run had used the whole 2 minutes
    torch.save(state, tmp_path / "run" / "trainer_state.pt")
    FakeClock(monkeypatch)
    assert make_trainer(micro, *settings).fit() == 0
    assert checkpoint.load_state(tmp_path / "run")["iter"] == 30
    assert "raise train.max_minutes to continue" in capsys.readouterr().out


def test_training_samples_are_drawn_at_temperature_0_8_in_the_runs_dtype(micro, monkeypatch):
    trainer = make_trainer(micro, dtype=torch.bfloat16)
    seen, real_generate = [], GPT.generate
    monkeypatch.setattr(GPT, "generate", lambda self, idx, n, **kw: (
        seen.append((kw["temperature"], torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu"))),
        real_generate(self, idx, n, **kw))[1])
    trainer.sample_text()
    assert seen == [(0.8, torch.bfloat16)]


def test_a_resume_may_keep_its_token_files_elsewhere(tmp_path, micro, capsys):
    """data.cache_dir says where the token files are kept, not what they hold: moving them
    does not make another run."""
    assert train.main(["--config", TINY, *micro("train.max_iters=4", "train.sample_tokens=0")]) == 0
    moved = micro("train.max_iters=6", "train.sample_tokens=0", f"data.cache_dir={tmp_path / 'elsewhere'}")
    assert train.main(["--config", TINY, *moved]) == 0
    assert "resuming at iteration 4" in capsys.readouterr().out


def test_train_compile_compiles_the_model_it_trains(micro, monkeypatch):
    compiled = []
    monkeypatch.setattr(torch, "compile", lambda model: (compiled.append(model), model)[1])  # (compiling takes 10 s)
    trainer = make_trainer(micro, "train.compile=true")
    assert compiled == [trainer.model]


def test_training_samples_never_show_unk(micro):
    trainer = make_trainer(micro)
    unk = trainer.data.tokenizer.token_to_id(UNK)
    favour_token(trainer.model, unk)
    prompt = torch.tensor([[0]])
    assert trainer.model.generate(prompt, 1, temperature=0.8)[0, -1] == unk  # what an unguarded sampler picks
    text = trainer.sample_text()
    assert UNK not in text and len(text) == len(trainer.tc.sample_prompt) + trainer.tc.sample_tokens


def test_training_samples_are_the_same_at_every_evaluation_of_the_same_weights(micro):
    """Samples draw from their own generator (seed 0), so a change in the text between two
    evaluations comes from the weights, not from the random stream."""
    trainer = make_trainer(micro)
    first = trainer.sample_text()
    torch.rand(1000)  # the training step's random numbers come from the global stream
    assert trainer.sample_text() == first


def test_a_stop_saves_and_says_how_to_continue(tmp_path, micro, monkeypatch, capsys):
    FakeClock(monkeypatch, stop_at=7)
    assert make_trainer(micro, "train.eval_interval=100").fit() == 128 + signal.SIGINT
    assert checkpoint.load_state(tmp_path / "run")["iter"] == 7
    assert (f"stopped at iteration 7; checkpoint saved in {tmp_path / 'run'}. Run the same command to continue.\n"
            in capsys.readouterr().out)


def test_a_run_that_ended_where_its_budget_said_is_finished(micro):
    """Under train.max_minutes a checkpoint at its fitted max_iters is a finished run, even
    when it used less than the budget; one saved before the fit (no max_iters recorded, as
    older checkpoints) is finished only at the configured max_iters."""
    trainer = make_trainer(micro, "train.max_minutes=2", "train.max_iters=400")
    trainer.seconds_before = 90.0
    assert trainer.budget_finished({"iter": 50, "max_iters": 50, "max_minutes": 2.0})
    assert not trainer.budget_finished({"iter": 50, "max_iters": 51, "max_minutes": 2.0})
    assert not trainer.budget_finished({"iter": 50, "max_iters": 50, "max_minutes": 1.0})  # the budget was raised
    assert not trainer.budget_finished({"iter": 50})
    assert trainer.budget_finished({"iter": 400})


def test_throughput_and_mfu_count_every_process_since_the_last_report(micro, monkeypatch):
    trainer = make_trainer(micro, "train.grad_accum=2")
    logged = []
    trainer.log = SimpleNamespace(progress=lambda *args: None, scalars=lambda it, values: logged.append(values))
    trainer.dist = Distributed(rank=0, world_size=2)  # (report itself exchanges nothing)
    trainer.peak_flops = 1e9
    trainer.tick, trainer.it = (100.0, 10), 20
    monkeypatch.setattr(Trainer, "clock", lambda self: 105.0)
    trainer.report(2.0, 1.0, 1e-3)
    tokens_per_sec = 8 * 32 * 2 * 2 * 10 / 5  # batch × T × grad_accum × processes, 10 steps in 5 s
    assert logged[0]["train/tokens_per_sec"] == tokens_per_sec
    assert logged[0]["train/mfu"] == pytest.approx(trainer.model.flops_per_token(32) * tokens_per_sec / 2 / 1e9)
    assert trainer.tick == (105.0, 20)


def test_only_the_main_process_measures_the_peak_that_mfu_divides_by(micro, monkeypatch):
    import training.trainer

    monkeypatch.setattr(training.trainer, "peak_flops", lambda device, dtype, threads: 4.2e9)
    trainer = make_trainer(micro)
    trainer.log = SimpleNamespace(text=lambda *args: None, message=lambda line: None)
    trainer.out_dir.mkdir(parents=True)
    trainer.start()
    assert trainer.peak_flops == 4.2e9
    trainer.dist = Distributed(rank=1, world_size=2)  # the others log no MFU and need no measurement
    trainer.start()
    assert trainer.peak_flops == 1.0


def test_every_process_takes_rank_0s_target(micro, monkeypatch):
    """retarget sums the targets over the processes with every other rank adding 0, so all
    of them train to rank 0's max_iters (a rank that stopped sooner would hang the others)."""
    trainer = make_trainer(micro, "train.max_minutes=1", "train.max_iters=100000")
    trainer.log = SimpleNamespace(retarget=lambda max_iters: None)
    trainer.started, trainer.iteration_cap, trainer.it = 0.0, 100000, 10
    monkeypatch.setattr(Trainer, "clock", lambda self: 0.0)
    trainer.dist = SimpleNamespace(is_main=False, sum=lambda values, device: [values[0] + 77])  # rank 0 sent 77
    trainer.retarget(1.0, 0.0)
    assert trainer.tc.max_iters == 77


def test_a_checkpoint_without_a_recorded_setup_is_refused_by_name(tmp_path, micro, capsys):
    """A trainer_state.pt of another program (or an older one) lacks the setup it trained
    with, or a part of it: the run stops with the one-line message, naming what is missing."""
    assert train.main(["--config", TINY, *micro("train.max_iters=2", "train.sample_tokens=0")]) == 0
    capsys.readouterr()  # (the data preparation's lines, when this test is the first to use the corpus)
    state_file = tmp_path / "run" / "trainer_state.pt"
    state = torch.load(state_file, weights_only=True)
    for identity, named in ((None, "model.vocab_size: checkpoint None"), ({"model": state["identity"]["model"]},
                                                                            "data.source: checkpoint None")):
        if identity is None:
            del state["identity"]
        else:
            state["identity"] = identity
        torch.save(state, state_file)
        assert train.main(["--config", TINY, *micro("train.max_iters=4")]) == 2
        err = capsys.readouterr().err
        assert f"holds a run with a different setup ({named}" in err and err.count("\n") == 1


def test_a_one_process_checkpoint_resumed_by_two_restores_its_sampler(micro, tmp_path, capsys):
    settings = ("train.max_iters=4", "train.sample_tokens=0", "train.grad_accum=2")
    assert train.main(["--config", TINY, *micro(*settings)]) == 0
    state = checkpoint.load_state(tmp_path / "run")
    trainer = make_trainer(micro, "train.max_iters=8")
    trainer.dist = Distributed(rank=0, world_size=2)  # rank 0 of 2, before it draws anything
    trainer.restore(state)
    assert trainer.tc.grad_accum == 1 and trainer.it == 4  # 2 micro-batches of one process over two
    assert trainer.sampler.generator.get_state().equal(state["ranks"][0]["sampler"]["generator"])
    assert "resuming a 1-process run with 2: train.grad_accum 2 -> 1 keeps the global batch of 16" \
        in capsys.readouterr().err
