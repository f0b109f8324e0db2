"""The training loop. `Trainer.fit` reads top to bottom: each iteration sets the learning
rate, takes a batch, runs the model forward to the loss and backward to the gradients
(over grad_accum micro-batches), clips them, steps the optimizers and moves the average
of the weights; now and then it reads the losses, evaluates, keeps a snapshot and saves.

Each optional piece is one line in the loop. Its machinery is a small object beside it
that keeps its own state and hands it to the checkpoint through state_dict and
load_state_dict, as torch's modules and optimizers do:

    schedule    training/optim.py         the learning rate: warm-up, then decay
    average     training/average.py       train.ema: the average of the weights
    budget      training/budget.py        the run's clock, and train.max_minutes
    snapshots   training/snapshots.py     the model as it forms (train.snapshots), for explore.py
    sampler     data/batches.py           each process's random windows of tokens (or conversations)
    losses      training/evaluation.py    the steps' losses, read from the device in one go
    evaluator   training/evaluation.py    the validation loss, a sample, each head's map and scores
    dist        training/distributed.py   torchrun's processes (DistributedDataParallel)
    stop        training/signals.py       Ctrl-C and SIGTERM: stop after this iteration
    threads     common/threads.py         the thread count that trains faster now (a busy machine)
    log         training/logger.py        the progress bar, the log lines, TensorBoard
    run_dir     common/run_dir.py         the checkpoint's files

With lora.rank, the model brought in (train.init_from) is frozen and LoRA adapters train
beside its matrices (lora/): the loop is the same; what is saved is the model with the
adapters merged, and the adapters apart.
"""

from __future__ import annotations

import math
import signal
import time

import torch
import yaml

from common.device import autocast, peak_flops
from common.run_dir import RunDir
from common.threads import AdaptiveThreads
from data.batches import sampler_for
from lora import add_adapters, adapter_state, load_adapter_state, merged, trained_parameters
from model import GPT

from . import resume
from .average import WeightAverage
from .budget import TimeBudget
from .distributed import Distributed
from .evaluation import Evaluator, StepLosses
from .logger import RunLogger, continuation_message, done_message, header, warmup_message
from .optim import Schedule, make_optimizers
from .preparation import PreparedRun
from .signals import StopRequest
from .snapshots import Snapshots


BARELY_TRAINED = 0.25  # a model from scratch whose loss fell by less than this share of its initial loss


class TrainingError(Exception):
    """The run cannot go on (the loss is no longer finite, the disk is full); exit code 1."""


class Trainer:
    clock = staticmethod(time.perf_counter)  # the wall clock of the time budget and throughput (tests fake it)

    def __init__(self, run: PreparedRun, device: torch.device, dtype: torch.dtype, dist: Distributed = Distributed()):
        settings = run.config.train
        self.run = run
        self.settings = settings
        self.device = device
        self.dtype = dtype
        self.dist = dist
        self.run_dir = RunDir(run.config.out_dir)
        self.grad_accum = run.grad_accum  # micro-batches per step (a resume may change it: resume.py)
        self.budget = TimeBudget(settings.max_minutes, settings.max_iters, settings.eval_interval, self.clock,
                                 seconds_before=run.seconds)
        self.sampler = sampler_for(run.data, run.model_config.block_size, settings.batch_size, settings.seed,
                                   dist.rank, dist.world_size)  # windows of text, or conversations
        resume.seed_everything(settings.seed + dist.rank)
        self.model = GPT.initialised(run.model_config, settings.seed + dist.rank).to(device)  # (DDP: rank 0's for all)
        self.lora = run.config.lora if run.config.lora.rank else None
        if run.base is not None and (run.state is None or self.lora):  # existing weights (train.init_from)
            self.model.load_state_dict(run.base.state_dict(run.model_config))
        if self.lora:  # the weights brought in freeze; adapters (and a chat template's new tokens' rows) train
            first_new = run.base.tokenizer().get_vocab_size()  # (the ids data/chat.py added come after)
            add_adapters(self.model, self.lora, first_new if run.data.vocab_size > first_new else None)
            self.trained = list(trained_parameters(self.model))
        self.optimizers = make_optimizers(self.model, settings, device)
        self.schedule = Schedule(settings, settings.max_iters)
        self.average = WeightAverage(self.model, settings.ema) if settings.ema else None
        self.evaluator = Evaluator(run, dist, device, dtype)
        self.snapshots = Snapshots.for_run(self.run_dir, settings.snapshots, self.model, dist.is_main)
        self.losses = StepLosses()
        self.threads = AdaptiveThreads(run.adapt_threads, self.clock)
        self.iteration = 0  # optimizer steps taken
        self.tokens_before = 0  # tokens trained on up to the checkpoint this process resumed from
        self.resumed_at = 0  # the iteration of that checkpoint
        self.val_loss = math.nan
        self.best_val_loss = math.inf
        self.changed_settings: list[str] = []  # optimizer settings a resume changed (said at the start)
        self.budget_announced = False  # the time budget's first estimate was said
        self.decay_end_before = self.schedule.decay_iters  # where a resumed run's decay ended (said if it moves)
        self.warmup_before = self.schedule.warmup  # and its warm-up (said if it is shortened)
        if run.state is not None:
            self.load_state_dict(run.state)
        compiled = torch.compile(self.model) if settings.compile else self.model
        self.train_model = dist.wrap(compiled, device)  # what the step calls: compiled, and/or DDP
        self.scaler = torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)  # float16 only

    @property
    def max_iters(self) -> int:
        """Where training ends: train.max_iters, or what train.max_minutes fits."""
        return self.budget.max_iters

    @property
    def eval_model(self) -> GPT:
        """The weights that are evaluated, sampled and saved: the average with train.ema."""
        return self.average.model if self.average is not None else self.model

    @property
    def saved_model(self) -> GPT:
        """What the run folder keeps as its model: eval_model, its adapters merged (LoRA)."""
        return merged(self.eval_model) if self.lora else self.eval_model

    # ---- the loop ---------------------------------------------------------------------

    def fit(self) -> int:
        """Train to max_iters (returns 0), or until Ctrl-C or SIGTERM (saves, returns 128 + the signal)."""
        if self.iteration >= self.max_iters:
            self.say_finished()
            return 0
        settings = self.settings
        checkpoint_interval = settings.checkpoint_interval or settings.eval_interval
        log = RunLogger(self.run_dir, self.dist.is_main, self.iteration, self.max_iters, settings.log_interval)
        with log, StopRequest() as stop:
            self.begin(log)
            self.model.train()
            while self.iteration < self.max_iters:
                # 1. the learning rate of this iteration: a warm-up, then a decay
                lr = settings.lr * self.schedule.apply(self.optimizers, self.iteration)

                # 2. forward and backward, over grad_accum micro-batches: each loss is divided by
                #    grad_accum, so the gradients add up to those of the mean over the whole batch
                loss = torch.zeros((), device=self.device)
                for micro in range(self.grad_accum):
                    x, y = self.sampler.next_batch()  # [B, T] token ids, and the next token of each (-100: not scored)
                    x = x.to(self.device, non_blocking=True)
                    y = y.to(self.device, non_blocking=True)
                    with self.dist.gradients_averaged(self.train_model, now=micro == self.grad_accum - 1):
                        with autocast(self.device, self.dtype):
                            _, micro_loss = self.train_model(x, y)  # mean cross-entropy, a scalar
                        self.scaler.scale(micro_loss / self.grad_accum).backward()
                    loss += micro_loss.detach() / self.grad_accum

                # 3. clip the gradients' norm to grad_clip (float16: the scaler's factor undone first)
                for optimizer in self.optimizers:
                    self.scaler.unscale_(optimizer)
                grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), settings.grad_clip or math.inf)

                # 4. the optimizer step, then the gradients cleared for the next one
                for optimizer in self.optimizers:
                    self.scaler.step(optimizer)  # (float16: skipped where the gradients overflowed)
                    optimizer.zero_grad(set_to_none=True)
                self.scaler.update()

                # 5. the average of the weights follows the weights (train.ema)
                if self.average is not None:
                    self.average.update(self.model, self.iteration)
                self.iteration += 1
                self.losses.add(self.iteration, loss, grad_norm)  # still on the device, read below

                # 6. now and then: read the losses, evaluate, save; the time budget refits
                evaluate = (self.budget.wants_evaluation(self.iteration)  # (the first estimate of train.max_minutes)
                            or self.iteration % settings.eval_interval == 0 or self.iteration == self.max_iters)
                save = evaluate or self.iteration % checkpoint_interval == 0
                read = save or self.iteration % settings.log_interval == 0
                stopping = 0
                if read or (stop.signal and not self.dist.enabled):  # (under DDP, all read at the same steps)
                    stopping = self.read_losses(log, lr, stop.signal)
                    self.threads.update(self.iteration)  # one thread or all, whichever trains faster now
                snapshot = self.snapshots.due(self.iteration, self.max_iters)
                if evaluate or snapshot:  # each head's attention map and scores, in TensorBoard
                    self.evaluator.log_heads(log, self.iteration, self.eval_model)
                if snapshot:  # the model as it forms, for explore.py's timeline
                    self.save_snapshot()
                if evaluate:
                    started = self.clock()
                    self.evaluate(log)
                    self.save()
                    self.budget.spent_on_evaluation(self.clock() - started)
                elif save or stopping:
                    self.save()
                if evaluate or save or snapshot:
                    self.threads.pause()  # (the threads are chosen on the steps' pace alone)
                if stopping:
                    log.message(f"stopped at iteration {self.iteration}; checkpoint saved in {self.run_dir}. "
                                "Run the same command to continue.")
                    return 128 + stopping
                if read:
                    self.retarget(log, self.budget.fit(self.iteration))
            log.hparams(self.run.config.to_dict(), {"val/loss": self.val_loss, "val/best_loss": self.best_val_loss})
        self.say_done()
        return 0

    def begin(self, log: RunLogger) -> None:
        """Before the first iteration: measure the peak FLOP/s (for MFU), write config.yaml,
        print the run's header and what a resume changed, start the clocks."""
        self.peak_flops = peak_flops(self.device, self.dtype, torch.get_num_threads()) if self.dist.is_main else 1.0
        self.tick = (self.clock(), self.iteration)  # throughput is measured from here
        self.budget.begin(self.iteration)
        if not self.dist.is_main:
            return
        resolved = yaml.safe_dump(self.run.config.to_dict(self.run.model_config), sort_keys=False, allow_unicode=True)
        self.run_dir.save_run_config(resolved)
        if self.run.data.chat_template is not None:  # a run on conversations: the template renders them
            self.run_dir.save_chat_template(self.run.data.chat_template)
        log.text("config", resolved, self.iteration)
        log.text("attention/text", self.run.data.tokenizer.decode(self.evaluator.attention_ids[0].tolist()), self.iteration)
        log.message(header(self.model, self.run.data, self.device, self.dtype, self.dist.world_size, self.iteration))
        log.layout_heads()
        if self.iteration == 0:  # step 0: the model at initialisation
            self.evaluator.log_heads(log, 0, self.eval_model)
            if self.snapshots.due(0, self.max_iters):
                self.save_snapshot()
        if self.changed_settings:
            log.message(f"resuming with the optimizer settings of the config as it is now: {'; '.join(self.changed_settings)}")
        if self.iteration and self.schedule.decay_iters != self.decay_end_before:
            log.message(continuation_message(self.decay_end_before, self.schedule.decay_iters,
                                             self.settings.lr * self.schedule.factor(self.iteration)))
        if self.schedule.warmup != self.warmup_before:
            log.message(warmup_message(self.warmup_before, self.schedule.warmup, self.max_iters))

    def read_losses(self, log: RunLogger, lr: float, stop_signal: int) -> int:
        """Read the losses of the steps since the last read in one transfer (and, under DDP,
        one exchange that averages the last loss and agrees on a stop signal); stop with a
        TrainingError at the first non-finite loss (or gradient norm, but with float16's
        scaler, which skips those steps); report; return the signal all processes stop for."""
        loss, grad_norm, bad_at, bad_loss, bad_norm = self.losses.read(check_norms=not self.scaler.is_enabled())
        total, bad_ranks, signals = self.dist.sum([loss, bad_at is not None, stop_signal], self.device)
        if bad_ranks:
            where = f"at iteration {bad_at}" if bad_at is not None else "on another process"
            raise TrainingError(f"the loss became {bad_loss} (gradient norm {bad_norm}) {where}; the last good "
                                f"checkpoint in {self.run_dir} is kept. Try a lower train.lr, train.grad_clip=1.0 "
                                "or train.dtype=float32")
        self.report(log, total / self.dist.world_size, grad_norm, lr)
        return stop_signal or (signal.SIGTERM if signals else 0)

    def report(self, log: RunLogger, loss: float, grad_norm: float, lr: float) -> None:
        """The progress bar; every log_interval, the scalars with tokens/s and MFU."""
        started, start_iteration = self.tick
        now = self.clock()
        block_size = self.run.model_config.block_size
        sequences = self.settings.batch_size * self.grad_accum * self.dist.world_size * (self.iteration - start_iteration)
        tokens_per_sec = sequences * block_size / max(now - started, 1e-9)
        log.progress(self.iteration, loss, lr, tokens_per_sec)
        if self.iteration % self.settings.log_interval == 0:
            per_device = self.model.flops_per_token(block_size) * tokens_per_sec / self.dist.world_size
            log.scalars(self.iteration, {"train/loss": loss, "train/lr": lr, "train/grad_norm": grad_norm,
                                         "train/tokens_per_sec": tokens_per_sec, "train/mfu": per_device / self.peak_flops,
                                         "train/threads": torch.get_num_threads()})
            self.tick = (now, self.iteration)

    def evaluate(self, log: RunLogger) -> None:
        """Score the weights that are saved (and at the end, with train.ema, the trained ones too)."""
        weights = "the average of the weights" if self.average is not None else "the weights"
        trained = self.model if self.average is not None and self.iteration == self.max_iters else None
        self.val_loss = self.evaluator.log(log, self.iteration, self.eval_model, weights, trained)
        improved = self.val_loss < self.best_val_loss
        self.best_val_loss = min(self.best_val_loss, self.val_loss)
        if improved and self.settings.keep_best and self.dist.is_main:  # the best so far, in out_dir/best
            self.save_best()
        self.tick = (self.clock(), self.iteration)  # evaluation time is not training throughput

    def retarget(self, log: RunLogger, target: int | None) -> None:
        """Train to rank 0's target (the same on every process; None: no change); the
        schedule's decay follows. The first estimate of a time budget is said."""
        if target is None:
            return
        if self.dist.enabled:
            target = int(self.dist.sum([target if self.dist.is_main else 0], self.device)[0])
        if not self.budget_announced:
            self.budget_announced = True
            log.message(f"time budget {self.settings.max_minutes:g} min: {1000 * self.budget.pace:.0f} ms per "
                        f"iteration, {self.budget.overhead:.1f} s per evaluation and checkpoint; training to "
                        f"iteration {target}")
        if target == self.max_iters:
            return
        warmup = self.schedule.warmup
        self.budget.max_iters = target
        self.schedule.retarget(self.iteration, self.settings.lr_decay_iters or target)
        log.retarget(target)
        if self.schedule.warmup != warmup:
            log.message(warmup_message(warmup, self.schedule.warmup, target))

    # ---- checkpoints ------------------------------------------------------------------

    def save(self) -> None:
        """A checkpoint: the saved model, the summary and the trainer state (rank 0 writes)."""
        ranks = self.dist.gather({"sampler": self.sampler.state_dict(), "rng": resume.rng_state(self.device)})
        if not self.dist.is_main:
            return
        try:
            if self.lora:  # the adapters alone, beside the merged model
                self.run_dir.save_adapters(adapter_state(self.eval_model, self.trained), self.adapter_config())
            self.run_dir.save_checkpoint(self.saved_model, self.run.data.tokenizer, self.summary(), self.state_dict(ranks))
        except OSError as e:  # a full disk, a quota, a vanished folder
            raise TrainingError(f"could not write the checkpoint of iteration {self.iteration} in {self.run_dir} "
                                f"({e.strerror or e}); the previous checkpoint is kept. Free some space "
                                "and run the same command to continue") from None

    def save_best(self) -> None:
        try:
            self.run_dir.save_best(self.saved_model, self.run.data.tokenizer, self.summary())
        except OSError as e:
            raise TrainingError(f"could not write the best model of iteration {self.iteration} in {self.run_dir} "
                                f"({e.strerror or e}); the previous checkpoint is kept. Free some space and run "
                                "the same command to continue") from None

    def save_snapshot(self) -> None:
        """The model the run evaluates now, kept in snapshots/ (train.snapshots)."""
        try:
            self.snapshots.save(self.iteration, self.saved_model)
        except OSError as e:
            raise TrainingError(f"could not write the snapshot of step {self.iteration} in {self.run_dir} "
                                f"({e.strerror or e}); the previous checkpoint is kept. Free some space (or set "
                                "train.snapshots=0) and run the same command to continue") from None

    def state_dict(self, ranks: list[dict]) -> dict:
        """Everything a resume needs; `ranks`: each process's sampler and random state."""
        return {
            "iteration": self.iteration,
            "model": adapter_state(self.model, self.trained) if self.lora else self.model.state_dict(),
            "optimizers": [optimizer.state_dict() for optimizer in self.optimizers],
            "schedule": self.schedule.state_dict(),
            "budget": self.budget.state_dict(),
            "average": None if self.average is None else self.average.state_dict(),
            "ranks": ranks,
            "grad_accum": self.grad_accum,
            "best_val_loss": self.best_val_loss,
            "tokens_seen": self.tokens_seen(),
            "losses": self.losses.state_dict(),
            "identity": self.run.identity,  # the model and data settings a resume must match
        }

    def load_state_dict(self, state: dict) -> None:
        """Continue where the saved run stopped: each piece takes back its own state."""
        self.iteration = state["iteration"]
        self.resumed_at = state["iteration"]
        self.tokens_before = state["tokens_seen"]
        self.best_val_loss = state["best_val_loss"]
        best = self.run_dir.best()
        if self.settings.keep_best and best is not None:  # (a killed process may have kept a better one
            # after its last checkpoint: a real model, its loss really measured; it stays the one to beat)
            self.best_val_loss = min(self.best_val_loss, best.summary().get("val_loss") or math.inf)
        self.losses.load_state_dict(state["losses"])
        if self.lora:  # (the weights brought in are loaded already, as they were)
            load_adapter_state(self.model, state["model"], self.trained)
        else:
            self.model.load_state_dict(state["model"])
        self.changed_settings = resume.load_optimizers(self.optimizers, state["optimizers"], self.run_dir.path)
        self.schedule.load_state_dict(state["schedule"])
        self.decay_end_before = self.schedule.decay_iters
        self.warmup_before = self.schedule.warmup
        self.budget.load_state_dict(state["budget"], self.iteration)
        self.snapshots.resume(self.iteration)
        if self.settings.max_minutes is None:  # the decay goes on to the end the config asks for now
            self.schedule.retarget(self.iteration, self.settings.lr_decay_iters or self.max_iters)
        # (with a time budget, it keeps the saved end until the pace is measured again)
        if self.average is not None:  # (a run that turns train.ema on starts its average here)
            self.average.load_state_dict(state["average"] if state["average"] is not None else self.model.state_dict())
        ranks = state["ranks"]
        if len(ranks) == self.dist.world_size:
            self.sampler.load_state_dict(ranks[self.dist.rank]["sampler"])
            resume.set_rng_state(ranks[self.dist.rank]["rng"], self.device)
        else:  # another process count: rank 0's sampler; every process draws the same global batch
            self.sampler.load_state_dict(ranks[0]["sampler"])

    def adapter_config(self) -> dict:
        """adapter_config.json: the adapters' settings and the model they adapt (peft's keys
        where they mean the same: r, lora_alpha, lora_dropout, target_modules)."""
        return {"r": self.lora.rank, "lora_alpha": self.lora.alpha, "lora_dropout": self.lora.dropout,
                "target_modules": self.lora.targets, "base_model_name_or_path": self.run.config.train.init_from,
                "trained": self.trained}

    def tokens_seen(self) -> int:
        """Training tokens so far, across resumes (each with its own batch layout)."""
        per_step = self.settings.batch_size * self.grad_accum * self.dist.world_size * self.run.model_config.block_size
        return self.tokens_before + (self.iteration - self.resumed_at) * per_step

    def summary(self) -> dict:
        """summary.json: the last evaluation, what it scored, and a prompt to try (model cards),
        the tokens trained on, which weights were saved, and whether the model is barely trained."""
        data = self.run.data
        measured = math.isfinite(self.val_loss)
        return {"iteration": self.iteration, "val_loss": self.val_loss if measured else None,
                "best_val_loss": self.best_val_loss if math.isfinite(self.best_val_loss) else None,
                "val_bits_per_char": data.bits_per_character(self.val_loss) if measured else None,
                "data_fingerprint": data.meta["fingerprint"], "prompt": self.run.prompt,
                "seconds": round(self.budget.seconds_used(), 1), "tokens": self.tokens_seen(),
                "weights": "average" if self.average is not None else "trained",
                "barely_trained": self.barely_trained()}

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
                            f"{initial:.2f}, the loss at initialisation"}
        return None

    # ---- what the user reads at the end -------------------------------------------------

    def say_finished(self) -> None:
        if self.dist.is_main:
            limit = "train.max_minutes" if self.settings.max_minutes else "train.max_iters"
            print(f"{self.run_dir} already holds a finished run of {self.iteration} iterations; "
                  f"add --fresh to start over or raise {limit} to continue")

    def say_done(self) -> None:
        """The run's whole training time (across resumes) and this process's part of it."""
        if self.dist.is_main:
            mine = self.budget.seconds_used() - self.budget.earlier
            print(done_message(self.iteration, self.budget.seconds_used(), mine, self.val_loss, self.best_val_loss,
                               self.run_dir, self.run.prompt, self.barely_trained(), self.continue_command()))

    def continue_command(self) -> str:
        """The command that trains this run on: the run's own config with twice the length."""
        if self.settings.max_minutes:
            longer = f"train.max_minutes={2 * self.settings.max_minutes:g}"
            if self.iteration >= self.settings.max_iters:
                longer += f" train.max_iters={2 * self.settings.max_iters}"
        else:
            longer = f"train.max_iters={2 * self.iteration}"
        return f"python train.py --config {self.run_dir.path / RunDir.RUN_CONFIG} {longer}"
