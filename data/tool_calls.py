"""Tool calls in what an assistant writes: found in its text, compared by name and arguments.

A chat template writes a call as JSON inside markers of its own: the default template
(data/template.py) the message's list of tool_calls, Qwen2's and Hermes's
{"name": ..., "arguments": ...} between <tool_call> tags, Llama 3.1's
{"name": ..., "parameters": ...} alone. Whatever the markers, the call is a JSON object with
a "name" and its "arguments" (or "parameters"), alone, in a list, or inside a "function":
that is what `split_calls` looks for, and what it leaves, with the calls taken out, is the
turn's text with the template's markers. A template that writes calls in another form
(Python's syntax, say) is read as text.

evaluate.py scores a turn that calls tools by the calls' names, their arguments as JSON
values (key order and spacing aside) and the text around them (compare_turn);
generate.py --chat shows the calls a model writes and takes the tools' replies.
"""

from __future__ import annotations

import json

from .shared import DataError
from .template import TURN_ENDS


def call_of(value) -> dict | None:
    """{"name", "arguments"} of one call as JSON holds it (OpenAI's {"type": "function",
    "function": {...}} or the bare {"name", "arguments"}; Llama's "parameters"; arguments given
    as JSON text, as OpenAI's API gives them, read as the value they hold), else None."""
    if not isinstance(value, dict):
        return None
    inner = value["function"] if isinstance(value.get("function"), dict) else value
    if not isinstance(inner.get("name"), str) or not ("arguments" in inner or "parameters" in inner):
        return None
    arguments = inner["arguments"] if "arguments" in inner else inner["parameters"]
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            pass  # (text that is not JSON stays text, and is compared as text)
    return {"name": inner["name"], "arguments": arguments}


def calls_in(value) -> list[dict]:
    """The calls a JSON value holds, as written: one call, or a list of them (every item a
    call); else none."""
    if call_of(value) is not None:
        return [value]
    if isinstance(value, list) and value and all(call_of(item) is not None for item in value):
        return value
    return []


def split_calls(text: str) -> tuple[str, list[dict]]:
    """(the text with each call's JSON taken out, the calls as written, in order). Each { or [
    is tried as the start of a JSON value; one that holds calls is taken out whole."""
    decoder = json.JSONDecoder()
    kept, calls = [], []
    start = i = 0
    while i < len(text):
        if text[i] in "{[":
            try:
                value, end = decoder.raw_decode(text, i)
            except json.JSONDecodeError:
                end = None
            if end is not None and (found := calls_in(value)):
                kept.append(text[start:i])
                calls += found
                start = i = end
                continue
        i += 1
    kept.append(text[start:])
    return "".join(kept), calls


def assistant_turn(template, messages: list[dict], tools: list[dict] | None, written: str) -> dict:
    """The assistant's message that the template writes as `written` after `messages` (a
    ChatTemplate's; the turn without its end-of-turn marker): its text and its calls. The calls
    are kept as written where the template writes them again so (the default template writes
    the message's own list), else in OpenAI's form, {"type": "function", "function": {...}},
    which most templates read. The text is what is left with the calls taken out and, around
    them, the template's own markers (what it writes for the same calls with no text); if no
    such message is written back as `written`, the text is what is left with the calls taken
    out. A template that refuses the calls in either form leaves the reply as text."""
    text, written_calls = split_calls(written)
    if not written_calls:
        return {"role": "assistant", "content": written}
    before = template.render(messages, add_generation_prompt=True, tools=tools)

    def turn(content: str, calls: list[dict]) -> str:  # what the template writes for the message after `before`
        message = {"role": "assistant", "content": content, "tool_calls": calls}
        return template.render([*messages, message], tools=tools)[len(before):]

    openai_form = [{"type": "function", "function": call_of(call)} for call in written_calls]
    accepted = None  # (the first form the template renders, where neither writes the reply again)
    for calls in (written_calls, openai_form):
        try:
            markers = split_calls(turn("", calls))[0]
        except DataError:  # (a template that reads call["function"], say, given the calls as written)
            continue
        markers = markers[:min([markers.find(end) for end in TURN_ENDS if end in markers], default=len(markers))]
        candidates = [text, text.strip()]
        if markers.strip() and text.rstrip().endswith(markers.strip()):
            candidates.append(text.rstrip()[:-len(markers.strip())].strip())
        content = next((c for c in candidates if turn(c, calls).startswith(written)), None)
        if content is not None:
            return {"role": "assistant", "content": content, "tool_calls": calls}
        accepted = accepted or calls
    if accepted is None:
        return {"role": "assistant", "content": written}
    return {"role": "assistant", "content": text.strip(), "tool_calls": accepted}


def compare_turn(expected: str, got: str, expected_calls: list[dict] | None = None) -> dict:
    """How the turn a model wrote (`got`) compares with the one expected, both as the
    template writes them: "right" when they are the same text; for a turn that calls tools
    (expected_calls: the message's tool_calls, as the data holds them), also whether the calls
    have the right names (all of them, in order), the right arguments (as JSON values) and the
    right text around them (the turns with their calls taken out, spaces at the ends aside)."""
    result = {"kind": "tool_call" if expected_calls else "text", "right": got == expected}
    if expected_calls:
        wanted = [call_of(call) for item in expected_calls for call in calls_in(item)]
        text_expected, _ = split_calls(expected)
        text_got, written = split_calls(got)
        written = [call_of(call) for call in written]
        names = [call["name"] for call in written] == [call["name"] for call in wanted]
        result["calls"] = {"expected": wanted, "got": written, "name_right": names,
                           "arguments_right": names and [c["arguments"] for c in written] == [c["arguments"] for c in wanted],
                           "text_right": text_got.strip() == text_expected.strip(),
                           "template_writes_json": len(split_calls(expected)[1]) == len(wanted)}
    return result
