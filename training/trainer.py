"""The training loop. A Trainer sets a run up (data, model, optimizer, the resume point);
fit() then repeats one optimizer step, logs it, and now and then evaluates and saves,
until max_iters or a stop signal (Ctrl-C, SIGTERM)."""

from __future__ import annotations

import copy
import dataclasses
import math
import os
import random
import signal
import socket
import sys
import time
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import torch
import yaml

from common import checkpoint
from common.attention_maps import attention_maps
from common.cli import UserError
from common.device import autocast, peak_flops
from data import BatchSampler, TokenData, content_digest, fixed_batches, prepare
from data.tokenizer import encode_or_start, suppressed_ids
from model import GPT, GPTConfig

from .config import RunConfig
from .distributed import Distributed
from .init_from import Source, model_config
from .logger import RunLogger
from .optim import lr_factor, make_optimizers, muon_momentum


class TrainingError(Exception):
    """The run cannot go on (the loss is no longer finite, the disk is full); exit code 1."""


def load_data(cfg: RunConfig, dist: Distributed, source: Source | None) -> tuple[TokenData, GPTConfig]:
    """The token files and the model's settings: from the run config, or with
    train.init_from from the source model, whose tokenizer then encodes the data.
    The first process of each node tokenizes (or finds) the token files; the others then
    reuse them, and with several nodes every process checks that it holds rank 0's."""
    tokenizer = source.tokenizer() if source else None
    data = prepare(cfg.data, progress=True, tokenizer=tokenizer) if dist.local_rank == 0 else None
    dist.barrier()
    if data is None:
        data = prepare(cfg.data, progress=False, tokenizer=tokenizer)
    if dist.nodes > 1:
        check_same_data(data, dist)
    if source is None:
        return data, cfg.model_config(data.vocab_size)
    if data.vocab_size > source.config.vocab_size:
        raise UserError(f"train.init_from={source.name}: its tokenizer has {data.vocab_size} tokens, more than "
                        f"the model's {source.config.vocab_size}")
    return data, model_config(source, cfg.model, cfg.model_keys)


def check_same_data(data: TokenData, dist: Distributed) -> None:
    """Every node prepared its own token files (paths and times differ between nodes, so
    the hash is of their content and the tokenizer's): all must equal rank 0's."""
    held = dist.gather((socket.gethostname(), content_digest(data.directory)))
    for rank, (host, digest) in enumerate(held):
        if digest != held[0][1]:
            raise UserError(f"node {host} (rank {rank}) holds other token files than rank 0 on {held[0][0]} "
                            f"(their content differs, in {data.directory}): give every node the same corpus "
                            "and data settings, or put data.cache_dir on storage all nodes share")


def rng_state(device: torch.device) -> dict:
    state = {"torch": torch.get_rng_state(), "python": list(random.getstate()[1]),
             "numpy": torch.from_numpy(np.random.get_state()[1].astype(np.int64))}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict, device: torch.device) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate((3, tuple(state["python"]), None))
    np.random.set_state(("MT19937", state["numpy"].numpy().astype(np.uint32), 624, 0, 0.0))
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


class Trainer:
    clock = staticmethod(time.perf_counter)  # the wall clock of time budgets and throughput (tests fake it)

    def __init__(self, cfg: RunConfig, device: torch.device, dtype: torch.dtype,
                 dist: Distributed = Distributed(), fresh: bool = False, source: Source | None = None):
        self.started = self.clock()  # the "done" line reports the wall time from here
        self.cfg, self.tc, self.device, self.dtype, self.dist = cfg, cfg.train, device, dtype, dist
        self.out_dir = Path(cfg.out_dir)
        if self.tc.threads:
            torch.set_num_threads(self.tc.threads)
        state = None if fresh else checkpoint.load_state(self.out_dir)
        self.data, self.model_config = load_data(cfg, dist, source)
        data_identity = {**{k: v for k, v in vars(cfg.data).items() if k != "cache_dir"}, "init_from": self.tc.init_from}
        self.identity = {"model": self.model_config.to_dict(), "data": data_identity}  # what a resume must match
        if state is not None:
            self.check_resumable(state)
        if dist.enabled:
            self.check_same_checkpoint(state)
        T, B, seed = self.model_config.block_size, self.tc.batch_size, self.tc.seed
        self.val_batches = fixed_batches(self.data.val, T, B, self.tc.eval_iters, seed, "val")
        self.train_batches = fixed_batches(self.data.train, T, B, self.tc.eval_iters, seed, "train")
        self.sampler = BatchSampler(self.data.train, T, B, seed, dist.rank, dist.world_size)
        torch.manual_seed(seed + dist.rank)
        random.seed(seed + dist.rank)
        np.random.seed(seed + dist.rank)
        self.model = GPT(self.model_config).to(device)
        if source is not None and state is None:  # a fresh start from existing weights
            self.model.load_state_dict(source.state_dict(self.model_config))
        self.optimizers = make_optimizers(self.model, self.tc, device)
        self.it, self.best_val, self.val_loss = 0, float("inf"), float("nan")
        if state is not None:
            self.restore(state)
        self.ema_model = self.make_ema(state)
        # train.max_minutes covers the whole run: the seconds the checkpoint's run had used
        # count against it, and every run that starts (a resume too) fits max_iters to what is left
        self.seconds_before = state.get("seconds", 0.0) if state is not None else 0.0
        self.budget_pending = self.tc.max_minutes is not None
        self.budget_mark = None  # (time, iteration) of the first estimate, in this process
        self.iteration_cap = self.tc.max_iters  # the configured max_iters stays an upper bound
        if self.budget_pending and state is not None and self.budget_finished(state):
            self.tc = dataclasses.replace(self.tc, max_iters=state["iter"])
        if fresh and dist.is_main:
            checkpoint.start_over(self.out_dir)
        self.train_model = self.wrap(self.model)
        self.scaler = torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)
        self.stop_signal = 0  # the signal that asked the run to stop after this iteration

    # ---- set-up --------------------------------------------------------------

    def check_resumable(self, state: dict) -> None:
        saved = state.get("identity", {})
        diffs = [f"{section}.{key}: checkpoint {saved.get(section, {}).get(key)!r}, requested {value!r}"
                 for section in ("model", "data") for key, value in self.identity[section].items()
                 if saved.get(section, {}).get(key) != value]
        if diffs:
            raise UserError(f"{self.out_dir} holds a run with a different setup ({'; '.join(diffs[:3])}); "
                            "add --fresh to start over there, or set out_dir=PATH for a new run")

    def check_same_checkpoint(self, state: dict | None) -> None:
        """Every process must resume from the same checkpoint: with several nodes, out_dir
        must be one folder they all see (rank 0 writes it, every process reads it)."""
        held = self.dist.gather((socket.gethostname(), None if state is None else state["iter"]))
        for rank, (host, iteration) in enumerate(held):
            if iteration != held[0][1]:
                def seen(i):
                    return "no checkpoint" if i is None else f"the checkpoint of iteration {i}"
                raise UserError(f"node {host} (rank {rank}) finds {seen(iteration)} in {self.out_dir}, rank 0 on "
                                f"{held[0][0]} {seen(held[0][1])}: put out_dir on storage every node shares")

    def restore(self, state: dict) -> None:
        """Continue exactly where the saved run stopped: weights, optimizer, iteration, and
        each process's RNG and batch sampler (so the same batches and dropout masks follow)."""
        self.model.load_state_dict(state["model"])
        saved = state["optimizer"] if isinstance(state["optimizer"], list) else [state["optimizer"]]
        if len(saved) != len(self.optimizers):
            raise UserError(f"{self.out_dir} was trained with another train.optimizer; add --fresh to start over "
                            "there, or set out_dir=PATH for a new run")
        for optimizer, optimizer_state in zip(self.optimizers, saved):
            optimizer.load_state_dict(optimizer_state)
        self.it, self.best_val = state["iter"], state["best_val_loss"]
        ranks = state["ranks"]
        if len(ranks) == self.dist.world_size:
            self.sampler.load_state_dict(ranks[self.dist.rank]["sampler"])
            set_rng_state(ranks[self.dist.rank]["rng"], self.device)
        else:
            self.change_process_count(len(ranks), state.get("grad_accum", self.tc.grad_accum))
            self.sampler.load_state_dict(ranks[0]["sampler"])  # every rank's sampler draws the same global batch

    def change_process_count(self, saved_processes: int, saved_accum: int) -> None:
        """Resume a run saved by another number of processes: keep its global batch
        (batch_size × grad_accum × processes sequences) by changing grad_accum where it
        divides evenly; the samplers then draw the very same windows. What differs: the
        dropout masks (each process has its own random stream) and the last bits of the sums."""
        micro_batches = saved_accum * saved_processes  # per optimizer step, over all processes
        accum = micro_batches // self.dist.world_size
        if accum >= 1 and accum * self.dist.world_size == micro_batches:
            self.tc = dataclasses.replace(self.tc, grad_accum=accum)
            what = (f"train.grad_accum {saved_accum} -> {accum} keeps the global batch of "
                    f"{micro_batches * self.tc.batch_size} sequences and its windows; dropout masks differ")
        else:
            what = (f"its {micro_batches} micro-batches per step do not split evenly over {self.dist.world_size} "
                    f"processes, so the global batch becomes {self.tc.batch_size * self.tc.grad_accum * self.dist.world_size}"
                    " sequences and the batches differ (set train.grad_accum to choose)")
        if self.dist.is_main:
            print(f"note: resuming a {saved_processes}-process run with {self.dist.world_size}: {what}", file=sys.stderr)

    def make_ema(self, state: dict | None) -> GPT | None:
        """train.ema: a copy of the model whose weights follow the trained ones as an
        exponential moving average (ema_w ← ema · ema_w + (1 − ema) · w after each step);
        it is the model that is evaluated and saved for generate.py, an average that sits
        lower in the valley than the last step's weights. None when train.ema is 0."""
        if not self.tc.ema:
            return None
        ema = copy.deepcopy(self.model).requires_grad_(False)
        if state is not None and "ema" in state:  # (a run that had no EMA starts it from its weights)
            ema.load_state_dict(state["ema"])
        return ema

    @property
    def eval_model(self) -> GPT:
        """The weights that are evaluated, sampled and saved: the average with train.ema."""
        return self.ema_model if self.ema_model is not None else self.model

    def wrap(self, model: GPT) -> torch.nn.Module:
        """The module the training step calls: compiled and/or DistributedDataParallel."""
        if self.tc.compile:
            model = torch.compile(model)
        if self.dist.enabled:
            from torch.nn.parallel import DistributedDataParallel

            model = DistributedDataParallel(model, device_ids=[self.device.index] if self.device.type == "cuda" else None)
        return model

    def start(self) -> None:
        """Write config.yaml, print the run's header, measure the peak FLOP/s (for MFU) and
        pick the validation text whose attention maps are logged at each evaluation."""
        c, data = self.model_config, self.data
        self.peak_flops = peak_flops(self.device, self.dtype, torch.get_num_threads()) if self.dist.is_main else 1.0
        self.attention_ids = torch.from_numpy(data.val[:min(c.block_size, 128)].astype(np.int64))[None].to(self.device)
        if self.dist.is_main:
            resolved = yaml.safe_dump(self.cfg.to_dict(self.model_config), sort_keys=False, allow_unicode=True)
            checkpoint.save_run_config(self.out_dir, resolved)
            self.log.text("config", resolved, self.it)
            self.log.text("attention/text", data.tokenizer.decode(self.attention_ids[0].tolist()), self.it)
            self.log.message(f"model: {self.model.num_parameters():,} parameters, {c.n_layer} layers, "
                             f"{c.pos_encoding} positions | data: {len(data.train):,} train / {len(data.val):,} "
                             f"val tokens, vocab {data.vocab_size} | {self.device}, {str(self.dtype)[6:]}, "
                             f"{torch.get_num_threads()} threads, {self.dist.world_size} process(es)"
                             + (f" | resuming at iteration {self.it}" if self.it else ""))

    # ---- the loop ------------------------------------------------------------

    def fit(self) -> int:
        """Train to max_iters (returns 0), or until a stop signal (saves, returns 128 + signal)."""
        if self.it >= self.tc.max_iters:
            if self.dist.is_main:
                limit = "train.max_minutes" if self.tc.max_minutes is not None else "train.max_iters"
                print(f"{self.out_dir} already holds a finished run of {self.it} iterations; "
                      f"add --fresh to start over or raise {limit} to continue")
            return 0
        self.log = RunLogger(self.out_dir, self.dist.is_main, self.it, self.tc.max_iters, self.tc.log_interval)
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
            wall = self.clock() - self.started
            print(f"done: {self.it} iterations in {wall / 60:.1f} min ({wall:.0f} s); val loss {self.val_loss:.4f} "
                  f"(best {self.best_val:.4f}); model in {self.out_dir}")
            print(f"try it: python generate.py --checkpoint {self.out_dir} --prompt \"ROMEO:\"")
        return code

    def loop(self) -> int:
        """Step, report, and now and then evaluate and save, until the end or a signal."""
        checkpoint_interval = self.tc.checkpoint_interval or self.tc.eval_interval
        self.model.train()
        self.tick = (self.clock(), self.it)  # throughput is measured from here
        self.budget_start = self.it + 2  # (train.max_minutes) the first iterations are slower
        while self.it < self.tc.max_iters:
            loss, grad_norm, lr = self.step()
            loss, stop_signal = self.sync_ranks(loss)
            self.report(loss, grad_norm, lr)
            if self.budget_pending:
                self.fit_to_budget()
            last = self.it == self.tc.max_iters
            if self.it % self.tc.eval_interval == 0 or last:
                self.evaluate_and_log()
                if self.budget_mark and self.it > self.budget_mark[1] and not last:
                    self.refit_budget()
            if self.it % checkpoint_interval == 0 or last or stop_signal:
                self.save()
            if stop_signal:
                self.log.message(f"stopped at iteration {self.it}; checkpoint saved in {self.out_dir}. "
                                 "Run the same command to continue.")
                return 128 + stop_signal
        self.log.hparams(self.cfg.to_dict(), {"val/loss": self.val_loss, "val/best_loss": self.best_val})
        return 0

    def fit_to_budget(self, measure: int = 10) -> None:
        """train.max_minutes: set max_iters so that the whole run, data preparation and an
        evaluation every eval_interval included, ends within the budget (a resumed run:
        within what its checkpoint left of it). A first estimate
        from `measure` timed iterations (from budget_start on, after the slower first ones)
        and one evaluation and checkpoint; refit_budget corrects it at each evaluation."""
        if self.it == self.budget_start:
            self.budget_clock = self.clock()
        if self.it < self.budget_start + measure:
            return
        step_seconds = (self.clock() - self.budget_clock) / measure
        started = self.clock()
        self.evaluate_and_log()
        self.save()
        overhead = self.clock() - started  # what each evaluation and checkpoint costs
        self.budget_pending = False
        self.budget_mark = (self.clock(), self.it)
        self.retarget(step_seconds + overhead / self.tc.eval_interval, overhead)
        self.log.message(f"time budget {self.tc.max_minutes:g} min: {1000 * step_seconds:.0f} ms per iteration, "
                         f"{overhead:.1f} s per evaluation and checkpoint; training to iteration {self.tc.max_iters}")

    def refit_budget(self) -> None:
        """The wall time per iteration measured since the first estimate, evaluations and
        checkpoints included, sets max_iters again: the first evaluation on a cold GPU can
        take several times as long as the later ones, and the machine's speed may change."""
        clock, it = self.budget_mark
        self.retarget((self.clock() - clock) / (self.it - it), self.eval_seconds)

    def retarget(self, seconds_per_iteration: float, reserve: float) -> None:
        """max_iters = the iterations that fit in what is left of the budget, less `reserve`
        seconds for the final evaluation; the same on every rank (rank 0's)."""
        remaining = self.tc.max_minutes * 60 - self.seconds_used() - reserve
        more = int(max(0.0, remaining) / seconds_per_iteration)
        target = min(self.it + max(1, more), self.iteration_cap)
        target = self.dist.sum([target if self.dist.is_main else 0], self.device)[0]
        self.tc = dataclasses.replace(self.tc, max_iters=int(target))
        self.log.retarget(self.tc.max_iters)

    def budget_finished(self, state: dict) -> bool:
        """Whether a checkpoint's run has nothing left to train under train.max_minutes: it
        reached max_iters, or its time is spent, or it ended where its fitted max_iters said
        and the budget was not raised since."""
        ended = state["iter"] >= state.get("max_iters", self.iteration_cap)
        same_budget = self.tc.max_minutes <= state.get("max_minutes", self.tc.max_minutes)
        return (state["iter"] >= self.iteration_cap or self.seconds_before >= self.tc.max_minutes * 60
                or (ended and same_budget))

    def seconds_used(self) -> float:
        """Wall time of the whole run so far: this process's, from its start (data
        preparation included), plus what the runs before it had used up to their checkpoint."""
        return self.seconds_before + self.clock() - self.started

    def on_signal(self, signum, frame) -> None:
        if self.stop_signal:  # a second Ctrl-C: leave now; every file on disk is whole
            os._exit(128 + signum)
        self.stop_signal = signum
        print(f"stopping after this iteration ({signal.Signals(signum).name}); saving a checkpoint", file=sys.stderr)

    def step(self) -> tuple[float, float, float]:
        """One optimizer step; returns (mean loss, gradient norm before clipping, learning rate)."""
        factor = lr_factor(self.it, self.tc)
        for optimizer in self.optimizers:
            for group in optimizer.param_groups:
                group["lr"] = group["initial_lr"] * factor
                if "momentum" in group:  # Muon's
                    group["momentum"] = muon_momentum(self.it, self.tc)
        loss = self.compute_gradients()
        grad_norm = self.clip_gradients()
        # with fp16 the scaler skips steps whose gradients overflowed; otherwise stop
        if not math.isfinite(loss) or not (math.isfinite(grad_norm) or self.scaler.is_enabled()):
            raise TrainingError(f"the loss became {loss} (gradient norm {grad_norm}) at iteration "
                                f"{self.it + 1}; the last good checkpoint in {self.out_dir} is kept. "
                                "Try a lower train.lr, train.grad_clip=1.0 or train.dtype=float32")
        for optimizer in self.optimizers:
            self.scaler.step(optimizer)
            optimizer.zero_grad(set_to_none=True)
        self.scaler.update()
        if self.ema_model is not None:
            for average, weight in zip(self.ema_model.parameters(), self.model.parameters()):
                average.lerp_(weight, 1.0 - self.tc.ema)
        self.it += 1
        return loss, grad_norm, self.tc.lr * factor

    def compute_gradients(self) -> float:
        """Forward and backward over grad_accum micro-batches; returns their mean loss.
        Each loss is divided by grad_accum, so the summed gradients are those of the mean
        over the whole batch. Under DDP the processes average their gradients once, in
        the backward pass of the last micro-batch (no_sync for the ones before)."""
        total = 0.0
        for micro in range(self.tc.grad_accum):
            x, y = self.sampler.next_batch()
            x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
            last = micro == self.tc.grad_accum - 1
            with nullcontext() if last or not self.dist.enabled else self.train_model.no_sync():
                with autocast(self.device, self.dtype):
                    _, loss = self.train_model(x, y)
                self.scaler.scale(loss / self.tc.grad_accum).backward()
            total += loss.item()
        return total / self.tc.grad_accum

    def clip_gradients(self) -> float:
        """Clip the gradients' norm to grad_clip (0: no clipping); returns the norm before."""
        for optimizer in self.optimizers:
            self.scaler.unscale_(optimizer)  # (fp16) clip the true gradients
        limit = self.tc.grad_clip or float("inf")
        return torch.nn.utils.clip_grad_norm_(self.model.parameters(), limit).item()

    def sync_ranks(self, loss: float) -> tuple[float, int]:
        """Under DDP, one collective: the loss averaged over the processes, and a stop
        signal if any process received one (so that all stop at the same iteration)."""
        if not self.dist.enabled:
            return loss, self.stop_signal
        total, signals = self.dist.sum([loss, self.stop_signal], self.device)
        return total / self.dist.world_size, self.stop_signal or (signal.SIGTERM if signals else 0)

    def report(self, loss: float, grad_norm: float, lr: float) -> None:
        """The progress bar; every log_interval, the scalars with tokens/s and MFU."""
        started, start_it = self.tick
        now = self.clock()
        tokens = self.tc.batch_size * self.model_config.block_size * self.tc.grad_accum * self.dist.world_size
        tokens_per_sec = tokens * (self.it - start_it) / max(now - started, 1e-9)
        self.log.progress(self.it, loss, lr, tokens_per_sec)
        if self.it % self.tc.log_interval == 0:
            per_device = self.model.flops_per_token(self.model_config.block_size) * tokens_per_sec / self.dist.world_size
            self.log.scalars(self.it, {"train/loss": loss, "train/lr": lr, "train/grad_norm": grad_norm,
                                       "train/tokens_per_sec": tokens_per_sec, "train/mfu": per_device / self.peak_flops})
            self.tick = (now, self.it)

    # ---- evaluation and checkpoints -------------------------------------------

    @torch.no_grad()
    def evaluate(self, batches: list) -> float:
        """Mean loss over fixed batches, split across processes and averaged over all."""
        model = self.eval_model
        was_training = model.training
        model.eval()
        total = count = 0.0
        for x, y in batches[self.dist.rank::self.dist.world_size]:
            with autocast(self.device, self.dtype):
                _, loss = model(x.to(self.device), y.to(self.device))
            total += loss.item()
            count += 1
        model.train(was_training)
        total, count = self.dist.sum([total, count], self.device)
        return total / count

    def evaluate_and_log(self) -> None:
        started = self.clock()
        train_loss, self.val_loss = self.evaluate(self.train_batches), self.evaluate(self.val_batches)
        self.best_val = min(self.best_val, self.val_loss)
        metrics = {"val/loss": self.val_loss, "val/perplexity": math.exp(min(self.val_loss, 50)),
                   "val/bits_per_char": self.data.bits_per_character(self.val_loss), "train/eval_loss": train_loss}
        self.log.scalars(self.it, metrics)
        self.log.message(f"iter {self.it}: train {train_loss:.4f}, val {self.val_loss:.4f} (perplexity "
                         f"{metrics['val/perplexity']:.2f}, {metrics['val/bits_per_char']:.3f} bits/char)")
        if self.dist.is_main:
            self.log.attention(self.it, attention_maps(self.eval_model, self.attention_ids))
            if self.tc.sample_tokens:
                self.log.text("samples", self.sample_text(), self.it)
        self.tick = (self.clock(), self.it)  # evaluation time is not training throughput
        self.eval_seconds = self.tick[0] - started

    def sample_text(self) -> str:
        tokenizer = self.data.tokenizer
        idx = torch.tensor([encode_or_start(tokenizer, self.tc.sample_prompt)], device=self.device)
        generator = torch.Generator(device=self.device).manual_seed(0)
        with autocast(self.device, self.dtype):
            out = self.eval_model.generate(idx, self.tc.sample_tokens, temperature=0.8, generator=generator,
                                      suppress_tokens=suppressed_ids(tokenizer))
        return tokenizer.decode(out[0].tolist())

    def save(self) -> None:
        ranks = self.dist.gather({"sampler": self.sampler.state_dict(), "rng": rng_state(self.device)})
        if not self.dist.is_main:
            return
        state = {"model": self.model.state_dict(), "optimizer": [o.state_dict() for o in self.optimizers], "iter": self.it,
                 "best_val_loss": self.best_val, "identity": self.identity, "ranks": ranks,
                 "grad_accum": self.tc.grad_accum, "max_iters": self.tc.max_iters, "max_minutes": self.tc.max_minutes, "seconds": self.seconds_used(),
                 # for the model card of an export: what was measured, on which token files
                 "val_loss": self.val_loss, "val_bits_per_char": self.data.bits_per_character(self.val_loss),
                 "data_fingerprint": self.data.meta["fingerprint"]}
        if self.ema_model is not None:
            state["ema"] = self.ema_model.state_dict()
        try:
            checkpoint.save_run(self.out_dir, self.eval_model, self.data.tokenizer, state)
        except OSError as e:  # a full disk, a quota, a vanished folder
            raise TrainingError(f"could not write the checkpoint of iteration {self.it} in {self.out_dir} "
                                f"({e.strerror or e}); the previous checkpoint is kept. Free some space "
                                "and run the same command to continue") from None
