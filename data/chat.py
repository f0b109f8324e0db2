"""Conversations: chat records -> token ids, and which of them the model learns to write.

A record of a .jsonl file is one conversation, as the chat datasets on the hub hold them:

    {"messages": [{"role": "user", "content": "2+3="}, {"role": "assistant", "content": "5"}]}
    {"prompt": "2+3=", "response": "5"}                       (one turn; "system" too, if given)

A chat template turns the messages into one text: the `chat_template` of the tokenizer a
run starts from (train.init_from of a transformers folder), or else DEFAULT_TEMPLATE,
whose role and end-of-turn markers are special tokens added to the tokenizer. A template
is someone else's code: it runs in Jinja's immutable sandbox, as transformers runs it.

The model learns to write the assistant's turns only. `encode` says which tokens those
are: each assistant message's text is where rendering the conversation up to it grows
past rendering the conversation before it (with the prompt that asks for an answer);
the tokens that overlap it, up to and including the end-of-turn token, are the
assistant's. Training then scores only the targets that are (data/batches.py).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tokenizers import AddedToken, Tokenizer

from .sources import (DataError, check_readable, file_stats, first_record, folder_files, hub_reachable, json_lines,
                      load_split)
from .tokenizer import END_OF_TEXT, end_of_text_id, start_ids

ROLES = ("system", "user", "assistant", "tool")
# The default template: a role marker before each message, END_OF_TURN after it; the
# markers are special tokens, one id each (in a rendered conversation a message that
# spells one is read as it, as transformers' apply_chat_template reads it). The tools a
# conversation may call come first, as JSON in a system turn; an assistant's calls of them
# follow its text as JSON, and are learnt with it.
END_OF_TURN = "<|end|>"
CHAT_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>", "<|tool|>", END_OF_TURN)
DEFAULT_TEMPLATE = (
    "{% if tools %}{{ '<|system|>' + tools | tojson + '<|end|>' }}{% endif %}"
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>' }}"
    "{% if message['content'] %}{{ message['content'] }}{% endif %}"
    "{% if message['tool_calls'] %}{{ message['tool_calls'] | tojson }}{% endif %}"
    "{{ '<|end|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)
TURN_ENDS = (END_OF_TURN, *END_OF_TEXT)  # the tokens an assistant's turn ends with, in the templates we meet
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
    """Conversations (data/chat.py): `train()` and `val()` yield Records, `everything()` all of
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


def parquet_rows(path: Path) -> Iterator[tuple[str, dict]]:
    """(where, row) of each row of a Parquet file, read a batch at a time."""
    import pyarrow.parquet

    number = 0
    try:
        for batch in pyarrow.parquet.ParquetFile(path).iter_batches(batch_size=1000):
            for row in batch.to_pylist():
                number += 1
                yield f"{path}, row {number}", row
    except pyarrow.ArrowException as e:
        raise DataError(f"could not read {path}: {str(e).splitlines()[0]}") from None


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


def parquet_columns(path: Path) -> list[str]:
    import pyarrow.parquet

    try:
        return pyarrow.parquet.read_schema(path).names
    except (OSError, pyarrow.ArrowException):
        return []  # (the text path says what is wrong with the file)


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


def dataset_columns(name: str, config: str, split: str, data_files: str | None) -> list[str]:
    """The columns of an hf: dataset's split: from its description (the hub's dataset info), or
    from the schema or first record of its first local file, else by loading it."""
    import datasets

    datasets.disable_progress_bars()
    try:
        builder = datasets.load_dataset_builder(name, data_files=data_files, name=config or None)
    except Exception:  # (datasets raises many kinds; the text path says what is wrong)
        return []
    if builder.info.features is not None:
        return list(builder.info.features)
    files = (builder.config.data_files or {}).get(split.split("[")[0]) or []
    first = Path(str(files[0])) if files else None
    if first is not None and first.is_file():
        if first.suffix.lower() == ".parquet":
            return parquet_columns(first)
        if first.suffix.lower() == ".jsonl" and isinstance(record := first_record(first), dict):
            return list(record)
    return load_split(name, data_files, split, name=config or None)[0].column_names


RENDER_SECONDS = 2.0  # a template may take this long to render one conversation
RENDER_CHARACTERS = 4_000_000  # and write at most this much of it (a conversation is cut to the context anyway)
LARGEST_DIGITS = 1000  # the most digits a power (a ** b) a template computes may have
LONGEST_REPETITION = 10 ** 6  # the most characters (or items) a repetition (text * n) may make


class TemplateLimit(Exception):
    """A template went past RENDER_SECONDS, RENDER_CHARACTERS, LARGEST_DIGITS or LONGEST_REPETITION."""


def generation_blocks():
    """The Jinja extension of {% generation %} ... {% endgeneration %}: transformers' mark of
    what the assistant writes in a template (return_assistant_tokens_mask; trl's
    assistant_only_loss). It writes the block's text as it is and, while `spans` is a list,
    adds the block's (start, end) in the rendered text to it: rendering streams the text
    (Template.generate), so what came before the block is what was streamed before it."""
    from jinja2 import nodes
    from jinja2.ext import Extension

    class GenerationBlocks(Extension):
        tags = {"generation"}

        def __init__(self, environment):
            super().__init__(environment)
            self.streamed: list[str] = []  # the text written so far by the render under way
            self.spans: list[tuple[int, int]] | None = None
            self.used = False

        def parse(self, parser):
            self.used = True  # (the template has a block: its answers are what the blocks hold)
            line = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.CallBlock(self.call_method("written", []), [], [], body).set_lineno(line)

        def written(self, caller):
            text = caller()
            if self.spans is not None:
                start = sum(len(piece) for piece in self.streamed)
                self.spans.append((start, start + len(text)))
            return text

    return GenerationBlocks


def limited_environment():
    """Jinja's immutable sandbox (a template is someone else's code, as in transformers),
    with trim_blocks and lstrip_blocks as transformers sets them, and with the arithmetic that
    could run for ever or fill the memory in one step (a huge power, a huge repetition)
    refused, and transformers' {% generation %} blocks (GenerationBlocks); time is limited
    around each render (ChatTemplate.render)."""
    from jinja2 import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Limited(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset(["**", "*"])

        def call_binop(self, context, operator, left, right):
            numbers = all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in (left, right))
            if operator == "**" and numbers and abs(left) > 1 and right * math.log10(abs(left)) > LARGEST_DIGITS:
                raise TemplateLimit(f"{left!r} ** {right!r} is too large a number to compute")
            if operator == "*" and not numbers:
                count = right if isinstance(right, int) else left if isinstance(left, int) else 0
                if count * max(len(x) for x in (left, right) if hasattr(x, "__len__")) > LONGEST_REPETITION:
                    raise TemplateLimit(f"a repetition of {count:,} is too long")
            return super().call_binop(context, operator, left, right)

    def raise_exception(message):  # what transformers gives templates to refuse a conversation
        raise TemplateError(message)

    def strftime_now(format: str) -> str:  # today's date, as Llama 3's templates write it
        import datetime

        return datetime.datetime.now().strftime(format)

    def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        # transformers' tojson: JSON as written (Jinja's own escapes <, > and & for HTML)
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    environment = Limited(trim_blocks=True, lstrip_blocks=True, extensions=[generation_blocks()])
    environment.globals.update(raise_exception=raise_exception, strftime_now=strftime_now)
    environment.filters["tojson"] = tojson
    return environment


def rendered_within(seconds: float, render: Callable[[], str]) -> str:
    """render(), stopped with TemplateLimit once it has run `seconds`: the template's own code
    (compiled by Jinja under the name "<template>") checks the clock at each of its lines, so
    no loop of it runs for ever."""
    import sys
    import time

    deadline = time.monotonic() + seconds

    def in_template(frame, event, arg):
        if time.monotonic() > deadline:
            raise TemplateLimit(f"rendering one conversation took more than {seconds:g} s")
        return in_template

    def tracer(frame, event, arg):
        return in_template if frame.f_code.co_filename == "<template>" else None

    before = sys.gettrace()
    sys.settrace(tracer)
    try:
        return render()
    finally:
        sys.settrace(before)


class ChatTemplate:
    """A Jinja chat template, compiled in the sandbox (limited_environment); `special`: the
    tokenizer's special tokens by the names templates use (bos_token, eos_token); `name`:
    where it comes from, for the one-line errors."""

    def __init__(self, source: str, special: dict[str, str] | None = None, name: str = "the chat template"):
        from jinja2 import TemplateError

        environment = limited_environment()
        try:
            self.template = environment.from_string(source)
        except TemplateError as e:
            raise DataError(f"{name} is not valid Jinja: {e}") from None
        self.blocks = next(e for e in environment.extensions.values() if "generation" in e.tags)
        self.source = source
        self.special = special or {}
        self.name = name

    @property
    def marks_answers(self) -> bool:
        """Whether the template marks what the assistant writes with {% generation %} blocks."""
        return self.blocks.used

    def render(self, messages: list[dict], add_generation_prompt: bool = False, tools: list[dict] | None = None) -> str:
        """The conversation as the template writes it (with the tools a model may call, as
        transformers passes them: None when there are none); a refusal, an error of the template's
        own code (a division by zero, endless recursion, no memory) or a limit passed
        (RENDER_SECONDS, RENDER_CHARACTERS, LARGEST_DIGITS, LONGEST_REPETITION) is a DataError in one line."""
        return self.render_marked(messages, add_generation_prompt, tools)[0]

    def render_marked(self, messages: list[dict], add_generation_prompt: bool = False,
                      tools: list[dict] | None = None) -> tuple[str, list[tuple[int, int]]]:
        """`render`'s text, and the (start, end) of each {% generation %} block's text in it."""
        from jinja2 import TemplateError

        self.blocks.streamed = streamed = []
        self.blocks.spans = spans = []

        def streaming() -> str:
            for piece in self.template.generate(messages=messages, add_generation_prompt=add_generation_prompt,
                                                tools=tools, **self.special):
                streamed.append(piece)
            return "".join(streamed)

        try:
            text = rendered_within(RENDER_SECONDS, streaming)
        except TemplateError as e:
            raise DataError(f"{self.name} refused a conversation: {e}") from None
        except TemplateLimit as e:
            raise DataError(f"{self.name} went past a limit: {e}; use another template") from None
        except (ArithmeticError, RecursionError, MemoryError, TypeError, ValueError, LookupError) as e:
            raise DataError(f"{self.name} failed on a conversation: {type(e).__name__}: {str(e)[:200]}") from None
        finally:
            self.blocks.streamed, self.blocks.spans = [], None
        if len(text) > RENDER_CHARACTERS:
            raise DataError(f"{self.name} wrote {len(text):,} characters for one conversation, more than the "
                            f"{RENDER_CHARACTERS:,} allowed; shorten the conversation or use another template")
        return text, spans


def special_token_names(tokenizer: Tokenizer) -> dict[str, str]:
    """bos_token and eos_token, as templates name them (a transformers tokenizer's first
    and end-of-text tokens, where it has them)."""
    names = {}
    eot = end_of_text_id(tokenizer)
    if eot is not None:
        names["eos_token"] = tokenizer.id_to_token(eot)
    start = start_ids(tokenizer)
    if start:
        names["bos_token"] = tokenizer.id_to_token(start[0])
    return names


def chat_tokenizer(tokenizer: Tokenizer) -> Tokenizer:
    """A copy of the tokenizer with DEFAULT_TEMPLATE's markers as special tokens (new ids
    after the others), for a run that has no template of its own."""
    tokenizer = Tokenizer.from_str(tokenizer.to_str())
    tokenizer.add_special_tokens([AddedToken(token, special=True, normalized=False) for token in CHAT_TOKENS])
    return tokenizer


def assistant_spans(template: ChatTemplate, messages: list[dict],
                    tools: list[dict] | None = None) -> tuple[str, list[tuple[int, int]]]:
    """The conversation's text (with the tools it may call), and the character span of each
    assistant message in it: from where the text before it (with the generation prompt) ends
    to where it ends."""
    text = template.render(messages, tools=tools)
    spans = []
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        before = template.render(messages[:i], add_generation_prompt=True, tools=tools)
        upto = template.render(messages[:i + 1], tools=tools)
        if not (text.startswith(upto) and upto.startswith(before)):
            raise DataError("the chat template does not render a conversation as a growing text (the text "
                            "before an answer is not the start of the text with it), so the answer's tokens "
                            "cannot be told apart; use another template")
        spans.append((len(before), len(upto)))
    return text, spans


def encode_rendered(tokenizer: Tokenizer, text: str):
    """A rendered conversation's tokens (tokenizers' Encoding), the template's special
    tokens matched as one id each, as transformers' apply_chat_template matches them
    (elsewhere this project's tokenizers keep text that spells a special token as text)."""
    matching = tokenizer.encode_special_tokens
    tokenizer.encode_special_tokens = False
    try:
        return tokenizer.encode(text, add_special_tokens=False)
    finally:
        tokenizer.encode_special_tokens = matching


def turn_ends(tokenizer: Tokenizer) -> set[int]:
    """The ids that end an assistant's turn (and a reply in generate.py --chat)."""
    return {tokenizer.token_to_id(token) for token in TURN_ENDS} - {None}


def encode(tokenizer: Tokenizer, template: ChatTemplate, messages: list[dict],
           tools: list[dict] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(token ids, the assistant's: 1 for each token of an assistant message up to and
    including its end-of-turn token, else 0). What follows an end-of-turn token inside the
    span (a template's newline) is the template's, not the answer's. A template with
    {% generation %} blocks says itself which text is the assistant's: the blocks'."""
    if template.marks_answers:  # the template says which text is the assistant's
        text, spans = template.render_marked(messages, tools=tools)
    else:
        text, spans = assistant_spans(template, messages, tools)
    encoding = encode_rendered(tokenizer, text)
    ids = np.asarray(encoding.ids, dtype=np.int64)
    offsets = encoding.offsets  # (read once: the binding builds the whole list at each read)
    mask = np.zeros(len(ids), dtype=np.uint8)
    ends = turn_ends(tokenizer)
    i = 0
    for start, end in spans:  # (spans and offsets both run along the text)
        while i < len(ids) and offsets[i][1] <= start:
            i += 1
        while i < len(ids) and offsets[i][0] < end:
            mask[i] = 1
            i += 1
            if ids[i - 1] in ends:  # the turn ends here
                break
    return ids, mask


def prompt_ids(tokenizer: Tokenizer, template: ChatTemplate, messages: list[dict],
               tools: list[dict] | None = None) -> list[int]:
    """The conversation so far with the prompt that asks for the assistant's answer."""
    return encode_rendered(tokenizer, template.render(messages, add_generation_prompt=True, tools=tools)).ids


def in_memory(encoded: list[tuple[np.ndarray, np.ndarray]]) -> Conversations:
    """Conversations from (ids, mask) pairs, as token files would hold them."""
    lengths = [len(ids) for ids, _ in encoded]
    return Conversations(np.concatenate([ids for ids, _ in encoded]), np.concatenate([mask for _, mask in encoded]),
                         np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64))


@dataclass
class Conversations:
    """One split's conversations as token files hold them: all their ids one after the
    other (`tokens`), the assistant's flags (`mask`, one per token) and where each one
    starts (`starts`, with the end of the last appended)."""

    tokens: np.ndarray
    mask: np.ndarray
    starts: np.ndarray

    def __len__(self) -> int:
        return len(self.starts) - 1

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        start, end = self.starts[i], self.starts[i + 1]
        return self.tokens[start:end], self.mask[start:end]
