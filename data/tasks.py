"""Small instruction sets, made from a seed, to fine-tune on and to measure what a model
learnt (docs/usage.md, "Fine-tuning on conversations"): each is a .jsonl file of
conversations in the {"messages": [...]} form of the hub's chat datasets.

    python -m data.tasks add --count 3000 --out add.jsonl        "47+38=" -> "85"
    python -m data.tasks reverse --count 3000 --out reverse.jsonl    "reverse: stone" -> "enots"
    python -m data.tasks dates --count 3000 --out dates.jsonl        "Write 1999-12-31 in words." -> "31 December 1999"
    python -m data.tasks weather --count 3000 --out calls.jsonl      a tool's call, its reply, the answer
    python -m data.tasks weather --pairs --count 3000 --out pairs.jsonl   the right call against a wrong one

--turns N gives each conversation 1 to N questions, each answered before the next (a chat
model must answer the last one, whatever came before). --plain writes plain text instead,
a question and its answer a line ("47+38=85"), for a base model to pretrain on. The same
seed always writes the same file.

weather is a set of function calls, as the hub's hold them: a system prompt and the record's
"tools" (one, weather(city, day)); the user asks, the assistant calls the tool (its call
with an id), the tool replies (JSON, answering the call's id), the assistant answers from the
reply. --until-call ends each conversation with its last call, so that the answer a model is
scored on is the call (evaluate.py scores calls apart: the tool, the arguments, the text).
--pairs makes preference pairs of those calls instead (trl's layout: the prompt, the right call
chosen, one with a wrong city or day rejected), to tune a model with DPO after fine-tuning.
"""

from __future__ import annotations

import argparse
import json
import random
import string
from pathlib import Path

from storage.atomic import write_atomic


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


CITIES = ("Paris", "Rome", "Oslo", "Lima", "Cairo", "Quito", "Hanoi", "Dakar", "Perth", "Tunis")
DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
SKIES = ("sunny", "cloudy", "rainy", "windy", "foggy")
WEATHER_TOOL = {"type": "function", "function": {
    "name": "weather", "description": "the weather in a city on a day",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "day": {"type": "string"}},
                   "required": ["city", "day"]}}}
WEATHER_SYSTEM = "You are a helpful assistant. Call a tool when you need one."


def weather(rng: random.Random, number: int) -> list[dict]:
    """One exchange of a function call: the question, the call, the tool's reply, the answer."""
    city, day, sky, celsius = rng.choice(CITIES), rng.choice(DAYS), rng.choice(SKIES), rng.randint(-5, 35)
    call = {"id": f"call_{number}", "type": "function",
            "function": {"name": "weather", "arguments": {"city": city, "day": day}}}
    return [{"role": "user", "content": f"What will the weather be in {city} on {day}?"},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "content": json.dumps({"sky": sky, "celsius": celsius}), "tool_call_id": call["id"]},
            {"role": "assistant", "content": f"On {day} {city} will be {sky}, {celsius} C."}]


TASKS = {"add": addition, "reverse": reverse, "dates": dates, "weather": weather}


def conversations(task: str, count: int, seed: int = 0, turns: int = 1, until_call: bool = False) -> list[dict]:
    """`count` conversations of `task` (one of TASKS), each of 1 to `turns` questions and
    answers, the same for the same seed; weather's with its system prompt and tools, and with
    until_call each cut after its last call."""
    rng = random.Random(seed)
    records, calls = [], 0
    for _ in range(count):
        messages = []
        for _ in range(rng.randint(1, turns)):
            if task == "weather":
                messages += weather(rng, calls)
                calls += 1
                continue
            question, answer = TASKS[task](rng)
            messages += [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
        if task == "weather":
            records.append({"messages": [{"role": "system", "content": WEATHER_SYSTEM},
                                         *(messages[:-2] if until_call else messages)], "tools": [WEATHER_TOOL]})
        else:
            records.append({"messages": messages})
    return records


def call_pairs(count: int, seed: int = 0) -> list[dict]:
    """`count` preference pairs of weather calls, in trl's layout with an explicit prompt: the
    system prompt and the question (with the tools), the call with the city and the day asked
    for chosen, and one with either of them wrong (another city, or another day) rejected."""
    rng = random.Random(seed)
    pairs = []
    for number in range(count):
        system, question, call = conversations("weather", 1, seed=rng.randrange(1 << 30), until_call=True)[0]["messages"]
        right = call["tool_calls"][0]["function"]["arguments"]
        key, choices = rng.choice([("city", CITIES), ("day", DAYS)])
        wrong = {**right, key: rng.choice([value for value in choices if value != right[key]])}
        rejected = {**call, "tool_calls": [{**call["tool_calls"][0], "function": {"name": "weather", "arguments": wrong}}]}
        for message in (call, rejected):  # (each pair's own call id, as the conversations number them)
            message["tool_calls"][0]["id"] = f"call_{number}"
        pairs.append({"prompt": [system, question], "chosen": [call], "rejected": [rejected], "tools": [WEATHER_TOOL]})
    return pairs


def write(path: Path, records: list[dict]) -> None:
    write_atomic(path, "".join(json.dumps(record, ensure_ascii=False) + "\n" for record in records).encode("utf-8"))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("task", choices=sorted(TASKS))
    p.add_argument("--count", type=int, default=3000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--turns", type=int, default=1, help="at most this many questions a conversation (default 1)")
    p.add_argument("--plain", action="store_true", help="plain text: each question and its answer on a line")
    p.add_argument("--until-call", action="store_true", help="weather: end each conversation with its last call "
                   "(the answer to score)")
    p.add_argument("--pairs", action="store_true", help="weather: preference pairs (trl's layout) of the call asked "
                   "for, chosen, and one with a wrong city or day, rejected (DPO, docs/usage.md)")
    p.add_argument("--out", type=Path, required=True, help="the .jsonl file to write")
    args = p.parse_args(argv)
    if args.count < 2:
        p.error("--count must be at least 2 (training and validation need one conversation each)")
    if args.turns < 1:
        p.error("--turns must be at least 1")
    if args.until_call and args.task != "weather":
        p.error("--until-call cuts the weather set's conversations after their call; the other sets call no tool")
    if args.plain and args.task == "weather":
        p.error("--plain writes a question and its answer a line; the weather set's conversations call a tool")
    if args.pairs:
        if args.task != "weather" or args.turns != 1 or args.plain or args.until_call:
            p.error("--pairs makes pairs of the weather set's calls, one question each; give it alone with weather")
        write(args.out, call_pairs(args.count, args.seed))
        print(f"wrote {args.out}: {args.count} preference pairs of weather calls (seed {args.seed})")
        return 0
    records = conversations(args.task, args.count, args.seed, args.turns, args.until_call)
    if args.plain:  # "47+38=85", a conversation a line
        lines = ["".join(m["content"] for m in r["messages"]) + "\n" for r in records]
        write_atomic(args.out, "".join(lines).encode("utf-8"))
    else:
        write(args.out, records)
    print(f"wrote {args.out}: {args.count} conversations of {args.task}, up to {args.turns} turn(s) each (seed {args.seed})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
