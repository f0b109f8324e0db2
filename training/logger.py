"""What the user sees during training: a progress bar (or plain lines when stdout is
not a terminal), TensorBoard event files in out_dir, and the same scalars in its
metrics.jsonl."""

from __future__ import annotations

import json
import math
import sys
from typing import Any

from tqdm import tqdm

from runs.folder import RunDir
from inspection.head_scores import KINDS


def header(model, training: int, data, device, dtype, processes: int, resumed_at: int) -> str:
    """The run's first line: the model (and, of its numbers, how many train), the data, where
    and how it trains."""
    import torch

    c = model.config
    trains = "" if training == model.num_parameters() else (
        f" ({training:,} train: LoRA's adapters, lora/, any modules trained whole and any new tokens' rows)")
    return (f"model: {model.num_parameters():,} parameters{trains}, {c.n_layer} layers, {c.pos_encoding} positions | "
            f"data: {len(data.train):,} train / {len(data.val):,} val tokens"
            + (f" (val: {data.validated_on()})" if data.validated_on() else "")
            + f", vocab {data.vocab_size} | {device}, "
            f"{str(dtype).removeprefix('torch.')}, {torch.get_num_threads()} threads, {processes} process(es)"
            + (f" | resuming at iteration {resumed_at}" if resumed_at else ""))


def optimizer_settings(optimizers: list[dict]) -> dict[tuple[int, str], object]:
    """Each group's settings in saved optimizer states, {(optimizer, key): value}; the rate
    of each step and Muon's momentum are the schedule's, so they are left out."""
    return {(number, "peak lr" if key == "initial_lr" else key): value
            for number, state in enumerate(optimizers) for group in state["param_groups"]
            for key, value in group.items() if key not in ("params", "lr", "momentum")}


def what_changed(before, after, optimizer_names: list[str], lr: float) -> list[str]:
    """What going on from the saved state `before` changed in the state `after` (both
    training/state.TrainerState), the config being as it is now: the optimizers' settings,
    where the decay ends (it goes on along the rest of its curve), a shorter warm-up."""
    said = []
    old = optimizer_settings(before.optimizers)
    settings = [f"{optimizer_names[n]} {key} {old.get((n, key))} -> {value}"
                for (n, key), value in optimizer_settings(after.optimizers).items() if old.get((n, key)) != value]
    if settings:
        said.append(f"resuming with the optimizer settings of the config as it is now: "
                    f"{'; '.join(dict.fromkeys(settings))}")  # (AdamW's two groups change alike)
    if after.iteration and after.schedule["decay_iters"] != before.schedule["decay_iters"]:
        said.append(f"continuing: the learning rate's decay now ends at iteration {after.schedule['decay_iters']} (it "
                    f"ended at {before.schedule['decay_iters']}); it goes on from {lr:.2e} along the rest of its "
                    "curve, so it does not jump (docs/usage.md)")
    return said + warmup_change(before.schedule, after.schedule, after.budget["max_iters"])


def warmup_change(before: dict, after: dict, length: int) -> list[str]:
    """The warm-up of schedule state `after` shortened from `before`'s, for a run of `length` iterations."""
    if after["warmup"] == before["warmup"]:
        return []
    return [f"the learning-rate warm-up now ends at iteration {after['warmup']} instead of {before['warmup']}, so "
            f"that it takes at most a tenth of what is left of a run of {length} iterations"]


def budget_message(budget, target: int) -> str:
    """The time budget's first estimate (training/budget.py)."""
    return (f"time budget {budget.minutes:g} min: {1000 * budget.pace:.0f} ms per iteration, {budget.overhead:.1f} s "
            f"per evaluation and checkpoint; training to iteration {target}")


def stopped_message(it: int, out_dir) -> str:
    return f"stopped at iteration {it}; checkpoint saved in {out_dir}. Run the same command to continue."


def finished_message(it: int, out_dir, limit: str) -> str:
    return (f"{out_dir} already holds a finished run of {it} iterations; add --fresh to start over or raise {limit} "
            "to continue")


BUSY_SAID = 0.25  # the share of a budgeted run's training time on a busy machine that is said


def done_message(it: int, total: float, mine: float, val_loss: float, best: float, out_dir, try_it: str,
                 barely_trained: dict | None, continue_command: str, got: dict | None = None,
                 epochs: float | None = None, snapshots: int = 0, items: str = "conversations") -> str:
    """The last lines: iterations, the run's whole time (and this process's part, after a
    resume), the loss, and the command that tries the model (its job's, `try_it`); under a time budget, the iterations against
    those the same time would have reached at the best pace the run measured here (`got`:
    TimeBudget.report), and when the machine was busy for a large part of it, that it was (a
    run of fixed length: what the same steps would have taken at that pace); when the model is
    barely trained, why, and the command that trains it on; with two or more `snapshots`, the
    explorer's command. `epochs`: the passes over a run's `items` (conversations, pairs; None: a
    text's windows, drawn in no epochs)."""
    part = f", {mine / 60:.1f} min ({mine:.0f} s) of them in this process" if total > mine + 0.5 else ""
    passes = f" ({epochs:.2f} epochs of the {items})" if epochs is not None else ""
    done = (f"done: {it} iterations{passes} in {total / 60:.1f} min ({total:.0f} s){part}; val loss {val_loss:.4f} "
            f"(best {best:.4f}); model in {out_dir}\n")
    if got is not None and got.get("budget", True):
        done += (f"at the best pace this run measured on this machine ({1000 * got['best_pace']:.0f} ms an iteration), "
                 f"its timed training would have held {got['at_best_pace']} iterations; it held {got['timed_iterations']}")
        if got["busy_share"] >= BUSY_SAID:
            done += (f"; the machine was busy (other work on its cores) for {got['busy_share']:.0%} of the training "
                     f"time, so this run trained less than the docs' runs: to train on, {continue_command}")
        done += "\n"
    elif got is not None and got["busy_share"] >= BUSY_SAID:  # a run of fixed length: the same steps, more time
        done += (f"the machine was busy (other work on its cores) for {got['busy_share']:.0%} of the training time: at "
                 f"the best pace this run measured ({1000 * got['best_pace']:.0f} ms an iteration) its timed training "
                 f"would have taken {got['timed_iterations'] * got['best_pace']:.0f} s, not "
                 f"{got['training_seconds']:.0f} s\n")
    if barely_trained:
        if barely_trained.get("held_off"):  # (an experiment: the heads held off may be what it measures)
            done += (f"the model is barely trained: {barely_trained['text']}, with {', '.join(barely_trained['held_off'])} "
                     "held off from step 0 (train.heads_off): what it could not learn without them may be the "
                     f"experiment's answer (a longer run tells whether it learns later: {continue_command})\n")
        else:
            done += (f"the model is barely trained: {barely_trained['text']}. Its samples will read as noise. "
                     f"Train it on: {continue_command}\n")
    if snapshots:  # the model as it formed: the explorer's timeline
        done += f"watch it form: python explore.py --checkpoint {out_dir}\n"
    return done + try_it


SHORT = {"rewards/margins": "margin", "rewards/accuracies": "right"}  # the figures a progress line shows, by name


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

    def head_scores(self, step: int, scores: dict) -> None:
        """{kind: [n_layer, H]} (inspection/head_scores.py's KINDS): one scalar per head and
        score, drawn together by layout_heads's charts."""
        if self.writer is not None:
            for kind in KINDS:
                for layer, row in enumerate(scores[kind].tolist()):
                    for head, value in enumerate(row):
                        self.writer.add_scalar(f"heads/{kind}/layer{layer}_head{head}", value, step)

    def layout_heads(self) -> None:
        """TensorBoard's Custom Scalars tab: one chart per score, every head a line in it."""
        if self.writer is not None:
            self.writer.add_custom_scalars({"attention heads": {
                "current-token score (weight on its own token)": ["Multiline", [r"heads/current_token/.*"]],
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

    def progress(self, it: int, loss: float, lr: float, tokens_per_sec: float,
                 figures: dict[str, float] | None = None) -> None:
        """The progress bar (a terminal), or a line every log_interval; figures: the objective's
        others (DPO's reward margin and the share of pairs ranked right)."""
        if not self.enabled:
            return
        shown = {SHORT[name]: f"{value:.3f}" for name, value in (figures or {}).items() if name in SHORT}
        if self.bar is not None:
            self.bar.n = it
            self.bar.set_postfix(loss=f"{loss:.4f}", **shown, lr=f"{lr:.2e}", tok_s=f"{tokens_per_sec:,.0f}",
                                 refresh=False)
            self.bar.refresh()
        elif it % self.log_interval == 0:
            print(f"iter {it} | loss {loss:.4f} | " + "".join(f"{name} {value} | " for name, value in shown.items())
                  + f"lr {lr:.2e} | {tokens_per_sec:,.0f} tok/s", flush=True)

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
