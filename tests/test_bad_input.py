"""A table of bad inputs across train.py, generate.py, configs, data, tokenizer and
checkpoint files. Each must give exit code 2 and a one-line message naming the problem,
with no traceback, and leave every file already in the run directory unchanged."""

import hashlib
import json
import shutil

import pytest
import torch

import generate
import train
from conftest import ROOT

TINY = str(ROOT / "configs" / "tiny.yaml")
MICRO = ["data.tokenizer=char", "model.n_layer=1", "model.n_head=2", "model.n_embd=16", "model.block_size=16", "train.max_iters=4",
         "train.eval_interval=4", "train.eval_iters=1", "train.batch_size=2", "train.sample_tokens=0",
         "train.dtype=float32", "train.threads=1"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory, corpus):
    tmp = tmp_path_factory.mktemp("bad")
    run = tmp / "run"
    base = [f"data.source={corpus}", f"data.cache_dir={tmp / 'cache'}", *MICRO]
    assert train.main(["--config", TINY, *base, f"out_dir={run}"]) == 0
    return run, base


def write(path, data):
    path.write_bytes(data if isinstance(data, bytes) else data.encode())
    return str(path)


def config_file(tmp, text):
    return write(tmp / "c.yaml", text)


# (name, make(tmp, run) -> argv for train.py, message)
TRAIN = [
    ("config missing", lambda t, r: ["--config", str(t / "none.yaml")], "does not exist"),
    ("config empty", lambda t, r: ["--config", config_file(t, "")], "is empty"),
    ("config malformed", lambda t, r: ["--config", config_file(t, "model: [1, 2\n")], "not valid YAML"),
    ("config a list", lambda t, r: ["--config", config_file(t, "- 1\n")], "must be a mapping"),
    ("config not utf-8", lambda t, r: ["--config", write(t / "c.yaml", b"model:\n  n_layer: \xff\n")], "not UTF-8"),
    ("misspelled section", lambda t, r: ["--config", config_file(t, "modle: {}\n")], "did you mean 'model'"),
    ("misspelled key", lambda t, r: ["--config", TINY, "train.lrr=1"], "did you mean 'lr'"),
    ("wrong type", lambda t, r: ["--config", TINY, "train.max_iters=ten"], "must be an integer"),
    ("negative lr", lambda t, r: ["--config", TINY, "train.lr=-0.1"], "train.lr=-0.1: must be positive"),
    ("heads do not divide", lambda t, r: ["--config", TINY, "model.n_head=6"], "not divisible by n_head=6"),
    ("block_size 0", lambda t, r: ["--config", TINY, "model.block_size=0"], "block_size=0"),
    ("unknown option", lambda t, r: ["--config", TINY, "model.pos_encoding=alibi"], "must be one of"),
    ("override without =", lambda t, r: ["--config", TINY, "train.lr"], "section.key=value"),
    ("unknown override section", lambda t, r: ["--config", TINY, "trian.lr=1"], "did you mean 'train'"),
    ("data missing", lambda t, r: ["--config", TINY, f"data.source={t / 'none.txt'}"], "does not exist"),
    ("data empty", lambda t, r: ["--config", TINY, f"data.source={write(t / 'e.txt', '')}"], "is empty"),
    ("data binary", lambda t, r: ["--config", TINY, f"data.source={write(t / 'b.txt', bytes(range(256)))}"],
     "looks binary"),
    ("data not utf-8", lambda t, r: ["--config", TINY, "data.source=" + write(t / "l.txt", b"abc" * 100 + b"\xe9")],
     "not UTF-8 text (truncated character at offset 300)"),
    ("data unknown type", lambda t, r: ["--config", TINY, f"data.source={write(t / 'x.pdf', 'x')}"],
     "unknown file type"),
    ("jsonl without the field", lambda t, r: ["--config", TINY, "data.source=" + write(t / "d.jsonl", '{"a": 1}')],
     "has no field 'text'"),
    ("bpe vocab too small", lambda t, r: ["--config", TINY, "data.tokenizer=bpe", "data.vocab_size=100"],
     "vocab_size=100 is below"),
    ("unknown tokenizer", lambda t, r: ["--config", TINY, "data.tokenizer=words"], "must be one of char, bpe"),
    ("validation shorter than a block", lambda t, r: ["--config", TINY, "model.block_size=20000",
                                                       f"out_dir={t / 'new'}"], "fewer than block_size + 1"),
    ("out_dir not writable", lambda t, r: ["--config", TINY, f"out_dir={write(t / 'file', 'x')}/sub"],
     "cannot be written"),
    ("cuda unavailable", lambda t, r: ["--config", TINY, "train.device=cuda:99"], "CUDA"),
    ("float16 on cpu", lambda t, r: ["--config", TINY, "train.device=cpu", "train.dtype=float16"],
     "float16 is for GPUs"),
    ("damaged trainer state", lambda t, r: (write(r / "trainer_state.pt", b"garbage"), ["--config", TINY])[1],
     "cannot be loaded safely"),
    ("different model in out_dir", lambda t, r: ["--config", TINY, "model.n_embd=32", "train.max_iters=8"],
     "different setup"),
]


def tokenizer_of_other_size(t, r):
    from data.tokenizer import train_tokenizer

    train_tokenizer("char", ["abc"], 0).save(str(r / "tokenizer.json"))


def rewrite_config(r, **changes):
    config = json.loads((r / "config.json").read_text())
    write(r / "config.json", json.dumps({**config, **changes}))


# (name, mutate(tmp, run) or None, extra generate.py argv, message)
GENERATE = [
    ("checkpoint missing", None, ["--checkpoint", "/nonexistent/run"], "does not exist; train one first"),
    ("weights missing", lambda t, r: (r / "model.safetensors").unlink(), [], "is missing model.safetensors"),
    ("weights truncated", lambda t, r: write(r / "model.safetensors", (r / "model.safetensors").read_bytes()[:500]),
     [], "not a valid safetensors file"),
    ("weights foreign", lambda t, r: write(r / "model.safetensors", bytes(range(256)) * 4), [],
     "not a valid safetensors file"),
    ("config.json malformed", lambda t, r: write(r / "config.json", "{"), [], "not valid JSON"),
    ("config.json mismatched", lambda t, r: rewrite_config(r, n_layer=2), [], "does not match"),
    ("config.json unknown field", lambda t, r: rewrite_config(r, n_embed=3), [], "unknown config field"),
    ("tokenizer.json malformed", lambda t, r: write(r / "tokenizer.json", "{]"), [], "not a valid tokenizer.json"),
    ("tokenizer.json of another run", tokenizer_of_other_size, [], "come from different runs"),
    ("negative temperature", None, ["--temperature", "-1"], "--temperature=-1.0"),
    ("top-p zero", None, ["--top-p", "0"], "--top-p=0.0"),
    ("top-k zero", None, ["--top-k", "0"], "--top-k=0"),
    ("negative max-new-tokens", None, ["--max-new-tokens", "-1"], "--max-new-tokens=-1"),
    ("prompt file missing", None, ["--prompt-file", "/nonexistent/p.txt"], "prompt file /nonexistent/p.txt"),
    ("unknown characters", None, ["--prompt", "ROMEO 你"], "never saw in training"),
    ("cuda unavailable", None, ["--device", "cuda:99"], "CUDA"),
    ("float16 on cpu", None, ["--device", "cpu", "--dtype", "float16"], "float16 is for GPUs"),
]


def hashes(folder):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.iterdir() if p.is_file()}


def check(code, capsys, message, before, run):
    err = capsys.readouterr().err
    assert code == 2, err
    # progress lines (e.g. "preparing data: ...") may come first; the error is one line, the last
    lines = err.strip().splitlines()
    assert lines[-1].startswith("error: ") and message in lines[-1], err
    assert "Traceback" not in err and sum(line.startswith("error") for line in lines) == 1, err
    after = hashes(run)
    assert all(after.get(name) == digest for name, digest in before.items())


@pytest.mark.parametrize("name, make, message", TRAIN, ids=[c[0] for c in TRAIN])
def test_train_bad_input(tmp_path, trained, capsys, name, make, message):
    source, base = trained
    run = tmp_path / "run"
    shutil.copytree(source, run)
    argv = make(tmp_path, run)
    overrides = [a for a in argv[2:]]
    settings = [*base, f"out_dir={run}", *overrides] if argv[1] == TINY else overrides
    before = hashes(run)
    code = train.main([argv[0], argv[1], *settings])
    check(code, capsys, message, before, run)


@pytest.mark.parametrize("name, mutate, argv, message", GENERATE, ids=[c[0] for c in GENERATE])
def test_generate_bad_input(tmp_path, trained, capsys, name, mutate, argv, message):
    if name == "cuda unavailable" and torch.cuda.device_count() > 99:
        pytest.skip("a machine with 100 GPUs")
    source, _ = trained
    run = tmp_path / "run"
    shutil.copytree(source, run)
    if mutate:
        mutate(tmp_path, run)
    before = hashes(run)
    code = generate.main(["--checkpoint", str(run), "--prompt", "A", "--max-new-tokens", "3", *argv])
    check(code, capsys, message, before, run)
