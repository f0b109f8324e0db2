"""Train a GPT: python train.py --config configs/tiny.yaml [section.key=value ...] [--fresh] [--explain]

Config → data → model → loop (evaluations, TensorBoard, checkpoints). Re-running the
same command resumes from out_dir; --fresh starts over. Under torchrun each process
trains on its own batches with DistributedDataParallel. --explain prints the shapes of
one traced forward pass of the configured model and exits without training.

Exit codes: 0 done, 1 training failed (non-finite loss), 2 bad input,
130/143 stopped by SIGINT/SIGTERM after saving a checkpoint.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import signal
import sys
import time
from pathlib import Path

import numpy as np
import torch
import yaml

from data import BatchSampler, DataError, fixed_batches, prepare
from data.tokenizer import encode_or_start
from model import GPT
from training import checkpoint
from training.attention_maps import attention_maps
from training.cli import OneLineParser, run_main
from training.config import RunConfig, UserError, load_config
from training.device import autocast, measure_peak_flops, resolve_device, resolve_dtype
from training.distributed import Distributed, setup
from training.logger import RunLogger


class TrainingError(Exception):
    """The run cannot go on (e.g. the loss is no longer finite); exit code 1."""


class Stop(Exception):
    def __init__(self, signum: int):
        self.signum = signum


# ---- learning rate and optimizer ---------------------------------------------

def learning_rate(it: int, cfg) -> float:
    """Linear warmup to lr, then cosine decay to min_lr at lr_decay_iters, then min_lr."""
    decay_iters = cfg.lr_decay_iters or cfg.max_iters
    if it < cfg.warmup_iters:
        return cfg.lr * (it + 1) / (cfg.warmup_iters + 1)
    if it >= decay_iters:
        return cfg.min_lr
    progress = (it - cfg.warmup_iters) / max(1, decay_iters - cfg.warmup_iters)
    return cfg.min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (cfg.lr - cfg.min_lr)


def make_optimizer(model: GPT, cfg, device: torch.device) -> torch.optim.AdamW:
    """AdamW; weight decay only on the matrices of Linear layers, never on norms,
    biases or embeddings (the tied embedding/LM head included)."""
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    decay = [p for p in model.parameters() if p.dim() >= 2 and id(p) not in embeddings]
    rest = [p for p in model.parameters() if p.dim() < 2 or id(p) in embeddings]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": rest, "weight_decay": 0.0}]
    fused = device.type in ("cpu", "cuda")
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), fused=fused)


# ---- run set-up ----------------------------------------------------------------

def check_out_dir(out_dir: Path) -> None:
    """Fail before any work if out_dir cannot be written."""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        probe = out_dir / ".write-test"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise UserError(f"out_dir {out_dir} cannot be written ({e.strerror}); "
                        "choose another with out_dir=PATH") from None


def identity(cfg: RunConfig, model_config) -> dict:
    """What must match for a checkpoint to be resumed: the model and the data."""
    data = {k: v for k, v in vars(cfg.data).items() if k != "cache_dir"}
    return {"model": model_config.to_dict(), "data": data}


def check_resumable(state: dict, wanted: dict, out_dir: Path) -> None:
    saved = state.get("identity", {})
    diffs = [f"{section}.{key}: checkpoint {saved.get(section, {}).get(key)!r}, requested {value!r}"
             for section in ("model", "data") for key, value in wanted[section].items()
             if saved.get(section, {}).get(key) != value]
    if diffs:
        raise UserError(f"{out_dir} holds a run with a different setup ({'; '.join(diffs[:3])}); "
                        "add --fresh to start over there, or set out_dir=PATH for a new run")


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


# ---- evaluation ----------------------------------------------------------------

@torch.no_grad()
def evaluate(model: GPT, batches, device, dtype, dist: Distributed) -> float:
    """Mean loss over fixed batches, split across ranks and averaged over all of them."""
    was_training = model.training
    model.eval()
    total = count = 0.0
    for x, y in batches[dist.rank::dist.world_size]:
        with autocast(device, dtype):
            _, loss = model(x.to(device), y.to(device))
        total += loss.item()
        count += 1
    model.train(was_training)
    total, count = dist.sum([total, count], device)
    return total / count


def sample_text(model: GPT, tokenizer, prompt: str, n_tokens: int, device) -> str:
    idx = torch.tensor([encode_or_start(tokenizer, prompt)], device=device)
    out = model.generate(idx, n_tokens, temperature=0.8, generator=torch.Generator(device=device).manual_seed(0))
    return tokenizer.decode(out[0].tolist())


# ---- the run -------------------------------------------------------------------

def data_settings(cfg: RunConfig) -> dict:
    d = cfg.data
    return dict(source=d.source, tokenizer=d.tokenizer, vocab_size=d.vocab_size, text_field=d.text_field,
                val_fraction=d.val_fraction, cache_dir=d.cache_dir)


def explain(cfg: RunConfig, dtype: torch.dtype) -> int:
    """Trace one forward pass of the configured model on a real batch; no training."""
    from training.explain import report

    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    data = prepare(**data_settings(cfg), progress=True)
    model_config = cfg.model_config(data.vocab_size)
    torch.manual_seed(cfg.train.seed)
    model = GPT(model_config)
    x, y = fixed_batches(data.train, model_config.block_size, cfg.train.batch_size, 1, cfg.train.seed, "train")[0]
    print(report(model, x, y, dtype))
    return 0


def train(args) -> int:
    start_time = time.perf_counter()
    cfg = load_config(args.config, args.overrides)
    tc = cfg.train
    device = resolve_device(tc.device)
    dtype = resolve_dtype(tc.dtype, device)
    if args.explain:
        return explain(cfg, dtype)
    dist = setup(device.type)
    if dist.enabled and device.type == "cuda":
        device = torch.device("cuda", dist.local_rank)
    out_dir = Path(cfg.out_dir)
    lock = checkpoint.RunLock(out_dir)
    try:
        if dist.is_main:
            check_out_dir(out_dir)
            if not lock.acquire():
                raise UserError(f"out_dir {out_dir} is in use by another training run (pid {lock.holder()}); "
                                "wait for it to finish or set out_dir=PATH")
        return run(cfg, args, device, dtype, dist, out_dir, start_time)
    finally:
        lock.release()
        dist.close()


def run(cfg: RunConfig, args, device, dtype, dist: Distributed, out_dir: Path, start_time: float) -> int:
    tc = cfg.train
    try:
        state = None if args.fresh else checkpoint.load_state(out_dir)
    except ValueError as e:
        raise UserError(str(e)) from None
    if tc.threads:
        torch.set_num_threads(tc.threads)

    # data: rank 0 tokenizes (or finds the token files); the others then reuse them
    prep = data_settings(cfg)
    if dist.is_main:
        data = prepare(**prep, progress=True)
    dist.barrier()
    if not dist.is_main:
        data = prepare(**prep, progress=False)

    model_config = cfg.model_config(data.vocab_size)
    wanted = identity(cfg, model_config)
    if state is not None:
        check_resumable(state, wanted, out_dir)
        if state["iter"] >= tc.max_iters:
            if dist.is_main:
                print(f"{out_dir} already holds a finished run of {state['iter']} iterations; "
                      f"add --fresh to start over or raise train.max_iters to continue")
            return 0
    block_size = model_config.block_size
    val_batches = fixed_batches(data.val, block_size, tc.batch_size, tc.eval_iters, tc.seed, "val")
    train_batches = fixed_batches(data.train, block_size, tc.batch_size, tc.eval_iters, tc.seed, "train")
    sampler = BatchSampler(data.train, block_size, tc.batch_size, tc.seed, dist.rank, dist.world_size)

    torch.manual_seed(tc.seed + dist.rank)
    random.seed(tc.seed + dist.rank)
    np.random.seed(tc.seed + dist.rank)
    model = GPT(model_config).to(device)
    optimizer = make_optimizer(model, tc, device)
    it, best_val = 0, float("inf")
    if state is not None:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        it, best_val = state["iter"], state["best_val_loss"]
        ranks = state["ranks"]
        if len(ranks) == dist.world_size:
            sampler.load_state_dict(ranks[dist.rank]["sampler"])
            set_rng_state(ranks[dist.rank]["rng"], device)
        elif dist.is_main:
            print(f"note: resuming {len(ranks)}-process state with {dist.world_size} processes; "
                  "batches will differ from the original run", file=sys.stderr)

    if dist.is_main:
        if args.fresh:  # the user asked to start over: drop the old state and curves
            (out_dir / checkpoint.STATE_FILE).unlink(missing_ok=True)
            for old in out_dir.glob("events.out.tfevents.*"):
                old.unlink()
        resolved = yaml.safe_dump(cfg.to_dict(), sort_keys=False, allow_unicode=True)
        checkpoint.write_atomic(out_dir / "config.yaml", resolved.encode())

    train_model = model
    if tc.compile:
        train_model = torch.compile(model)
    if dist.enabled:
        from torch.nn.parallel import DistributedDataParallel
        train_model = DistributedDataParallel(train_model, device_ids=[device.index] if device.type == "cuda" else None)
    scaler = torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)

    stop = {"signum": 0}

    def on_signal(signum, frame):
        if stop["signum"]:  # a second Ctrl-C: leave now; every file on disk is whole
            os._exit(128 + signum)
        stop["signum"] = signum
        print(f"stopping after this iteration ({signal.Signals(signum).name}); saving a checkpoint", file=sys.stderr)

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)

    log = RunLogger(out_dir, dist.is_main, it, tc.max_iters, tc.log_interval)
    if dist.is_main:
        log.text("config", resolved, it)
        log.message(f"model: {model.num_parameters():,} parameters, {model_config.n_layer} layers, "
                    f"{model_config.pos_encoding} positions | data: {len(data.train):,} train / "
                    f"{len(data.val):,} val tokens, vocab {data.vocab_size} | {device}, {str(dtype)[6:]}, "
                    f"{torch.get_num_threads()} threads, {dist.world_size} process(es)"
                    + (f" | resuming at iteration {it}" if it else ""))
    peak = measure_peak_flops(device, dtype) if dist.is_main else 1.0
    flops_per_token = model.flops_per_token(block_size)
    tokens_per_iter = tc.batch_size * block_size * tc.grad_accum  # per process
    bits_per_char = data.meta["val_tokens"] / max(1, data.meta["val_characters"]) / math.log(2)
    # a fixed piece of validation text whose attention maps are logged at each evaluation
    attention_ids = torch.from_numpy(data.val[:min(block_size, 128)].astype(np.int64))[None].to(device)
    if dist.is_main:
        log.text("attention/text", data.tokenizer.decode(attention_ids[0].tolist()), it)

    def save() -> None:
        ranks = dist.gather({"sampler": sampler.state_dict(), "rng": rng_state(device)})
        if not dist.is_main:
            return
        try:
            model.save_pretrained(out_dir)
            checkpoint.write_atomic(out_dir / "tokenizer.json", data.tokenizer.to_str().encode())
            checkpoint.save_state(out_dir, {
                "model": model.state_dict(), "optimizer": optimizer.state_dict(), "iter": it,
                "best_val_loss": best_val, "identity": wanted, "ranks": ranks})
        except OSError as e:  # a full disk, a quota, a vanished folder
            raise TrainingError(f"could not write the checkpoint of iteration {it} in {out_dir} "
                                f"({e.strerror or e}); the previous checkpoint is kept. Free some space "
                                "and run the same command to continue") from None

    checkpoint_interval = tc.checkpoint_interval or tc.eval_interval
    val_loss = float("nan")
    model.train()
    tick, tick_iter = time.perf_counter(), it
    try:
        while it < tc.max_iters:
            lr = learning_rate(it, tc)
            for group in optimizer.param_groups:
                group["lr"] = lr
            loss_sum = 0.0
            for micro in range(tc.grad_accum):
                x, y = sampler.next_batch()
                x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
                sync = micro == tc.grad_accum - 1 or not dist.enabled
                context = train_model.no_sync() if not sync else torch.enable_grad()
                with context, autocast(device, dtype):
                    _, loss = train_model(x, y)
                scaler.scale(loss / tc.grad_accum).backward()
                loss_sum += loss.item()
            scaler.unscale_(optimizer)
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), tc.grad_clip or float("inf")).item()
            loss_value = loss_sum / tc.grad_accum
            # with fp16 the scaler skips steps whose gradients overflowed; otherwise stop
            if not math.isfinite(loss_value) or not (math.isfinite(grad_norm) or scaler.is_enabled()):
                raise TrainingError(f"the loss became {loss_value} (gradient norm {grad_norm}) at iteration "
                                    f"{it + 1}; the last good checkpoint in {out_dir} is kept. "
                                    "Try a lower train.lr, train.grad_clip=1.0 or train.dtype=float32")
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
            it += 1
            signum = stop["signum"]
            if dist.enabled:  # one collective: the loss averaged over ranks, and whether any rank was signalled
                loss_total, signals = dist.sum([loss_value, stop["signum"]], device)
                loss_value = loss_total / dist.world_size
                signum = signum or (signal.SIGTERM if signals else 0)

            now = time.perf_counter()  # throughput averaged since the last log line
            tokens_per_sec = tokens_per_iter * (it - tick_iter) / max(now - tick, 1e-9)
            log.progress(it, loss_value, lr, tokens_per_sec * dist.world_size)
            if it % tc.log_interval == 0:
                log.scalars(it, {"train/loss": loss_value, "train/lr": lr, "train/grad_norm": grad_norm,
                                 "train/tokens_per_sec": tokens_per_sec * dist.world_size,
                                 "train/mfu": flops_per_token * tokens_per_sec / peak})
                tick, tick_iter = now, it
            if it % tc.eval_interval == 0 or it == tc.max_iters:
                train_loss = evaluate(model, train_batches, device, dtype, dist)
                val_loss = evaluate(model, val_batches, device, dtype, dist)
                best_val = min(best_val, val_loss)
                metrics = {"val/loss": val_loss, "val/perplexity": math.exp(min(val_loss, 50)),
                           "val/bits_per_char": val_loss * bits_per_char, "train/eval_loss": train_loss}
                log.scalars(it, metrics)
                log.message(f"iter {it}: train {train_loss:.4f}, val {val_loss:.4f} "
                            f"(perplexity {metrics['val/perplexity']:.2f}, {metrics['val/bits_per_char']:.3f} bits/char)")
                if dist.is_main:
                    log.attention(it, attention_maps(model, attention_ids))
                if dist.is_main and tc.sample_tokens:
                    with autocast(device, dtype):
                        log.text("samples", sample_text(model, data.tokenizer, tc.sample_prompt,
                                                        tc.sample_tokens, device), it)
                tick, tick_iter = time.perf_counter(), it  # evaluation time is not training throughput
            if it % checkpoint_interval == 0 or it == tc.max_iters:
                save()
            if signum:
                if it % checkpoint_interval and it != tc.max_iters:
                    save()
                raise Stop(signum)
        log.hparams(cfg.to_dict(), {"val/loss": val_loss, "val/best_loss": best_val})
    except Stop as s:
        log.message(f"stopped at iteration {it}; checkpoint saved in {out_dir}. "
                    f"Run the same command to continue.")
        return 128 + s.signum
    finally:
        log.close()
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)

    if dist.is_main:
        wall = time.perf_counter() - start_time
        print(f"done: {it} iterations in {wall / 60:.1f} min ({wall:.0f} s); val loss {val_loss:.4f} "
              f"(best {best_val:.4f}); model in {out_dir}")
        print(f"try it: python generate.py --checkpoint {out_dir} --prompt \"ROMEO:\"")
    return 0


# ---- command line ----------------------------------------------------------------

def parse_args(argv):
    parser = OneLineParser(prog="train.py", description=__doc__.split("\n\n")[0],
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="YAML run config, e.g. configs/tiny.yaml")
    parser.add_argument("overrides", nargs="*", metavar="section.key=value",
                        help="override config values, typed as YAML: train.max_iters=100 out_dir=out/exp")
    parser.add_argument("--fresh", action="store_true", help="start over, ignoring a checkpoint in out_dir")
    parser.add_argument("--explain", action="store_true",
                        help="print the shapes of one traced forward pass of this model, then exit")
    parser.add_argument("--debug", action="store_true", help="show full tracebacks")
    return parser.parse_intermixed_args(argv)


def main(argv=None) -> int:
    return run_main(parse_args, train, argv, {UserError: 2, DataError: 2, TrainingError: 1})


if __name__ == "__main__":
    sys.exit(main())
