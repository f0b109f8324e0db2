"""Preference pairs: two answers to one prompt, the first preferred (Rafailov et al., 2023,
"Direct Preference Optimization"), in trl's layouts, so that a dataset made for trl is read
as it is:

    {"prompt": [messages], "chosen": [messages], "rejected": [messages]}   an explicit prompt, conversational
    {"chosen": [messages], "rejected": [messages]}                         an implicit prompt: the messages both start with
    {"prompt": "text", "chosen": "text", "rejected": "text"}               standard (plain text)
    {"chosen": "text", "rejected": "text"}                                 standard, the text both start with as the prompt

with a record's "tools" where the model may call them. The sources are those of
conversations (data/conversations.py: .jsonl, Parquet, hf:), each pair checked as it is read;
`encode_pair` turns one into the two token sequences training compares, each with the
answer's tokens flagged.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from tokenizers import Tokenizer

from .config import DataConfig
from .conversations import BadRecord, ChatSource, Kind, conversation, conversation_tools, records_of
from .shared import DataError
from .template import ChatTemplate, encode, prompt_ids
from .tokenizer import Unencodable, end_of_text_id


@dataclass(frozen=True)
class Pair:
    """One preference: the prompt, the answer preferred (chosen) and the other (rejected), each
    a list of messages (conversational) or a text (standard); the tools the model may call."""

    prompt: list[dict] | str
    chosen: list[dict] | str
    rejected: list[dict] | str
    tools: list[dict] | None = None

    @property
    def conversational(self) -> bool:
        return isinstance(self.chosen, list)


def has_pairs(columns) -> bool:
    """Whether a table with these columns (or a record with these fields) holds preference pairs."""
    return {"chosen", "rejected"} <= set(columns)


def pair(record, where: str) -> Pair:
    """The pair of one record, checked: both sides there, of one kind (messages or text), an
    implicit prompt found where both sides start alike, the answers different; a conversational
    pair's prompt and each answer a conversation a chat can have (data/conversations.py's rules),
    each answer starting with the assistant. A bad pair is a BadRecord."""
    if not isinstance(record, dict):
        raise BadRecord("not a JSON object", f"{where}: a preference pair is a JSON object with \"chosen\" and "
                        f"\"rejected\" (and \"prompt\"), not a {type(record).__name__}")
    sides = {side: record.get(side) for side in ("chosen", "rejected")}
    for side, value in sides.items():
        if value is None or (isinstance(value, (str, list)) and not value):
            raise BadRecord("with a side missing", f"{where} has no {side} answer; give each pair \"chosen\" and "
                            "\"rejected\"")
    chosen, rejected = sides["chosen"], sides["rejected"]
    prompt = record.get("prompt")
    text = isinstance(chosen, str)
    if text != isinstance(rejected, str) or (prompt is not None and text != isinstance(prompt, str)) \
            or not (text or (isinstance(chosen, list) and isinstance(rejected, list))):
        raise BadRecord("with sides of different kinds", f"{where}: \"prompt\", \"chosen\" and \"rejected\" must all "
                        "be texts or all be lists of messages")
    if prompt is None:  # the implicit prompt: what both sides start with (trl's extract_prompt)
        prompt, chosen, rejected = shared_start(chosen, rejected)
        if not prompt:
            raise BadRecord("whose sides share no prompt", f"{where}: \"chosen\" and \"rejected\" start differently, so "
                            "no prompt is shared; give the pair a \"prompt\"")
    if chosen == rejected:
        raise BadRecord("with chosen equal to rejected", f"{where}: the chosen answer is the rejected one; a pair "
                        "teaches nothing unless they differ")
    tools = conversation_tools(record, where)
    if not text:  # each side a conversation a chat can have, the answer the assistant's
        checked = []
        for side, answer in (("chosen", chosen), ("rejected", rejected)):
            if not isinstance(answer[0], dict) or answer[0].get("role") != "assistant":
                raise BadRecord("with an answer that is not the assistant's", f"{where}: the {side} answer must start "
                                "with an assistant message", "the prompt ends where the assistant speaks")
            checked.append(conversation({"messages": prompt + answer}, f"{where} ({side})"))
        prompt, chosen, rejected = checked[0][:len(prompt)], checked[0][len(prompt):], checked[1][len(prompt):]
    return Pair(prompt, chosen, rejected, tools)


def shared_start(chosen, rejected):
    """(prompt, chosen, rejected): the messages (or characters) both sides start with, as the
    prompt, and what follows in each (trl's extract_prompt: a space before the first character
    that differs goes with the answers)."""
    same = 0
    while same < min(len(chosen), len(rejected)) and chosen[same] == rejected[same]:
        same += 1
    if isinstance(chosen, str) and same and chosen[same - 1] == " ":
        same -= 1
    return chosen[:same], chosen[same:], rejected[same:]


PAIRS = Kind("preference", has_pairs, lambda row, where: (pair(row, where),), "pairs")


def preference_source(config: DataConfig) -> ChatSource | None:
    """The preference pairs of config's source (records of (where, Pair)), else None."""
    return records_of(config, PAIRS)


def common_prefix(a, b) -> int:
    """How many leading tokens a and b share."""
    n = min(len(a), len(b))
    differ = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(differ[0]) if len(differ) else n


def encode_pair(tokenizer: Tokenizer, template: ChatTemplate | None, pair: Pair, lost: Unencodable | None = None
                ) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """The two sequences a pair is scored on, chosen then rejected: each (token ids, 1 for each
    token of the answer). Both start with the same prompt tokens (as trl tokenizes them: the
    prompt alone, then prompt and answer, the answer starting where they first differ, the
    shorter of the two sides' prompts kept for both). Conversational: rendered by the chat
    template, the answer's tokens those of the assistant's turns after the prompt (up to their
    end-of-turn tokens, as fine-tuning scores them; what the template writes after a turn's end,
    a newline, is not the answer's). Standard: the text, the answer ending with the
    tokenizer's end-of-text token (as trl appends it). lost: shown each side's text, to count the
    characters the tokenizer cannot write."""
    if pair.conversational:
        prompt = prompt_ids(tokenizer, template, pair.prompt, pair.tools)
        sides = [encode(tokenizer, template, pair.prompt + answer, pair.tools, lost) for answer in (pair.chosen, pair.rejected)]
    else:
        end = end_of_text_id(tokenizer)
        if end is None:
            raise DataError("preference pairs of plain text end each answer with an end-of-text token, which this "
                            "tokenizer has not; train on conversational pairs, or bring in a model whose tokenizer has one")
        prompt = tokenizer.encode(pair.prompt).ids
        sides = []
        for answer in (pair.chosen, pair.rejected):
            if lost is not None:
                lost.count(pair.prompt + answer)
            ids = np.asarray(tokenizer.encode(pair.prompt + answer).ids + [end], dtype=np.int64)
            sides.append((ids, np.ones(len(ids), dtype=np.uint8)))
    shared = min(common_prefix(prompt, ids) for ids, _ in sides)
    encoded = []
    for ids, mask in sides:
        mask = mask.copy()
        mask[:shared] = 0  # the prompt's tokens (an earlier assistant turn of it included) are not the answer's
        if not mask.any():
            raise DataError("an answer with no tokens of its own once tokenized")
        encoded.append((ids, mask))
    return encoded[0], encoded[1]
