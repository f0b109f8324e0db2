"""evaluate.py: every token scored once, in windows along the text; the run's validation
split as training scores it; the bad input it refuses."""

import json
import math
import re
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import yaml

import evaluate
from jobs import text_data
import train
from runs.folder import RunDir
from conftest import ROOT, untrained_run
from data.config import DataConfig
from data.tokenizer import train_tokenizer
from model import GPT, GPTConfig

TINY = str(ROOT / "configs" / "tiny.yaml")


@pytest.fixture(scope="module")
def runs(tmp_path_factory, corpus):
    """A briefly trained micro run: {"rope": run directory}."""
    tmp = tmp_path_factory.mktemp("runs")
    settings = [f"data.source={corpus}", f"data.cache_dir={tmp / 'cache'}", "data.tokenizer=char", "model.n_layer=2",
                "model.n_head=2", "model.n_embd=32", "model.block_size=48", "train.batch_size=8", "train.max_iters=80",
                "train.eval_interval=80", "train.eval_iters=4", "train.sample_tokens=0", "train.dtype=float32",
                "train.threads=1", "train.lr=0.01", "model.pos_encoding=rope"]
    assert train.main(["--config", TINY, *settings, f"out_dir={tmp / 'rope'}"]) == 0
    return {"rope": tmp / "rope"}


def scored_by_hand(model, ids, block, stride):
    """Each target's negative log-likelihood, taken from the first window that ends past it."""
    x, y = ids[:-1], ids[1:]
    nll, begin = {}, 0
    while True:
        end = min(begin + block, len(x))
        with torch.no_grad():
            logits, _ = model(torch.tensor([x[begin:end]]))
        losses = F.cross_entropy(logits[0], torch.tensor(y[begin:end]), reduction="none")
        for j in range(begin, end):
            nll.setdefault(j, losses[j - begin].item())
        if end == len(x):
            return sum(nll.values()) / len(nll), len(nll)
        begin += stride


@pytest.mark.parametrize("length, stride", [(30, None), (400, 48), (400, 20)])
def test_evaluate_scores_every_token_once(runs, tmp_path, capsys, corpus, length, stride):
    model, tokenizer = RunDir(runs["rope"]).load_model()
    text = corpus.read_text()[:length]  # the start of the training text: every character is known
    path = tmp_path / "t.txt"
    path.write_text(text)
    argv = ["--checkpoint", str(runs["rope"]), "--text", str(path), "--json", "--batch-size", "3"]
    assert evaluate.main(argv + (["--stride", str(stride)] if stride else [])) == 0
    result = json.loads(capsys.readouterr().out)
    expected, count = scored_by_hand(model.eval(), tokenizer.encode(text).ids, 48, stride or 24)
    assert result["tokens"] == count == length - 1 and result["characters"] == result["bytes"] == length
    assert result["loss"] == pytest.approx(expected, abs=1e-5)
    assert result["bits_per_char"] == pytest.approx(expected * count / length / math.log(2), abs=1e-5)
    assert result["perplexity"] == pytest.approx(math.exp(expected), rel=1e-5)


def test_evaluate_scores_in_the_dtype_asked_for(tmp_path, capsys):
    run = untrained_run(tmp_path / "run")
    (tmp_path / "t.txt").write_text("hear me speak. " * 10)
    argv = ["--checkpoint", str(run), "--text", str(tmp_path / "t.txt"), "--json", "--dtype"]
    losses = {}
    for dtype in ("auto", "float32", "bfloat16"):
        assert evaluate.main(argv + [dtype]) == 0
        losses[dtype] = json.loads(capsys.readouterr().out)["loss"]
    assert losses["auto"] == losses["float32"] != losses["bfloat16"]  # on a CPU, auto scores in float32
    assert losses["bfloat16"] == pytest.approx(losses["float32"], abs=0.05)
    assert evaluate.main(argv + ["float16"]) == 2
    assert "dtype=float16 is for GPUs; on the CPU use bfloat16 or float32" in capsys.readouterr().err


@pytest.mark.parametrize("length, block, stride, chunk", [(9, 8, 4, 100), (10, 4, 4, 3), (23, 4, 1, 5), (4, 8, 8, 2)])
def test_windows_score_every_target_once_in_full_windows(length, block, stride, chunk):
    """scored_windows() over a stream in chunks: each window is at most block + 1 tokens (all of
    them but the last exactly that), moves by the stride, and scores its last n targets:
    together, every target 1 … length - 1 exactly once, none twice, no window without one."""
    tokens = np.arange(length)
    chunks = [tokens[i:i + chunk] for i in range(0, length, chunk)]
    got = list(text_data.scored_windows(chunks, block, stride))
    scored = [t for window, n in got for t in window[len(window) - n:]]
    assert scored == list(range(1, length)) and all(n > 0 for _, n in got)
    assert all(len(w) == block + 1 for w, _ in got[:-1]) and len(got[-1][0]) <= block + 1
    assert [w[0] for w, _ in got] == list(range(0, stride * len(got), stride))


def test_evaluate_defaults_and_edges_of_the_stride_and_batch(tmp_path, capsys, monkeypatch):
    run = untrained_run(tmp_path / "run")  # block_size 16
    (tmp_path / "t.txt").write_text("hear me speak. " * 10)
    text = ["--checkpoint", str(run), "--text", str(tmp_path / "t.txt")]
    assert evaluate.main(text) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{tmp_path / 't.txt'}: 149 tokens scored (150 characters, 150 bytes) in ")
    assert "; windows of 16 tokens moved by 8\n" in out  # block_size // 2
    short = untrained_run(tmp_path / "short-run")
    vocab = GPT.from_pretrained(short).config.vocab_size
    GPT(GPTConfig(vocab_size=vocab, block_size=2, n_layer=1, n_head=2, n_embd=16)).save_pretrained(short)
    assert evaluate.main(["--checkpoint", str(short), *text[2:]]) == 0
    assert "; windows of 2 tokens moved by 1\n" in capsys.readouterr().out  # never by 0, nor by more than half
    sizes = []
    real_forward = GPT.forward
    monkeypatch.setattr(GPT, "forward", lambda self, idx, *a, **kw: (sizes.append(len(idx)),
                                                                     real_forward(self, idx, *a, **kw))[1])
    assert evaluate.main([*text, "--stride", "1", "--batch-size", "5"]) == 0  # the smallest stride
    assert "windows of 16 tokens moved by 1\n" in capsys.readouterr().out
    assert max(sizes) == 5 and sum(sizes) == 150 - 16  # 134 windows, at most 5 a forward pass
    monkeypatch.undo()
    (tmp_path / "one.txt").write_text("h")
    assert evaluate.main(["--checkpoint", str(run), "--text", str(tmp_path / "one.txt")]) == 2
    assert capsys.readouterr().err == f"error: {tmp_path / 'one.txt'} is too short to score: it needs at least 2 tokens\n"
    (tmp_path / "short.txt").write_text("hear me speak")  # a validation split of 1 token
    (run / "config.yaml").write_text(f"data:\n  source: {tmp_path / 'short.txt'}\n  tokenizer: char\n"
                                     f"  val_fraction: 0.05\n  cache_dir: {tmp_path / 'cache'}\n")
    assert evaluate.main(["--checkpoint", str(run), "--split", "val"]) == 2
    assert capsys.readouterr().err.endswith("error: the validation split is too short to score: it needs at least 2 "
                                            "tokens\n")
    (run / "config.yaml").write_text(f"data:\n  source: {tmp_path / 't.txt'}\n  tokenizer: char\n"
                                     f"  cache_dir: {tmp_path / 'cache'}\n")
    assert evaluate.main(["--checkpoint", str(run), "--split", "val"]) == 0
    assert capsys.readouterr().out.startswith("the validation split: 14 tokens scored (15 characters, 15 bytes) in ")


def test_evaluate_split_val_agrees_with_training(runs, capsys):
    assert evaluate.main(["--checkpoint", str(runs["rope"]), "--split", "val"]) == 0
    out = capsys.readouterr().out
    loss = float(re.search(r"loss ([\d.]+) nats/token", out).group(1))
    logged = json.loads((runs["rope"] / "summary.json").read_text())["val_loss"]
    assert loss == pytest.approx(logged, rel=0.05)  # training's estimate uses 4 random batches
    assert "tokens/s" in out and "bits/byte" in out


def test_evaluate_split_val_reads_the_runs_own_token_files(runs, tmp_path, capsys):
    """The run's validation tokens come from the token files it trained on: no second cache
    folder, nothing encoded again. Where they are gone, the validation text alone is
    encoded, and the figure is the same."""
    cache = yaml.safe_load((runs["rope"] / "config.yaml").read_text())["data"]["cache_dir"]
    before = sorted(p.name for p in Path(cache).iterdir())
    assert evaluate.main(["--checkpoint", str(runs["rope"]), "--split", "val", "--json"]) == 0
    out, err = capsys.readouterr()
    assert sorted(p.name for p in Path(cache).iterdir()) == before and err == ""
    moved = shutil.copytree(runs["rope"], tmp_path / "run")
    settings = yaml.safe_load((moved / "config.yaml").read_text())
    settings["data"]["cache_dir"] = str(tmp_path / "empty-cache")
    (moved / "config.yaml").write_text(yaml.safe_dump(settings))
    assert evaluate.main(["--checkpoint", str(moved), "--split", "val", "--json"]) == 0
    again, err = capsys.readouterr()
    assert "encoded the validation text of" in err and not (tmp_path / "empty-cache").exists()
    assert json.loads(again) == json.loads(out)


def test_evaluate_split_val_scores_the_validation_text_as_a_file_would(tmp_path, capsys):
    """--split val rebuilds the run's validation tokens with the run's own tokenizer (a
    tokenizer trained on this corpus would number the characters differently) and its
    val_fraction, and scores and counts them exactly as --text scores that text."""
    from data.shared import END
    from data.text import open_source

    corpus = tmp_path / "corpus.txt"
    words = "hear me speak Before we proceed any further".split()  # characters the run's tokenizer knows
    corpus.write_text("".join(" ".join(words[i % 8:] + words[:i % 3]) + ".\n" for i in range(60)))
    run = untrained_run(tmp_path / "run")
    (run / "config.yaml").write_text(f"data:\n  source: {corpus}\n  tokenizer: char\n  val_fraction: 0.25\n"
                                     f"  cache_dir: {tmp_path / 'cache'}\n")
    val_text = "".join(p for p in open_source(DataConfig(str(corpus), val_fraction=0.25)).val() if p is not END)
    (tmp_path / "val.txt").write_text(val_text)
    results = []
    for argv in (["--split", "val"], ["--text", str(tmp_path / "val.txt")]):
        assert evaluate.main(["--checkpoint", str(run), *argv, "--json"]) == 0
        out, err = capsys.readouterr()
        results.append(json.loads(out))
        assert ("encoded the validation text of" in err) == (argv[0] == "--split")  # no token files of the run
    assert not (tmp_path / "cache").exists()  # the validation text alone, and no cache folder
    assert results[0] == pytest.approx(results[1], rel=1e-6)
    assert results[0]["characters"] == len(val_text) and results[0]["tokens"] == len(val_text) - 1


def test_evaluate_reads_newlines_as_training_does_and_batches_16_windows(tmp_path, capsys, monkeypatch):
    """A Windows text (\r\n) scores as its \n version, as train.py reads it (a char model
    never saw \r); windows go 16 to a forward pass unless told; tokens/s is tokens over seconds."""
    run = untrained_run(tmp_path / "run")  # block_size 16: windows move by 8
    text = "hear me speak.\n" * 20  # 300 characters
    (tmp_path / "unix.txt").write_bytes(text.encode())
    (tmp_path / "windows.txt").write_bytes(text.replace("\n", "\r\n").encode())
    results = []
    for name in ("unix.txt", "windows.txt"):
        assert evaluate.main(["--checkpoint", str(run), "--text", str(tmp_path / name), "--json"]) == 0
        results.append(json.loads(capsys.readouterr().out))
    assert results[0] == results[1] and results[0]["characters"] == 300
    import machine.device
    monkeypatch.setattr(machine.device, "cpu_has_fast_bf16", lambda: True)  # bf16 would pay for training only
    assert evaluate.main(["--checkpoint", str(run), "--text", str(tmp_path / "unix.txt"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == results[0]  # scored in float32 all the same
    sizes, real_forward = [], GPT.forward
    monkeypatch.setattr(GPT, "forward", lambda self, idx, *a, **kw: (sizes.append(len(idx)),
                                                                     real_forward(self, idx, *a, **kw))[1])
    clock = iter([10.0, 10.5])  # scoring started at 10 s and ended half a second later
    monkeypatch.setattr(evaluate, "time", SimpleNamespace(perf_counter=lambda: next(clock)))
    assert evaluate.main(["--checkpoint", str(run), "--text", str(tmp_path / "unix.txt")]) == 0
    assert sizes == [16, 16, 4, 1]  # 36 full windows, then the shorter last one alone
    assert "299 tokens scored (300 characters, 300 bytes) in 0.5 s, 598 tokens/s;" in capsys.readouterr().out
    monkeypatch.setattr(text_data, "CHUNK", 128)  # a long text is read a bounded piece at a time
    counts = {"characters": 0, "bytes": 0}
    assert list(text_data.read_chunks(tmp_path / "windows.txt", counts)) == [text[:128], text[128:256], text[256:]]
    assert counts == {"characters": 300, "bytes": 300}


def test_evaluate_split_val_reads_the_runs_data_settings(tmp_path, capsys):
    """--split val takes the source's text field from the run's config.yaml, and without
    that file says which file it needs."""
    run = untrained_run(tmp_path / "run", config=False)
    assert evaluate.main(["--checkpoint", str(run), "--split", "val"]) == 2
    err = capsys.readouterr().err
    assert err == (f"error: --split val needs the run's data settings: {run / 'config.yaml'} does not exist "
                   "or has no data: section (train.py writes it)\n")
    rows = [{"id": i, "body": f"hear me speak {i % 3}."} for i in range(40)]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "config.yaml").write_text(f"data:\n  source: {tmp_path / 'rows.jsonl'}\n  text_field: body\n"
                                     f"  tokenizer: char\n  cache_dir: {tmp_path / 'cache'}\n")
    assert evaluate.main(["--checkpoint", str(run), "--split", "val", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["characters"] > 0


def test_evaluate_counts_over_every_chunk_and_names_the_commonest_unknown_characters(tmp_path, capsys,
                                                                                     monkeypatch):
    """With chunks of 8 characters (1 Mi in use): a text's characters and bytes, and the
    validation split's over all its documents, are sums over every chunk and piece; the
    unknown characters are counted over the whole text, the five commonest named first."""
    run = untrained_run(tmp_path / "run")
    monkeypatch.setattr(text_data, "CHUNK", 8)
    text = "hear me speak. " * 7
    (tmp_path / "t.txt").write_text(text)
    assert evaluate.main(["--checkpoint", str(run), "--text", str(tmp_path / "t.txt"), "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert (r["characters"], r["bytes"], r["tokens"]) == (len(text), len(text), len(text) - 1)
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for name in ("a", "b"):
        (corpus / f"{name}.txt").write_text(f"hear me speak {name}.\n" * 4)  # the validation text spans both
    (run / "config.yaml").write_text(f"data:\n  source: {corpus}\n  tokenizer: char\n  val_fraction: 0.75\n"
                                     f"  cache_dir: {tmp_path / 'cache'}\n")
    assert evaluate.main(["--checkpoint", str(run), "--split", "val", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    from data.shared import END
    from data.text import open_source
    val = [p for p in open_source(DataConfig(str(corpus), val_fraction=0.75)).val() if p is not END]
    assert len(val) == 2 and r["characters"] == r["bytes"] == sum(map(len, val))
    (tmp_path / "unknown.txt").write_text("hear " + " ".join("∑" * 6 + "€" * 5 + "你" * 4 + "Ω" * 3 + "üüq"))
    assert evaluate.main(["--checkpoint", str(run), "--text", str(tmp_path / "unknown.txt")]) == 2
    assert capsys.readouterr().err == (
        f"error: {tmp_path / 'unknown.txt'} has 21 characters the model's tokenizer never saw (6 distinct, e.g. "
        "'∑' '€' '你' 'Ω' 'ü'); a char model scores only text made of its training characters\n")


def test_evaluate_shows_its_progress_in_bytes_on_a_long_text(tmp_path, capsys, monkeypatch):
    run = untrained_run(tmp_path / "run")
    monkeypatch.setattr(text_data, "PROGRESS_BYTES", 1000)  # (1 MiB in use)
    for size in (999, 1000, 1200):
        (tmp_path / "t.txt").write_text(("hear me speak. " * 100)[:size])
        assert evaluate.main(["--checkpoint", str(run), "--text", str(tmp_path / "t.txt")]) == 0
        err = capsys.readouterr().err
        shown = {999: None, 1000: "1.00k/1.00k", 1200: "1.20k/1.20k"}[size]
        bar = re.search(r"^scoring: 100%\|.*\| (\S+) \[.*B/s\]$", err.replace("\r", "\n"), re.M)
        assert (bar and bar[1]) == shown, err


def test_evaluate_command_line_help_requirements_and_debug(tmp_path, capsys):
    assert evaluate.main(["--help"]) == 0
    shown = " ".join(capsys.readouterr().out.split())  # (argparse re-wraps the lines)
    assert shown == (
        "usage: evaluate.py [-h] --checkpoint CHECKPOINT (--text TEXT | --split {val}) [--stride STRIDE] "
        "[--batch-size BATCH_SIZE] [--device DEVICE] [--dtype {auto,float32,bfloat16,float16}] [--json] "
        "[--answers FILE.jsonl] [--chat-template FILE] [--max-new-tokens N] [--reference DIR] [--threads THREADS] [--debug] Score a text with a trained model: python "
        "evaluate.py --checkpoint out/tiny --text FILE (or --split val) options: -h, --help show this help message "
        "and exit --checkpoint CHECKPOINT run directory, e.g. out/tiny, or a transformers model folder --text TEXT a UTF-8 text file to score "
        "--split {val} the run's own validation split --stride STRIDE how far each window moves (default "
        "block_size // 2) --batch-size BATCH_SIZE windows per forward pass --device DEVICE auto, cpu, cuda or mps "
        "--dtype {auto,float32,bfloat16,float16} the weights' dtype while scoring (auto: bfloat16 on a GPU that has "
        "it, else float32) --json print one JSON object --answers FILE.jsonl conversations: write each last "
        "answer, with its prompt, the expected one, its kind (text or tool calls) and its scores, a JSON line each "
        "--chat-template FILE conversations: the "
        "Jinja chat template to use instead of the model's, or default: the template a model without one is given "
        "when it is fine-tuned, its markers added the same way: the base as fine-tuning starts it "
        "--max-new-tokens N conversations: the most tokens a written answer may have (default: twice the longest "
        "expected answer with its end of turn, at least 16, at most the context) --reference DIR preference pairs: the model "
        "each answer's reward is measured from (default: the run's train.init_from, where it tuned from one) --threads THREADS torch's CPU threads (default: $OMP_NUM_THREADS if set, else one per core, or one while the machine is so busy that one is faster) --debug show full tracebacks")
    for argv, message in [([], "the following arguments are required: --checkpoint"),
                          (["--checkpoint", "x"], "one of the arguments --text --split is required"),
                          (["--checkpoint", "x", "--text", "a", "--split", "val"],
                           "argument --split: not allowed with argument --text"),
                          (["--checkpoint", "x", "--split", "test"], "argument --split: invalid choice: 'test' "
                                                                     "(choose from 'val')"),
                          (["--checkpoint", "x", "--text", "a", "--batch-size", "0"], "--batch-size=0: must be at least 1")]:
        assert evaluate.main(argv) == 2
        assert capsys.readouterr().err == f"error: {message} (see python evaluate.py --help)\n"
    assert evaluate.main(["--checkpoint", "x", "--text", "a", "--batch-size", "1"]) == 2  # 1 is allowed: the run is missing
    assert "checkpoint folder x does not exist" in capsys.readouterr().err
    with pytest.raises(Exception, match="checkpoint folder x does not exist"):  # --debug: the traceback
        evaluate.main(["--checkpoint", "x", "--text", "a", "--debug"])


def test_evaluate_bad_input(runs, tmp_path, capsys):
    run = str(runs["rope"])
    cases = [(["--text", str(tmp_path / "missing.txt")], "does not exist"),
             (["--text", str(tmp_path / "empty.txt")], "is empty"),
             (["--text", str(tmp_path / "latin1.txt")], "not UTF-8"),
             (["--text", str(tmp_path / "unknown.txt")], "has 4 characters the model's tokenizer never saw (3 distinct"),
             (["--text", str(tmp_path / "short.txt")], "too short to score"),
             (["--text", str(tmp_path / "short.txt"), "--stride", "0"], "--stride=0"),
             (["--text", str(tmp_path / "short.txt"), "--checkpoint", str(tmp_path)], "is missing"),
             # a broken .jsonl is named, not scored as plain text
             (["--text", str(tmp_path / "broken.jsonl")], "broken.jsonl, line 1: not JSON")]
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "latin1.txt").write_bytes("caf\xe9\n".encode("latin-1"))
    (tmp_path / "unknown.txt").write_text("MACBETH: 你好你\u20ac\n")
    (tmp_path / "short.txt").write_text("M")
    (tmp_path / "broken.jsonl").write_text('{"messages": [{"role": "user", "content": "hi"\n' * 30)
    for argv, message in cases:
        assert evaluate.main(["--checkpoint", run, *argv]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, (argv, err)


def test_evaluate_counts_characters_and_bytes_apart(tmp_path, capsys):
    """Bits per character and per byte divide the same total by different counts."""
    from model import GPTConfig

    tokenizer = train_tokenizer("bpe", ["Ça va? Très bien, merci. 你好，世界。" * 30], 300)
    torch.manual_seed(0)
    GPT(GPTConfig(vocab_size=tokenizer.get_vocab_size(), block_size=16, n_layer=1, n_head=2, n_embd=16)) \
        .save_pretrained(tmp_path / "run")
    tokenizer.save(str(tmp_path / "run" / "tokenizer.json"))
    text = "Très bien. 你好，世界。\n" * 5
    (tmp_path / "t.txt").write_text(text, encoding="utf-8")
    assert evaluate.main(["--checkpoint", str(tmp_path / "run"), "--text", str(tmp_path / "t.txt"), "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert (r["characters"], r["bytes"]) == (len(text), len(text.encode("utf-8")))
    nll = r["loss"] * r["tokens"]
    assert r["bits_per_char"] == pytest.approx(nll / math.log(2) / len(text))
    assert r["bits_per_byte"] == pytest.approx(nll / math.log(2) / len(text.encode("utf-8")))
    assert r["tokens"] == len(tokenizer.encode(text).ids) - 1
