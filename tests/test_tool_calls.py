"""Tool calls in what an assistant writes (data/tool_calls.py), and evaluate.py scoring the turns
that call tools by what the template writes for them."""

import json

import pytest
import torch
from tokenizers import AddedToken

import evaluate
from jobs import chat_data
from data.tasks import WEATHER_TOOL as WEATHER_SET_TOOL
from data.template import DEFAULT_TEMPLATE, ChatTemplate, chat_tokenizer, prompt_ids
from data.tokenizer import train_tokenizer
from data.tool_calls import assistant_turn, call_of, compare_turn, split_calls
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
# the same, reading each call in OpenAI's form only (call["function"]), as many templates do
OPENAI_ONLY = CHATML_TOOLS.replace("{% set call = call['function'] if call['function'] is defined else call %}",
                                   "{% set call = call['function'] %}")


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
    assert [call_of(call) for call in calls] == [PARIS]
    assert "Let me look." in text and "weather" not in text and "Paris" not in text
    # OpenAI's arguments as JSON text are the same call
    stringly = [{"type": "function", "function": {"name": "weather", "arguments": json.dumps({"city": "Paris"})}}]
    assert [call_of(call) for call in split_calls(json.dumps(stringly))[1]] == [PARIS]
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

    monkeypatch.setattr(chat_data, "replies", stand_in)
    model = model_for(tokenizer)
    scored = chat_data.score_conversations(model, tokenizer, template, conversations, 2, "cpu")
    assert scored["exact_match"] == 1.0
    assert [a["kind"] for a in scored["answers"]] == ["tool_call", "tool_call", "text"]
    assert scored["tool_call_answers"] | {"template_writes_json": True} == {
        "count": 2, "exact_match": 1.0, "name_right": 1.0, "arguments_right": 1.0, "text_right": 1.0,
        "template_writes_json": True}
    assert scored["text_answers"] == {"count": 1, "exact_match": 1.0}
    assert scored["answers"][0]["calls"]["got"] == [PARIS]
    writes = swapped
    scored = chat_data.score_conversations(model, tokenizer, template, conversations, 2, "cpu")
    assert scored["exact_match"] == pytest.approx(2 / 3)  # (the text of the one with days changed)
    assert scored["tool_call_answers"]["arguments_right"] == 1.0 and scored["tool_call_answers"]["exact_match"] == 0.5


def test_the_answers_are_capped_and_those_that_reach_the_cap_are_counted(tmp_path, monkeypatch, capsys):
    """A base that never ends its turn writes up to --max-new-tokens (by default twice the
    longest expected answer, at least 16) and the summary counts the answers that reached it;
    the progress is shown on stderr."""
    tokenizer, template = tokenizer_for(DEFAULT_TEMPLATE), ChatTemplate(DEFAULT_TEMPLATE)
    conversations = [([{"role": "user", "content": "Weather?"}, {"role": "assistant", "content": answer}], None)
                     for answer in ("Paris?", "sunny, 21 C and sunny, 21 C and sunny, 21 C")]
    longest = max(len(chat_data.last_answer(tokenizer, template, m, t)[1]) for m, t in conversations)
    asked = []

    def never_ending(model, prompts, ends, max_new_tokens):  # a base that never writes the end of a turn
        asked.append(max_new_tokens)
        return [[tokenizer.token_to_id("s")] * max_new_tokens for _ in prompts]

    monkeypatch.setattr(chat_data, "replies", never_ending)
    model = model_for(tokenizer)
    scored = chat_data.score_conversations(model, tokenizer, template, conversations, 16, "cpu")
    assert asked == [scored["max_new_tokens"]] == [max(16, 2 * (longest + 1))] and longest > 8
    assert scored["at_the_cap"] == 2
    assert "answers" in capsys.readouterr().err  # (the progress bar)
    assert chat_data.score_conversations(model, tokenizer, template, conversations, 16, "cpu", 5)["max_new_tokens"] == 5
    # the cap of a real model's replies: each stops at its end or the cap
    monkeypatch.undo()
    scored = chat_data.score_conversations(model, tokenizer, template, conversations, 16, "cpu", 3)
    written = [len(tokenizer.encode(a["got"], add_special_tokens=False).ids) for a in scored["answers"]]
    assert all(n <= 3 for n in written)
    assert scored["at_the_cap"] == sum(a["at_the_cap"] for a in scored["answers"])


@pytest.mark.parametrize("source", [DEFAULT_TEMPLATE, CHATML_TOOLS, OPENAI_ONLY], ids=["default", "chatml", "openai"])
@pytest.mark.parametrize("content", ["Let me look.", ""])
def test_a_turn_that_calls_a_tool_is_read_back_as_the_message_the_template_writes_so(source, content):
    """generate.py --chat keeps a reply as the message the template would write as that text:
    its text and its calls (as written, or in OpenAI's form where the template reads only that),
    so the conversation renders again as the model wrote it."""
    template = ChatTemplate(source)
    messages = cut_after_the_call(content)
    asked = messages[:1]
    written = template.render(messages)[len(template.render(asked, add_generation_prompt=True)):]
    written = written[:min(written.find(end) for end in ("<|end|>", "<|im_end|>") if end in written)]
    turn = assistant_turn(template, asked, None, written)
    calls = {DEFAULT_TEMPLATE: messages[1]["tool_calls"], CHATML_TOOLS: [PARIS],
             OPENAI_ONLY: [{"type": "function", "function": PARIS}]}[source]
    assert turn == {"role": "assistant", "content": content, "tool_calls": calls}
    assert template.render([*asked, turn]) == template.render(messages)
    assert assistant_turn(template, asked, None, "Sunny.") == {"role": "assistant", "content": "Sunny."}


def test_a_call_that_the_template_cannot_write_is_kept_as_text():
    refusing = ChatTemplate("{% for message in messages %}{% if message['tool_calls'] %}{{ raise_exception('no calls') }}"
                            "{% endif %}{{ message['role'] + ': ' + message['content'] + '\\n' }}{% endfor %}"
                            "{% if add_generation_prompt %}{{ 'assistant: ' }}{% endif %}")
    written = json.dumps(PARIS)
    assert assistant_turn(refusing, [{"role": "user", "content": "Weather?"}], None, written) == {
        "role": "assistant", "content": written}


def scripted(monkeypatch, tokenizer, *turns):
    """The chat's sampling replaced by a script: each turn's text, token by token, then the end
    of the turn (the model still runs every step, with its cache)."""
    import jobs.chat_session

    script = []
    for text in turns:
        script += tokenizer.encode(text, add_special_tokens=False).ids + [tokenizer.token_to_id("<|end|>")]
    monkeypatch.setattr(jobs.chat_session, "sample_next", lambda logits, sampling, generator: torch.tensor([script.pop(0)]))
    return script


def test_chat_with_tools_shows_the_call_takes_its_result_and_answers_it(monkeypatch):
    """Chat with tools: the tools are in every prompt; a reply that calls them waits for their
    results (the tool's message answers the call by its id and name), and the model's answer to
    them is written on the conversation with the results in it."""
    from jobs.chat_session import Chat
    from model import Sampling

    tokenizer = tokenizer_for(DEFAULT_TEMPLATE)
    template = ChatTemplate(DEFAULT_TEMPLATE)
    calls = [{"id": "c1", "type": "function", "function": {"name": "weather", "arguments": {"city": "Paris"}}},
             {"id": "c2", "type": "function", "function": {"name": "weather", "arguments": {"city": "Rome"}}}]
    script = scripted(monkeypatch, tokenizer, "Let me look." + json.dumps(calls), "Sunny in both.")
    seen = []
    model = model_for(tokenizer, block_size=512)
    forward = model.forward
    monkeypatch.setattr(model, "forward", lambda idx, *a, **k: (seen.append(idx[0].tolist()), forward(idx, *a, **k))[1])
    session = Chat(model, tokenizer, template, Sampling(temperature=0), 100, torch.Generator(), note=print,
                   tools=[WEATHER])
    assert session.reply("Weather in Paris and Rome?") == "Let me look." + json.dumps(calls)
    assert session.messages[-1] == {"role": "assistant", "content": "Let me look.", "tool_calls": calls}
    assert session.waiting == calls
    assert session.tool_result("sunny, 21 C") is None and session.waiting == calls[1:]  # (the other call waits)
    answer = session.tool_result("sunny, 25 C")
    assert answer == "Sunny in both." and not script and not session.waiting
    assert session.messages[2:] == [
        {"role": "tool", "content": "sunny, 21 C", "name": "weather", "tool_call_id": "c1"},
        {"role": "tool", "content": "sunny, 25 C", "name": "weather", "tool_call_id": "c2"},
        {"role": "assistant", "content": "Sunny in both."}]
    # the answer was written after the whole conversation, tools and results in it, as the template writes it
    ran = [token for step in seen for token in step]
    expected = prompt_ids(tokenizer, template, session.messages[:4], [WEATHER])
    assert ran[:len(expected)] == expected
    with pytest.raises(evaluate.UserError, match="no call of the model's waits for a result"):
        session.tool_result("sunny")


def tools_run(tmp_path) -> list[dict]:
    """A chat run of one step on conversations that call the weather tool (a BPE, a context of
    512) in tmp_path / "run"; returns its records."""
    import train
    from test_chat import chat_run

    records = [{"messages": cut_after_the_call() + [{"role": "tool", "content": "sunny"},
                                                    {"role": "assistant", "content": "Sunny."}], "tools": [WEATHER]}] * 40
    data = tmp_path / "tools.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert train.main(chat_run(tmp_path, "train.max_iters=1", "data.tokenizer=bpe", "data.vocab_size=300",
                               "model.block_size=512", data=data)) == 0
    return records


def test_generate_chat_takes_tools_shows_each_call_and_reads_their_results(tmp_path, monkeypatch, capsys):
    import io

    import generate
    from runs.folder import RunDir

    records = tools_run(tmp_path)
    tokenizer = RunDir(tmp_path / "run").load_model()[1]
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps([WEATHER]))
    script = scripted(monkeypatch, tokenizer, "Let me look." + json.dumps(CALL), "Sunny.")
    monkeypatch.setattr("sys.stdin", io.StringIO("Weather in Paris?\n/tool sunny, 21 C\n"))
    capsys.readouterr()
    assert generate.main(["--checkpoint", str(tmp_path / "run"), "--chat", "--tools", str(tools)]) == 0
    out = capsys.readouterr()
    assert out.out == "Let me look." + json.dumps(CALL) + "\nSunny.\n" and not script
    assert 'call: weather({"city": "Paris"}); give its result as /tool RESULT' in out.err
    for bad, said in [("[]", "give a JSON list of tool descriptions"), ("{", "is not a JSON file"),
                      (None, "does not exist")]:
        path = tmp_path / "bad.json"
        path.unlink(missing_ok=True)
        if bad is not None:
            path.write_text(bad)
        assert generate.main(["--checkpoint", str(tmp_path / "run"), "--chat", "--tools", str(path)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: --tools {path}") and said in err and len(err.splitlines()) == 1
    assert generate.main(["--checkpoint", str(tmp_path / "run"), "--tools", str(tools), "--prompt", "x"]) == 2
    assert "give them with --chat" in capsys.readouterr().err
    # evaluate.py says the scores of the answers that call tools apart, in words
    held_out = tmp_path / "held_out.jsonl"
    held_out.write_text(json.dumps({"messages": cut_after_the_call(), "tools": [WEATHER]}) + "\n"
                        + json.dumps({"messages": records[0]["messages"]}) + "\n")
    assert evaluate.main(["--checkpoint", str(tmp_path / "run"), "--text", str(held_out), "--max-new-tokens", "3"]) == 0
    said = capsys.readouterr().out.splitlines()
    assert said[2].startswith("text answers: 1, exact match ")
    assert said[3].startswith("answers that call tools: 1, exact match 0.0% | the right tool 0.0% | the right "
                              "arguments (as JSON) 0.0% | the right text around the calls ")
    assert said[4] == "answers written up to 3 tokens (--max-new-tokens): 2 of 2 reached it without ending their turn"


def test_the_weather_set_is_function_calls_a_chat_run_takes(tmp_path, capsys):
    """python -m data.tasks weather: conversations as the hub's sets of function calls hold them
    (system prompt, tools, a call with an id, the tool's reply to it, the answer), checked as any
    record is; the same seed, the same file; --until-call ends each with its call."""
    from data import tasks
    from data.conversations import conversation, conversation_tools

    assert tasks.main(["weather", "--count", "20", "--turns", "2", "--out", str(tmp_path / "a.jsonl")]) == 0
    assert tasks.main(["weather", "--count", "20", "--turns", "2", "--out", str(tmp_path / "b.jsonl")]) == 0
    assert (tmp_path / "a.jsonl").read_bytes() == (tmp_path / "b.jsonl").read_bytes()
    records = [json.loads(line) for line in (tmp_path / "a.jsonl").read_text().splitlines()]
    for record in records:
        messages = conversation(record, "x")  # (the roles in order, each reply to its call)
        assert conversation_tools(record, "x") == [WEATHER_SET_TOOL] and messages[0]["role"] == "system"
        calls = [m["tool_calls"][0] for m in messages if m.get("tool_calls")]
        city = calls[-1]["function"]["arguments"]["city"]
        assert city in messages[-4]["content"] and city in messages[-1]["content"]
    ids = [m["tool_calls"][0]["id"] for r in records for m in r["messages"] if m.get("tool_calls")]
    assert len(ids) == len(set(ids)) > 20  # (some conversations hold two calls)
    assert tasks.main(["weather", "--count", "5", "--until-call", "--out", str(tmp_path / "c.jsonl")]) == 0
    cut = [json.loads(line) for line in (tmp_path / "c.jsonl").read_text().splitlines()]
    assert all(r["messages"][-1]["role"] == "assistant" and r["messages"][-1]["tool_calls"] for r in cut)
    for refused in (["add", "--until-call"], ["weather", "--plain"]):
        with pytest.raises(SystemExit):
            tasks.main([*refused, "--out", str(tmp_path / "d.jsonl")])
        assert "error:" in capsys.readouterr().err


def test_large_tools_leave_a_message_room_or_are_refused_naming_what_fills_the_context(tmp_path, monkeypatch, capsys):
    """Tools that fill more than half the context: with the default --max-new-tokens the room
    kept for a reply shrinks to half of what they leave (said) and a message is answered; with
    a reply's length chosen too long, each line is refused naming the tools' tokens, the room
    kept and the fixes, and a session of refused lines exits 2; tools that fill the context are
    refused before the first line."""
    import io

    import generate

    tools_run(tmp_path)
    described = [{**WEATHER, "function": {**WEATHER["function"], "name": f"weather_{i}",
                                          "description": "The weather of a city on a day, as the forecast says it."}}
                 for i in range(4)]
    tools = tmp_path / "large.json"
    tools.write_text(json.dumps(described))
    chat = ["--checkpoint", str(tmp_path / "run"), "--chat", "--tools", str(tools), "--temperature", "0"]
    monkeypatch.setattr("sys.stdin", io.StringIO("Weather in Paris?\n"))
    capsys.readouterr()
    assert generate.main([*chat, "--max-new-tokens", "400"]) == 2
    err = capsys.readouterr().err
    fixed = int(err.split("after the system prompt and the tools' ")[1].split(";")[0])
    assert 256 < fixed < 500  # (the tools are more than half the context: every message was refused before)
    assert ("the model's context holds 512 and keeps 256 for the reply: write less, or give a smaller "
            "--max-new-tokens, fewer tools, or a model with a larger context") in err
    assert err.strip().splitlines()[-1] == "error: every line (1) was refused, none answered"
    monkeypatch.setattr("sys.stdin", io.StringIO("Weather in Paris?\n"))
    assert generate.main([*chat, "--max-new-tokens", "500"]) == 2  # (chosen, though it is the default's number)
    assert capsys.readouterr().err.strip().endswith("error: every line (1) was refused, none answered")
    monkeypatch.setattr("sys.stdin", io.StringIO("Weather in Paris?\n"))
    assert generate.main(chat) == 0
    err = capsys.readouterr().err
    assert (f"note: the system prompt and the tools are {fixed} of the context's 512 tokens: {(512 - fixed) // 2} "
            "are kept for each reply (--max-new-tokens chooses)") in err and "error" not in err
    tools.write_text(json.dumps(described * 2))
    monkeypatch.setattr("sys.stdin", io.StringIO("Weather in Paris?\n"))
    assert generate.main(chat) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]  # (after the note that the model is barely trained)
    assert err.startswith("error: the system prompt and the tools are ")
    assert err.endswith("the model's context holds 512: give fewer tools, a shorter system prompt, or a "
                                "model with a larger context")
