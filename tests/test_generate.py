"""generate.py: loading, sampling options, batching, streaming, the cache, bad input."""

import io
import json
import re

import pytest
import torch

import generate
from conftest import favour_token, run_cli
from data.tokenizer import UNK, load_tokenizer, train_tokenizer
from model import GPT, GPTConfig, Sampling

TEXT = "ROMEO:\nBut soft, what light through yonder window breaks?\n\nJULIET:\nAy me.\n"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A micro run directory: random weights, a char tokenizer, block_size 16."""
    path = tmp_path_factory.mktemp("ckpt")
    tokenizer = train_tokenizer("char", [TEXT], 0)
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=tokenizer.get_vocab_size(), block_size=16, n_layer=2, n_head=2, n_embd=32))
    model.save_pretrained(path)
    tokenizer.save(str(path / "tokenizer.json"))
    return path


def run(checkpoint, capsys, *args):
    code = generate.main(["--checkpoint", str(checkpoint), *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_end_to_end_and_stats(checkpoint, capsys):
    code, out, err = run(checkpoint, capsys, "--prompt", "ROMEO:", "--max-new-tokens", "20", "--seed", "1", "--stats")
    assert code == 0 and out.startswith("ROMEO:")
    assert "prompt tokens: 6 | new tokens: 20" in err and "kv cache on" in err


def greedy(checkpoint, capsys, *args):
    code, out, err = run(checkpoint, capsys, "--temperature", "0", "--max-new-tokens", "50", *args)
    assert code == 0, err
    return out


def test_greedy_is_the_same_without_the_cache_past_block_size(checkpoint, capsys):
    cached = greedy(checkpoint, capsys, "--prompt", "But soft")
    uncached = greedy(checkpoint, capsys, "--prompt", "But soft", "--no-kv-cache")
    assert cached == uncached and len(cached) > 50  # 50 new tokens, block_size is 16


def test_batched_prompts_match_each_prompt_alone(checkpoint, capsys):
    prompts = ["ROMEO:", "Ay", "But soft, what light"]
    batched = greedy(checkpoint, capsys, *[a for p in prompts for a in ("--prompt", p)])
    alone = [greedy(checkpoint, capsys, "--prompt", p).rstrip("\n") for p in prompts]
    for i, text in enumerate(alone):
        assert f"sample {i + 1} of 3" in batched and text in batched


def test_same_seed_same_samples(checkpoint, capsys):
    a = run(checkpoint, capsys, "--prompt", "Ay", "--seed", "7", "--max-new-tokens", "40", "--num-samples", "2")[1]
    b = run(checkpoint, capsys, "--prompt", "Ay", "--seed", "7", "--max-new-tokens", "40", "--num-samples", "2")[1]
    c = run(checkpoint, capsys, "--prompt", "Ay", "--seed", "8", "--max-new-tokens", "40", "--num-samples", "2")[1]
    assert a == b and a != c and "sample 2 of 2" in a


def test_streaming_prints_the_same_text(checkpoint):
    model, tokenizer = generate.load(checkpoint, torch.device("cpu"), torch.float32)
    texts = []
    for stream in (True, False):
        out = io.StringIO()
        settings = generate.Settings(stream=stream, seed=3, max_new_tokens=60, stop=["\n\n"])
        generate.generate(model, tokenizer, ["ROMEO:"], settings, torch.device("cpu"), out=out)
        texts.append(out.getvalue())
    assert texts[0] == texts[1]


def test_stream_holds_back_partial_stop_strings():
    out = io.StringIO()
    stream = generate.Stream(out, ["END"])
    stream.update("abcE")
    assert out.getvalue() == "ab"  # "cE" may still become the start of "END"
    stream.update("abcEN\ufffd")
    assert out.getvalue() == "abc"
    stream.update("abcENx", final=True)
    assert out.getvalue() == "abcENx"


def test_stop_string_ends_the_sample(checkpoint, capsys):
    full = greedy(checkpoint, capsys, "--prompt", "R")
    stop = full[3:5]
    cut = greedy(checkpoint, capsys, "--prompt", "R", "--stop", stop)
    assert cut == full[: full.index(stop, 1)] + "\n"


def test_empty_prompt_and_long_prompt(checkpoint, capsys):
    code, out, err = run(checkpoint, capsys, "--max-new-tokens", "5", "--prompt", "")
    assert code == 0 and len(out) >= 5
    code, out, err = run(checkpoint, capsys, "--max-new-tokens", "5", "--prompt", "ROMEO: " * 5)
    assert code == 0 and "keeping the last 16 (block_size)" in err


def broken(tmp_path, checkpoint, name, content):
    import shutil

    target = tmp_path / "ckpt"
    shutil.copytree(checkpoint, target)
    if content is None:
        (target / name).unlink()
    else:
        data = content((target / name).read_bytes())
        (target / name).write_bytes(data)
    return target


def config_with(**changes):
    return lambda data: json.dumps({**json.loads(data), **changes}).encode()


@pytest.mark.parametrize("name, content, message", [
    ("model.safetensors", lambda d: d[: len(d) // 2], "is not a valid safetensors file"),
    ("model.safetensors", lambda d: b"PK\x03\x04 not safetensors", "is not a valid safetensors file"),
    ("model.safetensors", None, "is missing model.safetensors"),
    ("config.json", config_with(n_layer=3), "does not match"),
    ("config.json", lambda d: b"{oops", "not valid JSON"),
    ("tokenizer.json", lambda d: b"[]", "not a valid tokenizer.json"),
])
def test_broken_checkpoint_files(tmp_path, checkpoint, capsys, name, content, message):
    target = broken(tmp_path, checkpoint, name, content)
    code, out, err = run(target, capsys, "--prompt", "R")
    assert code == 2 and message in err and err.count("\n") == 1


@pytest.mark.parametrize("args, message", [
    (["--temperature", "-1"], "--temperature=-1.0: must be 0 (greedy) or more"),
    (["--top-p", "0"], "--top-p=0.0: must be in (0, 1]"),
    (["--top-p", "1.5"], "--top-p=1.5"),
    (["--top-k", "0"], "--top-k=0: must be 1 or more"),
    (["--max-new-tokens", "-5"], "--max-new-tokens=-5: must be 0 or more"),
    (["--prompt-file", "/nonexistent/prompt.txt"], "prompt file /nonexistent/prompt.txt does not exist"),
    (["--prompt", "ROMEO 你"], "never saw in training: '你'"),
    (["--num-samples", "0"], "--num-samples=0"),
    (["--temperature", "hot"], "invalid float value: 'hot'"),
    (["--show-attention", "maps.jpg"], "must end in .png or .html"),
    (["--show-attention", "/nonexistent/maps.png"], "folder /nonexistent does not exist"),
])
def test_bad_options(checkpoint, capsys, args, message):
    code, out, err = run(checkpoint, capsys, *args)
    assert code == 2 and message in err and err.count("\n") == 1 and not out


def test_missing_checkpoint_names_the_train_command(tmp_path):
    result = run_cli("generate.py", "--prompt", "x", cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "out/tiny" in result.stderr and "python train.py --config configs/tiny.yaml" in result.stderr
    assert result.stderr.count("\n") == 1


def test_interactive_mode_reads_prompts_until_eof(checkpoint):
    result = run_cli("generate.py", "--checkpoint", str(checkpoint), "--interactive", "--temperature", "0",
                     "--max-new-tokens", "10", input="ROMEO:\nAy\n")
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("\n") >= 2 and "ROMEO:" in result.stdout and "Ay" in result.stdout
    assert result.stderr.count("prompt> ") == 3  # two prompts, then end of input


def test_samples_come_in_prompt_order_with_their_labels(checkpoint, capsys):
    prompts = ["ROMEO:", "Ay", "But"]
    code, out, _ = run(checkpoint, capsys, *[a for p in prompts for a in ("--prompt", p)], "--num-samples", "2",
                       "--max-new-tokens", "7", "--seed", "1")
    assert code == 0
    parts = re.split(r"-{20} sample (\d+) of (\d+) -{20}\n", out)
    assert parts[0] == "" and parts[1::3] == ["1", "2", "3", "4", "5", "6"] and set(parts[2::3]) == {"6"}
    texts = [t[:-1] for t in parts[3::3]]  # each sample ends with a newline
    for i, text in enumerate(texts):
        prompt = prompts[i // 2]
        assert text.startswith(prompt) and len(text) >= len(prompt) + 7, (i, text)  # (<unk> prints 5 characters)
    assert texts[0] != texts[1]  # two samples of one prompt, not one printed twice


def test_sampling_options_reach_the_sampler(checkpoint, capsys, monkeypatch):
    import model.gpt

    seen = set()
    real = model.gpt.sample_next

    def recording(logits, sampling, generator=None):
        seen.add(sampling)
        return real(logits, sampling, generator)

    monkeypatch.setattr(model.gpt, "sample_next", recording)
    code, _, _ = run(checkpoint, capsys, "--prompt", "R", "--max-new-tokens", "3",
                     "--temperature", "0.7", "--top-k", "5", "--top-p", "0.9")
    unk = load_tokenizer(checkpoint / "tokenizer.json").token_to_id(UNK)
    assert code == 0 and seen == {Sampling(0.7, 5, 0.9, suppress_tokens=(unk,))}


def test_unk_is_never_generated(checkpoint, tmp_path, capsys):
    """<unk> stands for no character: even when the model scores it highest, generate.py
    neither picks it greedily nor samples it."""
    tokenizer = load_tokenizer(checkpoint / "tokenizer.json")
    unk = tokenizer.token_to_id(UNK)
    model = GPT.from_pretrained(checkpoint)
    favour_token(model, unk)
    model.save_pretrained(tmp_path)
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    prompt = torch.tensor([tokenizer.encode("ROMEO:").ids])
    assert model.generate(prompt, 1, temperature=0)[0, -1] == unk  # what an unguarded sampler picks
    for args in (["--temperature", "0"], ["--temperature", "1.5", "--seed", "3"], ["--top-k", "2", "--seed", "3"]):
        code, out, err = run(tmp_path, capsys, "--prompt", "ROMEO:", "--max-new-tokens", "40", *args)
        assert code == 0, err
        assert UNK not in out and len(out) == len("ROMEO:") + 40 + 1


def test_checkpoint_messages_name_what_is_missing(tmp_path, monkeypatch, capsys):
    """In-process (so that every line is credited to a test): the default run's hint, the
    missing files listed, the first ten unknown characters named."""
    from common.checkpoint import DEFAULT_RUN, load_run
    from common.cli import UserError

    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError, match=r"out/tiny \(the tiny config's run\) does not exist; train one first"):
        load_run(DEFAULT_RUN)
    (tmp_path / "partial").mkdir()
    (tmp_path / "partial" / "tokenizer.json").write_text("{}")
    with pytest.raises(UserError, match="is missing config.json, model.safetensors; it is not a finished run"):
        load_run(tmp_path / "partial")


def test_the_first_ten_unknown_characters_are_named(checkpoint, capsys):
    code, _, err = run(checkpoint, capsys, "--prompt", "0123456789QXZ")
    shown = err.split("never saw in training: ")[1].split(";")[0].split()
    assert code == 2 and shown == [repr(c) for c in "0123456789"]
