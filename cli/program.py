"""One-line errors and exit codes, the same for every command-line program."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Callable


class UserError(Exception):
    """Bad input from the user: the message says what is wrong and how to fix it (exit code 2)."""


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (and exit code 2), like every other error."""

    def error(self, message: str):
        print(f"error: {message} (see python {self.prog} --help)", file=sys.stderr)
        sys.exit(2)


def check_output_folder(option: str, path) -> None:
    """The rule of every program for a file or folder it is told to write (--out,
    --show-attention): the folder it goes in must exist; none is made on a typo's behalf.
    (train.py's out_dir is a run folder the program owns, and makes, out/ included.)"""
    if not path.parent.is_dir():
        raise UserError(f"{option} {path}: folder {path.parent} does not exist; create it first")


def positive(text: str) -> int:
    """An argparse type: a whole number of at least 1 (a usage error names the option otherwise)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be at least 1")
    return value


class Terminated(KeyboardInterrupt):
    """SIGTERM where a program turned it into this (train.py while it prepares its data):
    it unwinds as Ctrl-C does, so that the same clean-ups run, and exits 143."""


def run_main(parse: Callable[[Any], Any], body: Callable[[Any], int], argv,
             exit_codes: dict[type, int]) -> int:
    """Parse argv and run body(args). An exception listed in exit_codes prints
    'error: message' on one line and returns its code (--debug shows the traceback)."""
    try:
        args = parse(argv)
    except SystemExit as e:  # --help, or a usage error already printed
        return e.code
    try:
        return body(args)
    except tuple(exit_codes) as e:
        if args.debug:
            raise
        print(f"error: {e}", file=sys.stderr)
        return next(code for cls, code in exit_codes.items() if isinstance(e, cls))
    except KeyboardInterrupt as stopped:
        terminated = isinstance(stopped, Terminated)
        print("\nterminated" if terminated else "\ninterrupted", file=sys.stderr)
        return 143 if terminated else 130
    except BrokenPipeError:  # output piped into a program that stopped reading, e.g. head
        return 0


def locale_language() -> str:
    """'zh' when the locale asks for Chinese (LC_ALL, LC_MESSAGES or LANG), else 'en':
    the default of --lang in train.py --explain and explore.py."""
    for name in ("LC_ALL", "LC_MESSAGES", "LANG"):
        if os.environ.get(name):
            return "zh" if os.environ[name].lower().startswith("zh") else "en"
    return "en"
