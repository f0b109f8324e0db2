"""DistributedDataParallel set-up for torchrun: one process per GPU (or CPU slot).

torchrun sets RANK, LOCAL_RANK and WORLD_SIZE; without them this is a single process
and every helper below is a no-op. NCCL on GPUs, gloo on CPUs.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist


@dataclass
class Distributed:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def nodes(self) -> int:
        """Machines in the run: torchrun starts LOCAL_WORLD_SIZE processes on each."""
        return self.world_size // int(os.environ.get("LOCAL_WORLD_SIZE", self.world_size))

    def barrier(self) -> None:
        if self.enabled:
            dist.barrier()

    def sum(self, values: list[float], device: torch.device) -> list[float]:
        """Element-wise sum over all ranks."""
        if not self.enabled:
            return values
        t = torch.tensor(values, dtype=torch.float64, device=device)
        dist.all_reduce(t)
        return t.tolist()

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's obj, in rank order (on every rank)."""
        if not self.enabled:
            return [obj]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def wrap(self, model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
        """The module the training step calls: under torchrun, DistributedDataParallel,
        which averages the gradients over the processes during backward."""
        if not self.enabled:
            return model
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)

    def close(self) -> None:
        if dist.is_initialized():  # (torchrun with one process joins a group too)
            dist.destroy_process_group()


JOIN_SECONDS = 60  # how long the processes of one launch wait for each other before giving up


class JoinError(Exception):
    """The processes of a launch did not all join the group in time (exit code 1)."""


def join_process_group(device_type: str) -> Distributed:
    """Join the process group when launched by torchrun (else: one process alone)."""
    if "RANK" not in os.environ:
        return Distributed()
    d = Distributed(int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", 0)), int(os.environ["WORLD_SIZE"]))
    backend = "nccl" if device_type == "cuda" else "gloo"
    if device_type == "cuda":
        torch.cuda.set_device(d.local_rank)
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        dist.init_process_group(backend=backend, store=launch_store(d), rank=d.rank, world_size=d.world_size)
    else:
        dist.init_process_group(backend=backend)
    return d


def launch_store(d: Distributed) -> dist.Store:
    """The key-value store of torchrun's agent, seen through a prefix that belongs to this
    launch of the workers alone.

    torchrun keeps one store for the whole job, and after it restarts the workers (a lost
    worker under --max-restarts) the new processes find the keys the dead ones wrote: the
    process group's addresses. A new process that reads a dead one's address connects to
    nothing, and the group fails or hangs for good (torch issue 135712). So each process
    claims the slot of its rank in numbered launches: a slot already held belongs to a dead
    process, and whoever finds one moves everyone on to the next number. A launch is
    agreed on when every rank's slot in it is claimed and every claimant says so."""
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                          timeout=timedelta(seconds=JOIN_SECONDS))
    me = f"{socket.gethostname()}/{os.getpid()}/{time.time_ns()}"
    deadline = time.monotonic() + JOIN_SECONDS
    while time.monotonic() < deadline:
        launch = store.add("workers/launch", 0)  # (adding 0 reads the counter)
        prefix = f"workers/{launch}"

        def all_present(kind: str) -> bool:
            """Wait until every rank wrote its `kind` key in this launch; False if the launch moved on."""
            while not store.check([f"{prefix}/{kind}{rank}" for rank in range(d.world_size)]):
                if store.add("workers/launch", 0) != launch or time.monotonic() > deadline:
                    return False
                time.sleep(0.02)
            return True

        if store.compare_set(f"{prefix}/claim{d.rank}", "", me) != me.encode():  # a dead process's slot
            store.compare_set("workers/launch", str(launch), str(launch + 1))
            continue
        if all_present("claim"):
            store.set(f"{prefix}/ready{d.rank}", me)
            if all_present("ready"):
                return dist.PrefixStore(prefix, store)
    raise JoinError(f"rank {d.rank}: the {d.world_size} processes did not all join within {JOIN_SECONDS} s; "
                    "a process or a node is missing (torchrun restarts the group if --max-restarts allows)")
