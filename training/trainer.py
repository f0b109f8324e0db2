"""The training loop. `Trainer.fit` reads top to bottom: each iteration is one call of
training/step.py's `train_step` (the learning rate, forward and backward, clipping, the
optimizer step, the average of the weights); then, now and then, the events a `Due`
record names for that iteration: read the losses, log each head, keep a snapshot,
evaluate, save.

Each optional piece is one line in the loop. Its machinery is a small object beside it
that keeps its own state and hands it to the run's state (training/state.py) through
state_dict and load_state_dict, as torch's modules and optimizers do:

    trained     training/trained.py       what trains: every weight, or LoRA's adapters (and what is saved)
    schedule    training/schedule.py      the learning rate: warm-up, then decay (a value; a refit makes a new one)
    average     training/average.py       train.ema: the average of the weights
    budget      training/budget.py        the run's clock, and train.max_minutes (it owns max_iters)
    snapshots   training/snapshots.py     the model as it forms (train.snapshots), for explore.py
    sampler     data/batches.py           each process's random windows of tokens, or conversations (the job's corpus)
    losses      training/evaluation.py    the steps' losses, read from the device in one go
    evaluator   training/evaluation.py    the validation loss, a sample, each head's map and scores
    dist        training/distributed.py   torchrun's processes (DistributedDataParallel)
    stop        training/signals.py       Ctrl-C and SIGTERM: stop after this iteration
    threads     machine/threads.py         the thread count that trains faster now (a busy machine)
    log         training/logger.py        the progress bar, the log lines, TensorBoard
    run_dir     runs/folder.py         the checkpoint's files

What the run trains is `trained` (training/trained.py): every weight, or, with lora.rank,
LoRA's adapters beside the frozen model brought in (lora/): the loop is the same; what is
saved is the model with the adapters merged, and the adapters apart.
"""

from __future__ import annotations

import math
import signal
import time
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Callable

import torch
import yaml

from machine.device import peak_flops
from runs.folder import RunDir
from machine.threads import AdaptiveThreads
from model import GPT

from . import logger, resume
from .average import WeightAverage
from .budget import TimeBudget, refitted
from .distributed import Distributed
from .evaluation import Evaluator, StepLosses
from .logger import RunLogger
from .optim import make_optimizers
from .preparation import PreparedRun
from .recompute import recompute_in_backward
from .schedule import Schedule
from .signals import StopRequest
from .snapshots import Snapshots
from .state import TrainerState
from .step import StepResult, StepSetup, train_step
from .trained import what_trains


BARELY_TRAINED = 0.25  # a model from scratch whose loss fell by less than this share of its initial loss


class TrainingError(Exception):
    """The run cannot go on (the loss is no longer finite, the disk is full); exit code 1."""


@dataclass
class Due:
    """What the loop does after an iteration besides training, one flag an event."""

    read: bool  # read the steps' losses from the device, report them, refit the time budget
    evaluation: bool  # score the model on the fixed validation windows (a checkpoint follows)
    checkpoint: bool  # save the model and the run's state
    snapshot: bool  # keep the model in snapshots/ for the explorer's timeline


class Trainer:
    def __init__(self, run: PreparedRun, device: torch.device, dtype: torch.dtype, dist: Distributed | None = None,
                 clock: Callable[[], float] = time.perf_counter):
        dist = dist if dist is not None else Distributed()
        self.clock = clock  # the time budget's and the throughput's (a test hands one that the work advances)
        settings = run.config.train
        self.run = run
        self.settings = settings
        self.device = device
        self.dtype = dtype
        self.dist = dist
        self.run_dir = RunDir(run.config.out_dir)
        state = resume.check(self.run_dir, run, dist)  # the run's state to go on from (None: a new run)
        self.grad_accum = run.grad_accum if state is None else resume.grad_accum_for(state, dist, settings)
        self.sampler = run.data.sampler(run.model_config.block_size, settings.batch_size, settings.seed, dist.rank,
                                        dist.world_size, settings.packing)  # windows of text, or conversations
        length = min(settings.max_iters, self.iterations_for_epochs())
        self.budget = TimeBudget(settings.max_minutes, length, settings.eval_interval, self.clock,
                                 seconds_before=run.seconds)
        resume.seed_everything(settings.seed + dist.rank)
        self.model = GPT.initialised(run.model_config, settings.seed + dist.rank).to(device)  # (DDP: rank 0's for all)
        # every weight, or LoRA's adapters over the model brought in (train.init_from), which it loads
        self.trained = what_trains(self.model, run, dtype)
        # what each step lowers: the next token's cross-entropy, or the job's own (DPO: against a reference)
        self.objective = run.job.objective(run, self.model, self.trained.reference, dtype, dist.is_main)
        if settings.checkpointing:  # less memory, a forward more per block
            recompute_in_backward(self.model)
        self.optimizers = make_optimizers(self.trained.groups(), settings, device)
        self.schedule = Schedule.of(settings, length)
        self.average = WeightAverage(self.model, settings.ema) if settings.ema else None
        self.evaluator = Evaluator(run, self.grad_accum, dist, device, dtype, self.objective)
        self.snapshots = Snapshots.for_run(self.run_dir, settings.snapshots, settings.snapshot_every, self.model,
                                           dist.is_main)
        self.losses = StepLosses()
        # (a run of fixed length chooses once and keeps it, resumes included: machine/threads.py)
        self.threads = AdaptiveThreads(run.adapt_threads and device.type == "cpu", self.clock,
                                       once=settings.max_minutes is None)
        self.iteration = 0  # optimizer steps taken
        self.val_loss = math.nan
        self.best_val_loss = math.inf
        self.tokens_before = 0  # the training tokens of the run before this process went on with it
        self.changes: list[str] = []  # what going on from it changed, said when the loop starts
        if state is not None:
            self.resume(state)
        compiled = torch.compile(self.model) if settings.compile else self.model
        forward = dist.wrap(compiled, device)  # what the step calls: compiled, and/or DDP
        # what every iteration uses, built once (training/step.py)
        self.setup = StepSetup(self.model, self.sampler.next_batch, self.optimizers, self.grad_accum, settings.grad_clip,
                               device, dtype, forward, no_sync=forward.no_sync if dist.enabled else nullcontext,
                               scaler=torch.amp.GradScaler(device.type, enabled=dtype == torch.float16),  # float16 only
                               average=self.average, objective=self.objective)

    @property
    def max_iters(self) -> int:
        """Where training ends: train.max_iters (or train.epochs, if sooner), or what
        train.max_minutes fits (the budget's)."""
        return self.budget.max_iters

    def iterations_for_epochs(self) -> int | float:
        """The iterations that take train.epochs passes over the conversations (inf: unset)."""
        epochs = self.settings.epochs
        if epochs is None:
            return math.inf
        rows = self.sampler.rows_in(epochs)  # (a text's windows come in no epochs: a DataError)
        return max(1, math.ceil(rows / (self.settings.batch_size * self.grad_accum * self.dist.world_size)))

    @property
    def epochs_done(self) -> float | None:
        """The passes over the conversations so far (None: a text's windows)."""
        return self.sampler.epochs_done

    @property
    def eval_model(self) -> GPT:
        """The weights that are evaluated, sampled and saved: the average with train.ema."""
        return self.average.model if self.average is not None else self.model

    @property
    def saved_model(self) -> GPT:
        """What the run folder keeps as its model: eval_model (with LoRA, its adapters merged)."""
        return self.trained.saved(self.eval_model)

    # ---- the loop ---------------------------------------------------------------------

    def fit(self) -> int:
        """Train to max_iters (returns 0), or until Ctrl-C or SIGTERM (saves, returns 128 + the signal)."""
        if self.iteration >= self.max_iters:
            self.say_finished()
            return 0
        log = RunLogger(self.run_dir, self.dist.is_main, self.iteration, self.max_iters, self.settings.log_interval)
        with log, StopRequest() as stop:
            self.begin(log)
            self.model.train()
            while self.iteration < self.max_iters:
                # 1-5. one iteration: the rate, forward and backward, clip, step, average (training/step.py)
                step = train_step(self.iteration, self.schedule, self.setup)
                due = self.step_taken(step, stop)  # counted; what is due after it

                # 6. now and then: read the losses, look at the heads, keep a snapshot, evaluate, save
                stopping = 0
                if due.read:
                    stopping = self.read_losses(log, step.lr, stop.signal)
                if due.evaluation or due.snapshot:  # each head's attention map and scores, in TensorBoard
                    self.evaluator.log_heads(log, self.iteration, self.eval_model)
                if due.snapshot:
                    self.save_snapshot()
                if due.evaluation:
                    self.evaluate_and_save(log)
                elif due.checkpoint or stopping:
                    self.save()
                if due.evaluation or due.checkpoint or due.snapshot:
                    self.threads.pause()  # (the threads are chosen on the steps' pace alone)
                if stopping:
                    log.message(logger.stopped_message(self.iteration, self.run_dir))
                    return 128 + stopping
                if due.read:
                    self.refit(log)
            log.hparams(self.run.config.to_dict(), {"val/loss": self.val_loss, "val/best_loss": self.best_val_loss})
        self.say_done()
        return 0

    def step_taken(self, step: StepResult, stop: StopRequest) -> Due:
        """An iteration taken: counted, its loss kept (still on the device, read when due), the
        thread count and the clock told; returns the events it is due (`due`, with a stop asked
        for until now)."""
        self.iteration += 1
        self.losses.add(self.iteration, step.loss, step.grad_norm, step.figures)
        self.threads.update(self.iteration)  # one thread or all, whichever trains faster now
        self.budget.step_done(self.iteration)
        return self.due(stop.signal)

    def due(self, stop_signal: int) -> Due:
        """The events of the iteration just taken. An evaluation is due every eval_interval
        and at the end; a checkpoint with each evaluation and every checkpoint_interval; the
        losses are read before each checkpoint (a non-finite loss never reaches one), every
        log_interval, and when a signal asks to stop (under DDP, all processes read at the
        same steps)."""
        it, settings = self.iteration, self.settings
        evaluation = it % settings.eval_interval == 0 or it == self.max_iters
        checkpoint = evaluation or it % (settings.checkpoint_interval or settings.eval_interval) == 0
        read = checkpoint or it % settings.log_interval == 0 or bool(stop_signal and not self.dist.enabled)
        return Due(read=read, evaluation=evaluation, checkpoint=checkpoint,
                   snapshot=self.snapshots.due(it, self.max_iters))

    def begin(self, log: RunLogger) -> None:
        """Before the first iteration: measure the peak FLOP/s (for MFU), write config.yaml,
        print the run's header and what going on from a saved state changed, start the clocks."""
        self.peak_flops = peak_flops(self.device, self.dtype, torch.get_num_threads()) if self.dist.is_main else 1.0
        self.tick = (self.clock(), self.sampler.drawn)  # throughput is measured from here
        self.budget.begin(self.iteration)
        if not self.dist.is_main:
            return
        resolved = yaml.safe_dump(self.run.config.to_dict(self.run.model_config), sort_keys=False, allow_unicode=True)
        self.run_dir.save_run_config(resolved)
        self.run.job.save_beside(self.run_dir, self.run.data)  # (conversations: the template that renders them)
        roles = {**self.run.base.special_tokens(), **self.run.base.token_ids()} if self.run.base is not None else {}
        if roles:  # a transformers model's: an export declares them again
            self.run_dir.save_special_tokens(roles)
        log.text("config", resolved, self.iteration)
        log.text("attention/text", self.run.data.tokenizer.decode(self.evaluator.attention_ids[0].tolist()), self.iteration)
        log.message(logger.header(self.model, self.trained.count(), self.run.data, self.device, self.dtype,
                                  self.dist.world_size, self.iteration))
        log.layout_heads()
        if self.iteration == 0:  # step 0: the model at initialisation
            self.evaluator.log_heads(log, 0, self.eval_model)
            if self.snapshots.due(0, self.max_iters):
                self.save_snapshot()
        for change in self.changes:
            log.message(change)

    def read_losses(self, log: RunLogger, lr: float, stop_signal: int) -> int:
        """Read the losses of the steps since the last read in one transfer (and, under DDP,
        one exchange that averages the last loss and agrees on a stop signal); stop with a
        TrainingError at the first non-finite loss (or gradient norm, but with float16's
        scaler, which skips those steps); report; return the signal all processes stop for."""
        read = self.losses.read(check_norms=not self.setup.scaler.is_enabled())
        names = sorted(read.figures)
        total, bad_ranks, signals, *figures = self.dist.sum([read.loss, read.bad_at is not None, stop_signal,
                                                             *(read.figures[name] for name in names)], self.device)
        if bad_ranks:
            where = f"at iteration {read.bad_at}" if read.bad_at is not None else "on another process"
            raise TrainingError(f"the loss became {read.bad_loss} (gradient norm {read.bad_norm}) {where}; the last "
                                f"good checkpoint in {self.run_dir} is kept. Try a lower train.lr, train.grad_clip=1.0 "
                                "or train.dtype=float32")
        self.report(log, total / self.dist.world_size, read.grad_norm, lr,
                    {name: value / self.dist.world_size for name, value in zip(names, figures)})
        return stop_signal or (signal.SIGTERM if signals else 0)

    def report(self, log: RunLogger, loss: float, grad_norm: float, lr: float, figures: dict[str, float]) -> None:
        """The progress bar; every log_interval, the scalars with tokens/s and MFU (real
        tokens: a conversation's padding is not counted) and the objective's other figures
        (DPO's rewards: the mean over the steps since the last read)."""
        started, drawn_before = self.tick
        now = self.clock()
        block_size = self.run.model_config.block_size
        tokens_per_sec = (self.sampler.drawn - drawn_before) * self.dist.world_size / max(now - started, 1e-9)
        log.progress(self.iteration, loss, lr, tokens_per_sec, figures)
        if self.iteration % self.settings.log_interval == 0:
            per_device = self.model.flops_per_token(block_size) * tokens_per_sec / self.dist.world_size
            log.scalars(self.iteration, {"train/loss": loss, "train/lr": lr, "train/grad_norm": grad_norm,
                                         "train/tokens_per_sec": tokens_per_sec, "train/mfu": per_device / self.peak_flops,
                                         "train/threads": torch.get_num_threads(),
                                         **{f"train/{name}": value for name, value in figures.items()}})
            self.tick = (now, self.sampler.drawn)

    def evaluate_and_save(self, log: RunLogger) -> None:
        """Score the weights that are saved (and at the end, with train.ema, the trained ones
        too), keep the best with train.keep_best, save a checkpoint; the time budget learns
        what the two cost."""
        started = self.clock()
        weights = "the average of the weights" if self.average is not None else "the weights"
        trained = self.model if self.average is not None and self.iteration == self.max_iters else None
        self.val_loss = self.evaluator.log(log, self.iteration, self.eval_model, weights, trained)
        improved = self.val_loss < self.best_val_loss
        self.best_val_loss = min(self.best_val_loss, self.val_loss)
        if improved and self.settings.keep_best and self.dist.is_main:  # the best so far, in out_dir/best
            self.write(f"the best model of iteration {self.iteration}", lambda: self.run_dir.save_best(self.saved_model, self.run.data.tokenizer,
                                                                         self.summary()))
        self.save()
        self.budget.spent_on_evaluation(self.clock() - started)
        self.tick = (self.clock(), self.sampler.drawn)  # evaluation time is not training throughput

    def refit(self, log: RunLogger) -> None:
        """With a time budget, the iteration to stop at from the pace measured so far (rank
        0's, the same on every process); the schedule's decay follows, the warm-up is
        shortened only once the estimates agree, and what changed is said."""
        if self.budget.needs_overhead(self.iteration):  # (no evaluation is forced early to learn its cost)
            self.budget.expect_overhead(self.evaluator.estimate_seconds(self.eval_model, self.clock))
            self.threads.pause()
        target = self.budget.fit(self.iteration)
        if target is None:
            return
        if self.dist.enabled:
            target = int(self.dist.sum([target if self.dist.is_main else 0], self.device)[0])
        if len(self.budget.estimates) == 1:
            log.message(logger.budget_message(self.budget, target))
        if target == self.max_iters:
            return
        before = self.schedule.state_dict()
        self.budget.stop_at(target)
        # (a run that reaches its max_iters keeps its configured warm-up)
        shorten = self.budget.settled() and target < self.budget.cap
        self.schedule = refitted(self.schedule, self.iteration, self.settings.lr_decay_iters or target, shorten)
        log.retarget(target)
        for change in logger.warmup_change(before, self.schedule.state_dict(), target):
            log.message(change)

    # ---- checkpoints and the run's state ----------------------------------------------

    def write(self, what: str, save, other_fix: str = "") -> None:
        """Run `save`, which writes `what` into the run folder; a full disk stops the run
        with the previous checkpoint kept."""
        try:
            save()
        except OSError as e:  # a full disk, a quota, a vanished folder
            raise TrainingError(f"could not write {what} in {self.run_dir} ({e.strerror or e}); the previous "
                                f"checkpoint is kept. Free some space{other_fix} and run the same command to "
                                "continue") from None

    def save(self) -> None:
        """A checkpoint: the saved model, the summary and the run's state (rank 0 writes)."""
        ranks = self.dist.gather({"sampler": self.sampler.state_dict(), "rng": resume.rng_state(self.device)})
        if not self.dist.is_main:
            return

        def checkpoint() -> None:
            self.trained.save_beside(self.run_dir, self.eval_model)  # (LoRA: the adapters alone)
            self.run_dir.save_checkpoint(self.saved_model, self.run.data.tokenizer, self.summary(),
                                         self.state(ranks).to_dict())

        self.write(f"the checkpoint of iteration {self.iteration}", checkpoint)

    def save_snapshot(self) -> None:
        """The model the run evaluates now, kept in snapshots/ (train.snapshots)."""
        self.write(f"the snapshot of step {self.iteration}", lambda: self.snapshots.save(self.iteration, self.saved_model),
                   other_fix=" (or set train.snapshots=0)")

    def state(self, ranks: list[dict]) -> TrainerState:
        """The run's state now; `ranks`: each process's sampler and random state."""
        return TrainerState(
            iteration=self.iteration,
            model=self.trained.state_dict(),
            optimizers=[optimizer.state_dict() for optimizer in self.optimizers],
            schedule=self.schedule.state_dict(),
            budget=self.budget.state_dict(),
            average=None if self.average is None else self.average.state_dict(),
            ranks=ranks,
            grad_accum=self.grad_accum,
            best_val_loss=self.best_val_loss,
            tokens_seen=self.tokens_seen(),
            losses=self.losses.state_dict(),
            identity=self.run.identity,
            threads=self.threads.chosen,
        )

    def resume(self, saved: TrainerState) -> None:
        """Go on where the saved run stopped (resume.check has checked it): each piece takes
        back its own field; what the config as it is now changes is kept to be said."""
        self.tokens_before = saved.tokens_seen
        self.iteration = saved.iteration
        if saved.threads is not None and self.run.adapt_threads:  # (a run of fixed length keeps the count it chose)
            self.threads.keep(saved.threads)
        self.best_val_loss = saved.best_val_loss
        best = self.run_dir.best()
        if self.settings.keep_best and best is not None:  # (a killed process may have kept a better one
            # after its last checkpoint: a real model, its loss really measured; it stays the one to beat)
            self.best_val_loss = min(self.best_val_loss, best.summary().get("val_loss") or math.inf)
        self.losses.load_state_dict(saved.losses)
        self.trained.load_state_dict(saved.model)
        resume.load_optimizers(self.optimizers, saved.optimizers, self.run_dir.path)
        self.schedule = self.schedule.loaded(saved.schedule)
        self.budget.load_state_dict(saved.budget, self.iteration)
        self.snapshots.drop_after(self.iteration)
        if self.settings.max_minutes is None:  # the decay goes on to the end the config asks for now
            self.schedule = refitted(self.schedule, self.iteration, self.settings.lr_decay_iters or self.max_iters)
        # (with a time budget, it keeps the saved end until the pace is measured again)
        if self.average is not None:  # (a run that turns train.ema on starts its average here)
            self.average.load_state_dict(saved.average if saved.average is not None else self.model.state_dict())
        if len(saved.ranks) == self.dist.world_size:
            self.sampler.load_state_dict(saved.ranks[self.dist.rank]["sampler"])
            resume.set_rng_state(saved.ranks[self.dist.rank]["rng"], self.device)
        else:  # another process count: rank 0's sampler; every process draws the same global batch
            self.sampler.load_state_dict(saved.ranks[0]["sampler"])
        names = [type(optimizer).__name__ for optimizer in self.optimizers]
        self.changes = logger.what_changed(saved, self.state([]), names,
                                           self.settings.lr * self.schedule(self.iteration))

    def tokens_seen(self) -> int:
        """Training tokens so far, across resumes: the real tokens of every batch drawn (a
        conversation's padding is not counted; under DDP each process draws alike)."""
        return self.tokens_before + self.sampler.drawn * self.dist.world_size

    def summary(self) -> dict:
        """summary.json: the last evaluation, what it scored, and a prompt to try (model cards),
        the tokens trained on, which weights were saved, and whether the model is barely trained."""
        data = self.run.data
        measured = math.isfinite(self.val_loss)
        return {"iteration": self.iteration, "job": self.run.job.name, "val_loss": self.val_loss if measured else None,
                "best_val_loss": self.best_val_loss if math.isfinite(self.best_val_loss) else None,
                **(data.loss_figures(self.val_loss)[0] if measured else {}),  # (a text's: bits per character)
                "data_fingerprint": data.meta["fingerprint"], "prompt": self.run.prompt,
                "seconds": round(self.budget.seconds_used(), 1), "tokens": self.tokens_seen(),
                "weights": "average" if self.average is not None else "trained",
                "barely_trained": self.barely_trained(), "pace": self.budget.report(), "epochs": self.epochs_done,
                "threads": {"count": torch.get_num_threads(), "tried_seconds": round(self.threads.lost, 2)}}

    def barely_trained(self) -> dict | None:
        """Why the model saved now is barely trained (None: it is not): the reason, its
        numbers (for the explorer's words in each language) and a sentence in English. The
        rule holds for any recipe: the run stopped inside its warm-up, or (from scratch) its
        validation loss fell by less than BARELY_TRAINED of the first step's loss."""
        if self.iteration < self.schedule.warmup:
            return {"reason": "warmup", "iteration": self.iteration, "warmup": self.schedule.warmup,
                    "text": f"the run stopped inside its learning-rate warm-up, at iteration {self.iteration} of "
                            f"{self.schedule.warmup}"}
        initial = self.losses.initial
        if self.run.base is None and initial is not None and self.val_loss > (1 - BARELY_TRAINED) * initial:
            return {"reason": "loss", "val_loss": self.val_loss, "initial_loss": initial,
                    "text": f"its validation loss {self.val_loss:.2f} is less than {BARELY_TRAINED:.0%} below "
                            f"{initial:.2f}, the loss at initialisation",
                    **({"held_off": self.settings.heads_off} if self.settings.heads_off else {})}
        return None

    # ---- what the user reads at the end -------------------------------------------------

    def say_finished(self) -> None:
        if self.dist.is_main:
            limit = "train.max_minutes" if self.settings.max_minutes else "train.max_iters"
            print(logger.finished_message(self.iteration, self.run_dir, limit))

    def say_done(self) -> None:
        """The run's whole training time (across resumes) and this process's part of it."""
        if self.dist.is_main:
            mine = self.budget.seconds_used() - self.budget.earlier
            print(logger.done_message(self.iteration, self.budget.seconds_used(), mine, self.val_loss, self.best_val_loss,
                                      self.run_dir, self.run.job.try_it(self.run_dir.path, self.run.prompt),
                                      self.barely_trained(), self.continue_command(), self.budget.report(),
                                      self.epochs_done, len(self.run_dir.snapshot_paths()), self.sampler.items))

    def continue_command(self) -> str:
        """The command that trains this run on: the run's own config with twice the length."""
        if self.settings.max_minutes:
            longer = f"train.max_minutes={2 * self.settings.max_minutes:g}"
            if self.iteration >= self.settings.max_iters:
                longer += f" train.max_iters={2 * self.settings.max_iters}"
        elif self.settings.epochs is not None and self.iteration < self.settings.max_iters:
            longer = f"train.epochs={2 * self.settings.epochs:g}"
        else:
            longer = f"train.max_iters={2 * self.iteration}"
        return f"python train.py --config {self.run_dir.path / RunDir.RUN_CONFIG} {longer}"
