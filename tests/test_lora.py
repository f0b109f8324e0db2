"""LoRA adapters (lora/): the layer against peft's, merging, and a fine-tuning run that
trains the adapters alone, leaves the model it started from as it was, resumes exactly and
is opened by every program."""

import copy
import json

import pytest
import torch
import yaml
from safetensors.torch import load_file

import export
import train
from runs.folder import RunDir
from conftest import make_trainer, run_cli
from lora import LoRAConfig, add_adapters, merged, new_rows, trained_count, trained_parameters
from lora.adapters import TARGETS
from lora.adapters import adapted_layers
from model import GPT, GPTConfig
from test_chat import chat_run
from data.tasks import conversations, write

SETTINGS = dict(vocab_size=40, block_size=16, n_layer=2, n_head=4, n_kv_head=2, n_embd=32)


def with_random_updates(model: GPT) -> GPT:
    """B is zero at the start (the adapted model is the model); make every update count."""
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=generator) * 0.1)
    return model


@pytest.mark.parametrize("shape", [dict(), dict(mlp="swiglu", norm="rmsnorm", bias=False)])
def test_the_adapted_model_is_peft_s_on_the_same_weights(shape):
    peft = pytest.importorskip("peft")
    torch.manual_seed(0)
    base = GPT(GPTConfig(**SETTINGS, **shape)).eval()
    ours = with_random_updates(add_adapters(copy.deepcopy(base), LoRAConfig(rank=4, alpha=8)))
    targets = sorted({target for target, *_ in adapted_layers(base)})
    theirs = peft.get_peft_model(copy.deepcopy(base), peft.LoraConfig(r=4, lora_alpha=8, target_modules=targets)).eval()
    state = theirs.state_dict()
    with torch.no_grad():
        for name, p in ours.named_parameters():
            if "lora_" in name:  # transformer.h.0.attn.c_attn.lora_A -> ...c_attn.lora_A.default.weight
                state_name = f"base_model.model.{name}.default.weight"
                state[state_name].copy_(p)
    theirs.load_state_dict(state)
    x = torch.randint(0, SETTINGS["vocab_size"], (2, 12))
    with torch.no_grad():
        assert torch.allclose(ours(x)[0], theirs(x)[0], atol=1e-6)
        assert not torch.allclose(ours(x)[0], base(x)[0], atol=1e-3)  # the adapters do change it


def test_merging_gives_the_adapted_models_logits_and_a_plain_model():
    torch.manual_seed(0)
    adapted = with_random_updates(add_adapters(GPT(GPTConfig(**SETTINGS)), LoRAConfig(rank=4, alpha=8))).eval()
    plain = merged(adapted)
    assert not any("lora" in name for name in plain.state_dict())
    assert set(plain.state_dict()) == set(GPT(GPTConfig(**SETTINGS)).state_dict())
    x = torch.randint(0, SETTINGS["vocab_size"], (2, 12))
    with torch.no_grad():
        assert (adapted(x)[0] - plain(x)[0]).abs().max() < 1e-5
    assert not any(p.requires_grad for p in plain.parameters())  # (plain weights: nothing left to train)


def test_an_adapter_starts_as_nn_linear_starts_a_matrix_and_new_rows_train_alone():
    """A starts as nn.Linear (and peft) start a matrix (Kaiming-uniform with a = √5), B at
    zero; train_rows passes the new rows' gradient as it is, in the weight's dtype, and
    zeroes the others'."""
    from lora import LoRALinear
    from lora.adapters import train_rows

    linear = torch.nn.Linear(24, 40)
    torch.manual_seed(3)
    layer = LoRALinear(linear, rank=4, alpha=8, dropout=0.0)
    torch.manual_seed(3)
    assert torch.equal(layer.lora_A, torch.nn.Linear(24, 4, bias=False).weight)
    assert not layer.lora_B.any() and layer.bias is linear.bias
    for dtype in (torch.float32, torch.bfloat16):
        weight = torch.nn.Parameter(torch.randn(10, 6, dtype=dtype))
        train_rows(weight, 7)
        upstream = torch.randn(10, 6, dtype=dtype)
        (weight * upstream).sum().backward()
        assert weight.grad.dtype == dtype and not weight.grad[:7].any()
        assert torch.equal(weight.grad[7:], upstream[7:])


def test_the_adapters_saved_load_back_and_no_others_do():
    """adapter_state / load_adapter_state (a resume): the trained tensors come back in
    place; a state missing one, or holding one the model does not train, is refused by name."""
    from lora import adapter_state, load_adapter_state

    torch.manual_seed(0)
    saved = with_random_updates(add_adapters(GPT(GPTConfig(**SETTINGS)), LoRAConfig(rank=4)))
    names = list(trained_parameters(saved))
    state = adapter_state(saved, names)
    assert sorted(state) == sorted(names)
    fresh = add_adapters(GPT(GPTConfig(**SETTINGS)), LoRAConfig(rank=4))
    frozen = {name: t.clone() for name, t in fresh.state_dict().items() if name not in names}
    load_adapter_state(fresh, state, names)
    assert all(torch.equal(fresh.state_dict()[name], saved.state_dict()[name]) for name in names)
    assert all(torch.equal(fresh.state_dict()[name], t) for name, t in frozen.items())
    with pytest.raises(ValueError, match=r"missing \['transformer.h.0.attn.c_attn.lora_A'\], unexpected \[\]"):
        load_adapter_state(fresh, {k: v for k, v in state.items() if k != names[0]}, names)
    with pytest.raises(ValueError, match=r"missing \[\], unexpected \['transformer.wte.weight'\]"):
        load_adapter_state(fresh, {**state, "transformer.wte.weight": fresh.transformer.wte.weight}, names)


def test_only_the_adapters_train_and_the_rank_counts():
    torch.manual_seed(0)
    base = GPT(GPTConfig(**SETTINGS)).eval()
    model = add_adapters(copy.deepcopy(base), LoRAConfig(rank=4, targets=["attn.c_attn"]))
    x = torch.randint(0, SETTINGS["vocab_size"], (2, 12))
    with torch.no_grad():
        assert torch.equal(model(x)[0], base(x)[0])  # B starts at zero: the adapted model starts as the model
    trained = trained_parameters(model)
    assert sorted(trained) == [f"transformer.h.{i}.attn.c_attn.lora_{m}" for i in range(2) for m in "AB"]
    C, kv = 32, 2 * 2 * 8  # c_attn: [C + 2 H_kv d_k, C]
    assert sum(p.numel() for p in trained.values()) == trained_count(model, {}) == 2 * (4 * C + (C + kv) * 4)
    config = LoRAConfig(rank=4, targets=["attn.c_attn"])
    grown = GPT(GPTConfig(**SETTINGS))
    rows = new_rows(grown, config, new_tokens_from=36)
    assert rows == {"transformer.wte.weight": 36}  # (the tied head is the embedding: one matrix)
    add_adapters(grown, config, new_tokens_from=36)
    assert trained_count(grown, rows) == 2 * (4 * C + (C + kv) * 4) + 4 * C  # and the 4 new rows of the embedding
    with pytest.raises(ValueError, match=r"lora.targets=\['attn.c_q'\]: each must be one of attn.c_attn, attn.c_proj, "
                                         "mlp.c_fc, mlp.c_gate, mlp.c_proj"):
        LoRAConfig(rank=4, targets=["attn.c_q"])
    with pytest.raises(ValueError, match=r"lora.rank=-1: must be 0 \(off\) or more, e.g. 8"):
        LoRAConfig(rank=-1)
    with pytest.raises(ValueError, match=r"lora.dropout=1.0: must be in \[0, 1\)"):
        LoRAConfig(rank=4, dropout=1.0)
    assert LoRAConfig(rank=4, alpha=0.5, dropout=0.99).alpha == 0.5  # (any positive α; any dropout below 1)


@pytest.mark.parametrize("whole", [["lm_head"], []])
def test_a_head_trained_whole_decays_as_a_matrix_and_new_rows_never_decay(whole):
    """The optimizers' groups with adapters (training/trained.py): the adapters and an untied head
    trained whole (lora.modules_to_save) take weight decay as matrices do; a head whose new
    tokens' rows alone train does not (decay would move its other rows), nor do norms or embeddings."""
    from training.trained import groups_of

    model = GPT(GPTConfig(**SETTINGS, tie_embeddings=False))
    config = LoRAConfig(rank=4, targets=["attn.c_attn"], modules_to_save=whole)
    rows = new_rows(model, config, new_tokens_from=36)
    add_adapters(model, config, new_tokens_from=36)
    groups = groups_of(model, [], rows)
    names = {id(p): name for name, p in model.named_parameters()}
    adapters = {f"transformer.h.{i}.attn.c_attn.lora_{m}" for i in range(2) for m in "AB"}
    assert {names[id(p)] for p in groups.decayed} == adapters | ({"lm_head.weight"} if whole else set())
    assert {names[id(p)] for p in groups.rest} == {"transformer.wte.weight"} | ({"lm_head.weight"} - {
        names[id(p)] for p in groups.decayed})
    assert not groups.blocks  # (no Muon for adapters)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A base run on sums as plain text; then, from it, LoRA on the same sums as conversations."""
    tmp = tmp_path_factory.mktemp("lora")
    records = conversations("add", 400, seed=0)
    (tmp / "sums.txt").write_text("".join(f"{r['messages'][0]['content']}{r['messages'][1]['content']}\n"
                                          for r in records), encoding="utf-8")
    write(tmp / "add.jsonl", records)
    assert train.main(chat_run(tmp, f"data.source={tmp / 'sums.txt'}", "model.n_layer=2", "train.max_iters=30",
                               out="base")) == 0
    return tmp


def lora_run(tmp, *extra, out="lora"):
    return chat_run(tmp, f"train.init_from={tmp / 'base'}", "model.n_layer=2", "lora.rank=4", "lora.dropout=0.1",
                    *extra, out=out)


def test_a_lora_run_trains_the_adapters_and_the_new_tokens_rows_only(runs):
    """With tiny.yaml's optimizer (Muon), the adapters train with AdamW; every weight of the
    model brought in, old embedding rows included, stays bit for bit; the trainer state and
    the average hold the trained tensors only."""
    trainer = make_trainer(lora_run(runs, "data.tokenizer=bpe", "data.vocab_size=999", out="trainer")[2:])
    base, _ = RunDir(runs / "base").load_model()
    assert [type(o).__name__ for o in trainer.optimizers] == ["AdamW"]
    assert trainer.fit() == 0
    # config.yaml says what was used: AdamW, and the base's char tokenizer with its markers added
    used = yaml.safe_load((runs / "trainer" / "config.yaml").read_text())
    assert used["train"]["optimizer"] == "adamw"
    assert (used["data"]["tokenizer"], used["data"]["vocab_size"]) == ("char", trainer.model.config.vocab_size)
    model = trainer.model
    for name, weight in base.state_dict().items():
        ours = model.state_dict()[name]
        assert torch.equal(ours[:weight.size(0)], weight), name  # (the embedding: its old rows)
    vocab = base.config.vocab_size
    assert not torch.equal(model.transformer.wte.weight[vocab:], base.transformer.wte.weight.mean(0).expand(5, -1))
    assert any(p.abs().sum() > 0 for name, p in model.named_parameters() if "lora_B" in name)
    state = torch.load(runs / "trainer" / "trainer_state.pt", weights_only=True)
    adapters = [name for name in model.state_dict() if "lora_A" in name or "lora_B" in name]
    assert len(adapters) == 2 * 4 * model.config.n_layer  # A and B beside W_QKV, W_O, W_1, W_2 of each block
    expected = sorted([*adapters, "transformer.wte.weight"])  # (the markers' rows: the whole matrix is saved)
    assert sorted(state["model"]) == sorted(state["average"]) == expected
    saved = load_file(runs / "trainer" / "adapter_model.safetensors")  # of the embedding, the new rows alone
    assert sorted(saved) == expected
    assert torch.equal(saved["transformer.wte.weight"], trainer.eval_model.transformer.wte.weight[vocab:])
    assert json.loads((runs / "trainer" / "adapter_config.json").read_text())["rows_from"] == {
        "transformer.wte.weight": vocab}


def test_a_bfloat16_base_keeps_the_frozen_matrices_in_half_the_memory_with_the_same_results(runs, capsys):
    """train.base_dtype=bfloat16: the adapted layers' frozen matrices are kept in bfloat16 (half
    the bytes), training under bfloat16 autocast is that of float32 kept weights, and the
    saved model is float32, the adapters merged; it needs LoRA and bfloat16."""
    kept = make_trainer(lora_run(runs, "train.dtype=bfloat16", "lora.dropout=0", out="kept")[2:], torch.bfloat16)
    halved = make_trainer(lora_run(runs, "train.dtype=bfloat16", "lora.dropout=0", "train.base_dtype=bfloat16",
                                   out="halved")[2:], torch.bfloat16)
    frozen = [(name, p) for name, p in halved.model.named_parameters() if not p.requires_grad and p.dim() == 2
              and "wte" not in name and "lm_head" not in name]
    assert frozen and all(p.dtype == torch.bfloat16 for _, p in frozen)
    kept_bytes = sum(p.numel() * p.element_size() for p in kept.model.parameters())
    halved_bytes = sum(p.numel() * p.element_size() for p in halved.model.parameters())
    assert kept_bytes - halved_bytes == sum(p.numel() * 2 for _, p in frozen)
    for trainer in (kept, halved):
        assert trainer.fit() == 0
    capsys.readouterr()
    assert kept.val_loss == halved.val_loss  # the same computation, step for step: the same adapters
    trained = trained_parameters(kept.model)
    assert all(torch.equal(p, trained_parameters(halved.model)[name]) for name, p in trained.items())
    saved = load_file(runs / "halved" / "model.safetensors")
    assert all(t.dtype == torch.float32 for t in saved.values())
    assert train.main(lora_run(runs, "train.base_dtype=bfloat16", "train.dtype=float32", out="refused")) == 2
    assert "train.base_dtype=bfloat16 keeps LoRA's frozen matrices in bfloat16, which needs" in capsys.readouterr().err


@pytest.mark.slow  # (three runs and four programs: about ten seconds)
def test_a_lora_run_resumes_exactly_and_every_program_opens_it(runs, tmp_path):
    assert train.main(lora_run(runs, out="straight")) == 0
    assert train.main(lora_run(runs, "train.max_iters=10", out="resumed")) == 0
    assert train.main(lora_run(runs, out="resumed")) == 0
    for name in ("model.safetensors", "adapter_model.safetensors"):
        straight, resumed = (load_file(runs / run / name) for run in ("straight", "resumed"))
        assert all(torch.equal(straight[k], resumed[k]) for k in straight), name
    run = runs / "straight"
    config = json.loads((run / "adapter_config.json").read_text())
    assert config["r"] == 4 and config["base_model_name_or_path"] == str(runs / "base")
    # model.safetensors is the model with the adapters merged: the adapted model's logits
    trainer = make_trainer(lora_run(runs, out="straight")[2:])  # resumes at the end: base + saved adapters
    saved, _ = RunDir(run).load_model()
    x = torch.randint(0, saved.config.vocab_size, (2, 12))
    with torch.no_grad():
        assert (trainer.eval_model.eval()(x)[0] - saved.eval()(x)[0]).abs().max() < 1e-5
    for command in (["generate.py", "--checkpoint", str(run), "--prompt", "12+30=", "--max-new-tokens", "3"],
                    ["evaluate.py", "--checkpoint", str(run), "--split", "val"],
                    ["explore.py", "--checkpoint", str(run), "--prompt", "12+30=", "--out", str(tmp_path / "e.html")],
                    ["export.py", "--checkpoint", str(run), "--out", str(tmp_path / "hf")]):
        out = run_cli(*command)
        assert out.returncode == 0, out.stderr
    exported = load_file(tmp_path / "hf" / "model.safetensors")
    assert not any("lora" in name for name in exported)


SHAPES = {"gpt2": ["model.pos_encoding=learned"], "gpt_neox": [],
          "llama": ["model.norm=rmsnorm", "model.mlp=swiglu", "model.bias=false", "model.tie_embeddings=false"],
          "qwen2": ["model.norm=rmsnorm", "model.mlp=swiglu", "model.bias=false", "model.qkv_bias=true"],
          "qwen3": ["model.norm=rmsnorm", "model.mlp=swiglu", "model.bias=false", "model.qk_norm=true", "model.head_dim=24"]}


@pytest.mark.parametrize("kind", [pytest.param("gpt2", marks=pytest.mark.slow), "gpt_neox", "llama",
                                  pytest.param("qwen2", marks=pytest.mark.slow),
                                  pytest.param("qwen3", marks=pytest.mark.slow)])
def test_the_adapters_export_as_peft_s_over_the_base_with_the_merged_logits(runs, tmp_path, kind):
    """export.py --adapters: peft's PeftModel over base/ (train.init_from's model, exported)
    computes the merged export's logits, for each kind the export writes: GPT-2's fused
    Conv1D, GPT-NeoX's per-head rows, Llama's (and a Qwen2 written as Llama's, and Qwen3's,
    its heads 24 wide in a stream of 32) q, k and v split, with two query heads a key/value head; the chat markers' trained rows as
    trainable tokens (an untied head's too)."""
    peft = pytest.importorskip("peft")
    transformers = pytest.importorskip("transformers")
    shape = ["model.n_layer=2", *SHAPES[kind]]
    assert train.main(chat_run(tmp_path, f"data.source={runs / 'sums.txt'}", *shape, out="base")) == 0
    assert train.main(chat_run(tmp_path, f"train.init_from={tmp_path / 'base'}", *shape, "lora.rank=4",
                               "train.lr=0.01", data=runs / "add.jsonl", out="lora")) == 0
    run = str(tmp_path / "lora")
    assert export.main(["--checkpoint", run, "--out", str(tmp_path / "merged")]) == 0
    assert export.main(["--checkpoint", run, "--out", str(tmp_path / "peft"), "--adapters"]) == 0
    merged = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "merged").eval()
    assert (f"fine-tuned from `{tmp_path / 'base'}` with LoRA adapters of rank 4 (α = 16.0), merged into the "
            "weights here") in (tmp_path / "merged" / "README.md").read_text()
    base = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "peft" / "base").eval()
    x = torch.randint(0, merged.config.vocab_size, (2, 16))
    x[:, :5] = torch.arange(merged.config.vocab_size - 5, merged.config.vocab_size)  # (the markers)
    with torch.no_grad():
        before = base(x).logits
        # base/ is the model brought in (to float32's rounding), grown by the markers' rows, each the mean
        brought, _ = RunDir(tmp_path / "base").load_model()
        old = torch.randint(0, brought.config.vocab_size, (2, 16))
        torch.testing.assert_close(base(old).logits[..., :brought.config.vocab_size], brought.eval()(old)[0],
                                   atol=1e-5, rtol=0)
        rows = base.get_input_embeddings().weight
        assert torch.equal(rows[brought.config.vocab_size:], rows[:brought.config.vocab_size].mean(0).expand(5, -1))
        adapted = peft.PeftModel.from_pretrained(base, tmp_path / "peft").eval()
        torch.testing.assert_close(adapted(x).logits, merged(x).logits, atol=2e-5, rtol=0)
        assert (before - merged(x).logits).abs().max() > 1e-2  # (adapters that change the model)
    config = json.loads((tmp_path / "peft" / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str((tmp_path / "peft" / "base").resolve())
    markers = {"trainable_token_indices": {"wte" if kind == "gpt2" else "embed_in" if kind == "gpt_neox"
                                           else "embed_tokens": list(range(merged.config.vocab_size - 5,
                                                                           merged.config.vocab_size))}}
    if kind == "llama":
        markers["trainable_token_indices"]["lm_head"] = markers["trainable_token_indices"]["embed_tokens"]
    assert config.items() >= markers.items()
    assert export.main(["--checkpoint", str(tmp_path / "base"), "--out", str(tmp_path / "none"), "--adapters"]) == 2
    assert not (tmp_path / "none").exists()
    settings = json.loads((tmp_path / "lora" / "adapter_config.json").read_text())  # as the first LoRA runs wrote it
    del settings["rows_from"]
    (tmp_path / "lora" / "adapter_config.json").write_text(json.dumps(settings))
    assert export.main(["--checkpoint", run, "--out", str(tmp_path / "old"), "--adapters"]) == 2
    assert not (tmp_path / "old").exists()


def test_a_lora_run_on_plain_text_trains_the_adapters_alone(runs):
    """No chat markers were added: no embedding row trains, and the adapter file holds no
    embedding."""
    trainer = make_trainer(lora_run(runs, f"data.source={runs / 'sums.txt'}", "train.max_iters=2", out="plain")[2:])
    assert trainer.trained.names and all("lora_" in name for name in trainer.trained.names)
    assert trainer.trained.rows_from == {}


def test_lora_needs_a_model_to_adapt(runs):
    out = run_cli("train.py", *chat_run(runs, "lora.rank=4", out="nothing"))
    assert out.returncode == 2 and "set train.init_from" in out.stderr.splitlines()[-1]


def test_every_list_setting_comes_in_from_yaml_and_from_the_command_line(tmp_path):
    """A list-typed field of any section (lora.targets today) is read from a YAML file and
    from a key=value override, and a wrong one is refused by name (it crashed with
    KeyError: 'list[str]')."""
    import dataclasses

    from training.config import SECTIONS, ConfigError, load_config

    listed = [(section, f.name) for section, cls in SECTIONS.items() for f in dataclasses.fields(cls)
              if str(f.type).startswith("list")]
    assert ("lora", "targets") in listed
    config = tmp_path / "run.yaml"
    config.write_text("lora:\n  rank: 4\n  targets: [attn.c_attn, attn.c_proj]\n")
    assert load_config(config, []).lora.targets == ["attn.c_attn", "attn.c_proj"]
    assert load_config(config, ["lora.targets=[mlp.c_fc]"]).lora.targets == ["mlp.c_fc"]
    for bad, said in (("lora.targets=attn.c_attn", "must be a list of strings"), ("lora.targets=[1, 2]", "must be a list"),
                      ("lora.targets=[attn.c_q]", "each must be one of")):
        with pytest.raises(ConfigError, match=said):
            load_config(config, [bad])


@pytest.mark.parametrize("kind", ["llama", "gpt_neox", pytest.param("gpt2", marks=pytest.mark.slow)])
def test_modules_to_save_train_whole_resume_exactly_and_export_as_peft_keeps_them(runs, tmp_path, kind):
    """lora.modules_to_save: the head, the final norm and each block's first norm train whole
    beside the adapters (the rest of the model brought in stays as it was); a run stopped half
    way and resumed ends with the same tensors; export.py --adapters writes them as peft's
    modules_to_save (a tied head with its embedding, one matrix), base/ holding them as they
    started, and peft over base/ computes the merged export's logits."""
    peft = pytest.importorskip("peft")
    transformers = pytest.importorskip("transformers")
    shape = ["model.n_layer=2", *SHAPES[kind]]
    assert train.main(chat_run(tmp_path, f"data.source={runs / 'sums.txt'}", *shape, out="base")) == 0
    whole = ["lora.modules_to_save=[lm_head,ln_f,ln_1]", "lora.rank=4", "train.lr=0.01", "lora.dropout=0.1"]

    def lora(*extra, out):
        return chat_run(tmp_path, f"train.init_from={tmp_path / 'base'}", *shape, *whole, *extra,
                        data=runs / "sums.txt", out=out)

    assert train.main(lora(out="straight")) == 0
    assert train.main(lora("train.max_iters=10", out="resumed")) == 0
    assert train.main(lora(out="resumed")) == 0
    for name in ("model.safetensors", "adapter_model.safetensors"):
        straight, resumed = (load_file(tmp_path / run / name) for run in ("straight", "resumed"))
        assert sorted(straight) == sorted(resumed) and all(torch.equal(straight[k], resumed[k]) for k in straight)
    trained = load_file(tmp_path / "straight" / "adapter_model.safetensors")
    head = "transformer.wte.weight" if kind != "llama" else "lm_head.weight"  # (GPT-2's and GPT-NeoX's head is tied)
    wanted = {head, "transformer.ln_f.weight", *(f"transformer.h.{i}.ln_1.weight" for i in range(2))}
    assert wanted <= set(trained) and all("lora_" in name or name in wanted or name.endswith(".bias")
                                          for name in trained)
    brought, _ = RunDir(tmp_path / "base").load_model()
    merged_run, _ = RunDir(tmp_path / "straight").load_model()
    for name, weight in brought.state_dict().items():
        changed = not torch.equal(merged_run.state_dict()[name], weight)
        adapted = name.endswith(".weight") and any(f".{target}." in name for target in TARGETS)
        assert changed == (name in wanted or adapted or name.removesuffix(".bias") + ".weight" in wanted
                           or (kind != "llama" and name == "lm_head.weight")), name
    run = str(tmp_path / "straight")
    assert export.main(["--checkpoint", run, "--out", str(tmp_path / "merged")]) == 0
    assert export.main(["--checkpoint", run, "--out", str(tmp_path / "peft"), "--adapters"]) == 0
    config = json.loads((tmp_path / "peft" / "adapter_config.json").read_text())
    norms = {"llama": ["model.norm", "model.layers.0.input_layernorm", "model.layers.1.input_layernorm"],
             "gpt_neox": ["gpt_neox.final_layer_norm", "gpt_neox.layers.0.input_layernorm",
                          "gpt_neox.layers.1.input_layernorm"],
             "gpt2": ["transformer.ln_f", "transformer.h.0.ln_1", "transformer.h.1.ln_1"]}[kind]
    heads = {"llama": ["lm_head"], "gpt_neox": ["lm_head", "gpt_neox.embed_in"],
             "gpt2": ["lm_head", "transformer.wte"]}[kind]
    assert sorted(config["modules_to_save"]) == sorted(norms + heads)
    merged = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "merged").eval()
    base = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "peft" / "base").eval()
    x = torch.randint(0, merged.config.vocab_size, (2, 16))
    with torch.no_grad():
        torch.testing.assert_close(base(x).logits, brought.eval()(x)[0], atol=1e-5, rtol=0)  # (as they started)
        adapted = peft.PeftModel.from_pretrained(base, tmp_path / "peft").eval()
        torch.testing.assert_close(adapted(x).logits, merged(x).logits, atol=2e-5, rtol=0)
    if kind != "llama":  # a tied head stays one matrix with its embedding in peft too (ensure_weight_tying)
        copies = [module.modules_to_save["default"].weight
                  for module in (adapted.get_input_embeddings(), adapted.base_model.model.lm_head)]
        assert copies[0] is copies[1]
    with pytest.raises(ValueError, match=r"lora.modules_to_save=\['attn'\]: a list of modules that train whole"):
        LoRAConfig(rank=4, modules_to_save=["attn"])
