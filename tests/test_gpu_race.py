"""The GPU race's parts on a CPU: nanoGPT's checkpoints become run folders that score as
the model they hold, and the race keeps, times and scores each side's checkpoints by one
rule. (nanoGPT's own source is not here: a stand-in in its layout plays it.)"""

import json
import math
import re

import pytest
import torch

from bench import gpu_race
from bench.nanogpt import char_tokenizer, read_checkpoint, to_run_folder
from runs.folder import RunDir

GPT2_LINEARS = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


def nanogpt_checkpoint(hf, bias: bool, vocab: int, block: int) -> dict:
    """What nanoGPT's train.py saves for the model `hf` holds: GPT-2's names, nn.Linear's
    layout (GPT-2's Conv1D weights transposed), torch.compile's prefix on every name."""
    state = {}
    for name, t in hf.state_dict().items():
        if re.search(r"\.attn\.(masked_)?bias$", name) or (not bias and name.endswith(".bias")):
            continue
        state["_orig_mod." + name] = t.t().contiguous() if name.endswith(GPT2_LINEARS) else t
    args = dict(n_layer=hf.config.n_layer, n_head=hf.config.n_head, n_embd=hf.config.n_embd, block_size=block,
                bias=bias, vocab_size=vocab, dropout=0.2)
    return {"model": state, "optimizer": {"state": {}, "param_groups": []}, "model_args": args, "iter_num": 250,
            "best_val_loss": torch.tensor(1.5), "config": {"dataset": "shakespeare_char", "compile": True}}


@pytest.mark.parametrize("bias", [True, False])
def test_a_nanogpt_checkpoint_scores_as_the_model_it_holds(tmp_path, corpus, bias):
    transformers = pytest.importorskip("transformers")
    text = corpus.read_text(encoding="utf-8")
    chars = sorted(set(text))
    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=len(chars), n_positions=16, n_layer=2, n_head=2, n_embd=32, activation_function="gelu",
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith(("mlp.c_fc.weight", "mlp.c_proj.weight")):
                p.mul_(30)  # the GELU's inputs where its exact form and the tanh one part, and their effect
            if not bias and name.endswith(".bias"):  # nanoGPT's bias=False: GPT-2's biases at zero
                p.zero_()
    torch.save(nanogpt_checkpoint(hf, bias, len(chars), 16), tmp_path / "ckpt.pt")
    model, tokenizer = RunDir(to_run_folder(read_checkpoint(tmp_path / "ckpt.pt"), text, tmp_path / "run")).load_model()
    assert model.config.bias is bias and model.config.vocab_size == len(chars)
    ids = tokenizer.encode(text[:16]).ids
    assert ids == [chars.index(ch) for ch in text[:16]]  # nanoGPT's ids: sorted(set(text))
    x = torch.tensor([ids])
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(x)[0], hf(x).logits, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match=f"has {len(chars)} characters, the text {len(chars) - 1}"):
        to_run_folder(read_checkpoint(tmp_path / "ckpt.pt"), text.replace(chars[-1], ""), tmp_path / "other")


def test_the_vocabulary_has_no_unknown_token():
    """An extra <unk> row would put its logit into every softmax of the converted model."""
    tokenizer = char_tokenizer("ba\nab")
    assert tokenizer.get_vocab() == {"\n": 0, "a": 1, "b": 2}
    assert tokenizer.decode(tokenizer.encode("a\nb").ids) == "a\nb"


def test_time_to_a_target_and_the_best_within_a_budget():
    rows = [{"seconds": 10, "nats_per_char": 2.0}, {"seconds": 20, "nats_per_char": 1.5},
            {"seconds": 30, "nats_per_char": 1.6}, {"seconds": 40, "nats_per_char": 1.4}]
    assert gpu_race.time_to(rows, 1.5) == 20 and gpu_race.time_to(rows, 1.55) == 20  # the first at or below
    assert gpu_race.time_to(rows, 1.45) == 40 and gpu_race.time_to(rows, 1.3) is None
    assert gpu_race.best_within(rows, 30) == 1.5 and gpu_race.best_within(rows, 40) == 1.4
    assert gpu_race.best_within(rows, 9) is None
    assert gpu_race.cap_for_ours(rows, 300) == max(gpu_race.MIN_CAP, 40)  # nanoGPT's best came at 40 s
    assert gpu_race.cap_for_ours([{**r, "seconds": 10 * r["seconds"]} for r in rows], 300) == 300  # best at 400 s
    assert gpu_race.cap_for_ours([{**r, "seconds": 10 * r["seconds"]} for r in rows], 999) == 400
    assert gpu_race.cap_for_ours([], 300) == 300  # nanoGPT kept nothing: the cap as given


STAND_IN_TRAIN = '''
import os, sys, time
import torch
import model  # the stand-in's own model.py: the project's `model` must not shadow it
assert model.STAND_IN
print("argv:", sys.argv[1:])
V = len(set(open("data/shakespeare_char/input.txt", encoding="utf-8").read()))
C, T = 16, 16
shapes = {"wte": (V, C), "wpe": (T, C), "h.0.ln_1": (C,), "h.0.attn.c_attn": (3 * C, C),
          "h.0.attn.c_proj": (C, C), "h.0.ln_2": (C,), "h.0.mlp.c_fc": (4 * C, C), "h.0.mlp.c_proj": (C, 4 * C),
          "ln_f": (C,)}
os.makedirs("out", exist_ok=True)
for iteration, scale in ((10, 1.0), (20, 0.0)):  # the second: all zeros, so every logit is 0
    time.sleep(0.1)
    state = {f"transformer.{name}.weight": torch.randn(shape) * scale for name, shape in shapes.items()}
    state["lm_head.weight"] = state["transformer.wte.weight"]
    torch.save({"model": state, "optimizer": {"state": {}}, "iter_num": iteration, "config": {},
                "best_val_loss": torch.tensor(9.0),
                "model_args": dict(n_layer=1, n_head=2, n_embd=C, block_size=T, bias=False, vocab_size=V,
                                   dropout=0.0)}, os.path.join("out", "ckpt.pt"))
print("ckpt.pt written:", os.path.exists(os.path.join("out", "ckpt.pt")))
'''


@pytest.mark.slow
def test_the_race_keeps_times_and_scores_each_side_by_one_rule(tmp_path, corpus, capsys):
    nanogpt = tmp_path / "nanoGPT"
    (nanogpt / "config").mkdir(parents=True)
    (nanogpt / "data" / "shakespeare_char").mkdir(parents=True)
    (nanogpt / "config" / "train_shakespeare_char.py").write_text("")
    (nanogpt / "data" / "shakespeare_char" / "prepare.py").write_text("assert open('input.txt').read()\n")
    (nanogpt / "model.py").write_text("STAND_IN = True\n")
    (nanogpt / "train.py").write_text(STAND_IN_TRAIN)
    out = tmp_path / "race.json"
    gpu_race.main(["--quick", "--nanogpt", str(nanogpt), "--data", str(corpus), "--out", str(out),
                   "--budget", "600", "--recipes", "tiny,train.max_iters=20"])
    race = json.loads(out.read_text())
    theirs, ours = race["sides"]["nanoGPT"], race["sides"]["tiny,train.max_iters=20"]
    assert theirs["returncode"] == ours["returncode"] == 0, theirs["log_tail"] + ours["log_tail"]
    assert "--eval_iters=1" in theirs["log_tail"] and "'config/train_shakespeare_char.py'" in theirs["log_tail"]
    assert "ckpt.pt written: False" in theirs["log_tail"]  # kept by iteration instead
    text = corpus.read_text(encoding="utf-8")
    val = len(text) - int(len(text) * 0.9)  # nanoGPT's split
    uniform = math.log(len(set(text))) * (val - 1) / val  # every logit 0; the first character has no score
    assert [r["iter"] for r in theirs["scores"]] == [10, 20] == [r["iter"] for r in ours["scores"]]
    assert theirs["scores"][1]["nats_per_char"] == pytest.approx(uniform, abs=1e-5)
    assert theirs["scores"][0]["nats_per_char"] > uniform + 0.1
    assert 0 < theirs["scores"][0]["seconds"] < theirs["scores"][1]["seconds"] < theirs["wall_seconds"]
    assert race["target_nats_per_char"] == theirs["scores"][1]["nats_per_char"]
    assert theirs["seconds_to_target"] == theirs["scores"][1]["seconds"] and theirs["speedup"] == 1.0
    first, last = (r["nats_per_char"] for r in ours["scores"])
    assert first != last  # each kept checkpoint is that iteration's weights, not the last ones
    assert ours["best_within_budget"] == min(first, last)
    shown = capsys.readouterr().out
    assert "| nanoGPT | " in shown and "| tiny,train.max_iters=20 | " in shown
