"""The induction lesson's text (configs/induction.yaml, data.source: copies): lines of
random symbols, each line a string written twice.

    kQ3+zT8b kQ3+zT8b        (written without the space: "kQ3+zT8bkQ3+zT8b")

Nothing in the first copy can be predicted: each symbol is drawn at random from 64, so the
best a model can do there is a loss of ln 64 = 4.16 nats. The second copy can be predicted
exactly, but only by a model that finds the symbol it just read earlier in the line and
copies the one that came after it: an induction head (Olsson et al., 2022), made of a
head that looks one token back (layer 0) and one that looks for the token after the
earlier match (layer 1). The strings are 8 to 64 symbols long, so no fixed offset finds
the copy (a head that learnt "look 16 back" would be right only for strings of 16), and
64 symbols with no repeat inside a string are what inspection/head_scores.py's probe
uses too, so a perfect induction head scores near 1 on it.

The text is made from a seed, the same on every machine; make it with
`python -m data.copies --out copies.txt` to read it.
"""

from __future__ import annotations

import argparse
import random
import string
from pathlib import Path

from storage.atomic import write_atomic

SYMBOLS = string.ascii_letters + string.digits + "+/"  # 64, base64's alphabet
SHORTEST, LONGEST = 8, 64  # the length of the string a line writes twice
SEED = 0
TRAIN_CHARACTERS = 2_000_000
VERSION = 1  # the generator's rule; in the token files' fingerprint


def line(rng: random.Random) -> str:
    """One line: a random string of SHORTEST to LONGEST symbols, then the same again."""
    length = rng.randint(SHORTEST, LONGEST)
    copied = "".join(rng.choice(SYMBOLS) for _ in range(length))
    return copied + copied + "\n"


def text(characters: int, seed: int) -> str:
    """Whole lines from `seed`, at least `characters` of them."""
    rng = random.Random(seed)
    lines, total = [], 0
    while total < characters:
        lines.append(line(rng))
        total += len(lines[-1])
    return "".join(lines)


def splits(val_fraction: float) -> tuple[str, str]:
    """(training text, validation text), made from two seeds: the validation lines are
    strings the model never trained on."""
    return text(TRAIN_CHARACTERS, SEED), text(round(TRAIN_CHARACTERS * val_fraction), SEED + 1)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="Write the induction lesson's training text (data.source: copies).")
    p.add_argument("--out", type=Path, required=True, help="the .txt file to write")
    p.add_argument("--characters", type=int, default=TRAIN_CHARACTERS)
    args = p.parse_args(argv)
    write_atomic(args.out, text(args.characters, SEED).encode("utf-8"))
    print(f"wrote {args.out}: {args.characters:,}+ characters of lines written twice (seed {SEED})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
