"""Chat templates: a conversation -> token ids, and which of them the model learns to write.

A chat template turns the messages into one text: the `chat_template` of the tokenizer a
run starts from (train.init_from of a transformers folder), or else DEFAULT_TEMPLATE,
whose role and end-of-turn markers are special tokens added to the tokenizer. A template
is someone else's code: it runs in Jinja's immutable sandbox, as transformers runs it,
with limits on its time, its output and its arithmetic.

The model learns to write the assistant's turns only. `encode` says which tokens those
are: each assistant message's text is where rendering the conversation up to it grows
past rendering the conversation before it (with the prompt that asks for an answer);
the tokens that overlap it, up to and including the end-of-turn token, are the
assistant's (a template with {% generation %} blocks says itself which text that is).
Training then scores only the targets that are (data/batches.py).

Reading this module needs no data reader: generate.py --chat, evaluate.py and export.py
import it alone.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable

import numpy as np
from tokenizers import AddedToken, Tokenizer

from .shared import DataError
from .tokenizer import END_OF_TEXT, Unencodable, end_of_text_id, start_ids

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
                    tools: list[dict] | None = None) -> tuple[str, list[tuple[int, int | None]]]:
    """The conversation's text (with the tools it may call), and the character span of each
    assistant message in it: from where the text before it with the generation prompt ends
    to where the text up to it ends. Some templates write an answer otherwise once later
    messages follow it (Qwen3's leaves the thinking block, <think></think>, out of every
    answer but those after the last question): then the answer starts where the text before
    it with the prompt and the whole text part ways, and runs to its end-of-turn token (end
    None; encode finds it)."""
    text = template.render(messages, tools=tools)
    spans = []
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        before = template.render(messages[:i], add_generation_prompt=True, tools=tools)
        upto = template.render(messages[:i + 1], tools=tools)
        if text.startswith(upto) and upto.startswith(before):
            spans.append((len(before), len(upto)))
        elif upto.startswith(before) and text.startswith(template.render(messages[:i], tools=tools)):
            spans.append((len(os.path.commonprefix([text, before])), None))
        else:
            raise DataError(f"the chat template does not render the text before message {i + 1} (the assistant's) "
                            "as the start of the text with it, so the answer's tokens cannot be told apart; use "
                            "another template")
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
           tools: list[dict] | None = None, lost: Unencodable | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(token ids, the assistant's: 1 for each token of an assistant message up to and
    including its end-of-turn token, else 0). What follows an end-of-turn token inside the
    span (a template's newline) is the template's, not the answer's. A template with
    {% generation %} blocks says itself which text is the assistant's: the blocks'. lost: shown
    the rendered text, to count the characters the tokenizer cannot write (the template's
    escapes and newlines among them)."""
    if template.marks_answers:  # the template says which text is the assistant's
        text, spans = template.render_marked(messages, tools=tools)
    else:
        text, spans = assistant_spans(template, messages, tools)
    if lost is not None:
        lost.count(text)
    encoding = encode_rendered(tokenizer, text)
    ids = np.asarray(encoding.ids, dtype=np.int64)
    offsets = encoding.offsets  # (read once: the binding builds the whole list at each read)
    mask = np.zeros(len(ids), dtype=np.uint8)
    ends = turn_ends(tokenizer)
    i = 0
    for n, (start, end) in enumerate(spans):  # (spans and offsets both run along the text)
        while i < len(ids) and offsets[i][1] <= start:
            i += 1
        limit = end if end is not None else spans[n + 1][0] if n + 1 < len(spans) else len(text)
        while i < len(ids) and offsets[i][0] < limit:
            mask[i] = 1
            i += 1
            if ids[i - 1] in ends:  # the turn ends here
                break
        else:
            if end is None:  # (nothing else says where such an answer ends)
                raise DataError("the chat template writes an answer otherwise once later messages follow it, and "
                                "its turn ends with no end-of-turn token this project knows "
                                f"({', '.join(TURN_ENDS)}); use another template")
    return ids, mask


def prompt_ids(tokenizer: Tokenizer, template: ChatTemplate, messages: list[dict],
               tools: list[dict] | None = None) -> list[int]:
    """The conversation so far with the prompt that asks for the assistant's answer."""
    return encode_rendered(tokenizer, template.render(messages, add_generation_prompt=True, tools=tools)).ids


def template_for(tokenizer: Tokenizer, source: str | None = None, name: str | None = None) -> ChatTemplate:
    """The chat template that renders conversations for `tokenizer`, made here and nowhere
    else: `source` (a model's own, a run's, a file's), or DEFAULT_TEMPLATE, whose markers the
    tokenizer must then hold (chat_tokenizer); with the tokenizer's special tokens by the
    names templates use (special_token_names). name: where it comes from, for one-line errors."""
    name = name or ("the default chat template" if source is None else "the chat template")
    return ChatTemplate(source or DEFAULT_TEMPLATE, special_token_names(tokenizer), name=name)
