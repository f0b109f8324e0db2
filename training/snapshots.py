"""train.snapshots: the model as it forms, kept at a schedule of steps so that the explorer
can show the learner's own model at each one (explore.py's timeline).

The schedule is an even grid that thins itself. Step 0 (the model at initialisation) and
the run's last step are always kept; in between, every `every` steps (train.snapshot_every),
as long as that keeps at most `limit` snapshots (train.snapshots); when the next one would
be one too many, the grid's spacing doubles and the snapshots off the new grid are deleted.
So the snapshots stay evenly spread over the steps trained so far, at whatever length the
run ends, and which steps are kept depends on the step reached alone, never on where the
run will end: a resumed run, or one whose time budget refits its length, keeps the same
ones. Each snapshot is the model the run evaluates at that step (the average of the
weights with train.ema), in float32 safetensors, in the run folder (RunDir).
"""

from __future__ import annotations

from runs.folder import RunDir
from model import GPT

SNAPSHOT_BYTES = 64 * 2**20  # the float32 snapshots a run keeps by default, at most (disk)
FEWEST, MOST = 16, 64  # the default limit's range: the quick start's model keeps 20, a small one 64
SNAPSHOT_PARAMETERS = 4_000_000  # up to this size (16 MB a snapshot), train.snapshots is on unless set


def spacing(step: int, every: int, limit: int) -> int:
    """The grid's spacing once step `step` is reached: `every` doubled as often as it takes
    for the grid's steps between 0 and `step` to number at most limit - 2 (step 0 and step
    `step`, the last one so far, take the other two places)."""
    spaced = every
    while (step - 1) // spaced > max(limit - 2, 1):
        spaced *= 2
    return spaced


class Snapshots:
    """At most `limit` snapshots (0: none) on a grid of `every` steps that thins itself."""

    def __init__(self, run_dir: RunDir, limit: int, every: int, writes: bool):
        self.run_dir = run_dir
        self.limit = limit
        self.every = every
        self.writes = writes  # (under DDP, the main process writes)

    @classmethod
    def for_run(cls, run_dir: RunDir, limit: int | None, every: int, model: GPT, writes: bool) -> "Snapshots":
        """train.snapshots, or its default for the model's size: as many as SNAPSHOT_BYTES
        holds, FEWEST to MOST, none above SNAPSHOT_PARAMETERS parameters."""
        if limit is None:
            size = 4 * model.num_parameters()
            limit = min(MOST, max(FEWEST, SNAPSHOT_BYTES // size)) if model.num_parameters() <= SNAPSHOT_PARAMETERS else 0
        return cls(run_dir, limit, every, writes)

    def due(self, step: int, last: int) -> bool:
        """Whether to keep the model of `step`, the run ending at `last`."""
        if self.limit == 0:
            return False
        return step == 0 or step == last or step % spacing(step, self.every, self.limit) == 0

    def save(self, step: int, model: GPT) -> None:
        """Keep the model of `step`, and delete the snapshots the grid no longer holds (a
        last step of an earlier, shorter run among them). Raises OSError if the file
        cannot be written (a full disk): the trainer stops."""
        if not self.writes:
            return
        self.run_dir.save_snapshot(step, model)
        spaced = spacing(step, self.every, self.limit)
        for kept, path in self.run_dir.snapshot_paths().items():
            if 0 < kept < step and kept % spaced:
                path.unlink()

    def drop_after(self, step: int) -> None:
        """A run resumed at `step` keeps the snapshots up to it and deletes those after it
        (written by the process that was stopped or killed after its checkpoint): they are
        taken again."""
        if self.writes:
            for later, path in self.run_dir.snapshot_paths().items():
                if later > step:
                    path.unlink()
