"""Llama in and out, with no network: a small random LlamaForCausalLM made by transformers
here (2 layers, grouped-query attention, a tied and an untied head) with a small BPE
tokenizer of Llama's kind beside it (<s> before every text, </s> at the end) loads with
transformers' logits and greedy text; fine-tuning from it runs and resumes; every program
works on the run; and a run of the modern block exports back to LlamaForCausalLM."""

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

import evaluate
import explore
import export
import generate
import train
from cli.program import UserError
from runs.folder import RunDir
from conftest import ROOT
from data.config import DataConfig
from jobs import prepare
from model import GPT, GPTConfig

transformers = pytest.importorskip("transformers")
FINETUNE = str(ROOT / "configs" / "finetune-llama.yaml")


def llama_tokenizer(text: str):
    """Byte-level BPE with Llama's special tokens: <s> (id 1) put before every text by the
    post-processor, </s> (id 2) the end of a text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator([text], trainer)
    tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    return tokenizer


def qwen_tokenizer(text: str):
    """Byte-level BPE split as Qwen2's (export.QWEN_SPLIT, NFC): the kind a Qwen2 model brings."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(export.QWEN_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  show_progress=False, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator([text], trainer)
    return tokenizer


@pytest.fixture(scope="module", params=[True, False], ids=["tied", "untied"])
def llama_folder(request, tmp_path_factory, corpus):
    folder = tmp_path_factory.mktemp("llama")
    tokenizer = llama_tokenizer(corpus.read_text())
    config = transformers.LlamaConfig(vocab_size=tokenizer.get_vocab_size(), hidden_size=32, intermediate_size=88,
                                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                      max_position_embeddings=64, rms_norm_eps=1e-6, rope_theta=10000.0,
                                      tie_word_embeddings=request.param, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.1)
    model.save_pretrained(folder)
    tokenizer.save(str(folder / "tokenizer.json"))
    return folder


def test_a_llama_folder_loads_with_transformers_logits_and_greedy_text(llama_folder):
    from interop.base_model import open_base_model

    base = open_base_model(str(llama_folder))
    c = base.config
    assert (c.norm, c.mlp, c.n_kv_head, c.ffn_hidden, c.norm_eps, c.bias) == ("rmsnorm", "swiglu", 2, 88, 1e-6, False)
    ours = GPT(c).eval()
    ours.load_state_dict(base.state_dict(c))
    hf = transformers.LlamaForCausalLM.from_pretrained(llama_folder).eval()
    assert ours.config.tie_embeddings == hf.config.tie_word_embeddings
    idx = torch.randint(3, c.vocab_size, (2, 30))
    with torch.no_grad():
        torch.testing.assert_close(ours(idx)[0], hf(idx).logits, atol=1e-5, rtol=0)
    prompt = torch.tensor([base.tokenizer().encode("ROMEO:").ids])
    assert prompt[0, 0] == 1  # <s>, as Llama puts it
    theirs = hf.generate(prompt, max_new_tokens=40, do_sample=False, eos_token_id=None, pad_token_id=0)
    assert torch.equal(ours.generate(prompt, 40, temperature=0), theirs)


def micro_finetune(corpus, tmp, source, *extra):
    return ["--config", FINETUNE, f"train.init_from={source}", f"data.source={corpus}",
            f"data.cache_dir={tmp / 'cache'}", f"out_dir={tmp / 'ft'}", "train.max_iters=4", "model.block_size=32",
            "train.batch_size=4", "train.grad_accum=1", "train.eval_interval=2", "train.eval_windows=4",
            "train.sample_tokens=10", "train.dtype=float32", "train.threads=1", *extra]


def test_fine_tuning_a_llama_folder_runs_resumes_and_every_program_works(llama_folder, corpus, tmp_path, capsys):
    assert train.main(micro_finetune(corpus, tmp_path, llama_folder)) == 0
    assert train.main([*micro_finetune(corpus, tmp_path, llama_folder), "train.max_iters=6"]) == 0
    assert "resuming at iteration 4" in capsys.readouterr().out
    run = tmp_path / "ft"
    model, tokenizer = RunDir(run).load_model()
    assert model.config.mlp == "swiglu" and model.config.n_kv_head == 2
    # the data as Llama was trained: each document starts with <s>; documents end with </s>
    data = prepare(DataConfig(str(corpus), cache_dir=str(tmp_path / "cache")), progress=False, tokenizer=tokenizer)
    assert data.train[0] == 1 and 2 not in np.asarray(data.train[:-1])[np.asarray(data.train[1:]) != 1]
    assert generate.main(["--checkpoint", str(run), "--prompt", "ROMEO:", "--max-new-tokens", "5", "--temperature", "0"]) == 0
    assert capsys.readouterr().out.startswith("ROMEO:")
    assert evaluate.main(["--checkpoint", str(run), "--split", "val", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["tokens"] > 0
    assert explore.main(["--checkpoint", str(run), "--prompt", "ROMEO:", "--out", str(tmp_path / "page.html")]) == 0
    assert "no page of the model at initialisation" in capsys.readouterr().err  # it started from the folder's weights
    assert export.main(["--checkpoint", str(run), "--out", str(tmp_path / "back")]) == 0
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "back").eval()
    assert type(back).__name__ == "LlamaForCausalLM"
    idx = torch.tensor([tokenizer.encode("ROMEO: what light").ids])
    with torch.no_grad():
        torch.testing.assert_close(back(idx).logits, model.eval()(idx)[0], atol=1e-5, rtol=0)
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "back")
    assert hf_tokenizer("ROMEO:")["input_ids"] == tokenizer.encode("ROMEO:").ids  # <s> and all
    assert (hf_tokenizer.bos_token, hf_tokenizer.eos_token) == ("<s>", "</s>")
    assert json.loads((tmp_path / "back" / "generation_config.json").read_text())["eos_token_id"] == 2


def test_generation_stops_at_the_end_of_a_text(tmp_path, capsys):
    """A sample ends at </s> (or <|endoftext|>), as transformers' generate ends at eos."""
    from conftest import favour_token
    from data.tokenizer import train_tokenizer
    from model import GPTConfig

    tokenizer = llama_tokenizer("hear me speak. " * 50)
    model = GPT(GPTConfig(vocab_size=tokenizer.get_vocab_size(), block_size=16, n_layer=1, n_head=2, n_embd=16))
    favour_token(model, 2)  # every next token: </s>
    model.save_pretrained(tmp_path)
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    assert generate.main(["--checkpoint", str(tmp_path), "--prompt", "hear", "--max-new-tokens", "20",
                          "--temperature", "0", "--stats"]) == 0
    out, err = capsys.readouterr()
    assert out == "hear\n" and "new tokens: 0 |" in err
    ours = train_tokenizer("bpe", ["hear me speak. " * 50], 300)  # and this project's <|endoftext|>
    favour_token(model := GPT(GPTConfig(vocab_size=ours.get_vocab_size(), block_size=16, n_layer=1, n_head=2,
                                        n_embd=16)), ours.token_to_id("<|endoftext|>"))
    model.save_pretrained(tmp_path)
    ours.save(str(tmp_path / "tokenizer.json"))
    assert generate.main(["--checkpoint", str(tmp_path), "--prompt", "hear", "--max-new-tokens", "20",
                          "--temperature", "0"]) == 0
    assert capsys.readouterr().out == "hear\n"


def test_weights_sharded_over_several_files_come_in_exact(llama_folder, tmp_path):
    """A model over a few GB ships model-0000N-of-0000M.safetensors with an index: the
    shards together are the model, logits equal transformers'; an index naming a file
    outside the folder is refused."""
    from interop.base_model import open_base_model

    hf = transformers.LlamaForCausalLM.from_pretrained(llama_folder).eval()
    sharded = tmp_path / "sharded"
    hf.save_pretrained(sharded, max_shard_size="40KB")
    shutil.copy(llama_folder / "tokenizer.json", sharded)
    assert not (sharded / "model.safetensors").exists() and len(list(sharded.glob("model-*.safetensors"))) > 2
    base = open_base_model(str(sharded))
    ours = GPT(base.config).eval()
    ours.load_state_dict(base.state_dict(base.config))
    idx = torch.randint(3, base.config.vocab_size, (2, 30))
    with torch.no_grad():
        torch.testing.assert_close(ours(idx)[0], hf(idx).logits, atol=1e-5, rtol=0)
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    first = next(iter(index["weight_map"]))
    index["weight_map"][first] = "../elsewhere.safetensors"
    (sharded / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(UserError, match="not a safetensors file of the model's folder"):
        base.state_dict(base.config)


def exported(ours: GPT, tokenizer, tmp_path):
    """(the run folder, the transformers model export.py made of it) for our model."""
    run = tmp_path / "run"
    ours.save_pretrained(run)
    tokenizer.save(str(run / "tokenizer.json"))
    assert export.main(["--checkpoint", str(run), "--out", str(tmp_path / "out")]) == 0
    return run, transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()


def test_llama3s_rope_scaling_comes_in_and_goes_out_exact(tmp_path, corpus):
    """Llama 3.x stretches its slow rotary frequencies (rope_type llama3): with sizes chosen
    so that one pair keeps its speed, two are mixed and one is stretched, our logits equal
    transformers' past the original context, and the export is a Llama 3 again."""
    from interop.base_model import open_base_model

    tokenizer = llama_tokenizer(corpus.read_text())
    scaling = {"factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 8.0, "original_max_position_embeddings": 64}
    config = transformers.LlamaConfig(vocab_size=tokenizer.get_vocab_size(), hidden_size=32, intermediate_size=88,
                                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                      max_position_embeddings=128, rms_norm_eps=1e-6, tie_word_embeddings=True,
                                      rope_parameters={"rope_type": "llama3", "rope_theta": 100.0, **scaling},
                                      bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.normal_(0, 0.1)
    folder = tmp_path / "llama3"
    hf.save_pretrained(folder)
    tokenizer.save(str(folder / "tokenizer.json"))
    base = open_base_model(str(folder))
    assert base.config.rope_scaling == scaling and base.config.rope_base == 100.0
    ours = GPT(base.config).eval()
    ours.load_state_dict(base.state_dict(base.config))
    wavelengths = 2 * torch.pi / ours.rotary.inv_freq
    assert wavelengths[0] < 64 / 8 and 64 / 8 < wavelengths[1] < 64 and wavelengths[-1] > 64  # all three kinds
    idx = torch.randint(3, base.config.vocab_size, (2, 120))  # past the original 64 positions
    with torch.no_grad():
        torch.testing.assert_close(ours(idx)[0], hf(idx).logits, atol=1e-5, rtol=0)
    _, again = exported(ours, tokenizer, tmp_path)
    assert type(again).__name__ == "LlamaForCausalLM" and again.config.rope_parameters["rope_type"] == "llama3"
    with torch.no_grad():
        torch.testing.assert_close(again(idx).logits, hf(idx).logits, atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="must have exactly the keys factor, low_freq_factor"):
        GPTConfig(pos_encoding="rope", rope_scaling={"factor": 8.0})
    with pytest.raises(ValueError, match="high_freq_factor must be above low_freq_factor"):
        GPTConfig(pos_encoding="rope", rope_scaling={**scaling, "high_freq_factor": 1.0})
    with pytest.raises(ValueError, match="rope_scaling stretches rotary positions; pos_encoding='learned' has none"):
        GPTConfig(pos_encoding="learned", rope_scaling=scaling)


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_qwen2_comes_in_and_goes_out_exact(tmp_path, corpus, tied):
    """Qwen2 (and Qwen2.5): Llama's block with biases on q, k and v alone, and a sliding
    window its config names but leaves off. Our logits equal transformers'; the export is
    a Qwen2ForCausalLM again, and a GGUF of llama.cpp's qwen2 architecture with the biases."""
    from interop.base_model import open_base_model

    tokenizer = llama_tokenizer(corpus.read_text())
    config = transformers.Qwen2Config(vocab_size=tokenizer.get_vocab_size(), hidden_size=32, intermediate_size=88,
                                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                      max_position_embeddings=64, rms_norm_eps=1e-6, tie_word_embeddings=tied,
                                      use_sliding_window=False, sliding_window=32, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    hf = transformers.Qwen2ForCausalLM(config).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.normal_(0, 0.1)
    assert hf.model.layers[0].self_attn.q_proj.bias is not None and hf.model.layers[0].self_attn.o_proj.bias is None
    folder = tmp_path / "qwen2"
    hf.save_pretrained(folder)
    tokenizer.save(str(folder / "tokenizer.json"))
    base = open_base_model(str(folder))
    assert (base.config.bias, base.config.qkv_bias, base.config.tie_embeddings) == (False, True, tied)
    ours = GPT(base.config).eval()
    ours.load_state_dict(base.state_dict(base.config))
    idx = torch.randint(3, base.config.vocab_size, (2, 40))
    with torch.no_grad():
        torch.testing.assert_close(ours(idx)[0], hf(idx).logits, atol=1e-5, rtol=0)
    run, again = exported(ours, qwen_tokenizer(corpus.read_text()), tmp_path)
    assert type(again).__name__ == "Qwen2ForCausalLM"
    with torch.no_grad():
        torch.testing.assert_close(again(idx).logits, hf(idx).logits, atol=1e-5, rtol=0)
    # with a tokenizer of another kind: a Llama with attention biases (o_proj's zero), which comes back in
    shutil.rmtree(tmp_path / "run"), shutil.rmtree(tmp_path / "out")
    run, again = exported(ours, tokenizer, tmp_path)
    assert type(again).__name__ == "LlamaForCausalLM" and again.model.layers[0].self_attn.o_proj.bias.abs().sum() == 0
    with torch.no_grad():
        torch.testing.assert_close(again(idx).logits, hf(idx).logits, atol=1e-5, rtol=0)
    back = open_base_model(str(tmp_path / "out"))
    assert (back.config.bias, back.config.qkv_bias) == (False, True)
    came_back = GPT(back.config).eval()
    came_back.load_state_dict(back.state_dict(back.config))
    with torch.no_grad():
        torch.testing.assert_close(came_back(idx)[0], hf(idx).logits, atol=1e-5, rtol=0)
    again.model.layers[1].self_attn.o_proj.bias.data[0] = 1.0
    again.save_pretrained(tmp_path / "out")
    with pytest.raises(UserError, match="comes in only when its o_proj biases are zero"):
        open_base_model(str(tmp_path / "out")).state_dict(back.config)
    gguf = pytest.importorskip("gguf")
    assert export.main(["--checkpoint", str(run), "--out", str(tmp_path / "qwen2.gguf")]) == 0
    reader = gguf.GGUFReader(tmp_path / "qwen2.gguf")
    names = {t.name for t in reader.tensors}
    assert {"blk.0.attn_q.bias", "blk.0.attn_k.bias", "blk.0.attn_v.bias"} <= names and "blk.0.attn_output.bias" not in names
    q_bias = next(t for t in reader.tensors if t.name == "blk.1.attn_q.bias")
    assert np.array_equal(np.asarray(q_bias.data), hf.model.layers[1].self_attn.q_proj.bias.detach().numpy())  # as it is
    field = reader.fields["general.architecture"]
    assert bytes(field.parts[field.data[0]]).decode() == "qwen2"
    (folder / "config.json").write_text(json.dumps({**json.loads((folder / "config.json").read_text()),
                                                    "use_sliding_window": True}))
    with pytest.raises(UserError, match="qwen2 with use_sliding_window=true is not supported"):
        open_base_model(str(folder))


def qwen3_folder(folder: Path, tokenizer, tied: bool, **config) -> "transformers.Qwen3ForCausalLM":
    """A random Qwen3ForCausalLM as Qwen3's published ones are shaped (QK-norm, heads wider
    than hidden_size / heads: 4 of 12 in a stream of 32, two key/value heads, rope base 10⁶,
    no biases) with Qwen3's tokenizer roles and chat template, saved in `folder`."""
    eos = tokenizer.token_to_id("<|im_end|>")
    hf_config = transformers.Qwen3Config(
        vocab_size=tokenizer.get_vocab_size(), hidden_size=32, intermediate_size=88, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=12, max_position_embeddings=1024, rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6}, tie_word_embeddings=tied, use_sliding_window=False,
        bos_token_id=None, eos_token_id=eos, pad_token_id=tokenizer.token_to_id("<|endoftext|>"), **config)
    torch.manual_seed(0)
    hf = transformers.Qwen3ForCausalLM(hf_config).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.normal_(0, 0.1)
    hf.save_pretrained(folder)
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "bos_token": None,
        "chat_template": (ROOT / "tests" / "data" / "qwen3_chat_template.jinja").read_text()}))
    return hf


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_qwen3_comes_in_and_goes_out_exact(tmp_path, corpus, tied):
    """Qwen3: Llama's block with QK-norm (an RMSNorm with its own gain on each head's q and
    k, before the rotation) and a head size that is not hidden_size / heads. Our logits and
    greedy text equal transformers'; the export is a Qwen3ForCausalLM again with the same
    logits, its tokenizer read as written; biases on q, k and v alone go out with o's zero and
    come back; a sliding window and an o_proj bias are refused."""
    from interop.base_model import open_base_model

    tokenizer = qwen_tokenizer(corpus.read_text())
    hf = qwen3_folder(tmp_path / "qwen3", tokenizer, tied)
    base = open_base_model(str(tmp_path / "qwen3"))
    c = base.config
    assert (c.qk_norm, c.head_dim, c.head_size, c.n_kv_head, c.rope_base, c.bias, c.tie_embeddings) == (
        True, 12, 12, 2, 1e6, False, tied)
    ours = GPT(c).eval()
    ours.load_state_dict(base.state_dict(c))
    assert ours.transformer.h[0].attn.c_attn.weight.shape == (4 * 12 + 2 * 2 * 12, 32)
    idx = torch.randint(3, c.vocab_size, (2, 40))
    with torch.no_grad():
        torch.testing.assert_close(ours(idx)[0], hf(idx).logits, atol=1e-5, rtol=0)
    prompt = torch.tensor([tokenizer.encode("ROMEO:").ids])
    theirs = hf.generate(prompt, max_new_tokens=30, do_sample=False, eos_token_id=None, pad_token_id=0)
    assert torch.equal(ours.generate(prompt, 30, temperature=0), theirs)
    run, again = exported(ours, tokenizer, tmp_path)
    assert type(again).__name__ == "Qwen3ForCausalLM" and again.config.head_dim == 12
    with torch.no_grad():
        torch.testing.assert_close(again(idx).logits, hf(idx).logits, atol=1e-5, rtol=0)
    assert transformers.AutoTokenizer.from_pretrained(tmp_path / "out")(PROBE)["input_ids"] == tokenizer.encode(PROBE).ids
    # biases on q, k and v alone: Qwen3's attention_bias, o_proj's zero
    shutil.rmtree(tmp_path / "run"), shutil.rmtree(tmp_path / "out")
    biased = GPT(dataclasses.replace(c, qkv_bias=True)).eval()
    run, again = exported(biased, tokenizer, tmp_path)
    assert again.config.attention_bias and again.model.layers[0].self_attn.o_proj.bias.abs().sum() == 0
    with torch.no_grad():
        torch.testing.assert_close(again(idx).logits, biased(idx)[0], atol=1e-5, rtol=0)
    back = open_base_model(str(tmp_path / "out"))
    assert (back.config.qkv_bias, back.config.bias, back.config.qk_norm) == (True, False, True)
    again.model.layers[1].self_attn.o_proj.bias.data[0] = 1.0
    again.save_pretrained(tmp_path / "out")
    with pytest.raises(UserError, match="comes in only when its o_proj biases are zero"):
        open_base_model(str(tmp_path / "out")).state_dict(back.config)
    with pytest.raises(UserError, match="qwen3 with use_sliding_window=true is not supported"):
        qwen3_folder(tmp_path / "window", tokenizer, tied, sliding_window=16)
        config = json.loads((tmp_path / "window" / "config.json").read_text())
        (tmp_path / "window" / "config.json").write_text(json.dumps({**config, "use_sliding_window": True}))
        open_base_model(str(tmp_path / "window"))


@pytest.mark.parametrize("lora", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["every weight", "LoRA"])
def test_a_qwen3_fine_tuned_on_packed_conversations_with_tools_exports_with_its_template(tmp_path, corpus, lora):
    """A practitioner's path from a Qwen3 folder: fine-tuned (every weight, or LoRA) on
    conversations with tool calls, packed, with Qwen3's own chat template; the export is a
    Qwen3ForCausalLM with the run's logits, and transformers' apply_chat_template on it
    writes the ids the run learnt from. (Rows of 1,024 tokens: each packed conversation
    attends alone, model/attention.py's Sequences.)"""
    from data.tasks import conversations, write
    from data.template import encode, template_for

    records = conversations("weather", 40, seed=0)
    write(tmp_path / "calls.jsonl", records)
    tokenizer = qwen_tokenizer(corpus.read_text() + (tmp_path / "calls.jsonl").read_text())
    qwen3_folder(tmp_path / "qwen3", tokenizer, tied=True)
    tuned = ["--config", FINETUNE, f"train.init_from={tmp_path / 'qwen3'}", f"data.source={tmp_path / 'calls.jsonl'}",
             f"data.cache_dir={tmp_path / 'cache'}", f"out_dir={tmp_path / 'ft'}", "train.max_iters=2",
             "model.block_size=1024", "train.batch_size=2", "train.grad_accum=1", "train.eval_interval=2",
             "train.eval_windows=4", "train.sample_tokens=0", "train.dtype=float32", "train.threads=1",
             "train.packing=true", *(["lora.rank=4", "train.lr=0.01"] if lora else [])]
    assert train.main(tuned) == 0
    model, tokenizer = RunDir(tmp_path / "ft").load_model()
    assert model.config.qk_norm and model.config.head_dim == 12
    assert export.main(["--checkpoint", str(tmp_path / "ft"), "--out", str(tmp_path / "hf")]) == 0
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    assert type(back).__name__ == "Qwen3ForCausalLM"
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    messages, tools = records[0]["messages"], records[0].get("tools")
    ids = theirs.apply_chat_template(messages, tools=tools, tokenize=True)["input_ids"]
    run = RunDir(tmp_path / "ft")
    assert ids == encode(tokenizer, template_for(tokenizer, run.chat_template()), messages, tools)[0].tolist()
    assert "<think>" in theirs.decode(ids)  # (Qwen3's own template, kept)
    x = torch.tensor([ids[:60]])
    with torch.no_grad():
        torch.testing.assert_close(back(x).logits, model.eval()(x)[0], atol=1e-5, rtol=0)
        if lora:
            first = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "qwen3").eval()
            assert (first(x).logits - back(x).logits[..., :first.config.vocab_size]).abs().max() > 1e-3


@pytest.mark.parametrize("ends", ["one", "a list"])
def test_an_export_keeps_the_special_tokens_the_model_came_in_with(corpus, tmp_path, ends):
    """A Qwen2 base declares eos <|im_end|> and pad <|endoftext|> (and no bos): fine-tuned
    here and exported, transformers reads the same roles (not <|endoftext|> for all), and
    config.json the same ids, the end a list only where the base's was; fine-tuned again from
    the run, the export still says them. generation_config.json stops at every end."""
    tokenizer = qwen_tokenizer(corpus.read_text())
    ids = {token: tokenizer.token_to_id(token) for token in ("<|endoftext|>", "<|im_end|>")}
    eos = ids["<|im_end|>"] if ends == "one" else [ids["<|im_end|>"], ids["<|endoftext|>"]]
    config = transformers.Qwen2Config(vocab_size=tokenizer.get_vocab_size(), hidden_size=32, intermediate_size=88,
                                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                      max_position_embeddings=64, use_sliding_window=False,
                                      bos_token_id=None, eos_token_id=eos, pad_token_id=ids["<|endoftext|>"])
    folder = tmp_path / "qwen2"
    transformers.Qwen2ForCausalLM(config).save_pretrained(folder)
    tokenizer.save(str(folder / "tokenizer.json"))
    roles = {"bos_token": None, "eos_token": "<|im_end|>", "pad_token": {"content": "<|endoftext|>", "special": True},
             "unk_token": None, "model_max_length": 32768}
    (folder / "tokenizer_config.json").write_text(json.dumps(roles))
    assert train.main(micro_finetune(corpus, tmp_path, folder, "train.max_iters=2")) == 0
    assert json.loads((tmp_path / "ft" / "special_tokens_map.json").read_text()) == {
        "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "eos_token_id": eos, "pad_token_id": ids["<|endoftext|>"]}
    assert export.main(["--checkpoint", str(tmp_path / "ft"), "--out", str(tmp_path / "hf")]) == 0
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert (theirs.eos_token, theirs.pad_token, theirs.bos_token) == ("<|im_end|>", "<|endoftext|>", None)
    assert (theirs.eos_token_id, theirs.pad_token_id) == (ids["<|im_end|>"], ids["<|endoftext|>"])
    said = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert (said["eos_token_id"], said["pad_token_id"], said.get("bos_token_id")) == (eos, ids["<|endoftext|>"], None)
    assert json.loads((tmp_path / "hf" / "generation_config.json").read_text())["eos_token_id"] == sorted(ids.values())
    again = micro_finetune(corpus, tmp_path, tmp_path / "ft", "train.max_iters=2", f"out_dir={tmp_path / 'again'}")
    assert train.main(again) == 0
    assert export.main(["--checkpoint", str(tmp_path / "again"), "--out", str(tmp_path / "hf-again")]) == 0
    assert json.loads((tmp_path / "hf-again" / "config.json").read_text())["eos_token_id"] == eos


PROBE = "On 1999-12-31   at 23:59,\n\n\t  今天天气很好。 don't 12345 ROMEO:"


@pytest.mark.parametrize("kind", ["gpt2", "gpt_neox", "llama", "qwen2", "qwen2 with Qwen's tokenizer"])
def test_every_exports_tokenizer_gives_transformers_our_ids(tmp_path, kind):
    """transformers' AutoTokenizer on an export gives the project's ids on digits, runs of
    whitespace and Chinese, for each kind the export writes. (A qwen2 folder's tokenizer is
    read by transformers as Qwen2Tokenizer, which splits as Qwen does: a Qwen2-shaped model
    with a tokenizer of its own is written as a Llama, and a Qwen2 when it brings Qwen's.)"""
    from data.tokenizer import train_bpe

    text = (PROBE + " 2014-09-01 December 1999 ") * 40
    tokenizer = qwen_tokenizer(text) if "Qwen" in kind else train_bpe([text], 400)
    assert len(tokenizer.encode("1999").ids) < 4 or "Qwen" in kind  # digits merged (Qwen splits them)
    shape = {"gpt2": {"pos_encoding": "learned"}, "gpt_neox": {"pos_encoding": "rope"}}.get(
        kind, {"pos_encoding": "rope", "norm": "rmsnorm", "mlp": "swiglu", "bias": False, "qkv_bias": "qwen2" in kind})
    model = GPT(GPTConfig(vocab_size=tokenizer.get_vocab_size(), block_size=64, n_layer=1, n_head=2, n_embd=16, **shape))
    _, hf = exported(model, tokenizer, tmp_path)
    assert type(hf).__name__ == {"gpt2": "GPT2LMHeadModel", "gpt_neox": "GPTNeoXForCausalLM",
                                 "qwen2 with Qwen's tokenizer": "Qwen2ForCausalLM"}.get(kind, "LlamaForCausalLM")
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path / "out")
    for text in (PROBE, "1999", "   \n\n  x", "今天天气很好"):
        assert theirs(text)["input_ids"] == tokenizer.encode(text).ids, text
    if "Qwen" in kind:
        from transformers.models.qwen2 import tokenization_qwen2
        assert type(theirs).__name__ == "Qwen2Tokenizer" and export.QWEN_SPLIT == tokenization_qwen2.PRETOKENIZE_REGEX


@pytest.mark.parametrize("change, message", [
    ({"rope_parameters": {"rope_type": "yarn", "factor": 8.0, "rope_theta": 10000.0}},
     "llama with rope scaling 'yarn' is not supported"),
    ({"hidden_act": "gelu"}, "llama with hidden_act='gelu' is not supported (this model computes hidden_act='silu')"),
    ({"attention_bias": True, "mlp_bias": True}, "its weights have no 'model.layers.0.self_attn.q_proj.bias', "
                                                 "which its config.json implies"),
    ({"mlp_bias": True}, "llama with mlp_bias=True is not supported (this model computes mlp_bias=False)"),
    ({"sliding_window": 32}, "llama with sliding_window=32 is not supported (this model computes sliding_window=None)"),
    ({"eos_token_id": 5}, "declares end-of-text token"),
])
def test_what_our_block_cannot_express_is_refused_in_one_line(llama_folder, tmp_path, corpus, change, message, capsys):
    folder = shutil.copytree(llama_folder, tmp_path / "changed")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **change}))
    assert train.main(micro_finetune(corpus, tmp_path, folder)) == 2
    err = capsys.readouterr().err
    assert message in err.splitlines()[-1] and "Traceback" not in err and not (tmp_path / "ft").exists()
    assert err.count("\n") == 1 or "no 'model.layers" in message  # (a missing tensor shows once the data is ready)


def test_a_modern_block_run_exports_as_llama(tmp_path, micro, capsys):
    """Our run (rope, RMSNorm, SwiGLU, grouped-query attention, an untied head, no biases,
    a char tokenizer) as a LlamaForCausalLM: the same logits and greedy text within
    block_size, the suppressed <unk> kept, the model card naming the kind."""
    settings = ["model.pos_encoding=rope", "model.norm=rmsnorm", "model.mlp=swiglu", "model.n_kv_head=1",
                "model.tie_embeddings=false", "model.bias=false", "model.norm_eps=1e-6", "train.max_iters=6"]
    assert train.main(["--config", str(ROOT / "configs" / "tiny.yaml"), *micro(*settings)]) == 0
    run = tmp_path / "run"
    assert export.main(["--checkpoint", str(run), "--out", str(tmp_path / "hf")]) == 0
    assert "LlamaForCausalLM" in capsys.readouterr().out
    hf_config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert (hf_config["num_key_value_heads"], hf_config["intermediate_size"], hf_config["rms_norm_eps"],
            hf_config["tie_word_embeddings"], hf_config["max_position_embeddings"]) == (1, 96, 1e-6, False, 32)
    model, tokenizer = RunDir(run).load_model()
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    idx = torch.tensor([tokenizer.encode("ROMEO:\nWhat say you").ids])
    with torch.no_grad():
        torch.testing.assert_close(hf(idx).logits, model.eval()(idx)[0], atol=1e-5, rtol=0)
    suppressed = json.loads((tmp_path / "hf" / "generation_config.json").read_text())["suppress_tokens"]
    assert suppressed == [tokenizer.token_to_id("<unk>")]
    ours = model.generate(idx, 32 - idx.size(1), temperature=0, suppress_tokens=tuple(suppressed))
    theirs = hf.generate(idx, max_new_tokens=32 - idx.size(1), do_sample=False, suppress_tokens=suppressed,
                         attention_mask=torch.ones_like(idx), pad_token_id=0)
    assert torch.equal(ours, theirs)
    assert "exported as\n`LlamaForCausalLM`" in (tmp_path / "hf" / "README.md").read_text()


def test_the_finetune_config_names_a_real_llama_family_model():
    import yaml

    config = yaml.safe_load(Path(FINETUNE).read_text())
    assert config["train"]["init_from"] == "HuggingFaceTB/SmolLM2-135M" and config["out_dir"] == "out/finetune-llama"


def test_smollm2s_own_config_json_reads_as_the_block_it_describes():
    """SmolLM2-135M's config.json as the hub serves it (written by transformers 4.46: rope_theta
    at the top, rope_scaling null, keys ours ignores such as rope_interleaved)."""
    from interop.hf import config_from_transformers

    hub = {"architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
           "bos_token_id": 0, "eos_token_id": 0, "head_dim": 64, "hidden_act": "silu", "hidden_size": 576,
           "initializer_range": 0.041666666666666664, "intermediate_size": 1536, "is_llama_config": True,
           "max_position_embeddings": 8192, "mlp_bias": False, "model_type": "llama", "num_attention_heads": 9,
           "num_hidden_layers": 30, "num_key_value_heads": 3, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
           "rope_interleaved": False, "rope_scaling": None, "rope_theta": 100000, "tie_word_embeddings": True,
           "torch_dtype": "bfloat16", "transformers_version": "4.46.3", "use_cache": True, "vocab_size": 49152}
    c = config_from_transformers(hub)
    assert (c.n_layer, c.n_embd, c.n_head, c.n_kv_head, c.head_size, c.ffn_hidden) == (30, 576, 9, 3, 64, 1536)
    assert (c.rope_base, c.norm_eps, c.tie_embeddings, c.bias, c.block_size) == (100000.0, 1e-5, True, False, 8192)
    with torch.device("meta"):  # sizes only
        assert 134e6 < GPT(c).num_parameters() < 136e6  # the 135 M of its name
