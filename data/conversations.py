"""Conversations: where they come from (.jsonl files, Parquet files, hf: datasets), each
record checked as it is read.

A record is one conversation, as the chat datasets on the hub hold them:

    {"messages": [{"role": "user", "content": "2+3="}, {"role": "assistant", "content": "5"}]}
    {"prompt": "2+3=", "response": "5"}                       (one turn; "system" too, if given)

with, where a model may call tools, the record's "tools" and an assistant message's
"tool_calls" (a tool's reply: role "tool"). data/template.py turns the messages into tokens.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from .readers import (check_readable, dataset_columns, file_stats, first_record, folder_files, hub_reachable,
                      json_lines, load_split, parquet_columns, parquet_rows)
from .shared import DataError

ROLES = ("system", "user", "assistant", "tool")
MESSAGE_EXTRAS = {"tool_calls": list, "tool_call_id": str, "name": str}  # what a message may hold besides its text


def conversation(record, where: str) -> list[dict]:
    """The messages of one record ({"messages": [...]} or {"prompt", "response"[, "system"]}),
    checked: known roles, text contents (an assistant's may be empty when it calls tools),
    at least one assistant message. A message keeps its tool_calls, tool_call_id and name
    (a tool's) where it has them; a field with no value (a Parquet row's None) is left out."""
    if not isinstance(record, dict):
        raise DataError(f"{where}: a conversation is a JSON object with \"messages\" (or \"prompt\" and "
                        f"\"response\"), not a {type(record).__name__}")
    if record.get("messages") is not None:
        messages = record["messages"]
    elif record.get("prompt") is not None and record.get("response") is not None:
        messages = ([{"role": "system", "content": record["system"]}] if record.get("system") else []) + [
            {"role": "user", "content": record["prompt"]}, {"role": "assistant", "content": record["response"]}]
    else:
        raise DataError(f"{where} has neither \"messages\" nor \"prompt\" and \"response\" (it has "
                        f"{', '.join(record) or 'nothing'}); give each record one of them")
    if not isinstance(messages, list) or not messages:
        raise DataError(f"{where}: \"messages\" must be a list of {{\"role\", \"content\"}} objects")
    checked = []
    for number, message in enumerate(messages):
        calls = isinstance(message, dict) and message.get("role") == "assistant" and message.get("tool_calls")
        if (not isinstance(message, dict) or message.get("role") not in ROLES
                or not (isinstance(message.get("content"), str) or (calls and message.get("content") is None))):
            raise DataError(f"{where}, message {number}: each message needs a \"role\" ({', '.join(ROLES)}) and a "
                            f"text \"content\", not {json.dumps(message, ensure_ascii=False, default=str)[:80]}")
        kept = {"role": message["role"], "content": message.get("content") or ""}
        for key, kind in MESSAGE_EXTRAS.items():
            if message.get(key) is not None:
                if not isinstance(message[key], kind):
                    raise DataError(f"{where}, message {number}: \"{key}\" must be a {kind.__name__}")
                kept[key] = message[key]
        checked.append(kept)
    if not any(message["role"] == "assistant" for message in checked):
        raise DataError(f"{where}: no assistant message, so nothing to learn; give each conversation an answer")
    return checked


def conversation_tools(record: dict, where: str) -> list[dict] | None:
    """The tools a record's conversation may call ("tools": a list of function descriptions, or
    that list as JSON text, as some datasets keep it), as templates take them; None if none."""
    tools = record.get("tools") if isinstance(record, dict) else None
    if isinstance(tools, str):
        try:
            tools = json.loads(tools) if tools.strip() else None
        except json.JSONDecodeError as e:
            raise DataError(f"{where}: \"tools\" is text but not JSON ({e.msg})") from None
    if not tools:
        return None
    if not isinstance(tools, list) or not all(isinstance(tool, dict) for tool in tools):
        raise DataError(f"{where}: \"tools\" must be a list of tool descriptions (JSON objects)")
    return tools


def is_conversation(record) -> bool:
    """Whether a record holds a conversation rather than plain text."""
    return isinstance(record, dict) and (record.get("messages") is not None
                                         or (record.get("prompt") is not None and record.get("response") is not None))


def has_conversations(columns) -> bool:
    """Whether a table with these columns holds conversations (Parquet files, an hf: dataset)."""
    return "messages" in columns or {"prompt", "response"} <= set(columns)


# A conversation as a source yields it: where it is (file and line, or row), its messages, its tools.
Record = tuple[str, list[dict], list[dict] | None]


@dataclass
class ChatSource:
    """Conversations: `train()` and `val()` yield Records, `everything()` all of
    them (evaluate.py --text)."""

    name: str
    identity: dict
    train: Callable[[], Iterator[Record]]
    val: Callable[[], Iterator[Record]]
    everything: Callable[[], Iterator[Record]]
    size: Callable[[], int | None] = lambda: None


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


def checked_records(rows: Iterable[tuple[str, object]]) -> Iterator[Record]:
    for where, row in rows:
        yield where, conversation(row, where), conversation_tools(row, where)


def split_records(label: str, identity: dict, records: Callable[[], Iterator[Record]], val_fraction: float,
                  size: Callable[[], int | None] = lambda: None) -> ChatSource:
    """A source of conversations split at its end: the last val_fraction of them (at least one)
    is validation. The first read counts them; each split reads them again."""
    counts: list[int] = []

    def split_point() -> int:
        if not counts:
            total = sum(1 for _ in records())
            train = min(int(total * (1.0 - val_fraction)), total - 1)
            if train < 1:
                raise DataError(f"data source {label!r} holds {total} conversation{'s' if total != 1 else ''}; "
                                "training and validation need at least one each")
            counts.append(train)
        return counts[0]

    def train() -> Iterator[Record]:
        end = split_point()
        for index, item in enumerate(records()):
            if index == end:
                return
            yield item

    def val() -> Iterator[Record]:
        start = split_point()
        for index, item in enumerate(records()):
            if index >= start:
                yield item

    path = Path(label.removeprefix("hf:"))
    name = path.stem if path.is_file() else path.name.replace("/", "_") or "hub"
    return ChatSource(name, identity, train, val, records, size)


def chat_source(source: str, val_fraction: float, hf_split: str = "train",
                hf_data_files: str | None = None) -> ChatSource | None:
    """The conversations of a source, else None: a local .jsonl file (or folder of them)
    whose first record is one, a .parquet file (or folder) with a "messages" column (or
    "prompt" and "response"), or an hf: dataset with one (hub_chat_source)."""
    if source.startswith("hf:"):
        return hub_chat_source(source, val_fraction, hf_split, hf_data_files)
    path = Path(source).expanduser()
    if not path.exists():
        return None
    files = folder_files(path, source) if path.is_dir() else [path]
    kind = files[0].suffix.lower()
    if kind == ".jsonl" and is_conversation(first_record(files[0])):
        def rows() -> Iterator[tuple[str, object]]:
            for f in files:
                check_readable(f, "json")
                yield from ((f"{f}, line {number}", row) for number, row in json_lines(f))
    elif kind == ".parquet" and has_conversations(parquet_columns(files[0])):
        def rows() -> Iterator[tuple[str, object]]:
            for f in files:
                yield from parquet_rows(f)
    else:
        return None
    identity = {"source": "local", "kind": "chat", "files": file_stats(files), "val_fraction": val_fraction}
    return split_records(source, identity, lambda: checked_records(rows()), val_fraction,
                         lambda: sum(f.stat().st_size for f in files))


def hub_chat_source(source: str, val_fraction: float, split: str, data_files: str | None) -> ChatSource | None:
    """The conversations of an hf: dataset (a local folder in the hub's layout, or a hub
    name) whose split has a "messages" column (or "prompt" and "response"), else None. The
    columns are read from the dataset's description or its first file where it can, else by
    loading it (datasets caches it) as preparing its text would; the rows are read only when
    the token files are made."""
    spec = source[3:]
    name, _, config = spec.partition(":")
    if not name:
        return None  # (the text path says what is missing)
    if not Path(name).is_dir() and not os.environ.get("HF_HUB_OFFLINE") and not hub_reachable():
        return None  # (the text path says the hub cannot be reached, or uses the token files it made)
    columns = dataset_columns(name, config, split, data_files)
    if not has_conversations(columns):
        return None

    def rows() -> Iterator[tuple[str, object]]:
        dataset, _ = load_split(name, data_files, split, name=config or None)
        number = 0
        for batch in dataset.iter(batch_size=1000):
            for row in (dict(zip(batch, values)) for values in zip(*batch.values())):
                number += 1
                yield f"{source} ({split}), row {number}", row

    identity = {"source": "hf", "kind": "chat", "name": name, "config": config, "val_fraction": val_fraction,
                "split": split, "data_files": data_files}
    if Path(name).is_dir():
        identity["files"] = file_stats(sorted(p for p in Path(name).rglob("*") if p.is_file()))
    return split_records(source, identity, lambda: checked_records(rows()), val_fraction)
