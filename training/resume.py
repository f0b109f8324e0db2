"""Resuming a run from its state (training/state.py): `check` loads it and checks that it is
this run's, on every process; Trainer.resume then puts everything back where the saved run
stopped: weights, optimizers, iteration, the learning-rate schedule, and each process's RNG
and batch sampler, so the same batches and dropout masks follow and a resumed run ends
bit-identical to one never stopped. A run may also continue with another number of
processes (grad_accum_after).
"""

from __future__ import annotations

import random
import socket
import sys
from pathlib import Path

import numpy as np
import torch

from cli.program import UserError
from runs.folder import RunDir

from .distributed import Distributed
from .state import TrainerState


def seed_everything(seed: int) -> None:
    """torch's, Python's and NumPy's random streams (dropout, the samplers of data code)."""
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)


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


def check(run_dir: RunDir, run, dist: Distributed) -> TrainerState | None:
    """The run's state in run_dir (None: a new run), checked: of a layout this version
    reads, of the same model and data settings as `run` (training/preparation.PreparedRun),
    and the same on every process."""
    raw = run_dir.load_state()
    state = None if raw is None else TrainerState.from_dict(raw, str(run_dir.path / RunDir.STATE))
    if state is not None:
        check_resumable(state, run.identity, run_dir.path)
    if dist.enabled:
        check_same_checkpoint(dist, state, run_dir.path)
    return state


def check_resumable(state: TrainerState, identity: dict, out_dir: Path) -> None:
    """The checkpoint's model and data settings must be the requested ones."""
    saved = state.identity
    diffs = [f"{section}.{key}: checkpoint {saved.get(section, {}).get(key)!r}, requested {value!r}"
             for section in ("model", "data") for key, value in identity[section].items()
             if saved.get(section, {}).get(key) != value]
    if diffs:
        raise UserError(f"{out_dir} holds a run with a different setup ({'; '.join(diffs[:3])}); "
                        "add --fresh to start over there, or set out_dir=PATH for a new run")


def check_same_checkpoint(dist: Distributed, state: TrainerState | None, out_dir: Path) -> None:
    """Every process must resume from the same checkpoint: with several nodes, out_dir
    must be one folder they all see (rank 0 writes it, every process reads it)."""
    held = dist.gather((socket.gethostname(), None if state is None else state.iteration))

    def seen(iteration: int | None) -> str:
        return "no checkpoint" if iteration is None else f"the checkpoint of iteration {iteration}"

    for rank, (host, iteration) in enumerate(held):
        if iteration != held[0][1]:
            raise UserError(f"node {host} (rank {rank}) finds {seen(iteration)} in {out_dir}, rank 0 on "
                            f"{held[0][0]} {seen(held[0][1])}: put out_dir on storage every node shares")


def grad_accum_after(saved_processes: int, saved_accum: int, world_size: int, batch_size: int,
                     grad_accum: int) -> tuple[int, str]:
    """(train.grad_accum, what it means) for a run saved by `saved_processes` processes and
    resumed by `world_size`: the global batch (batch_size × grad_accum × processes) stays
    where the micro-batches split evenly, and then the samplers draw the very same windows
    (what differs: the dropout masks, each process's own, and the last bits of the sums)."""
    micro_batches = saved_accum * saved_processes  # per optimizer step, over all processes
    accum = micro_batches // world_size
    if accum >= 1 and accum * world_size == micro_batches:
        return accum, (f"train.grad_accum {saved_accum} -> {accum} keeps the global batch of "
                       f"{micro_batches * batch_size} sequences and its windows; dropout masks differ")
    return grad_accum, (f"its {micro_batches} micro-batches per step do not split evenly over {world_size} "
                        f"processes, so the global batch becomes {batch_size * grad_accum * world_size}"
                        " sequences and the batches differ (set train.grad_accum to choose)")


def grad_accum_for(state: TrainerState, dist: Distributed, settings) -> int:
    """The grad_accum a resumed run trains with (`settings`: the run config's train section);
    a change of process count is said on stderr."""
    saved = len(state.ranks)
    if saved == dist.world_size:
        return settings.grad_accum
    accum, what = grad_accum_after(saved, state.grad_accum, dist.world_size, settings.batch_size, settings.grad_accum)
    if dist.is_main:
        print(f"note: resuming a {saved}-process run with {dist.world_size}: {what}", file=sys.stderr)
    return accum


def load_optimizers(optimizers: list[torch.optim.Optimizer], saved: list[dict], out_dir: Path) -> None:
    """Each optimizer's state (its moments and step counts) from the checkpoint, and its
    settings (peak learning rates, betas, weight decay, ...) from the run config as it is
    now. (The rate and Muon's momentum of each step are the schedule's, from these.)"""
    if len(saved) != len(optimizers):
        raise UserError(f"{out_dir} was trained with another train.optimizer; add --fresh to start over "
                        "there, or set out_dir=PATH for a new run")
    for optimizer, optimizer_state in zip(optimizers, saved):
        wanted = [{k: v for k, v in group.items() if k not in ("params", "lr", "momentum")}
                  for group in optimizer.param_groups]
        optimizer.load_state_dict(optimizer_state)
        for group, settings in zip(optimizer.param_groups, wanted):
            group.update(settings)
