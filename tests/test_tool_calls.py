"""Tool calls in what an assistant writes (data/tool_calls.py), and evaluate.py scoring the turns
that call tools by what the template writes for them."""

import json

import pytest
import torch
from tokenizers import AddedToken

import evaluate
from data.template import DEFAULT_TEMPLATE, ChatTemplate, chat_tokenizer, encode, prompt_ids
from data.tokenizer import train_tokenizer
from data.tool_calls import compare_turn, split_calls
from model import GPT, GPTConfig
from test_chat_sources import CALL, WEATHER

# Qwen2's way (Hermes's): the calls as {"name", "arguments"} between <tool_call> tags after the text
CHATML_TOOLS = (
    "{% if tools %}{{ '<|im_start|>system\\n' }}{% for tool in tools %}{{ tool | tojson }}{% endfor %}"
    "{{ '<|im_end|>\\n' }}{% endif %}"
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] }}"
    "{% for call in message['tool_calls'] or [] %}{% set call = call['function'] if call['function'] is defined "
    "else call %}{{ '\\n<tool_call>\\n{\"name\": \"' + call['name'] + '\", \"arguments\": ' + call['arguments'] "
    "| tojson + '}\\n</tool_call>' }}{% endfor %}{{ '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
PARIS = {"name": "weather", "arguments": {"city": "Paris"}}


def tokenizer_for(template: str):
    text = [json.dumps([WEATHER, CALL, PARIS]), "Weather in Paris? Let me look. sunny, 21 C<tool_call></tool_call>"]
    tokenizer = train_tokenizer("bpe", text, 400)
    if template == DEFAULT_TEMPLATE:
        return chat_tokenizer(tokenizer)
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in ("<|im_start|>", "<|im_end|>")])
    return tokenizer


def cut_after_the_call(content="Let me look.", arguments=None, question="Weather in Paris?"):
    """A conversation that ends with the assistant's call, as a practitioner's held-out set cuts it."""
    call = [{"type": "function", "function": {"name": "weather", "arguments": arguments or {"city": "Paris"}}}]
    return [{"role": "user", "content": question},
            {"role": "assistant", "content": content, "tool_calls": call}]


@pytest.mark.parametrize("source", [DEFAULT_TEMPLATE, CHATML_TOOLS], ids=["default", "chatml"])
def test_the_calls_are_found_in_what_each_template_writes_and_the_rest_is_the_text(source):
    template = ChatTemplate(source)
    messages = cut_after_the_call()
    turn = template.render(messages)[len(template.render(messages[:1], add_generation_prompt=True)):]
    text, calls = split_calls(turn)
    assert calls == [PARIS]
    assert "Let me look." in text and "weather" not in text and "Paris" not in text
    # OpenAI's arguments as JSON text are the same call
    stringly = [{"type": "function", "function": {"name": "weather", "arguments": json.dumps({"city": "Paris"})}}]
    assert split_calls(json.dumps(stringly))[1] == [PARIS]
    # JSON that is no call stays text, and so does JSON that does not parse
    assert split_calls('a {"city": "Paris"} [1, 2] {"name": "x"} {"name": "weather", "arguments": {')[1] == []


def test_a_turn_is_scored_by_its_calls_names_their_arguments_as_json_and_the_text_around_them():
    expected = 'Let me look.[{"name": "weather", "arguments": {"city": "Paris", "days": 2}}]'
    call = [{"type": "function", "function": {"name": "weather", "arguments": {"city": "Paris", "days": 2}}}]

    def scores(got):
        c = compare_turn(expected, got, call)["calls"]
        return compare_turn(expected, got, call)["right"], c["name_right"], c["arguments_right"], c["text_right"]

    assert scores(expected) == (True, True, True, True)
    assert scores('Let me look.[{"name":"weather","arguments":{"days":2,"city":"Paris"}}]') == (False, True, True, True)
    assert scores('Let me look.[{"name": "weather", "arguments": {"city": "Rome", "days": 2}}]') == (False, True, False,
                                                                                                    True)
    assert scores('Let me look.[{"name": "forecast", "arguments": {"city": "Paris", "days": 2}}]') == (False, False,
                                                                                                      False, True)
    assert scores('Looking.[{"name": "weather", "arguments": {"city": "Paris", "days": 2}}]') == (False, True, True,
                                                                                                 False)
    assert scores("Let me look.") == (False, False, False, True)  # (no call written)
    assert compare_turn("5", "5", None) == {"kind": "text", "right": True}


def model_for(tokenizer, block_size=256):
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=tokenizer.get_vocab_size(), block_size=block_size, n_layer=1, n_head=2,
                         n_embd=16)).eval()


@pytest.mark.parametrize("source", [DEFAULT_TEMPLATE, CHATML_TOOLS], ids=["default", "chatml"])
def test_evaluate_scores_an_answer_that_calls_a_tool_by_the_turn_the_template_writes(source, monkeypatch):
    """Conversations cut after the assistant's call: a model that writes the turn as the template
    writes it (the stand-in below: the right turn, then one whose arguments come in another
    order) scores as right, tool by tool; the answers say which kind each was."""
    tokenizer, template = tokenizer_for(source), ChatTemplate(source)
    conversations = [(cut_after_the_call(), [WEATHER]), (cut_after_the_call("", {"city": "Paris", "days": 2}, "2 days?"), [WEATHER]),
                     ([{"role": "user", "content": "Weather?"}, {"role": "assistant", "content": "Paris?"}], None)]
    turns = {}
    for messages, tools in conversations:
        whole = template.render(messages, tools=tools)
        turn = whole[len(template.render(messages[:-1], add_generation_prompt=True, tools=tools)):]
        turns[json.dumps(prompt_ids(tokenizer, template, messages[:-1], tools))] = turn.split("<|")[0]
    swapped = {key: turn.replace('{"city": "Paris", "days": 2}', '{"days": 2, "city": "Paris"}')
               for key, turn in turns.items()}
    writes = turns

    def stand_in(model, prompts, ends, max_new_tokens):
        return [tokenizer.encode(writes[json.dumps(p)], add_special_tokens=False).ids for p in prompts]

    monkeypatch.setattr(evaluate, "replies", stand_in)
    model = model_for(tokenizer)
    scored = evaluate.score_conversations(model, tokenizer, template, conversations, 2, "cpu")
    assert scored["exact_match"] == 1.0
    assert [a["kind"] for a in scored["answers"]] == ["tool_call", "tool_call", "text"]
    assert scored["tool_call_answers"] | {"template_writes_json": True} == {
        "count": 2, "exact_match": 1.0, "name_right": 1.0, "arguments_right": 1.0, "text_right": 1.0,
        "template_writes_json": True}
    assert scored["text_answers"] == {"count": 1, "exact_match": 1.0}
    assert scored["answers"][0]["calls"]["got"] == [PARIS]
    writes = swapped
    scored = evaluate.score_conversations(model, tokenizer, template, conversations, 2, "cpu")
    assert scored["exact_match"] == pytest.approx(2 / 3)  # (the text of the one with days changed)
    assert scored["tool_call_answers"]["arguments_right"] == 1.0 and scored["tool_call_answers"]["exact_match"] == 0.5


def test_the_answers_are_capped_and_those_that_reach_the_cap_are_counted(tmp_path, monkeypatch, capsys):
    """A base that never ends its turn writes up to --max-new-tokens (by default twice the
    longest expected answer, at least 16) and the summary counts the answers that reached it;
    the progress is shown on stderr."""
    tokenizer, template = tokenizer_for(DEFAULT_TEMPLATE), ChatTemplate(DEFAULT_TEMPLATE)
    conversations = [([{"role": "user", "content": "Weather?"}, {"role": "assistant", "content": answer}], None)
                     for answer in ("Paris?", "sunny, 21 C and sunny, 21 C and sunny, 21 C")]
    longest = max(len(evaluate.last_answer(tokenizer, template, m, t)[1]) for m, t in conversations)
    asked = []

    def never_ending(model, prompts, ends, max_new_tokens):  # a base that never writes the end of a turn
        asked.append(max_new_tokens)
        return [[tokenizer.token_to_id("s")] * max_new_tokens for _ in prompts]

    monkeypatch.setattr(evaluate, "replies", never_ending)
    model = model_for(tokenizer)
    scored = evaluate.score_conversations(model, tokenizer, template, conversations, 16, "cpu")
    assert asked == [scored["max_new_tokens"]] == [max(16, 2 * (longest + 1))] and longest > 8
    assert scored["at_the_cap"] == 2
    assert "answers" in capsys.readouterr().err  # (the progress bar)
    assert evaluate.score_conversations(model, tokenizer, template, conversations, 16, "cpu", 5)["max_new_tokens"] == 5
    # the cap of a real model's replies: each stops at its end or the cap
    monkeypatch.undo()
    scored = evaluate.score_conversations(model, tokenizer, template, conversations, 16, "cpu", 3)
    written = [len(tokenizer.encode(a["got"], add_special_tokens=False).ids) for a in scored["answers"]]
    assert all(n <= 3 for n in written)
    assert scored["at_the_cap"] == sum(a["at_the_cap"] for a in scored["answers"])
