"""Characters a tokenizer brought in cannot write (data/tokenizer.py: Unencodable): a byte-level
BPE whose alphabet is its own text's bytes drops the others without a word, so a JSON string
would lose its escapes. Counted per character where decode(encode(·)) loses them, in meta.json
and the run's note; refused in one line past data.unencodable (by default, any); named by
evaluate.py instead of the template. A tokenizer that normalises text (a Llama's leading space,
Qwen's NFC) loses nothing by that."""

import json

import pytest
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

import evaluate
import train
from conftest import ROOT
from data.config import DataConfig
from data.shared import DataError
from data.template import chat_tokenizer, template_for
from data.tokenizer import Unencodable
from jobs import prepare
from model import GPT, GPTConfig

NOTE = {"type": "function", "function": {"name": "note", "description": "keep a note",
                                         "parameters": {"type": "object", "properties": {"text": {"type": "string"}}}}}


def own_bpe(text: str, size: int = 200) -> Tokenizer:
    """A practitioner's small byte-level BPE: its alphabet is the bytes its text holds, no more."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator([text], trainers.BpeTrainer(vocab_size=size, special_tokens=["<|endoftext|>"],
                                                              show_progress=False))
    return tokenizer


def records(count: int) -> list[dict]:
    """Conversations that call a tool with a quote and a line break in its argument (the template's
    JSON writes them as \\" and \\n) and answer on two lines."""
    return [{"messages": [{"role": "user", "content": f"note {i} please"},
                          {"role": "assistant", "content": "", "tool_calls": [
                              {"type": "function", "function": {"name": "note",
                                                                "arguments": {"text": f'say "hi {i}"\nbye'}}}]},
                          {"role": "tool", "content": "ok"}, {"role": "assistant", "content": f"Noted {i}.\nBye."}],
             "tools": [NOTE]} for i in range(count)]


def test_a_character_is_counted_where_the_tokenizer_loses_it():
    tokenizer = own_bpe("abc xyz")
    lost = Unencodable(tokenizer)
    text = "ab\nc\\x\n yz"
    lost.count(text)
    assert lost.lost == {"\n": 2, "\\": 1} and lost.characters == len(text)
    decoded = tokenizer.decode(tokenizer.encode(text).ids)
    assert "\n" not in decoded and "\\" not in decoded and decoded.count("b") == 1  # (what it says is lost, is)
    lost.count("abc <|endoftext|>")  # a special token is one id, its characters not the text's
    assert lost.lost == {"\n": 2, "\\": 1}


def test_a_tokenizer_that_normalises_text_loses_nothing_by_it():
    """A Llama-style tokenizer writes a space as ▁ and its decoder drops a text's leading space;
    Qwen's normalises to NFC (e + ◌́ becomes é): neither is a lost character."""
    text = " a b\nc  d é ab e\u0301"  # (é, then e and a combining acute accent)
    llama = Tokenizer(models.BPE(unk_token=None))
    llama.pre_tokenizer = pre_tokenizers.Metaspace()
    llama.decoder = decoders.Metaspace()
    llama.train_from_iterator([text], trainers.BpeTrainer(vocab_size=60, show_progress=False))
    assert llama.decode(llama.encode(" ").ids) == ""  # (alone, a space does not come back)
    qwen = own_bpe(text + " \u0301")
    qwen.normalizer = normalizers.NFC()
    for tokenizer in (llama, qwen):
        lost = Unencodable(tokenizer)
        lost.count(text)
        assert lost.lost == {}
    assert "\u0301" not in qwen.decode(qwen.encode("e\u0301").ids)  # (normalised: é, one character)


def test_token_files_that_would_lose_characters_are_refused_in_one_line_then_counted(tmp_path):
    write = lambda path, rows: path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    write(tmp_path / "notes.jsonl", records(40))
    text = (tmp_path / "notes.jsonl").read_text()
    tokenizer = own_bpe(text.replace("\\", "").replace("\n", " ") + " <|user|>")
    config = dict(source=str(tmp_path / "notes.jsonl"), cache_dir=str(tmp_path / "cache"))
    with pytest.raises(DataError) as error:
        prepare(DataConfig(**config), progress=False, tokenizer=tokenizer)
    said = str(error.value)
    assert "\n" not in said and "the tokenizer finds 2 characters it cannot write" in said
    assert '"\\\\" ×' in said and '"\\n" ×' in said and "data.unencodable (now 0)" in said
    data = prepare(DataConfig(**config, unencodable=0.1), progress=False, tokenizer=tokenizer)  # (let through)
    template = template_for(chat_tokenizer(tokenizer))
    rendered = [template.render(r["messages"], tools=r["tools"]) for r in records(40)]
    lost = {ch: sum(t.count(ch) for t in rendered) for ch in ("\\", "\n")}
    assert {ch: data.meta["train_unencodable"].get(ch, 0) + data.meta["val_unencodable"].get(ch, 0)
            for ch in lost} == lost and sum(lost.values()) > 0
    assert data.characters_lost().startswith("the tokenizer finds 2 characters it cannot write")
    with pytest.raises(DataError, match="cannot write"):  # the same token files, found again: still checked
        prepare(DataConfig(**config), progress=False, tokenizer=tokenizer)
    (tmp_path / "plain.txt").write_text("one line\\two\n" * 50)
    with pytest.raises(DataError, match=r'the tokenizer finds 1 character it cannot write, 50 times .*"\\\\" ×50'):
        prepare(DataConfig(source=str(tmp_path / "plain.txt"), cache_dir=str(tmp_path / "cache")), progress=False,
                tokenizer=own_bpe("one line two\n"))


def test_a_run_says_what_its_tokenizer_lost_and_evaluate_names_it_not_the_template(tmp_path, capsys):
    (tmp_path / "notes.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records(40)))
    tokenizer = own_bpe((tmp_path / "notes.jsonl").read_text().replace("\\", "").replace("\n", " "))
    base = tmp_path / "base"
    GPT(GPTConfig(vocab_size=tokenizer.get_vocab_size(), block_size=256, n_layer=1, n_head=2, n_kv_head=1, n_embd=32,
                  pos_encoding="rope")).save_pretrained(base)
    tokenizer.save(str(base / "tokenizer.json"))
    run = ["--config", str(ROOT / "configs" / "tiny.yaml"), f"train.init_from={base}",
           f"data.source={tmp_path / 'notes.jsonl'}", f"data.cache_dir={tmp_path / 'cache'}", f"out_dir={tmp_path / 'run'}",
           "model.n_layer=1", "model.n_head=2", "model.n_kv_head=1", "model.n_embd=32", "model.block_size=256",
           "train.batch_size=4", "train.max_iters=1", "train.eval_interval=1", "train.eval_windows=4",
           "train.sample_tokens=0", "train.dtype=float32", "train.threads=1", "train.max_minutes=null"]
    assert train.main(run) == 2
    err = capsys.readouterr().err
    last = err.splitlines()[-1]
    assert last.startswith("error: data.source=") and "it cannot write" in last and "Traceback" not in err
    assert not (tmp_path / "run").exists()
    assert train.main([*run, "data.unencodable=0.5"]) == 0
    out = capsys.readouterr().out
    assert "note: the tokenizer finds 2 characters it cannot write" in out and "(data.unencodable=0.5)" in out
    assert evaluate.main(["--checkpoint", str(tmp_path / "run"), "--text", str(tmp_path / "notes.jsonl"),
                          "--max-new-tokens", "4"]) == 0
    said = capsys.readouterr().out
    assert "note: in these conversations the tokenizer finds 2 characters it cannot write" in said
    assert "the chat template writes some calls in a form other than JSON" not in said
