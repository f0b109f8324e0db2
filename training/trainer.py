"""The training loop. A Trainer takes a run that training/setup.py prepared; fit() repeats
one optimizer step and now and then reports, evaluates and saves, until max_iters or a
stop signal (Ctrl-C, SIGTERM). Nothing waits on the device for nothing: the steps' losses
stay there until they are read, every log_interval iterations and before each evaluation
and checkpoint (so a non-finite loss never reaches one), with one exchange under DDP.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from contextlib import nullcontext
from pathlib import Path

import torch
import yaml

from common import checkpoint
from common.device import autocast, peak_flops
from data import BatchSampler
from model import GPT

from . import budget, resume
from .average import WeightAverage
from .distributed import Distributed
from .evaluation import Evaluator, read_steps
from .logger import RunLogger, continuation_message, done_message, header
from .optim import Schedule, make_optimizers, muon_momentum
from .setup import Run, wrap


class TrainingError(Exception):
    """The run cannot go on (the loss is no longer finite, the disk is full); exit code 1."""


class Trainer:
    clock = staticmethod(time.perf_counter)  # the wall clock of time budgets and throughput (tests fake it)

    def __init__(self, run: Run, device: torch.device, dtype: torch.dtype, dist: Distributed = Distributed()):
        self.started = self.clock()  # the "done" line reports the wall time from here
        self.run, self.cfg, self.tc, self.device, self.dtype, self.dist = run, run.cfg, run.cfg.train, device, dtype, dist
        self.out_dir, self.data, self.model_config, self.grad_accum = Path(run.cfg.out_dir), run.data, run.model_config, run.grad_accum
        seed, state = self.tc.seed, run.state
        self.evaluator = Evaluator(run, dist, device, dtype)
        self.sampler = BatchSampler(self.data.train, self.model_config.block_size, self.tc.batch_size, seed,
                                    dist.rank, dist.world_size)
        resume.seed_everything(seed + dist.rank)
        self.model = GPT.initialised(self.model_config, seed + dist.rank).to(device)  # (DDP: rank 0's for all)
        if run.base is not None and state is None:  # a fresh start from existing weights
            self.model.load_state_dict(run.base.state_dict(self.model_config))
        self.optimizers = make_optimizers(self.model, self.tc, device)
        self.it, self.best_val, self.val_loss = 0, float("inf"), float("nan")
        self.schedule = Schedule.of(self.tc, self.tc.max_iters)
        self.max_iters = self.tc.max_iters  # set by the time budget, if any: state, not config
        self.budget = budget.TimeBudget(self.tc.max_minutes, self.seconds_used,
                                        lambda: self.clock()) if self.tc.max_minutes else None
        if state is not None:
            self.restore(state)
        self.average = WeightAverage(self.model, self.tc.ema, (state or {}).get("ema")) if self.tc.ema else None
        self.train_model = wrap(self.model, self.tc.compile, dist, device)
        self.scaler = torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)
        self.stop_signal = 0  # the signal that asked the run to stop after this iteration
        self.pending: list[tuple[torch.Tensor, torch.Tensor]] = []  # (loss, grad norm) of the steps not yet read

    def global_batch(self) -> int:
        """Sequences per optimizer step, over all processes."""
        return self.tc.batch_size * self.grad_accum * self.dist.world_size

    def restore(self, state: dict) -> None:
        """Continue where the saved run stopped (training/resume.py); the schedule goes on to the
        decay the config asks for now (a time budget keeps the saved one until it refits)."""
        resume.restore(state, self.model, self.optimizers, self.sampler, self.dist, self.device, self.out_dir)
        self.it, self.best_val = state["iter"], state["best_val_loss"]
        saved = {"decay_iters": self.tc.lr_decay_iters or state.get("max_iters", self.tc.max_iters), "anchor": None}
        self.schedule = self.schedule.load_state_dict(state.get("schedule", saved))
        self.continued_from = self.schedule.decay_iters
        if self.budget is None:
            self.schedule = self.schedule.retarget(self.it, self.tc.lr_decay_iters or self.max_iters)
        elif budget.finished(state, self.tc.max_iters, self.tc.max_minutes, state.get("seconds", 0.0)):
            self.max_iters = state["iter"]

    @property
    def eval_model(self) -> GPT:
        """The weights that are evaluated, sampled and saved: the average with train.ema."""
        return self.average.model if self.average is not None else self.model

    # ---- the loop ------------------------------------------------------------

    def fit(self) -> int:
        """Train to max_iters (returns 0), or until a stop signal (saves, returns 128 + signal)."""
        if self.it >= self.max_iters:
            if self.dist.is_main:
                limit = "train.max_minutes" if self.budget is not None else "train.max_iters"
                print(f"{self.out_dir} already holds a finished run of {self.it} iterations; "
                      f"add --fresh to start over or raise {limit} to continue")
            return 0
        self.log = RunLogger(self.out_dir, self.dist.is_main, self.it, self.max_iters, self.tc.log_interval)
        signal.signal(signal.SIGINT, self.on_signal)
        signal.signal(signal.SIGTERM, self.on_signal)
        try:
            self.start()
            code = self.loop()
        finally:
            self.log.close()
            signal.signal(signal.SIGINT, signal.default_int_handler)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if code == 0 and self.dist.is_main:
            self.say_done()
        return code

    def start(self) -> None:
        """Measure the peak FLOP/s (for MFU), write config.yaml and print the run's header."""
        self.peak_flops = peak_flops(self.device, self.dtype, torch.get_num_threads()) if self.dist.is_main else 1.0
        if not self.dist.is_main:
            return
        resolved = yaml.safe_dump(self.cfg.to_dict(self.model_config), sort_keys=False, allow_unicode=True)
        checkpoint.save_run_config(self.out_dir, resolved)
        self.log.text("config", resolved, self.it)
        self.log.text("attention/text", self.data.tokenizer.decode(self.evaluator.attention_ids[0].tolist()), self.it)
        self.log.message(header(self.model, self.data, self.device, self.dtype, self.dist.world_size, self.it))
        if self.it and self.schedule.decay_iters != self.continued_from:
            self.log.message(continuation_message(self.continued_from, self.schedule.decay_iters,
                                                  self.tc.lr * self.schedule.factor(self.it)))

    def loop(self) -> int:
        """Step; now and then read the device and report, evaluate and save; until the end or a signal."""
        checkpoint_interval = self.tc.checkpoint_interval or self.tc.eval_interval
        self.model.train()
        self.tick = (self.clock(), self.it)  # throughput is measured from here
        if self.budget is not None:
            self.budget.begin(self.it)
        while self.it < self.max_iters:
            self.step()
            estimate = self.budget is not None and self.budget.first_estimate_due(self.it)
            evaluate = self.it % self.tc.eval_interval == 0 or self.it == self.max_iters
            save = evaluate or self.it % checkpoint_interval == 0
            stop = 0
            if save or estimate or self.it % self.tc.log_interval == 0 or (self.stop_signal and not self.dist.enabled):
                stop = self.read_steps()
            else:
                self.log.advance(self.it)  # the progress bar moves; its loss waits for the next read
            if estimate:
                self.fit_to_budget()
            if evaluate:
                self.evaluate_and_log()
                if self.budget is not None and self.it < self.max_iters:
                    self.retarget(self.budget.refit(self.it, self.eval_seconds, self.tc.max_iters))
            if save or stop:
                self.save()
            if stop:
                self.log.message(f"stopped at iteration {self.it}; checkpoint saved in {self.out_dir}. "
                                 "Run the same command to continue.")
                return 128 + stop
        self.log.hparams(self.cfg.to_dict(), {"val/loss": self.val_loss, "val/best_loss": self.best_val})
        return 0

    def step(self) -> tuple[torch.Tensor, torch.Tensor, float]:
        """One optimizer step; returns (mean loss, gradient norm before clipping, learning
        rate), the first two as tensors on the device, unread."""
        factor = self.schedule.factor(self.it)
        for optimizer in self.optimizers:
            for group in optimizer.param_groups:
                group["lr"] = group["initial_lr"] * factor
                if "momentum" in group:  # Muon's
                    group["momentum"] = muon_momentum(self.it, self.tc)
        loss = self.compute_gradients()
        grad_norm = self.clip_gradients()
        for optimizer in self.optimizers:
            self.scaler.step(optimizer)  # (fp16: skipped where the gradients overflowed)
            optimizer.zero_grad(set_to_none=True)
        self.scaler.update()
        if self.average is not None:
            self.average.update(self.model, self.it)
        self.it += 1
        self.lr = self.tc.lr * factor
        self.pending.append((loss, grad_norm))
        return loss, grad_norm, self.lr

    def compute_gradients(self) -> torch.Tensor:
        """Forward and backward over grad_accum micro-batches; returns their mean loss. Each
        loss is divided by grad_accum, so the summed gradients are those of the mean over the
        whole batch; under DDP they are averaged once, in the last micro-batch's backward."""
        total = torch.zeros((), device=self.device)
        for micro in range(self.grad_accum):
            x, y = self.sampler.next_batch()
            x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
            last = micro == self.grad_accum - 1
            with nullcontext() if last or not self.dist.enabled else self.train_model.no_sync():
                with autocast(self.device, self.dtype):
                    _, loss = self.train_model(x, y)
                self.scaler.scale(loss / self.grad_accum).backward()
            total += loss.detach()
        return total / self.grad_accum

    def clip_gradients(self) -> torch.Tensor:
        """Clip the gradients' norm to grad_clip (0: no clipping); returns the norm before."""
        for optimizer in self.optimizers:
            self.scaler.unscale_(optimizer)  # (fp16) clip the true gradients
        return torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.tc.grad_clip or float("inf"))

    def read_steps(self) -> int:
        """Read the steps since the last read in one transfer (and, under DDP, one exchange
        that averages the last loss and agrees on a stop signal): stop with a TrainingError
        at the first non-finite loss (or gradient norm, but with fp16's scaler, which skips
        those steps), report, and return the signal all processes stop for (0: none)."""
        loss, norm, first, bad_loss, bad_norm = read_steps(self.pending, check_norms=not self.scaler.is_enabled())
        since, self.pending = self.it - len(self.pending), []
        total, bad_ranks, signals = self.dist.sum([loss, first >= 0, self.stop_signal], self.device)
        if bad_ranks:
            where = f"at iteration {since + int(first) + 1}" if first >= 0 else "on another process"
            raise TrainingError(f"the loss became {bad_loss} (gradient norm {bad_norm}) {where}; the last good "
                                f"checkpoint in {self.out_dir} is kept. Try a lower train.lr, train.grad_clip=1.0 "
                                "or train.dtype=float32")
        self.report(total / self.dist.world_size, norm, self.lr)
        return self.stop_signal or (signal.SIGTERM if signals else 0)

    def report(self, loss: float, grad_norm: float, lr: float) -> None:
        """The progress bar; every log_interval, the scalars with tokens/s and MFU."""
        started, start_it = self.tick
        now = self.clock()
        tokens_per_sec = self.global_batch() * self.model_config.block_size * (self.it - start_it) / max(now - started, 1e-9)
        self.log.progress(self.it, loss, lr, tokens_per_sec)
        if self.it % self.tc.log_interval == 0:
            per_device = self.model.flops_per_token(self.model_config.block_size) * tokens_per_sec / self.dist.world_size
            self.log.scalars(self.it, {"train/loss": loss, "train/lr": lr, "train/grad_norm": grad_norm,
                                       "train/tokens_per_sec": tokens_per_sec, "train/mfu": per_device / self.peak_flops})
            self.tick = (now, self.it)

    def on_signal(self, signum, frame) -> None:
        if self.stop_signal:  # a second Ctrl-C: leave now; every file on disk is whole
            os._exit(128 + signum)
        self.stop_signal = signum
        print(f"stopping after this iteration ({signal.Signals(signum).name}); saving a checkpoint", file=sys.stderr)

    # ---- the time budget (training/budget.py) ------------------------------------

    def fit_to_budget(self) -> None:
        """train.max_minutes' first estimate: the timed steps' pace, and what one evaluation
        and checkpoint cost, set max_iters; every later evaluation refits it."""
        step_seconds = self.budget.step_seconds()
        started = self.clock()
        self.evaluate_and_log()
        self.save()
        overhead = self.clock() - started
        self.retarget(self.budget.first_estimate(self.it, step_seconds, overhead, self.tc.eval_interval,
                                                 self.tc.max_iters))
        self.log.message(f"time budget {self.tc.max_minutes:g} min: {1000 * step_seconds:.0f} ms per iteration, "
                         f"{overhead:.1f} s per evaluation and checkpoint; training to iteration {self.max_iters}")

    def retarget(self, target: int | None) -> None:
        """Train to rank 0's target (the same on every rank); the schedule's decay follows."""
        if target is None:
            return
        self.max_iters = int(self.dist.sum([target if self.dist.is_main else 0], self.device)[0])
        self.schedule = self.schedule.retarget(self.it, self.tc.lr_decay_iters or self.max_iters)
        self.log.retarget(self.max_iters)

    # ---- evaluation and checkpoints -------------------------------------------

    def evaluate_and_log(self) -> None:
        started = self.clock()
        weights = "the average of the weights" if self.average is not None else "the weights"
        trained = self.model if self.average is not None and self.it == self.max_iters else None  # once, at the end
        self.val_loss = self.evaluator.log(self.log, self.it, self.eval_model, weights, trained)
        self.best_val = min(self.best_val, self.val_loss)
        self.tick = (self.clock(), self.it)  # evaluation time is not training throughput
        self.eval_seconds = self.tick[0] - started

    def seconds_used(self) -> float:
        """Wall time of the whole run so far: this process's, its set-up included (data
        preparation), and what the processes before it had used up to their checkpoint."""
        before = self.run.state.get("seconds", 0.0) if self.run.state else 0.0
        return before + self.run.setup_seconds + self.clock() - self.started

    def save(self) -> None:
        ranks = self.dist.gather({"sampler": self.sampler.state_dict(), "rng": resume.rng_state(self.device)})
        if not self.dist.is_main:
            return
        state = {"model": self.model.state_dict(), "optimizer": [o.state_dict() for o in self.optimizers],
                 "iter": self.it, "best_val_loss": self.best_val, "identity": self.run.identity, "ranks": ranks,
                 "grad_accum": self.grad_accum, "max_iters": self.max_iters, "max_minutes": self.tc.max_minutes,
                 "schedule": self.schedule.state_dict(), "seconds": self.seconds_used(),
                 # for the model card of an export: what was measured, on which token files, tried how
                 "val_loss": self.val_loss, "val_bits_per_char": self.data.bits_per_character(self.val_loss),
                 "data_fingerprint": self.data.meta["fingerprint"], "prompt": self.run.prompt}
        if self.average is not None:
            state["ema"] = self.average.model.state_dict()
        try:
            checkpoint.save_run(self.out_dir, self.eval_model, self.data.tokenizer, state)
        except OSError as e:  # a full disk, a quota, a vanished folder
            raise TrainingError(f"could not write the checkpoint of iteration {self.it} in {self.out_dir} "
                                f"({e.strerror or e}); the previous checkpoint is kept. Free some space "
                                "and run the same command to continue") from None

    def say_done(self) -> None:
        """The run's whole training time (across resumes) and this process's part of it."""
        print(done_message(self.it, self.seconds_used(), self.run.setup_seconds + self.clock() - self.started,
                           self.val_loss, self.best_val, self.out_dir, self.run.prompt))
