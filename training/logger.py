"""What the user sees during training: a progress bar (or plain lines when stdout is
not a terminal), TensorBoard event files in out_dir, and the same scalars in its
metrics.jsonl."""

from __future__ import annotations

import json
import math
import sys
from typing import Any

from tqdm import tqdm

from common.run_dir import RunDir


def header(model, data, device, dtype, processes: int, resumed_at: int) -> str:
    """The run's first line: the model, the data, where and how it trains."""
    import torch

    c = model.config
    training = sum(p.numel() for p in model.parameters() if p.requires_grad)
    trains = "" if training == model.num_parameters() else f" ({training:,} train: LoRA's adapters, lora/)"
    return (f"model: {model.num_parameters():,} parameters{trains}, {c.n_layer} layers, {c.pos_encoding} positions | "
            f"data: {len(data.train):,} train / {len(data.val):,} val tokens, vocab {data.vocab_size} | {device}, "
            f"{str(dtype).removeprefix('torch.')}, {torch.get_num_threads()} threads, {processes} process(es)"
            + (f" | resuming at iteration {resumed_at}" if resumed_at else ""))


def continuation_message(old_end: int, new_end: int, lr: float) -> str:
    return (f"continuing: the learning rate's decay now ends at iteration {new_end} (it ended at {old_end}); it "
            f"goes on from {lr:.2e} along the rest of its curve, so it does not jump (docs/usage.md)")


def warmup_message(old_end: int, new_end: int, length: int) -> str:
    return (f"the learning-rate warm-up now ends at iteration {new_end} instead of {old_end}, so that it takes at "
            f"most a tenth of what is left of a run of {length} iterations")


def done_message(it: int, total: float, mine: float, val_loss: float, best: float, out_dir, prompt: str,
                 barely_trained: dict | None, continue_command: str) -> str:
    """The last lines: iterations, the run's whole time (and this process's part, after a
    resume), the loss, and a prompt the run's tokenizer can encode to try the model; when
    the model is barely trained, why, and the command that trains it on."""
    part = f", {mine / 60:.1f} min ({mine:.0f} s) of them in this process" if total > mine + 0.5 else ""
    done = (f"done: {it} iterations in {total / 60:.1f} min ({total:.0f} s){part}; val loss {val_loss:.4f} "
            f"(best {best:.4f}); model in {out_dir}\n")
    if barely_trained:
        done += (f"the model is barely trained: {barely_trained['text']}. Its samples will read as noise. "
                 f"Train it on: {continue_command}\n")
    return done + f"try it: python generate.py --checkpoint {out_dir} --prompt \"{prompt}\""


class RunLogger:
    """Only rank 0 logs; on other ranks every method does nothing. Every scalar goes to
    TensorBoard and, one JSON line per step, to the run folder's metrics.jsonl, for a script
    or another logger that reads a run without TensorBoard."""

    def __init__(self, run_dir: RunDir, enabled: bool, start_iter: int, max_iters: int, log_interval: int):
        self.enabled = enabled
        self.log_interval = log_interval
        self.writer = None
        self.metrics = None
        self.bar = None
        if not enabled:
            return
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(run_dir.path))
        self.metrics = run_dir.open_metrics(start_iter)
        if sys.stdout.isatty():
            self.bar = tqdm(total=max_iters, initial=start_iter, unit="it", dynamic_ncols=True)

    def message(self, text: str) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.write(text)
        else:
            print(text, flush=True)

    def scalars(self, step: int, values: dict[str, float]) -> None:
        if self.writer is not None:
            for tag, value in values.items():
                self.writer.add_scalar(tag, value, step)
        if self.metrics is not None:  # (JSON has no NaN: a value that is not finite is null)
            line = {"step": step, **{tag: float(v) if math.isfinite(v) else None for tag, v in values.items()}}
            self.metrics.write(json.dumps(line) + "\n")
            self.metrics.flush()

    def text(self, tag: str, text: str, step: int) -> None:
        if self.writer is not None:
            # TensorBoard renders markdown; a fenced block keeps line breaks and spaces
            self.writer.add_text(tag, "```\n" + text + "\n```", step)

    def attention(self, step: int, maps) -> None:
        """maps [n_layer, H, T, T]: one image per layer, its heads side by side."""
        if self.writer is not None:
            from inspection.attention_maps import heatmap_grid

            for layer, heads in enumerate(maps):
                self.writer.add_image(f"attention/layer_{layer}", heatmap_grid(heads[None]), step,
                                      dataformats="HWC")

    def head_scores(self, step: int, previous_token, induction) -> None:
        """[n_layer, H] each: one scalar per head and score, drawn together by layout_heads's charts."""
        if self.writer is not None:
            for kind, scores in (("previous_token", previous_token), ("induction", induction)):
                for layer, row in enumerate(scores.tolist()):
                    for head, value in enumerate(row):
                        self.writer.add_scalar(f"heads/{kind}/layer{layer}_head{head}", value, step)

    def layout_heads(self) -> None:
        """TensorBoard's Custom Scalars tab: one chart per score, every head a line in it."""
        if self.writer is not None:
            self.writer.add_custom_scalars({"attention heads": {
                "previous-token score (weight on the token just before)": ["Multiline", [r"heads/previous_token/.*"]],
                "induction score (weight on what followed the last occurrence)": ["Multiline", [r"heads/induction/.*"]],
            }})

    def hparams(self, config: dict[str, Any], metrics: dict[str, float]) -> None:
        """Hyperparameters in TensorBoard's HParams tab, in this run's own folder."""
        if self.writer is None:
            return
        from torch.utils.tensorboard.summary import hparams

        flat = {f"{section}.{k}": (v if isinstance(v, (int, float, str, bool)) else str(v))
                for section, values in config.items() if isinstance(values, dict)
                for k, v in values.items()}
        for summary in hparams(flat, metrics):
            self.writer.file_writer.add_summary(summary)

    def advance(self, it: int) -> None:
        """Move the bar to iteration `it` (its loss and speed change at the next progress)."""
        if self.bar is not None:
            self.bar.n = it
            self.bar.refresh()

    def progress(self, it: int, loss: float, lr: float, tokens_per_sec: float) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.n = it
            self.bar.set_postfix(loss=f"{loss:.4f}", lr=f"{lr:.2e}", tok_s=f"{tokens_per_sec:,.0f}", refresh=False)
            self.bar.refresh()
        elif it % self.log_interval == 0:
            print(f"iter {it} | loss {loss:.4f} | lr {lr:.2e} | {tokens_per_sec:,.0f} tok/s", flush=True)

    def retarget(self, max_iters: int) -> None:
        if self.bar is not None:
            self.bar.total = max_iters
            self.bar.refresh()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        if self.writer is not None:
            self.writer.close()
        if self.metrics is not None:
            self.metrics.close()

    def __enter__(self) -> "RunLogger":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
