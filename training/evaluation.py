"""What the trainer measures: the steps' losses, read from the device in one go; at each
evaluation, the mean loss over fixed windows and a sample of generated text."""

from __future__ import annotations

import math

import numpy as np
import torch

from inspection.attention_maps import attention_maps
from common.device import autocast
from data import fixed_windows
from data.tokenizer import encode_or_start, suppressed_ids
from model import GPT, evaluating

from .distributed import Distributed
from .logger import RunLogger
from .setup import Run


class Evaluator:
    """What a run is scored on, the same at every evaluation: fixed windows of the train and
    validation tokens, eval_iters × the global batch of them (or train.eval_windows), so
    that the figure does not depend on how the batch is laid out over processes and
    micro-batches; and a validation text for the attention maps."""

    def __init__(self, run: Run, dist: Distributed, device: torch.device, dtype: torch.dtype):
        c, tc = run.model_config, run.cfg.train
        count = tc.eval_windows or tc.eval_iters * tc.batch_size * run.grad_accum * dist.world_size
        self.val = fixed_windows(run.data.val, c.block_size, count, tc.seed, "val")
        self.train = fixed_windows(run.data.train, c.block_size, count, tc.seed, "train")
        self.attention_ids = torch.from_numpy(run.data.val[:min(c.block_size, 128)].astype(np.int64))[None].to(device)
        self.tokenizer, self.batch_size, self.dist, self.device, self.dtype = run.data.tokenizer, tc.batch_size, dist, device, dtype
        self.prompt, self.tokens, self.bits_per_character = tc.sample_prompt, tc.sample_tokens, run.data.bits_per_character

    @torch.no_grad()
    def loss(self, model: GPT, windows: tuple[torch.Tensor, torch.Tensor]) -> float:
        """Mean loss per window over x, y [N, T]: each process scores every world_size-th
        window, batch_size at a time, and the sums are added over the processes."""
        x, y = (t[self.dist.rank::self.dist.world_size] for t in windows)
        total = torch.zeros((), dtype=torch.float64, device=self.device)
        with evaluating(model):
            for start in range(0, len(x), self.batch_size):
                batch = slice(start, start + self.batch_size)
                with autocast(self.device, self.dtype):
                    _, loss = model(x[batch].to(self.device), y[batch].to(self.device))
                total += loss.double() * len(x[batch])  # every window has T targets: the sum of its means
        total, count = self.dist.sum([total.item(), len(x)], self.device)
        return total / count

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
        train_loss, val_loss = self.loss(model, self.train), self.loss(model, self.val)
        metrics = {"val/loss": val_loss, "val/perplexity": math.exp(min(val_loss, 50)),
                   "val/bits_per_char": self.bits_per_character(val_loss), "train/eval_loss": train_loss}
        if trained is not None:
            metrics["val/loss_raw_weights"] = self.loss(trained, self.val)
            weights += f"; the trained weights: val {metrics['val/loss_raw_weights']:.4f}"
        log.scalars(it, metrics)
        log.message(f"iter {it}: train {train_loss:.4f}, val {val_loss:.4f} (perplexity {metrics['val/perplexity']:.2f}, "
                    f"{metrics['val/bits_per_char']:.3f} bits/char; {weights})")
        if self.dist.is_main:
            log.attention(it, attention_maps(model, self.attention_ids))
            if self.tokens:
                log.text("samples", self.sample(model), it)
        return val_loss


def read_steps(steps: list[tuple[torch.Tensor, torch.Tensor]], check_norms: bool) -> list[float]:
    """(loss, gradient norm) of some steps, still on the device -> [the last loss, the last
    norm, the index of the first step whose loss (or norm, with check_norms) is not finite
    or -1, that step's loss and norm], in one transfer from the device."""
    losses, norms = (torch.stack(values) for values in zip(*steps))  # [steps] each
    bad = ~torch.isfinite(losses)
    if check_norms:
        bad |= ~torch.isfinite(norms)
    first = torch.where(bad.any(), bad.int().argmax(), -1)
    at = first.clamp(min=0)
    loss, norm, first, bad_loss, bad_norm = torch.stack(
        [losses[-1], norms[-1].to(losses.dtype), first.to(losses.dtype), losses[at], norms[at].to(losses.dtype)]).tolist()
    return [loss, norm, int(first), bad_loss, bad_norm]
