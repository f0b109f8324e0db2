"""train.snapshots: the model as it forms, kept at a fixed schedule of steps so that the
explorer can show the learner's own model at each one (explore.py's timeline).

The steps are 0 (the model at initialisation) and 1, 2, 5, 10, 20, 50, 100, ... (log-spaced:
the early steps change the model most), then the run's last step. The schedule does not
depend on the run's length, so a resumed run, or one whose time budget refits its length,
keeps the same list. Each snapshot is the model the run evaluates at that step (the average
of the weights with train.ema), in float32 safetensors, in the run folder (RunDir).
"""

from __future__ import annotations

import math

from common.run_dir import RunDir
from model import GPT

DEFAULT_COUNT = 16
SNAPSHOT_PARAMETERS = 4_000_000  # up to this size (16 MB a snapshot), train.snapshots is on unless set


def scheduled(step: int) -> bool:
    """Step 0, and 1, 2 and 5 times a power of ten."""
    if step == 0:
        return True
    power = 10 ** int(math.log10(step))
    return step % power == 0 and step // power in (1, 2, 5)


class Snapshots:
    """At most `limit` snapshots (the last place kept for the run's last step); 0: none."""

    def __init__(self, run_dir: RunDir, limit: int, writes: bool):
        self.run_dir = run_dir
        self.limit = limit
        self.writes = writes  # (under DDP, the main process writes)

    @classmethod
    def for_run(cls, run_dir: RunDir, setting: int | None, model: GPT, writes: bool) -> "Snapshots":
        """train.snapshots, or its default for the model's size."""
        limit = setting if setting is not None else DEFAULT_COUNT if model.num_parameters() <= SNAPSHOT_PARAMETERS else 0
        return cls(run_dir, limit, writes)

    def due(self, step: int, last: int) -> bool:
        """Whether to keep the model of `step`, the run ending at `last`."""
        if self.limit == 0 or not (step == last or scheduled(step)):
            return False
        kept = sum(1 for kept_step in self.run_dir.snapshot_paths() if kept_step < step)
        return step == last or kept < self.limit - 1

    def save(self, step: int, model: GPT) -> None:
        """Raises OSError if the file cannot be written (a full disk): the trainer stops."""
        if self.writes:
            self.run_dir.save_snapshot(step, model)

    def drop_after(self, step: int) -> None:
        """A run resumed at `step` keeps the snapshots up to it and deletes those after it
        (written by the process that was stopped or killed after its checkpoint): they are
        taken again."""
        if self.writes:
            for later, path in self.run_dir.snapshot_paths().items():
                if later > step:
                    path.unlink()
