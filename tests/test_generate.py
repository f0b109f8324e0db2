"""generate.py: loading, sampling options, batching, streaming, the cache, bad input."""

import io
import json
import re
import shutil
import sys

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


def test_batched_prompts_match_each_prompt_alone(checkpoint, capsys, tmp_path):
    """Prompts of different lengths run as one left-padded batch; each sample is its prompt's
    alone. (Weights large enough that attention to the padding would change the text.)"""
    sharp = tmp_path / "sharp"
    model = GPT.from_pretrained(checkpoint)
    with torch.no_grad():
        for weight in model.parameters():
            if weight.dim() == 2:
                weight.normal_(0, 0.5, generator=torch.Generator().manual_seed(weight.numel()))
    model.save_pretrained(sharp)
    shutil.copy(checkpoint / "tokenizer.json", sharp)
    prompts = ["ROMEO:", "Ay", "But soft, what light"]
    batched = greedy(sharp, capsys, *[a for p in prompts for a in ("--prompt", p)])
    alone = [greedy(sharp, capsys, "--prompt", p).rstrip("\n") for p in prompts]
    assert len(set(alone)) == 3
    for i, text in enumerate(alone):
        assert f"sample {i + 1} of 3" in batched and text in batched


def test_same_seed_same_samples(checkpoint, capsys):
    a = run(checkpoint, capsys, "--prompt", "Ay", "--seed", "7", "--max-new-tokens", "40", "--num-samples", "2")[1]
    b = run(checkpoint, capsys, "--prompt", "Ay", "--seed", "7", "--max-new-tokens", "40", "--num-samples", "2")[1]
    c = run(checkpoint, capsys, "--prompt", "Ay", "--seed", "8", "--max-new-tokens", "40", "--num-samples", "2")[1]
    assert a == b and a != c and "sample 2 of 2" in a


def test_streaming_prints_the_same_text_as_it_grows(checkpoint):
    model, tokenizer = generate.load_model(checkpoint, torch.device("cpu"), torch.float32)
    texts, writes = [], []
    for stream in (True, False):
        out = io.StringIO()
        out.write = lambda text, out=out, write=out.write: (writes.append(stream), write(text))[1]
        settings = generate.Settings(stream=stream, seed=3, max_new_tokens=60, stop=["\n\n"])
        generate.generate(model, tokenizer, ["ROMEO:"], settings, torch.device("cpu"), out=out)
        texts.append(out.getvalue())
    assert texts[0] == texts[1]
    assert writes.count(True) > 10 and writes.count(False) == 1  # streamed: piece by piece; else at the end


@pytest.mark.parametrize("no_cache", [False, True])
def test_generation_feeds_one_new_token_a_step_with_the_cache(checkpoint, capsys, monkeypatch, no_cache):
    lengths, real = [], GPT.forward

    def recorded(self, idx, *args, **kw):
        lengths.append(idx.shape[1])
        return real(self, idx, *args, **kw)

    monkeypatch.setattr(GPT, "forward", recorded)
    code, _, _ = run(checkpoint, capsys, "--prompt", "ROMEO:", "--max-new-tokens", "5", "--seed", "0",
                     *(["--no-kv-cache"] if no_cache else []))
    prompt = lengths[0]
    assert code == 0 and lengths[1:] == ([prompt + 1, prompt + 2, prompt + 3, prompt + 4] if no_cache else [1] * 4)


def test_ctrl_c_ends_the_sample_at_a_terminal_without_interactive(checkpoint, capsys, monkeypatch):
    """No --prompt on a terminal is interactive mode too: Ctrl-C stops the sample, not the program."""
    monkeypatch.setattr(sys.stdin, "isatty", lambda: True)
    answers = iter(["ROMEO:"])

    def typed():
        for answer in answers:
            return answer
        raise EOFError  # Ctrl-D

    monkeypatch.setattr("builtins.input", typed)

    def interrupted(self, *args):
        raise KeyboardInterrupt
        yield

    monkeypatch.setattr(GPT, "generate_tokens", interrupted)
    code, out, err = run(checkpoint, capsys)
    assert code == 0 and out == "ROMEO:\n" and "[stopped]" in err


def test_stream_holds_back_partial_stop_strings():
    out = io.StringIO()
    stream = generate.Stream(out, ["END"])
    stream.update("abcE")
    assert out.getvalue() == "ab"  # "cE" may still become the start of "END"
    stream.update("abcEN\ufffd")
    assert out.getvalue() == "abc"
    stream.update("abcENx", final=True)
    assert out.getvalue() == "abcENx"
    out = io.StringIO()
    free = generate.Stream(out, [])  # no stop string: nothing held back but a partial character
    free.update("ab")
    assert out.getvalue() == "ab"


def test_stop_string_ends_the_sample(checkpoint, capsys):
    full = greedy(checkpoint, capsys, "--prompt", "R")
    stop = full[3:5]
    code, cut, err = run(checkpoint, capsys, "--temperature", "0", "--max-new-tokens", "50", "--prompt", "R",
                         "--stop", stop, "--stats")
    assert cut == full[: full.index(stop, 1)] + "\n"
    # and sampling stops there: no tokens are made past the stop string
    assert f"new tokens: {full.index(stop, 1) + len(stop) - 1} |" in err
    # "\n" and "\t" typed as two characters each (a shell's '\n') mean a newline and a tab
    args = generate.parse_args(["--stop", "a\\n\\tb", "--stop", "\\t"])
    assert generate.Settings.from_args(args).stop == ["a\n\tb", "\t"]
    # a stop string in the prompt itself does not count
    assert run(checkpoint, capsys, "--prompt", "ROMEO:", "--stop", "O", "--max-new-tokens", "3")[1].startswith("ROMEO:")


def test_prompts_choose_between_sampling_and_interactive_mode(checkpoint, capsys, monkeypatch):
    """A terminal on stdin and no --prompt: interactive; a --prompt: one sample, even at a terminal."""
    monkeypatch.setattr(sys.stdin, "isatty", lambda: True)
    monkeypatch.setattr("builtins.input", lambda: (_ for _ in ()).throw(EOFError))
    assert run(checkpoint, capsys, "--prompt", "Ay", "--max-new-tokens", "3")[1].startswith("Ay")
    code, out, err = run(checkpoint, capsys, "--max-new-tokens", "3")
    assert code == 0 and out == "" and "prompt> " in err


def test_a_cpu_decodes_in_float32_unless_told_otherwise(checkpoint, capsys, monkeypatch):
    """--dtype auto is float32 on a CPU even where bf16 trains faster (AMX, AVX512-BF16):
    decoding one token at a time gains nothing from it; --dtype bfloat16 is obeyed."""
    import machine.device

    monkeypatch.setattr(machine.device, "cpu_has_fast_bf16", lambda: True)
    dtypes = []
    monkeypatch.setattr(generate, "generate", lambda model, *rest: dtypes.append(model.lm_head.weight.dtype))
    for dtype in ("auto", "bfloat16"):
        assert run(checkpoint, capsys, "--prompt", "Ay", "--dtype", dtype)[0] == 0
    assert dtypes == [torch.float32, torch.bfloat16]


def test_command_line_help_describes_every_option(capsys):
    assert generate.main(["--help"]) == 0
    shown = " ".join(capsys.readouterr().out.split())  # (argparse re-wraps the lines)
    assert shown.startswith("usage: generate.py [-h] [--checkpoint CHECKPOINT] [--prompt PROMPT] ")
    assert ' [--debug] Sample from a trained GPT: python generate.py --prompt "ROMEO:" [--checkpoint out/tiny] ' \
           'options: ' in shown  # the docstring's first paragraph, and only that
    assert (" options: -h, --help show this help message and exit --checkpoint CHECKPOINT run directory (default "
            "out/tiny) --prompt PROMPT text to continue; repeat for a batch of prompts --prompt-file PROMPT_FILE read "
            "one prompt from a file --chat talk with a model fine-tuned on conversations: each line is a message "
            "(end a line with \\ to go on on the next) --system SYSTEM --chat: the system message the conversation "
            "starts with --tools FILE.json --chat: the tools the model may call (a JSON list of tool descriptions); a "
            "line /tool RESULT gives a call's result --max-new-tokens MAX_NEW_TOKENS tokens to add to each sample (default 500; "
            "--chat: at most what the context leaves after large tools) "
            "--temperature TEMPERATURE 0 = greedy (default 0.8) --top-k TOP_K sample among the k likeliest tokens "
            "--top-p TOP_P nucleus sampling: smallest set with mass p --seed SEED same seed, same samples "
            "--num-samples NUM_SAMPLES samples per prompt --stop STOP end a sample at this text (repeatable) "
            "--device DEVICE auto, cpu, cuda or mps --dtype {auto,float32,bfloat16,float16} auto: bfloat16 on GPUs "
            "that have it, float32 on CPUs --no-kv-cache recompute the whole context every token --stats print token "
            "counts and tokens/s to stderr --interactive read prompts from the terminal --show-attention "
            "FILE.png for the first sample, prompt and generated text: every layer's attention maps (rows: "
            "layers, columns: heads) as a PNG (the explorer's page of a text: explore.py) "
            "--threads THREADS torch's CPU threads (default: $OMP_NUM_THREADS if set, else 1) --debug show full tracebacks") in shown


def test_prompts_of_one_length_need_no_padding_mask():
    from jobs.prompt import left_padded

    idx, mask = left_padded([[5, 6], [7, 8]], torch.device("cpu"))
    assert idx.tolist() == [[5, 6], [7, 8]] and mask is None  # the causal fast path stays open
    idx, mask = left_padded([[5, 6], [7]], torch.device("cpu"))
    assert idx.tolist() == [[5, 6], [0, 7]] and mask.tolist() == [[1, 1], [0, 1]]
    assert idx.dtype == mask.dtype == torch.long  # token ids, and Hugging Face's 0/1 attention mask


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
    (["--top-p", "0"], "--top-p=0.0: must be in (0, 1] (or unset)"),
    (["--top-p", "1.5"], "--top-p=1.5: must be in (0, 1] (or unset)"),
    (["--top-k", "0"], "--top-k=0: must be 1 or more (or unset)"),
    (["--max-new-tokens", "-5"], "--max-new-tokens=-5: must be 0 or more"),
    (["--prompt-file", "/nonexistent/prompt.txt"], "prompt file /nonexistent/prompt.txt does not exist"),
    (["--prompt", "ROMEO 你"], "the prompt has characters this model never saw in training: '你'; remove or replace them"),
    (["--num-samples", "0"], "--num-samples=0: must be 1 or more"),
    (["--temperature", "hot"], "argument --temperature: invalid float value: 'hot' (see python generate.py --help)"),
    (["--show-attention", "maps.jpg"], "--show-attention maps.jpg: the file name must end in .png"),
    (["--show-attention", "page.html"], "--show-attention page.html: the explorer's page is explore.py's now; save "
                                        "the sample and run python explore.py --prompt-file FILE --out PAGE.html"),
    (["--show-attention", "/nonexistent/maps.png"],
     "--show-attention /nonexistent/maps.png: folder /nonexistent does not exist; create it first"),
    (["--stop", "\n", "--stop", ""], "--stop needs some text, e.g. --stop '\\n\\n'"),
])
def test_bad_options(checkpoint, capsys, args, message):
    code, out, err = run(checkpoint, capsys, *args)
    assert code == 2 and err == f"error: {message}\n" and not out


def test_show_attention_into_a_folder_is_refused(checkpoint, capsys, tmp_path):
    (tmp_path / "maps.png").mkdir()
    code, out, err = run(checkpoint, capsys, "--prompt", "A", "--show-attention", str(tmp_path / "maps.png"))
    assert code == 2 and err == f"error: --show-attention {tmp_path / 'maps.png'} is a folder; give a file name " \
                                "ending in .png\n"


def test_a_sample_is_500_new_tokens_unless_told_otherwise():
    settings = generate.Settings.from_args(generate.parse_args(["--prompt", "x"]))
    assert settings.max_new_tokens == 500 and not settings.chosen_max_new_tokens  # what --help says
    assert generate.Settings.from_args(generate.parse_args(["--prompt", "x", "--max-new-tokens", "500"])).chosen_max_new_tokens


def test_a_prompt_file_is_read_as_utf8(checkpoint, capsys, tmp_path):
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("ROMEO: soft", encoding="utf-8")
    code, out, _ = run(checkpoint, capsys, "--prompt-file", str(prompt), "--max-new-tokens", "3")
    assert code == 0 and out.startswith("ROMEO: soft")
    prompt.write_bytes(b"ROMEO: caf\xe9")
    code, out, err = run(checkpoint, capsys, "--prompt-file", str(prompt))
    assert code == 2 and err == f"error: prompt file {prompt} is not UTF-8 text\n" and not out


def test_missing_checkpoint_names_the_train_command(tmp_path):
    result = run_cli("generate.py", "--prompt", "x", cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "out/tiny" in result.stderr and "python train.py --config configs/tiny.yaml" in result.stderr
    assert result.stderr.count("\n") == 1


def test_interactive_mode_reads_prompts_until_eof(checkpoint, capsys, monkeypatch):
    """Ctrl-C at the prompt asks again, a bad prompt prints its error and asks again,
    Ctrl-D ends; stdout holds only the samples; the prompt shows before the user types."""
    answers = iter(["ROMEO:", KeyboardInterrupt, "Ay§", "Ay", EOFError])
    terminal = io.BytesIO()  # stderr as on a terminal: flushed at newlines only
    monkeypatch.setattr(sys, "stderr", io.TextIOWrapper(terminal, encoding="utf-8", line_buffering=True))

    def typed():
        assert terminal.getvalue().endswith(b"prompt> ")
        answer = next(answers)
        if isinstance(answer, type):
            raise answer
        return answer

    monkeypatch.setattr("builtins.input", typed)
    code, out, _ = run(checkpoint, capsys, "--interactive", "--temperature", "0", "--max-new-tokens", "10")
    err = terminal.getvalue().decode()
    assert code == 0 and [len(line) for line in out.splitlines()] == [16, 12]
    assert out.startswith("ROMEO:") and out.splitlines()[1].startswith("Ay")
    assert err.startswith("Type a prompt and press Enter (Ctrl-D to quit, Ctrl-C stops a sample).\nprompt> ")
    assert err.count("prompt> ") == 5 and "\nprompt> error: the prompt has characters this model never saw" in err


def test_ctrl_c_ends_the_sample_in_interactive_mode_and_the_program_otherwise(checkpoint, capsys, monkeypatch):
    model, tokenizer = generate.load_model(checkpoint, torch.device("cpu"), torch.float32)
    real = model.generate_tokens

    def interrupted(*args):
        tokens = real(*args)
        yield next(tokens)
        yield next(tokens)
        raise KeyboardInterrupt

    monkeypatch.setattr(model, "generate_tokens", interrupted)
    clock = iter([100.0, 104.0, 0.0, 0.0])  # the first sample takes 4 s
    monkeypatch.setattr(generate, "time", type("Clock", (), {"perf_counter": lambda: next(clock)}))
    out = io.StringIO()
    settings = generate.Settings(temperature=0, seed=0, no_kv_cache=True, stats=True, interactive=True)
    texts = generate.generate(model, tokenizer, ["ROMEO:"], settings, torch.device("cpu"), out=out)
    assert out.getvalue() == texts[0] + "\n" and texts[0].startswith("ROMEO:")
    assert capsys.readouterr().err == ("\n[stopped]\nprompt tokens: 6 | new tokens: 2 | 4.00 s | 0.5 tokens/s | "
                                       "batch 1 | kv cache off | cpu\n")
    with pytest.raises(KeyboardInterrupt):
        generate.generate(model, tokenizer, ["ROMEO:"], generate.Settings(), torch.device("cpu"), out=out)


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
    from runs.folder import DEFAULT_RUN, RunDir
    from cli.program import UserError

    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError, match=r"out/tiny \(the tiny config's run\) does not exist; train one first"):
        RunDir(DEFAULT_RUN).load_model()
    (tmp_path / "partial").mkdir()
    (tmp_path / "partial" / "tokenizer.json").write_text("{}")
    with pytest.raises(UserError, match="is missing config.json, model.safetensors; it is not a finished run"):
        RunDir(tmp_path / "partial").load_model()


def test_the_first_ten_unknown_characters_are_named(checkpoint, capsys):
    code, _, err = run(checkpoint, capsys, "--prompt", "0123456789QXZ")
    shown = err.split("never saw in training: ")[1].split(";")[0].split()
    assert code == 2 and shown == [repr(c) for c in "0123456789"]
