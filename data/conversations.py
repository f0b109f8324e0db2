"""Conversations: where they come from (.jsonl files, Parquet files, hf: datasets), each
record checked as it is read.

A record is one conversation, as the chat datasets on the hub hold them:

    {"messages": [{"role": "user", "content": "2+3="}, {"role": "assistant", "content": "5"}]}
    {"prompt": "2+3=", "response": "5"}                       (one turn; "system" too, if given)

with, where a model may call tools, the record's "tools" and an assistant message's
"tool_calls" (a tool's reply: role "tool"). data/template.py turns the messages into tokens.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from .readers import (check_readable, dataset_columns, file_stats, first_record, folder_files, held_out_split,
                      hub_out_of_reach, json_lines, load_split, parquet_columns, parquet_rows)
from .config import DataConfig
from .shared import DataError

ROLES = ("system", "user", "assistant", "tool")
MESSAGE_EXTRAS = {"tool_calls": list, "tool_call_id": str, "name": str}  # what a message may hold besides its text
FIRST_NAMED = 3  # the bad records a report names (the rest are counted)


class BadRecord(DataError):
    """A record that is no conversation a model can learn from: its reason, a few words to
    count such records by; the problem, which says where it is; and the one-line error, the
    problem with its fix where that is a rule said apart (a list of skipped records says it once)."""

    def __init__(self, reason: str, problem: str, fix: str = ""):
        super().__init__(f"{problem}; {fix}" if fix else problem)
        self.reason = reason
        self.problem = problem


@dataclass
class Skipped:
    """The bad records of one reading of a source, skipped: at most `allowed` of them (a share
    of the records seen; data.skip_bad_records); with 0 the first is refused as it is found.
    Counted by reason, the first FIRST_NAMED named; `check` refuses the source past the limit."""

    allowed: float
    seen: int = 0
    reasons: dict = field(default_factory=dict)
    first: list = field(default_factory=list)
    plural: str = "conversations"  # what the records are, for messages

    @property
    def count(self) -> int:
        return sum(self.reasons.values())

    def take(self, error: BadRecord) -> None:
        if not self.allowed:
            raise error
        self.reasons[error.reason] = self.reasons.get(error.reason, 0) + 1
        if len(self.first) < FIRST_NAMED:
            self.first.append(error.problem)

    def said(self) -> str:
        """'2 with the roles out of order, 1 with a tool reply and no call; the first: ...'"""
        reasons = ", ".join(f"{n:,} {reason}" for reason, n in sorted(self.reasons.items(), key=lambda r: -r[1]))
        return f"{reasons}; the first: {' | '.join(self.first)}"

    def check(self, label: str) -> None:
        """A DataError if more of the records seen are bad than `allowed` lets be skipped."""
        if self.count > self.allowed * self.seen:
            raise DataError(f"{label}: {self.count:,} of {self.seen:,} {self.plural} are bad, more than "
                            f"data.skip_bad_records={self.allowed:g} lets be skipped ({self.said()}); fix the data, "
                            "or raise data.skip_bad_records")

    def report(self) -> dict:
        """What meta.json keeps of the skipped records."""
        return {"allowed": self.allowed, "of": self.seen, "reasons": self.reasons, "first": self.first}

    @classmethod
    def added(cls, reports: list[dict]) -> "Skipped":
        """The skipped records of several reports (a mixture's sources', from meta.json) as one."""
        total = cls(max(report["allowed"] for report in reports))
        for report in reports:
            total.seen += report["of"]
            for reason, count in report["reasons"].items():
                total.reasons[reason] = total.reasons.get(reason, 0) + count
            total.first += report["first"][:FIRST_NAMED - len(total.first)]
        return total


def conversation(record, where: str) -> list[dict]:
    """The messages of one record ({"messages": [...]} or {"prompt", "response"[, "system"]}),
    checked: known roles, text contents (an assistant's may be empty when it calls tools, and
    only then), at least one assistant message, the roles in an order a chat can have (check_turns). A
    message keeps its tool_calls, tool_call_id and name (a tool's) where it has them; a field
    with no value (a Parquet row's None) is left out. A bad record is a BadRecord."""
    if not isinstance(record, dict):
        raise BadRecord("not a JSON object", f"{where}: a conversation is a JSON object with \"messages\" (or "
                        f"\"prompt\" and \"response\"), not a {type(record).__name__}")
    if record.get("messages") is not None:
        messages = record["messages"]
    elif record.get("prompt") is not None and record.get("response") is not None:
        messages = ([{"role": "system", "content": record["system"]}] if record.get("system") else []) + [
            {"role": "user", "content": record["prompt"]}, {"role": "assistant", "content": record["response"]}]
    else:
        raise BadRecord("with no messages", f"{where} has neither \"messages\" nor \"prompt\" and \"response\" (it "
                        f"has {', '.join(record) or 'nothing'}); give each record one of them")
    if not isinstance(messages, list) or not messages:
        raise BadRecord("with no messages", f"{where}: \"messages\" must be a list of {{\"role\", \"content\"}} objects")
    checked = []
    for number, message in enumerate(messages):
        calls = isinstance(message, dict) and message.get("role") == "assistant" and message.get("tool_calls")
        if (not isinstance(message, dict) or message.get("role") not in ROLES
                or not (isinstance(message.get("content"), str) or (calls and message.get("content") is None))):
            raise BadRecord("with a message that has no role or text", f"{where}, message {number + 1}: each message "
                            f"needs a \"role\" ({', '.join(ROLES)}) and a text \"content\", not "
                            f"{json.dumps(message, ensure_ascii=False, default=str)[:80]}")
        kept = {"role": message["role"], "content": message.get("content") or ""}
        for key, kind in MESSAGE_EXTRAS.items():
            if message.get(key) is not None:
                if not isinstance(message[key], kind):
                    raise BadRecord("with a message field of the wrong type",
                                    f"{where}, message {number + 1}: \"{key}\" must be a {kind.__name__}")
                kept[key] = message[key]
        if kept["role"] == "assistant" and not kept["content"].strip() and not kept.get("tool_calls"):
            raise BadRecord("with an empty answer", f"{where}, message {number + 1}: the assistant says nothing and "
                            "calls no tool, and the model would learn to answer with nothing",
                            "give the answer its text, or leave the record out")
        checked.append(kept)
    if not any(message["role"] == "assistant" for message in checked):
        raise BadRecord("with no assistant message",
                        f"{where}: no assistant message, so nothing to learn; give each conversation an answer")
    check_turns(checked, where)
    return checked


def check_turns(messages: list[dict], where: str) -> None:
    """The roles in an order a chat can have, as chat templates expect it: a system message
    first or not at all; then the user and the assistant in turns, the user first; after an
    assistant's tool calls, the tools' replies (each to a call of it: by tool_call_id where the
    calls have ids, else no more replies than calls), then the assistant again."""
    before = None  # the role of the message before
    waiting: list = []  # the calls of the last assistant message that no tool has answered yet

    def refuse(number: int, problem: str, reason: str = "with the roles out of order"):
        raise BadRecord(reason, f"{where}, message {number + 1}: {problem}",
                        "a chat goes [system,] user, assistant, user, ... with a tool's replies after the assistant's calls")

    for number, message in enumerate(messages):
        role = message["role"]
        if role == "system" and number:
            refuse(number, "a system message after the conversation began")
        elif role == "user" and before in ("user", "tool"):
            refuse(number, f"a user message after a {before} message" + (" (the assistant answers the tool's reply "
                                                                          "first)" if before == "tool" else ""))
        elif role == "assistant" and before in (None, "system", "assistant"):
            refuse(number, "the assistant speaks first" if before != "assistant" else "two assistant messages in a row")
        elif role == "tool":
            if not waiting:
                refuse(number, "a tool's reply with no call of the assistant's before it", "with a tool reply to no call")
            ids = [call.get("id") for call in waiting if isinstance(call, dict) and call.get("id") is not None]
            answered = message.get("tool_call_id")
            if answered is not None and ids:
                if answered not in ids:
                    refuse(number, f"a tool's reply to call {answered!r}, which no unanswered call of the assistant's "
                                   "has", "with a tool reply to no call")
                waiting = [call for call in waiting if not (isinstance(call, dict) and call.get("id") == answered)]
            else:
                waiting = waiting[1:]
        if role == "assistant":
            waiting = list(message.get("tool_calls") or [])
        elif role in ("user", "system"):
            waiting = []
        before = role


def conversation_tools(record: dict, where: str) -> list[dict] | None:
    """The tools a record's conversation may call ("tools": a list of function descriptions, or
    that list as JSON text, as some datasets keep it), as templates take them; None if none."""
    tools = record.get("tools") if isinstance(record, dict) else None
    bad = "with a tools field that is not a list of tools"
    if isinstance(tools, str):
        try:
            tools = json.loads(tools) if tools.strip() else None
        except json.JSONDecodeError as e:
            raise BadRecord(bad, f"{where}: \"tools\" is text but not JSON ({e.msg})") from None
    if not tools:
        return None
    if not isinstance(tools, list) or not all(isinstance(tool, dict) for tool in tools):
        raise BadRecord(bad, f"{where}: \"tools\" must be a list of tool descriptions (JSON objects)")
    return tools


def has_conversations(columns) -> bool:
    """Whether a table with these columns (or a record with these fields) holds conversations."""
    return "messages" in columns or {"prompt", "response"} <= set(columns)


@dataclass(frozen=True)
class Kind:
    """A kind of record a source may hold: how to tell it from a table's columns (or a first
    record's fields), and how to read one record (row, where) into its parts, a bad one
    raising a BadRecord. A source's records are then (where, *parts)."""

    name: str  # the identity's "kind" (a source holds one kind)
    holds: Callable[[Iterable[str]], bool]
    read: Callable[[object, str], tuple]
    plural: str = "records"  # for messages: "conversations", "pairs"


CONVERSATIONS = Kind("chat", has_conversations,
                     lambda row, where: (conversation(row, where), conversation_tools(row, where)), "conversations")


def fields(record) -> list[str]:
    """The fields of a record that have a value (a Parquet row's None is no value)."""
    return [key for key, value in record.items() if value is not None] if isinstance(record, dict) else []


# A conversation as a source yields it: where it is (file and line, or row), its messages, its tools.
Record = tuple[str, list[dict], list[dict] | None]
Rows = Callable[[], Iterator[tuple[str, object]]]  # (where, record) of each record of a source, as read


@dataclass
class ChatSource:
    """Records of one kind (conversations; data/preferences.py's pairs): `train()` and `val()`
    yield them, `everything()` all of them (evaluate.py --text); the bad records among them
    are skipped, as `skipped` counts them (data.skip_bad_records): those of reading, found
    when the records are first counted, and those the chat template refuses, added as the
    token files are made (data/prepare.py)."""

    name: str
    label: str  # the source as the user named it, for messages
    identity: dict
    train: Callable[[], Iterator[Record]]
    val: Callable[[], Iterator[Record]]
    everything: Callable[[], Iterator[Record]]
    skipped: Skipped
    size: Callable[[], int | None] = lambda: None
    val_split: Callable[[], str | None] = lambda: None  # the dataset's own split that is validation (None: a cut)


def what_is_said(records: Iterable[Record]) -> Iterator[str]:
    """The texts of conversations a tokenizer learns from: each message's content, and the
    tools and calls of them as JSON (as the default template writes them); a piece each."""
    for _, messages, tools in records:
        if tools:
            yield json.dumps(tools, ensure_ascii=False)
        for message in messages:
            yield message["content"]
            if message.get("tool_calls"):
                yield json.dumps(message["tool_calls"], ensure_ascii=False)


def checked_records(rows: Iterable[tuple[str, object]], skipped: Skipped, kind: Kind = CONVERSATIONS) -> Iterator[tuple]:
    """Each row read as a record of `kind`, (where, *its parts); a bad one goes to `skipped`
    (counted, or refused)."""
    for where, row in rows:
        skipped.seen += 1
        try:
            record = where, *kind.read(row, where)
        except BadRecord as e:
            skipped.take(e)
            continue
        yield record


def split_records(label: str, identity: dict, rows: Rows, val_fraction: float, skip_bad: float,
                  size: Callable[[], int | None] = lambda: None,
                  val_rows: Callable[[], Rows | None] = lambda: None, kind: Kind = CONVERSATIONS) -> ChatSource:
    """A source of records of `kind` split at its end: the last val_fraction of its good records
    (at least one) is validation, or, where val_rows gives a split of its own (a dataset's test
    split), all of them train and those validate. The first read counts the records, and the
    bad ones (refused past skip_bad, data.skip_bad_records); each split reads them again."""
    skipped = Skipped(skip_bad, plural=kind.plural)
    counts: list[int] = []

    def read(some: Rows, counted: Skipped) -> Iterator[tuple]:
        return checked_records(some(), counted, kind)

    def split_point() -> int:
        if not counts:
            total = sum(1 for _ in read(rows, skipped))
            held = sum(1 for _ in read(val_rows(), skipped)) if val_rows() else None
            skipped.check(label)
            train = total if held is not None else min(int(total * (1.0 - val_fraction)), total - 1)
            if train < 1 or held == 0:
                raise DataError(f"data source {label!r} holds {total} {kind.plural if total != 1 else kind.plural[:-1]}"
                                + (f" and {held} to validate on" if held is not None else "")
                                + "; training and validation need at least one each")
            counts.append(train)
        return counts[0]

    def train() -> Iterator[tuple]:
        end = split_point()
        for index, item in enumerate(read(rows, Skipped(skip_bad, plural=kind.plural))):
            if index == end:
                return
            yield item

    def val() -> Iterator[tuple]:
        start = split_point()
        if val_rows():
            yield from read(val_rows(), Skipped(skip_bad, plural=kind.plural))
            return
        for index, item in enumerate(read(rows, Skipped(skip_bad, plural=kind.plural))):
            if index >= start:
                yield item

    def everything() -> Iterator[tuple]:  # (a pass of its own: it counts the bad records itself)
        skipped.seen, skipped.reasons, skipped.first = 0, {}, []
        yield from read(rows, skipped)
        skipped.check(label)

    path = Path(label.removeprefix("hf:"))
    name = path.stem if path.is_file() else path.name.replace("/", "_") or "hub"
    return ChatSource(name, label, identity, train, val, everything, skipped, size)


def chat_source(config: DataConfig) -> ChatSource | None:
    """The conversations of config's source (records_of), else None."""
    return records_of(config, CONVERSATIONS)


def records_of(config: DataConfig, kind: Kind) -> ChatSource | None:
    """The records of `kind` in config's source, else None: a local .jsonl file (or folder of
    them) whose first record is one, a .parquet file (or folder) whose columns hold one, or an
    hf: dataset whose split's do (hub_records)."""
    source = config.source
    if source.startswith("hf:"):
        return hub_records(config, kind)
    path = Path(source).expanduser()
    if not path.exists():
        return None
    files = folder_files(path, source) if path.is_dir() else [path]
    suffix = files[0].suffix.lower()
    if suffix == ".jsonl" and kind.holds(fields(first_record(files[0]))):
        def rows() -> Iterator[tuple[str, object]]:
            for f in files:
                check_readable(f, "json")
                yield from ((f"{f}, line {number}", row) for number, row in json_lines(f))
    elif suffix == ".parquet" and kind.holds(parquet_columns(files[0])):
        def rows() -> Iterator[tuple[str, object]]:
            for f in files:
                yield from parquet_rows(f)
    else:
        return None
    identity = {"source": "local", "kind": kind.name, "files": file_stats(files), "val_fraction": config.val_fraction}
    return split_records(source, identity, rows, config.val_fraction, config.skip_bad_records,
                         lambda: sum(f.stat().st_size for f in files), kind=kind)


def hub_records(config: DataConfig, kind: Kind) -> ChatSource | None:
    """The records of `kind` in an hf: dataset (a local folder in the hub's layout, or a hub
    name) whose split's columns hold them, else None. The columns are read from the dataset's
    description or its first file where it can, else by loading it (datasets caches it) as
    preparing its text would; the rows are read only when the token files are made."""
    source, split, data_files = config.source, config.hf_split, config.hf_data_files
    name, _, subset = source[3:].partition(":")
    if not name:
        return None  # (the text path says what is missing)
    if hub_out_of_reach(name):
        return None  # (the text path says the hub cannot be reached, or uses the token files it made)
    columns = dataset_columns(name, subset, split, data_files)
    if not kind.holds(columns):
        return None

    def rows_of(which: str) -> Rows:
        def rows() -> Iterator[tuple[str, object]]:
            dataset, _ = load_split(name, data_files, which, name=subset or None)
            number = 0
            for batch in dataset.iter(batch_size=1000):
                for row in (dict(zip(batch, values)) for values in zip(*batch.values())):
                    number += 1
                    yield f"{source} ({which}), row {number}", row

        return rows

    identity = {"source": "hf", "kind": kind.name, "name": name, "config": subset, "val_fraction": config.val_fraction,
                "split": split, "data_files": data_files, "val_split": config.hf_val_split}
    if Path(name).is_dir():
        identity["files"] = file_stats(sorted(p for p in Path(name).rglob("*") if p.is_file()))
    held_out = held_out_split(config, name, subset)
    records = split_records(source, identity, rows_of(split), config.val_fraction, config.skip_bad_records,
                            val_rows=lambda: rows_of(held_out()) if held_out() else None, kind=kind)
    return dataclasses.replace(records, val_split=held_out)
