"""Small instruction sets, made from a seed, to fine-tune on and to measure what a model
learnt (docs/usage.md, "Fine-tuning on conversations"): each is a .jsonl file of
conversations in the {"messages": [...]} form of the hub's chat datasets.

    python -m data.tasks add --count 3000 --out add.jsonl        "47+38=" -> "85"
    python -m data.tasks reverse --count 3000 --out reverse.jsonl    "reverse: stone" -> "enots"
    python -m data.tasks dates --count 3000 --out dates.jsonl        "Write 1999-12-31 in words." -> "31 December 1999"

--turns N gives each conversation 1 to N questions, each answered before the next (a chat
model must answer the last one, whatever came before). --plain writes plain text instead,
a question and its answer a line ("47+38=85"), for a base model to pretrain on. The same
seed always writes the same file.
"""

from __future__ import annotations

import argparse
import json
import random
import string
from pathlib import Path


def addition(rng: random.Random) -> tuple[str, str]:
    a, b = rng.randint(0, 99), rng.randint(0, 99)
    return f"{a}+{b}=", str(a + b)


def reverse(rng: random.Random) -> tuple[str, str]:
    word = "".join(rng.choices(string.ascii_lowercase, k=rng.randint(3, 7)))
    return f"reverse: {word}", word[::-1]


MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December")


def dates(rng: random.Random) -> tuple[str, str]:
    year, month, day = rng.randint(1900, 2099), rng.randint(1, 12), rng.randint(1, 28)
    return f"Write {year}-{month:02d}-{day:02d} in words.", f"{day} {MONTHS[month - 1]} {year}"


TASKS = {"add": addition, "reverse": reverse, "dates": dates}


def conversations(task: str, count: int, seed: int = 0, turns: int = 1) -> list[dict]:
    """`count` conversations of `task` (one of TASKS), each of 1 to `turns` questions and
    answers, the same for the same seed."""
    rng = random.Random(seed)
    records = []
    for _ in range(count):
        messages = []
        for _ in range(rng.randint(1, turns)):
            question, answer = TASKS[task](rng)
            messages += [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
        records.append({"messages": messages})
    return records


def write(path: Path, records: list[dict]) -> None:
    path.write_text("".join(json.dumps(record, ensure_ascii=False) + "\n" for record in records), encoding="utf-8")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("task", choices=sorted(TASKS))
    p.add_argument("--count", type=int, default=3000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--turns", type=int, default=1, help="at most this many questions a conversation (default 1)")
    p.add_argument("--plain", action="store_true", help="plain text: each question and its answer on a line")
    p.add_argument("--out", type=Path, required=True, help="the .jsonl file to write")
    args = p.parse_args(argv)
    if args.count < 2:
        p.error("--count must be at least 2 (training and validation need one conversation each)")
    if args.turns < 1:
        p.error("--turns must be at least 1")
    records = conversations(args.task, args.count, args.seed, args.turns)
    if args.plain:  # "47+38=85", a conversation a line
        lines = ["".join(m["content"] for m in r["messages"]) + "\n" for r in records]
        args.out.write_text("".join(lines), encoding="utf-8")
    else:
        write(args.out, records)
    print(f"wrote {args.out}: {args.count} conversations of {args.task}, up to {args.turns} turn(s) each (seed {args.seed})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
