"""Ctrl-C and SIGTERM ask a training run to stop after the iteration it is in, so that it
saves a checkpoint first; a second Ctrl-C leaves at once (every file on disk is whole,
since each is written atomically)."""

from __future__ import annotations

import os
import signal
import sys
from contextlib import contextmanager

from cli.program import Terminated


class StopRequest:
    """Inside `with StopRequest() as stop:`, stop.signal is the signal that asked the run
    to stop (0: none yet)."""

    def __init__(self):
        self.signal = 0

    def __enter__(self) -> "StopRequest":
        signal.signal(signal.SIGINT, self.on_signal)
        signal.signal(signal.SIGTERM, self.on_signal)
        return self

    def __exit__(self, *exc) -> None:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)

    def on_signal(self, signum, frame) -> None:
        if self.signal:  # a second Ctrl-C: leave now
            os._exit(128 + signum)
        self.signal = signum
        print(f"stopping after this iteration ({signal.Signals(signum).name}); saving a checkpoint", file=sys.stderr)


@contextmanager
def terminated_as_interrupt():
    """Inside it, SIGTERM raises Terminated (a KeyboardInterrupt): before the loop takes the
    signals over (data preparation, the model's set-up), a terminated run cleans up what a
    Ctrl-C would (a half-built token folder, a run folder it made) and exits 143, in one line."""
    def raise_terminated(signum, frame):
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
