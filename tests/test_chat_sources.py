"""Conversations from wherever a practitioner keeps them (data/conversations.py, data/prepare.py): Parquet
files and hf: datasets (local folders in the hub's layout stand in for the hub), the tool role
with the tools a conversation may call, and a mixture of sources with weights."""

import json

import numpy as np
import pyarrow
import pyarrow.parquet
import pytest

from data.config import DataConfig
from data.conversations import chat_source
from jobs import prepare
from data.shared import DataError
from data.template import DEFAULT_TEMPLATE, ChatTemplate, encode
from data.tasks import conversations as task_conversations
from test_chat import default_tokenizer, learnt

WEATHER = {"type": "function", "function": {"name": "weather", "description": "today's weather in a city",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
CALL = [{"type": "function", "function": {"name": "weather", "arguments": {"city": "Paris"}}}]
WITH_A_TOOL = {"messages": [{"role": "user", "content": "Weather in Paris?"},
                            {"role": "assistant", "content": None, "tool_calls": CALL},
                            {"role": "tool", "content": "sunny, 21 C", "name": "weather"},
                            {"role": "assistant", "content": "Sunny, 21 C."}],
               "tools": [WEATHER]}


def write_parquet(path, records):
    path.parent.mkdir(parents=True, exist_ok=True)
    pyarrow.parquet.write_table(pyarrow.Table.from_pylist(records), path)


def test_a_tool_turn_renders_with_its_tools_and_the_call_is_learnt():
    """The default template writes the tools first and the call after the assistant's text; the
    call and the final answer are learnt, the tool's result is not."""
    tokenizer = default_tokenizer("bpe")  # (byte-level: every character has its tokens)
    source_tools = WITH_A_TOOL["tools"]
    messages = WITH_A_TOOL["messages"]
    template = ChatTemplate(DEFAULT_TEMPLATE)
    text = template.render(messages, tools=source_tools)
    assert text.startswith("<|system|>" + json.dumps(source_tools) + "<|end|><|user|>Weather in Paris?<|end|>")
    assert "<|assistant|>" + json.dumps(CALL) + "<|end|><|tool|>sunny, 21 C<|end|>" in text
    ids, mask = encode(tokenizer, template, messages, source_tools)
    said = learnt(tokenizer, ids, mask)
    assert said == json.dumps(CALL) + "<|end|>Sunny, 21 C.<|end|>"  # the call and the answer, not the tool's result


def test_parquet_conversations_with_a_tool_turn_come_in_and_bad_rows_name_their_row(tmp_path):
    records = [WITH_A_TOOL | {"tools": json.dumps([WEATHER])}] + task_conversations("add", 9, seed=0)
    write_parquet(tmp_path / "chat.parquet", [r | {"tools": r.get("tools")} for r in records])
    source = chat_source(DataConfig(source=str(tmp_path / "chat.parquet"), val_fraction=0.2))
    train = list(source.train())
    assert len(train) == 8 and len(list(source.val())) == 2
    where, messages, tools = train[0]
    assert where == f"{tmp_path / 'chat.parquet'}, row 1" and tools == [WEATHER]
    assert messages[1] == {"role": "assistant", "content": "", "tool_calls": CALL}  # (Parquet's None fields left out)
    assert messages[2] == {"role": "tool", "content": "sunny, 21 C", "name": "weather"}
    assert train[1][1] == task_conversations("add", 1, seed=0)[0]["messages"] and train[1][2] is None
    bad = [{"messages": [{"role": "user", "content": "hi"}, {"role": "robot", "content": "beep"}]}]
    write_parquet(tmp_path / "bad.parquet", records[1:4] + bad)
    with pytest.raises(DataError, match=r"bad.parquet, row 4, message 2: each message needs a \"role\""):
        list(chat_source(DataConfig(source=str(tmp_path / "bad.parquet"), val_fraction=0.2, skip_bad_records=0)).val())


def test_an_hf_folder_in_the_hubs_layout_is_read_as_conversations_and_fingerprinted(tmp_path):
    """A dataset folder as the hub lays one out (data/train-00000-of-00001.parquet, a test
    split beside it): its train split's conversations train and its test split's validate
    (data.hf_val_split: auto), prepared once; changing a shard makes new token files;
    data.hf_val_split=none cuts validation from train, and data.hf_split picks another split."""
    hub = tmp_path / "org_chat"
    write_parquet(hub / "data" / "train-00000-of-00001.parquet", task_conversations("add", 40, seed=0))
    write_parquet(hub / "data" / "test-00000-of-00001.parquet", task_conversations("reverse", 10, seed=1))
    (hub / "README.md").write_text("---\nlicense: mit\n---\n")
    config = DataConfig(f"hf:{hub}", tokenizer="char", cache_dir=str(tmp_path / "c"))
    data = prepare(config, progress=False)
    assert len(data.conversations["train"]) == 40 and len(data.conversations["val"]) == 10
    assert data.meta["val_split"] == "test" and data.validated_on() == "the dataset's test split"
    sums = tmp_path / "sums.jsonl"
    sums.write_text("".join(json.dumps(r) + "\n" for r in task_conversations("add", 20, seed=2)))
    mixed = prepare(DataConfig(sources=[f"hf:{hub}", str(sums)], tokenizer="char", cache_dir=str(tmp_path / "c")),
                    progress=False)
    assert len(mixed.conversations["val"]) == 10 + 2  # (the test split, and a tenth of the sums)
    assert mixed.validated_on() == f"the test split of hf:{hub} (the others: held-out cuts)"
    assert data.meta["val_unknown"] > 0 == data.meta["train_unknown"]  # (the test split's letters, unknown to train's)
    again = prepare(config, progress=False)
    assert again.directory == data.directory and not again.built
    cut = prepare(DataConfig(f"hf:{hub}", tokenizer="char", hf_val_split="none", cache_dir=str(tmp_path / "c")),
                  progress=False)
    assert len(cut.conversations["train"]) == 36 and len(cut.conversations["val"]) == 4 and "val_split" not in cut.meta
    assert cut.validated_on() == "the last 10% of its train split, held out"  # (said on the run's first line)
    test = prepare(DataConfig(f"hf:{hub}", tokenizer="char", hf_split="test", cache_dir=str(tmp_path / "c")),
                   progress=False)
    assert test.validated_on() == "the last 10% of its test split, held out"
    part = prepare(DataConfig(f"hf:{hub}", tokenizer="char", hf_split="train[:50%]", val_fraction=0.25,
                              cache_dir=str(tmp_path / "c")), progress=False)
    assert len(part.conversations["train"]) + len(part.conversations["val"]) == 20
    assert part.validated_on() == "the last 25% of its train[:50%] split, held out"
    assert test.directory != data.directory and len(test.conversations["train"]) + len(test.conversations["val"]) == 10
    with pytest.raises(DataError, match="data.hf_val_split='validation': .* has no such split \\(it has train, test\\)"):
        prepare(DataConfig(f"hf:{hub}", tokenizer="char", hf_val_split="validation", cache_dir=str(tmp_path / "c")),
                progress=False)
    write_parquet(hub / "data" / "train-00000-of-00001.parquet", task_conversations("add", 50, seed=0))
    changed = prepare(config, progress=False)
    assert changed.directory != data.directory and len(changed.conversations["train"]) == 50


def test_an_hf_text_folder_validates_on_its_test_split_and_the_run_says_so(tmp_path, capsys):
    import train
    from test_chat import chat_run

    hub = tmp_path / "org_text"
    write_parquet(hub / "data" / "train-00000-of-00001.parquet", [{"text": "to be or not to be, that is the question " * 20}] * 20)
    write_parquet(hub / "data" / "validation-00000-of-00001.parquet", [{"text": "that is the question " * 20}] * 3)
    data = prepare(DataConfig(f"hf:{hub}", tokenizer="char", cache_dir=str(tmp_path / "c")), progress=False)
    assert data.meta["val_split"] == "validation"
    assert data.tokenizer.decode(data.val[:21].tolist()) == "that is the question "
    assert data.meta["train_characters"] == 20 * len("to be or not to be, that is the question " * 20)
    assert train.main(chat_run(tmp_path, "train.max_iters=1", f"data.source=hf:{hub}")) == 0
    assert " val tokens (val: the dataset's validation split), vocab " in capsys.readouterr().out
    with pytest.raises(DataError, match="data.hf_val_split='train' is the split the run trains on"):
        prepare(DataConfig(f"hf:{hub}", hf_val_split="train", cache_dir=str(tmp_path / "c")), progress=False)
    with pytest.raises(DataError, match="data.hf_split, data.hf_val_split and data.hf_data_files choose within an hf:"):
        DataConfig("a.txt", hf_val_split="none")


def test_a_mixture_prepares_each_source_once_and_weighs_them(tmp_path):
    adds, reverses = tmp_path / "add.jsonl", tmp_path / "reverse.parquet"
    adds.write_text("".join(json.dumps(r) + "\n" for r in task_conversations("add", 30, seed=0)))
    write_parquet(reverses, task_conversations("reverse", 20, seed=0))
    mixed = DataConfig(sources=[str(adds), {"source": str(reverses), "weight": 0.5}], tokenizer="char",
                       cache_dir=str(tmp_path / "c"))
    assert mixed.source == "mixture"
    data = prepare(mixed, progress=False)
    assert len(data.conversations["train"]) == 27 + 18 and len(data.conversations["val"]) == 3 + 2
    (first, one), (second, half) = data.weights
    assert first.tolist() == list(range(27)) and second.tolist() == list(range(27, 45)) and (one, half) == (1.0, 0.5)
    parts = data.meta["parts"]
    assert [p["weight"] for p in parts] == [1.0, 0.5] and len({p["directory"] for p in parts}) == 2
    # the conversations are each source's own, in order, encoded by the one tokenizer
    alone = prepare(DataConfig(str(reverses), cache_dir=str(tmp_path / "c")), progress=False, tokenizer=None)
    assert len(alone.conversations["train"]) == 18
    assert data.meta["train_conversations"] == 45
    # a second preparation reuses every folder; another weight reuses the sources' token files
    again = prepare(DataConfig(sources=[str(adds), {"source": str(reverses), "weight": 2}], tokenizer="char",
                               cache_dir=str(tmp_path / "c")), progress=False)
    assert [p["directory"] for p in again.meta["parts"]] == [p["directory"] for p in parts]
    assert not again.built and again.meta["fingerprint"] != data.meta["fingerprint"]
    assert np.array_equal(again.conversations["train"].tokens, data.conversations["train"].tokens)


def test_a_dataset_with_both_a_validation_and_a_test_split_validates_on_the_validation_split(tmp_path):
    """data.hf_val_split: auto takes `validation` before `test` (choosing checkpoints on the test
    split would leak it into the choice)."""
    hub = tmp_path / "org_both"
    write_parquet(hub / "data" / "train-00000-of-00001.parquet", task_conversations("add", 30, seed=0))
    write_parquet(hub / "data" / "validation-00000-of-00001.parquet", task_conversations("add", 6, seed=1))
    write_parquet(hub / "data" / "test-00000-of-00001.parquet", task_conversations("reverse", 9, seed=2))
    data = prepare(DataConfig(f"hf:{hub}", tokenizer="char", cache_dir=str(tmp_path / "c")), progress=False)
    assert data.meta["val_split"] == "validation" and len(data.conversations["val"]) == 6
    assert data.validated_on() == "the dataset's validation split"


@pytest.mark.parametrize("sources, said", [
    ([], "data.sources must be a list of sources"),
    ([{"weight": 2}], r"each is a source \(text\) or a mapping with source, weight"),
    ([{"source": "a.jsonl", "weight": 0}], "weight=0 must be a positive number"),
    ([{"source": "a.jsonl", "split": "x"}], r"each is a source \(text\) or a mapping"),
])
def test_a_bad_mixture_is_refused_in_one_line(sources, said):
    with pytest.raises(DataError, match=said):
        DataConfig(sources=sources)
    with pytest.raises(DataError, match="both say where the data is"):
        DataConfig(source="x.jsonl", sources=["y.jsonl"])


def test_a_text_in_a_mixture_is_refused(tmp_path):
    (tmp_path / "a.txt").write_text("plain text\n" * 20)
    (tmp_path / "b.jsonl").write_text("".join(json.dumps(r) + "\n" for r in task_conversations("add", 10)))
    with pytest.raises(DataError, match="data.sources mixes conversations; .*a.txt' is not conversations"):
        prepare(DataConfig(sources=[str(tmp_path / "b.jsonl"), str(tmp_path / "a.txt")], cache_dir=str(tmp_path)),
                progress=False)
