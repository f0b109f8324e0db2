"""Print a reproducible random sample of mutmut's mutant names for one part of the code.

mutmut writes every mutant's name into mutants/<file>.meta when it generates them (any
`mutmut run` does; `mutmut run "x*"` generates, then stops at the empty filter). The
sample is random.Random(seed).sample of the part's names in sorted order, so the same
code, part, size and seed give the same mutants on every machine:

    mutmut run --max-children 1 $(python docs/mutation_sample.py training 300)
"""

import argparse
import json
import random
from pathlib import Path


def mutant_names(part: str, mutants: Path = Path("mutants")) -> list[str]:
    """Every mutant name of `part` (a package such as training, or a module such as generate)."""
    names = []
    for meta in mutants.glob("**/*.meta"):
        names += json.loads(meta.read_text())["exit_code_by_key"]
    return sorted(n for n in names if n.startswith(part + "."))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("part", help="training, data, common, generate, evaluate, export, ...")
    parser.add_argument("size", type=int, help="mutants in the sample (all of them if there are fewer)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    names = mutant_names(args.part)
    if not names:
        raise SystemExit(f"no mutants of {args.part!r} in mutants/: run mutmut once to generate them")
    print(" ".join(random.Random(args.seed).sample(names, min(args.size, len(names)))))


if __name__ == "__main__":
    main()
