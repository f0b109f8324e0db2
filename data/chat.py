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
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tokenizers import AddedToken, Tokenizer

from .sources import DataError, check_readable, file_stats, first_record, folder_files, json_lines
from .tokenizer import END_OF_TEXT, end_of_text_id, start_ids

ROLES = ("system", "user", "assistant")
# The default template: a role marker before each message, END_OF_TURN after it; the
# markers are special tokens, one id each (in a rendered conversation a message that
# spells one is read as it, as transformers' apply_chat_template reads it).
END_OF_TURN = "<|end|>"
CHAT_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>", END_OF_TURN)
DEFAULT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>' + message['content'] + '<|end|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)
TURN_ENDS = (END_OF_TURN, *END_OF_TEXT)  # the tokens an assistant's turn ends with, in the templates we meet


def conversation(record, where: str) -> list[dict]:
    """The messages of one record ({"messages": [...]} or {"prompt", "response"[, "system"]}),
    checked: known roles, text contents, at least one assistant message."""
    if not isinstance(record, dict):
        raise DataError(f"{where}: a conversation is a JSON object with \"messages\" (or \"prompt\" and "
                        f"\"response\"), not a {type(record).__name__}")
    if "messages" in record:
        messages = record["messages"]
    elif "prompt" in record and "response" in record:
        messages = ([{"role": "system", "content": record["system"]}] if record.get("system") else []) + [
            {"role": "user", "content": record["prompt"]}, {"role": "assistant", "content": record["response"]}]
    else:
        raise DataError(f"{where} has neither \"messages\" nor \"prompt\" and \"response\" (it has "
                        f"{', '.join(record) or 'nothing'}); give each line one of them")
    if not isinstance(messages, list) or not messages:
        raise DataError(f"{where}: \"messages\" must be a list of {{\"role\", \"content\"}} objects")
    for number, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ROLES or not isinstance(message.get("content"), str):
            raise DataError(f"{where}, message {number}: each message needs a \"role\" ({', '.join(ROLES)}) and a "
                            f"text \"content\", not {json.dumps(message, ensure_ascii=False)[:80]}")
    if not any(message["role"] == "assistant" for message in messages):
        raise DataError(f"{where}: no assistant message, so nothing to learn; give each conversation an answer")
    return [{"role": message["role"], "content": message["content"]} for message in messages]


def is_conversation(record) -> bool:
    """Whether a .jsonl record holds a conversation rather than plain text."""
    return isinstance(record, dict) and ("messages" in record or ("prompt" in record and "response" in record))


@dataclass
class ChatSource:
    """Conversations (data/chat.py): `train()` and `val()` yield (where, messages), where
    names the file and line of each."""

    name: str
    identity: dict
    train: Callable[[], Iterator[tuple[str, list[dict]]]]
    val: Callable[[], Iterator[tuple[str, list[dict]]]]
    size: Callable[[], int | None] = lambda: None


def chat_source(source: str, val_fraction: float) -> ChatSource | None:
    """The conversations of a local .jsonl file or folder whose first record is one
    ({"messages": ...} or {"prompt", "response"}), else None. The last val_fraction of them
    (at least one) is validation."""
    path = Path(source).expanduser()
    if not path.exists():
        return None
    files = folder_files(path, source) if path.is_dir() else [path]
    if files[0].suffix.lower() != ".jsonl" or not is_conversation(first_record(files[0])):
        return None
    counts: list[int] = []
    checked: list[bool] = []

    def records() -> Iterator[tuple[str, list[dict]]]:
        if not checked:  # once, and only when the text is needed (not for cached token files)
            for f in files:
                check_readable(f, "json")
            checked.append(True)
        for f in files:
            for number, row in json_lines(f):
                where = f"{f}, line {number}"
                yield where, conversation(row, where)

    def split_point() -> int:
        if not counts:
            total = sum(1 for _ in records())
            train = min(int(total * (1.0 - val_fraction)), total - 1)
            if train < 1:
                raise DataError(f"data source {source!r} holds {total} conversation{'s' if total != 1 else ''}; "
                                "training and validation need at least one each")
            counts.append(train)
        return counts[0]

    def train() -> Iterator[tuple[str, list[dict]]]:
        end = split_point()
        for index, item in enumerate(records()):
            if index == end:
                return
            yield item

    def val() -> Iterator[tuple[str, list[dict]]]:
        start = split_point()
        for index, item in enumerate(records()):
            if index >= start:
                yield item

    identity = {"source": "local", "kind": "chat", "files": file_stats(files), "val_fraction": val_fraction}
    return ChatSource(path.stem if path.is_file() else path.name, identity, train, val,
                      lambda: sum(f.stat().st_size for f in files))


RENDER_SECONDS = 2.0  # a template may take this long to render one conversation
RENDER_CHARACTERS = 4_000_000  # and write at most this much of it (a conversation is cut to the context anyway)
LARGEST_DIGITS = 1000  # the most digits a power (a ** b) a template computes may have
LONGEST_REPETITION = 10 ** 6  # the most characters (or items) a repetition (text * n) may make


class TemplateLimit(Exception):
    """A template went past RENDER_SECONDS, RENDER_CHARACTERS, LARGEST_DIGITS or LONGEST_REPETITION."""


def limited_environment():
    """Jinja's immutable sandbox (a template is someone else's code, as in transformers),
    with trim_blocks and lstrip_blocks as transformers sets them, and with the arithmetic that
    could run for ever or fill the memory in one step (a huge power, a huge repetition)
    refused; time is limited around each render (ChatTemplate.render)."""
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

    environment = Limited(trim_blocks=True, lstrip_blocks=True)
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
        self.source = source
        self.special = special or {}
        self.name = name

    def render(self, messages: list[dict], add_generation_prompt: bool = False, tools: list[dict] | None = None) -> str:
        """The conversation as the template writes it (with the tools a model may call, as
        transformers passes them: None when there are none); a refusal, an error of the template's
        own code (a division by zero, endless recursion, no memory) or a limit passed
        (RENDER_SECONDS, RENDER_CHARACTERS, LARGEST_DIGITS, LONGEST_REPETITION) is a DataError in one line."""
        from jinja2 import TemplateError

        try:
            text = rendered_within(RENDER_SECONDS, lambda: self.template.render(
                messages=messages, add_generation_prompt=add_generation_prompt, tools=tools, **self.special))
        except TemplateError as e:
            raise DataError(f"{self.name} refused a conversation: {e}") from None
        except TemplateLimit as e:
            raise DataError(f"{self.name} went past a limit: {e}; use another template") from None
        except (ArithmeticError, RecursionError, MemoryError, TypeError, ValueError, LookupError) as e:
            raise DataError(f"{self.name} failed on a conversation: {type(e).__name__}: {str(e)[:200]}") from None
        if len(text) > RENDER_CHARACTERS:
            raise DataError(f"{self.name} wrote {len(text):,} characters for one conversation, more than the "
                            f"{RENDER_CHARACTERS:,} allowed; shorten the conversation or use another template")
        return text


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


def assistant_spans(template: ChatTemplate, messages: list[dict]) -> tuple[str, list[tuple[int, int]]]:
    """The conversation's text, and the character span of each assistant message in it:
    from where the text before it (with the generation prompt) ends to where it ends."""
    text = template.render(messages)
    spans = []
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        before = template.render(messages[:i], add_generation_prompt=True)
        upto = template.render(messages[:i + 1])
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


def encode(tokenizer: Tokenizer, template: ChatTemplate, messages: list[dict]) -> tuple[np.ndarray, np.ndarray]:
    """(token ids, the assistant's: 1 for each token of an assistant message up to and
    including its end-of-turn token, else 0). What follows an end-of-turn token inside the
    span (a template's newline) is the template's, not the answer's."""
    text, spans = assistant_spans(template, messages)
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


def prompt_ids(tokenizer: Tokenizer, template: ChatTemplate, messages: list[dict]) -> list[int]:
    """The conversation so far with the prompt that asks for the assistant's answer."""
    return encode_rendered(tokenizer, template.render(messages, add_generation_prompt=True)).ids


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
