"""Bad conversations in a practitioner's data (data/conversations.py, data/prepare.py): the order of
the roles and the tools' replies checked before the template sees them, and the rule that skips
bad records, counted by reason and named, up to data.skip_bad_records (past it, refused)."""

import json

import pytest

from data.config import DataConfig
from data.conversations import BadRecord, chat_source, conversation
from jobs import prepare
from data.shared import DataError
from data.tasks import conversations as task_conversations

USER, ANSWER = {"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}


def calling(*ids):
    return {"role": "assistant", "content": "", "tool_calls": [
        {"id": i, "type": "function", "function": {"name": "weather", "arguments": {}}} if i else
        {"type": "function", "function": {"name": "weather", "arguments": {}}} for i in ids]}


def reply(to=None):
    return {"role": "tool", "content": "sunny"} | ({"tool_call_id": to} if to else {})


@pytest.mark.parametrize("messages, said", [
    ([ANSWER, USER, ANSWER], "message 1: the assistant speaks first"),
    ([{"role": "system", "content": "Be brief."}, ANSWER], "message 2: the assistant speaks first"),
    ([USER, USER, ANSWER], "message 2: a user message after a user message"),
    ([USER, ANSWER, ANSWER], "message 3: two assistant messages in a row"),
    ([USER, {"role": "system", "content": "x"}, ANSWER], "message 2: a system message after the conversation began"),
    ([USER, ANSWER, reply(), ANSWER], "message 3: a tool's reply with no call of the assistant's before it"),
    ([reply(), USER, ANSWER], "message 1: a tool's reply with no call"),
    ([USER, calling("a"), reply("b"), ANSWER], "message 3: a tool's reply to call 'b', which no unanswered call"),
    ([USER, calling("a"), reply("a"), reply("a"), ANSWER], "message 4: a tool's reply with no call"),
    ([USER, calling(None, None), reply(), reply(), reply(), ANSWER], "message 5: a tool's reply with no call"),
    ([USER, calling("a"), reply("a"), USER, ANSWER], "message 4: a user message after a tool message"),
])
def test_a_conversation_whose_roles_are_out_of_order_is_a_bad_record(messages, said):
    with pytest.raises(BadRecord, match=said) as error:
        conversation({"messages": messages}, "chat.jsonl, line 7")
    assert str(error.value).startswith("chat.jsonl, line 7, message ") and "\n" not in str(error.value)
    assert str(error.value).endswith("; a chat goes [system,] user, assistant, user, ... with a tool's replies after "
                                     "the assistant's calls")  # (the fix, where the record is refused alone)


@pytest.mark.parametrize("messages", [
    [{"role": "system", "content": "Be brief."}, USER, ANSWER, USER, ANSWER],
    [USER, calling("a", "b"), reply("b"), reply("a"), ANSWER, USER, ANSWER],  # (answered in another order, by id)
    [USER, calling(None, None), reply(), reply(), ANSWER],  # (no ids: no more replies than calls)
    [USER, calling("a"), reply(), ANSWER],  # (a reply without an id answers the call)
    [USER, calling("a")],  # (a held-out set cut after the call)
])
def test_a_conversation_in_order_is_taken(messages):
    assert [m["role"] for m in conversation({"messages": messages}, "x")] == [m["role"] for m in messages]


@pytest.mark.parametrize("empty", [{"role": "assistant", "content": ""}, {"role": "assistant", "content": " \n"},
                                   {"role": "assistant", "content": "", "tool_calls": []}])
def test_an_answer_with_no_text_and_no_call_is_a_bad_record(empty):
    """Rows and messages both counted from 1; an answer that says nothing and calls nothing
    would teach the model to answer with nothing (an empty text beside a call is taken above)."""
    with pytest.raises(BadRecord, match=r"^chat.parquet, row 1832, message 4: the assistant says nothing and calls "
                                        "no tool") as error:
        conversation({"messages": [USER, ANSWER, USER, empty]}, "chat.parquet, row 1832")
    assert error.value.reason == "with an empty answer"


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    return path


REFUSING = ("{% for message in messages %}{% if message['content'] == 'REFUSE' %}{{ raise_exception('not this one') }}"
            "{% endif %}{{ '<|' + message['role'] + '|>' + message['content'] + '<|end|>' }}{% endfor %}"
            "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}")


def test_bad_records_are_skipped_counted_by_reason_and_named_up_to_the_limit(tmp_path, capsys):
    """data.skip_bad_records (0.01 by default): the bad records of a source (its reading's, and those
    the chat template refuses, named by file and line) are left out, counted by reason, the first
    three named, in meta.json and in what the run says; past the limit, or with 0, the source is
    refused in one line."""
    from data.tokenizer import train_tokenizer
    from data.template import chat_tokenizer

    good = task_conversations("add", 300, seed=0)
    bad = [{"messages": [ANSWER, USER, ANSWER]}, {"messages": [USER, USER, ANSWER]},
           {"messages": [USER, {"role": "assistant", "content": "REFUSE"}]}]
    path = write_jsonl(tmp_path / "chat.jsonl", good[:100] + bad[:1] + good[100:200] + bad[1:] + good[200:])
    tokenizer = chat_tokenizer(train_tokenizer("char", ["0123456789+=hello REFUSE"], 0))
    config = DataConfig(source=str(path), cache_dir=str(tmp_path / "c"))
    data = prepare(config, progress=False, tokenizer=tokenizer, chat_template=REFUSING)
    assert sum(len(data.conversations[split]) for split in ("train", "val")) == 300
    skipped = data.meta["skipped"]
    assert skipped["reasons"] == {"with the roles out of order": 2, "that the chat template refused": 1}
    assert skipped["of"] == 303 and skipped["first"][0].startswith(f"{path}, line 101, message 1: the assistant speaks")
    assert skipped["first"][:2] == [f"{path}, line 101, message 1: the assistant speaks first",
                                    f"{path}, line 202, message 2: a user message after a user message"]  # (no fix each)
    assert skipped["first"][2].startswith(f"{path}, line 203: the chat template of train.init_from refused a conversation: "
                                       "not this one")
    said = data.bad_records()
    assert said.startswith("3 of 303 conversations are bad and left out (data.skip_bad_records=0.01): 2 with the "
                           "roles out of order, 1 that the chat template refused; the first: ")
    again = prepare(config, progress=False, tokenizer=tokenizer, chat_template=REFUSING)
    assert not again.built and again.bad_records() == said  # (the token files found say it as those made)
    # refused: with 0, at the first; past the limit, with the count and the reasons
    strict = DataConfig(source=str(path), cache_dir=str(tmp_path / "s"), skip_bad_records=0)
    with pytest.raises(DataError, match=rf"^{path}, line 101, message 1: the assistant speaks first") as error:
        prepare(strict, progress=False, tokenizer=tokenizer, chat_template=REFUSING)
    assert "\n" not in str(error.value)
    mostly_bad = write_jsonl(tmp_path / "mostly_bad.jsonl", good[:50] + bad * 2)
    with pytest.raises(DataError) as error:
        prepare(DataConfig(source=str(mostly_bad), cache_dir=str(tmp_path / "m")), progress=False)
    assert str(error.value).startswith(f"{mostly_bad}: 4 of 56 conversations are bad, more than data.skip_bad_records="
                                       "0.01 lets be skipped (4 with the roles out of order; the first: ")
    assert str(error.value).endswith("; fix the data, or raise data.skip_bad_records") and "\n" not in str(error.value)
    assert not list((tmp_path / "m").glob("*/meta.json"))  # (nothing half-made is left to pass for token files)
    # the limit holds for what the template refuses too: read whole, half refused there, the source is refused
    half_refused = write_jsonl(tmp_path / "half_refused.jsonl", [record for pair in zip(good[:50], [bad[2]] * 50)
                                                                 for record in pair])
    with pytest.raises(DataError) as error:
        prepare(DataConfig(source=str(half_refused), cache_dir=str(tmp_path / "h")), progress=False,
                tokenizer=tokenizer, chat_template=REFUSING)
    assert str(error.value).startswith(f"{half_refused}: 50 of 100 conversations are bad, more than "
                                       "data.skip_bad_records=0.01 lets be skipped (50 that the chat template refused")
    assert not list((tmp_path / "h").glob("*/meta.json"))


def test_a_run_says_what_it_left_out(tmp_path, capsys):
    import train
    from test_chat import chat_run

    records = task_conversations("add", 400, seed=0)
    path = write_jsonl(tmp_path / "add.jsonl", records[:200] + [{"messages": [USER, USER, ANSWER]}] + records[200:])
    assert train.main(chat_run(tmp_path, "train.max_iters=1", data=path)) == 0
    assert ("note: 1 of 401 conversations are bad and left out (data.skip_bad_records=0.01): 1 with the roles out of "
            f"order; the first: {path}, line 201, message 2: a user message after a user message") in capsys.readouterr().out


def test_a_mixtures_bad_records_are_added_up(tmp_path):
    good = task_conversations("add", 200, seed=0)
    first = write_jsonl(tmp_path / "a.jsonl", good[:100] + [{"messages": [USER, ANSWER, ANSWER]}])
    second = write_jsonl(tmp_path / "b.jsonl", good[100:] + [{"messages": [ANSWER]}])
    data = prepare(DataConfig(sources=[str(first), str(second)], tokenizer="char", cache_dir=str(tmp_path / "c")),
                   progress=False)
    assert data.meta["skipped"]["reasons"] == {"with the roles out of order": 2} and data.meta["skipped"]["of"] == 202
    assert [line.split(",")[0] for line in data.meta["skipped"]["first"]] == [str(first), str(second)]


def test_skip_bad_records_is_a_share(tmp_path):
    for wrong in (1, -0.1, "all", True):
        with pytest.raises(DataError, match=r"data.skip_bad_records=.*must be a share from 0"):
            DataConfig(skip_bad_records=wrong)
    source = chat_source(DataConfig(source=str(write_jsonl(tmp_path / "c.jsonl", task_conversations("add", 5))),
                                    skip_bad_records=0))
    assert source.skipped.allowed == 0
