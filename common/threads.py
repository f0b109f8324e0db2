"""How the programs share the CPU with other work: OpenMP's wait policy and torch's thread
count, one rule for every program. Each program imports this module before torch.

torch's OpenMP threads spin while they wait for work (OpenMP's ACTIVE policy). On an idle
machine that costs nothing; beside another busy process the spinning threads fight it for
the cores, and a training step took 2.6 times as long, batch-1 decoding 30 times
(docs/performance.md, "On a busy machine"). The PASSIVE policy lets a waiting thread sleep.
OpenMP reads the policy once, when torch loads it, so it is set here, at import, unless the
user set OMP_WAIT_POLICY.

The thread count, highest first: the program's --threads N (train.py: train.threads), the
user's OMP_NUM_THREADS (torchrun sets 1 for each worker), then the default measured for
each kind of work (DEFAULT_THREADS).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# torch's threads for each kind of work when neither --threads nor OMP_NUM_THREADS says;
# None: one per core. Measured with python -m bench.load (docs/performance.md): decoding
# and the explorer's small forward passes are fastest on one thread, quiet or busy.
DEFAULT_THREADS = {"train": None, "evaluate": None, "generate": 1, "explore": 1, "export": 1}


def thread_help(work: str) -> str:
    default = DEFAULT_THREADS[work]
    return (f"torch's CPU threads (default: $OMP_NUM_THREADS if set, else "
            f"{'one per core' if default is None else default}; OpenMP waits passively unless $OMP_WAIT_POLICY says)")


def use_threads(work: str, requested: int | None = None) -> int:
    """Set torch's intra-op threads for `work` by the rule above; returns how many."""
    import torch

    if requested is not None:
        count = requested
    elif os.environ.get("OMP_NUM_THREADS"):
        return torch.get_num_threads()  # (torch took it when it loaded)
    else:
        count = DEFAULT_THREADS[work] or os.cpu_count() or 1
    torch.set_num_threads(count)
    return count
