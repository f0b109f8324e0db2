"""What the trainer measures: the steps' losses, read from the device in one go; at each
evaluation, the mean loss over fixed windows, the attention maps and a sample of text."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
import torch

from data.tokenizer import encode_or_start, suppressed_ids
from inspection.head_scores import head_scores, induction_probe
from jobs.objective import NextToken
from machine.device import autocast
from model import GPT, evaluating

from .distributed import Distributed
from .logger import RunLogger
from .preparation import PreparedRun


class Evaluator:
    """What a run is scored on, the same at every evaluation: fixed windows of the train and
    validation tokens (or conversations), eval_iters × the global batch of them (or
    train.eval_windows), so that the figure does not depend on how the batch is laid out
    over processes and micro-batches; and a validation text for the attention maps."""

    def __init__(self, run: PreparedRun, grad_accum: int, dist: Distributed, device: torch.device, dtype: torch.dtype,
                 objective=None):
        block_size = run.model_config.block_size
        settings = run.config.train
        count = settings.eval_windows or settings.eval_iters * settings.batch_size * grad_accum * dist.world_size
        self.val = run.data.evaluation_rows("val", block_size, count, settings.seed)
        self.train = run.data.evaluation_rows("train", block_size, count, settings.seed)
        self.attention_ids = torch.from_numpy(run.data.val[:min(block_size, 128)].astype(np.int64))[None].to(device)
        self.probe = induction_probe(run.data.tokenizer, run.model_config.vocab_size, block_size).to(device)
        self.tokenizer = run.data.tokenizer
        self.batch_size = settings.batch_size
        self.dist = dist
        self.device = device
        self.dtype = dtype
        self.prompt = settings.sample_prompt
        self.tokens = settings.sample_tokens
        self.loss_figures = run.data.loss_figures  # (a text's: bits per character; conversations' answers: none)
        self.objective = objective if objective is not None else NextToken()  # what is scored (jobs/objective.py)

    @torch.no_grad()
    def scores(self, model: GPT, rows: tuple, split: str = "val") -> dict[str, float]:
        """The objective's figures over fixed rows of `split` (a text's windows, conversations,
        pairs: their tensors along the first dimension): "loss", the mean per scored target (or
        per pair), and any others. Each process scores every world_size-th row, batch_size at a time, and
        the sums are added over the processes."""
        mine = [t[self.dist.rank::self.dist.world_size] for t in rows]
        totals: dict[str, float] = {}
        count = 0
        for start in range(0, len(mine[0]), self.batch_size):
            with autocast(self.device, self.dtype):
                sums, scored = self.objective.evaluate(model, [t[start:start + self.batch_size] for t in mine],
                                                       self.device, split)
            count += scored
            for name, value in sums.items():
                totals[name] = totals.get(name, 0.0) + value
        names = sorted(totals)
        *summed, count = self.dist.sum([totals[name] for name in names] + [count], self.device)
        return {name: value / count for name, value in zip(names, summed)}

    def loss(self, model: GPT, rows: tuple, split: str = "val") -> float:
        """The objective's mean loss over fixed rows of `split` (scores)."""
        return self.scores(model, rows, split)["loss"]

    @torch.no_grad()
    def estimate_seconds(self, model: GPT, clock=time.perf_counter) -> float:
        """What an evaluation will take, from one batch of its validation windows and a few
        tokens of its sample, scaled to all of both splits' windows and all of the sample's
        tokens (the time budget's estimate until a real evaluation is timed)."""
        with evaluating(model):
            started = clock()
            with autocast(self.device, self.dtype):
                self.objective.evaluate(model, [t[:self.batch_size] for t in self.val], self.device, "val")
            per_batch = clock() - started
            batches = 2 * math.ceil(len(self.val[0]) / self.batch_size / self.dist.world_size)  # train and val
            started = clock()
            few = min(self.tokens, 4)
            if few:
                idx = torch.tensor([encode_or_start(self.tokenizer, self.prompt)], device=self.device)
                model.generate(idx, few, temperature=0.8, generator=torch.Generator(device=self.device).manual_seed(0))
            per_token = (clock() - started) / few if few else 0.0
        return batches * per_batch + self.tokens * per_token

    def sample(self, model: GPT) -> str:
        """train.sample_prompt and sample_tokens more, at temperature 0.8, from a generator of
        its own (seed 0): a change between two evaluations comes from the weights."""
        idx = torch.tensor([encode_or_start(self.tokenizer, self.prompt)], device=self.device)
        generator = torch.Generator(device=self.device).manual_seed(0)
        with autocast(self.device, self.dtype):
            out = model.generate(idx, self.tokens, temperature=0.8, generator=generator,
                                 suppress_tokens=suppressed_ids(self.tokenizer))
        return self.tokenizer.decode(out[0].tolist())

    def log(self, log: RunLogger, it: int, model: GPT, weights: str, trained: GPT | None = None) -> float:
        """Score `model` (`weights` says which they are) and `trained` if given (the
        weights that `model` averages), log the figures, the attention maps and a sample;
        returns the validation loss."""
        train_loss, val = self.loss(model, self.train, "train"), self.scores(model, self.val)
        val_loss = val.pop("loss")
        figures, per = self.loss_figures(val_loss)
        metrics = {"val/loss": val_loss, "train/eval_loss": train_loss, **{f"val/{name}": value for name, value in val.items()},
                   **{f"val/{key.removeprefix('val_')}": value for key, value in figures.items()}}
        if trained is not None:
            metrics["val/loss_raw_weights"] = self.loss(trained, self.val)
            weights += f"; the trained weights: val {metrics['val/loss_raw_weights']:.4f}"
        said = [per]
        if self.objective.per_token:  # a mean over tokens: its exponential is a perplexity
            metrics["val/perplexity"] = math.exp(min(val_loss, 50))
            said.insert(0, f"perplexity {metrics['val/perplexity']:.2f}")
        said += [f"{name} {value:.4g}" for name, value in val.items()]
        log.scalars(it, metrics)
        log.message(f"iter {it}: train {train_loss:.4f}, val {val_loss:.4f} ({', '.join(said)}; {weights})")
        if self.dist.is_main and self.tokens:
            log.text("samples", self.sample(model), it)
        return val_loss

    def log_heads(self, log: RunLogger, it: int, model: GPT) -> None:
        """Every head's attention map on the validation text (TensorBoard's Images) and its
        previous-token and induction scores (Scalars; inspection/head_scores.py), from the
        model's own forward pass."""
        if self.dist.is_main:
            scores = head_scores(model, self.attention_ids, self.probe)
            log.attention(it, scores["maps"])
            log.head_scores(it, scores)


@dataclass
class LossesRead:
    """What StepLosses.read found in the steps since the last read."""

    loss: float  # the last step's loss
    grad_norm: float  # and its gradients' norm
    figures: dict[str, float]  # the objective's other figures, the mean over the steps read (DPO's rewards)
    bad_at: int | None  # the first iteration whose loss (or norm) is not finite; None: none
    bad_loss: float  # that iteration's loss and norm (meaningless when bad_at is None)
    bad_norm: float


class StepLosses:
    """The loss and gradient norm of each step since the last read, still on the device.
    Reading a number from a GPU waits for all the work queued before it, so they are read
    together, in one transfer, when the loop needs them: every log_interval iterations and
    before each evaluation and checkpoint (so a non-finite loss never reaches one)."""

    def __init__(self):
        self.pending: list[tuple[int, torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]] = []
        self.initial: float | None = None  # the first step's loss: the model's at initialisation

    def state_dict(self) -> dict:
        return {"initial": self.initial}

    def load_state_dict(self, state: dict) -> None:
        self.initial = state["initial"]

    def add(self, iteration: int, loss: torch.Tensor, grad_norm: torch.Tensor,
            figures: dict[str, torch.Tensor] | None = None) -> None:
        self.pending.append((iteration, loss, grad_norm, figures or {}))

    def read(self, check_norms: bool) -> LossesRead:
        """The pending steps' losses (and norms, checked with check_norms), then forgotten.
        The first step's loss is kept as `initial`."""
        iterations = [iteration for iteration, _, _, _ in self.pending]
        losses = torch.stack([loss for _, loss, _, _ in self.pending])  # [steps]
        norms = torch.stack([norm for _, _, norm, _ in self.pending]).to(losses.dtype)  # [steps]
        names = sorted(self.pending[-1][3])
        means = [torch.stack([figures[name] for _, _, _, figures in self.pending]).float().mean() for name in names]
        self.pending = []
        bad = ~torch.isfinite(losses)
        if check_norms:
            bad |= ~torch.isfinite(norms)
        first = torch.where(bad.any(), bad.int().argmax(), -1)
        at = first.clamp(min=0)
        read = torch.stack([losses[-1], norms[-1], first.to(losses.dtype), losses[at], norms[at],
                            losses[0], *(mean.to(losses.dtype) for mean in means)]).tolist()  # one transfer
        loss, norm, first_bad, bad_loss, bad_norm, first_loss, *figures = read
        if iterations[0] == 1:
            self.initial = first_loss
        return LossesRead(loss, norm, dict(zip(names, figures)), iterations[int(first_bad)] if first_bad >= 0 else None,
                          bad_loss, bad_norm)
