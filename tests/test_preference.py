"""Preference tuning (issue 77): pairs read in trl's layouts and checked, DPO's loss by its
definition, a run's first steps equal to trl's DPOTrainer on the same model and pairs, the
reference (a frozen copy, or the model with its adapters off), resume, and evaluate.py on pairs."""

import collections
import json
import math
import random

import pytest
import torch

import evaluate
from conftest import ROOT, run_cli
from data.config import DataConfig
from data.conversations import BadRecord, Skipped, checked_records
from data.preferences import PAIRS, Pair, encode_pair, pair, preference_source
from data.tasks import conversations
from data.tokenizer import train_tokenizer
from jobs.dpo import DPO, DPOConfig, answer_logps, dpo_loss, shared_rows, side_logps

USER = [{"role": "user", "content": "11+10="}]


def answer(text):
    return [{"role": "assistant", "content": text}]


@pytest.mark.parametrize("record, expected", [
    ({"prompt": USER, "chosen": answer("21"), "rejected": answer("20")}, Pair(USER, answer("21"), answer("20"))),
    ({"chosen": USER + answer("21"), "rejected": USER + answer("20")}, Pair(USER, answer("21"), answer("20"))),
    ({"prompt": "11+10=", "chosen": "21", "rejected": "20"}, Pair("11+10=", "21", "20")),
    ({"chosen": "The sky is blue.", "rejected": "The sky is green."}, Pair("The sky is", " blue.", " green.")),
])
def test_pairs_are_read_in_the_layouts_trl_reads(record, expected):
    """Explicit and implicit prompts, conversational and standard: the prompt, chosen and
    rejected trl's extract_prompt finds (a space before the first difference goes with the answers)."""
    assert pair(record, "here") == expected
    trl = pytest.importorskip("trl.data_utils")
    if "prompt" not in record:
        assert trl.extract_prompt(record) == {"prompt": expected.prompt, "chosen": expected.chosen,
                                              "rejected": expected.rejected}


@pytest.mark.parametrize("record, reason", [
    ({"prompt": "a", "chosen": "b"}, "with a side missing"),
    ({"prompt": "a", "chosen": "", "rejected": "c"}, "with a side missing"),
    ({"prompt": "a", "chosen": "b", "rejected": "b"}, "with chosen equal to rejected"),
    ({"chosen": "yes", "rejected": "no"}, "whose sides share no prompt"),
    ({"prompt": "a", "chosen": answer("b"), "rejected": "c"}, "with sides of different kinds"),
    ({"prompt": USER, "chosen": USER, "rejected": answer("x")}, "with an answer that is not the assistant's"),
    ({"prompt": [{"role": "robot", "content": "?"}], "chosen": answer("a"), "rejected": answer("b")},
     "with a message that has no role or text"),
    ([1, 2], "not a JSON object"),
])
def test_a_bad_pair_is_named_and_counted_by_its_reason(record, reason):
    with pytest.raises(BadRecord) as caught:
        pair(record, "pairs.jsonl, line 7")
    assert caught.value.reason == reason and "pairs.jsonl, line 7" in str(caught.value)
    skipped = Skipped(0.5, plural="pairs")
    good = {"prompt": "a", "chosen": "b", "rejected": "c"}
    kept = list(checked_records([("1", good), ("2", record), ("3", good)], skipped, PAIRS))
    assert [where for where, _ in kept] == ["1", "3"] and skipped.reasons == {reason: 1}


def test_a_source_of_pairs_skips_its_bad_ones_up_to_the_share_allowed(tmp_path):
    lines = [{"prompt": "1+1=", "chosen": "2", "rejected": "3"}] * 8 + [{"prompt": "x", "chosen": "y", "rejected": "y"}]
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    source = preference_source(DataConfig(source=str(path), val_fraction=0.25, skip_bad_records=0.2))
    assert len(list(source.train())) == 6 and len(list(source.val())) == 2
    assert source.skipped.count == 1 and "chosen equal to rejected" in source.skipped.said()
    with pytest.raises(Exception, match="1 of 9 pairs are bad, more than data.skip_bad_records=0.1 lets"):
        list(preference_source(DataConfig(source=str(path), skip_bad_records=0.1)).train())


def test_a_pair_is_two_sequences_with_one_prompt_and_each_answer_flagged():
    """Conversational: the template's rendering, the answer's tokens those of the assistant's
    turn after the prompt (its end-of-turn token included); standard: the text, the answer
    ended by the end-of-text token."""
    tokenizer = train_tokenizer("bpe", ["11+10=21\n", "12+7=19\n"], 300)
    from data.template import chat_tokenizer, template_for
    chat = chat_tokenizer(tokenizer)
    template = template_for(chat)
    (chosen, chosen_mask), (rejected, rejected_mask) = encode_pair(
        chat, template, Pair(USER + answer("hm") + USER, answer("21"), answer("20")))
    prompt = len(chosen) - int(chosen_mask.sum())
    assert (chosen[:prompt] == rejected[:prompt]).all() and not chosen_mask[:prompt].any()
    assert chat.decode(chosen[prompt:].tolist(), skip_special_tokens=False).startswith("21")
    (ids, mask), _ = encode_pair(tokenizer, None, Pair("11+10=", "21", "20"))
    assert tokenizer.decode(ids[mask == 1].tolist(), skip_special_tokens=False) == "21<|endoftext|>"
    assert tokenizer.decode(ids[mask == 0].tolist()) == "11+10="


def test_dpos_loss_is_its_definition():
    """−log σ(β ((π_w − ref_w) − (π_l − ref_l))): ln 2 where the policy is the reference; the
    rewards β (π − ref), their margin, the share ranked right; IPO's square of the per-token
    margin less 1/(2β)."""
    policy = torch.tensor([-3.0, -5.0, -4.0, -2.0])  # chosen 1, 2; rejected 1, 2
    loss, figures = dpo_loss(policy, policy.clone(), torch.ones(4), beta=0.1)
    assert loss.item() == pytest.approx(math.log(2)) and figures["rewards/margins"] == 0
    reference = torch.tensor([-4.0, -5.0, -4.0, -1.0])
    loss, figures = dpo_loss(policy, reference, torch.ones(4), beta=0.5)
    margins = [0.5 * ((-3 + 4) - 0), 0.5 * (0 - (-2 + 1))]  # 0.5, 0.5
    assert loss.item() == pytest.approx(sum(-math.log(1 / (1 + math.exp(-m))) for m in margins) / 2)
    assert figures["rewards/chosen"].item() == pytest.approx((0.5 + 0) / 2)
    assert figures["rewards/rejected"].item() == pytest.approx((0 - 0.5) / 2)
    assert figures["rewards/accuracies"].item() == 1.0 and figures["logps/rejected"].item() == -3.0
    lengths = torch.tensor([2.0, 1.0, 4.0, 1.0])
    ipo, _ = dpo_loss(policy, reference, lengths, beta=0.5, kind="ipo")
    per_token = [(1 / 2 - 0 / 4), (0 / 1 - (-1) / 1)]
    assert ipo.item() == pytest.approx(sum((m - 1.0) ** 2 for m in per_token) / 2)


def test_the_answers_log_probabilities_are_the_scored_targets_alone():
    logits = torch.randn(2, 4, 5)
    y = torch.tensor([[-100, 1, 2, -100], [3, -100, -100, -100]])
    logps, lengths = answer_logps(logits, y)
    by_hand = [torch.log_softmax(logits[0, 1], -1)[1] + torch.log_softmax(logits[0, 2], -1)[2],
               torch.log_softmax(logits[1, 0], -1)[3]]
    assert logps.tolist() == pytest.approx([t.item() for t in by_hand]) and lengths.tolist() == [2, 1]


def test_each_pairs_prompt_is_run_once_and_each_answer_scored_as_if_alone():
    """One row a pair (the prompt, the chosen answer, the rejected one beside it, unseen by it):
    every answer's log-probability equals that of its own side run alone, whatever the
    prompts' and answers' lengths, where the answers start alike, and with learned positions too."""
    from data.batches import in_memory, pair_batch
    from model import GPT, GPTConfig

    rng = torch.Generator().manual_seed(0)
    sequences = []
    for prompt, chosen, rejected, alike in ((5, 3, 4, 0), (2, 6, 1, 0), (7, 2, 2, 1), (3, 4, 4, 3)):
        start = torch.randint(1, 30, (prompt,), generator=rng)
        answers = [torch.randint(1, 30, (n,), generator=rng) for n in (chosen, rejected)]
        answers[1][:alike] = answers[0][:alike]  # (the answers may start with the same tokens)
        for answer in answers:
            ids = torch.cat([start, answer])
            sequences.append((ids.numpy(), (torch.arange(len(ids)) >= prompt).to(torch.uint8).numpy()))
    x, y, _ = pair_batch(in_memory(sequences), range(4), 16)
    for pos_encoding in ("rope", "learned"):
        torch.manual_seed(1)
        model = GPT(GPTConfig(vocab_size=32, block_size=16, n_layer=2, n_head=2, n_embd=16,
                              pos_encoding=pos_encoding)).eval()
        with torch.no_grad():
            shared, lengths = side_logps(model, shared_rows(x, y))
            alone = [answer_logps(model(x[:, side])[0], y[:, side])[0] for side in (0, 1)]
        assert shared.tolist() == pytest.approx(torch.cat(alone).tolist(), abs=1e-4)
        assert lengths.tolist() == [3, 6, 2, 4, 4, 1, 2, 4]
    assert shared_rows(x, y).x.size(1) < 2 * x.size(2)  # (fewer tokens than the two rows)


# ---- runs -------------------------------------------------------------------------------------------

SETTINGS = ["model.n_layer=1", "model.n_head=2", "model.n_kv_head=2", "model.bias=true", "model.n_embd=32",
            "model.block_size=16", "model.dropout=0.0", "train.eval_interval=10", "train.eval_windows=100",
            "train.sample_tokens=0", "train.dtype=float32", "train.threads=1", "train.max_minutes=null",
            "train.snapshots=0"]


def sums_and_pairs(folder, count=40, conversational=False):
    """A text of sums to pretrain a base on, and pairs of sums: the right one chosen, one 1 or 10 off rejected."""
    rng = random.Random(1)
    records = conversations("add", 400, seed=0)
    (folder / "sums.txt").write_text("".join(r["messages"][0]["content"] + r["messages"][1]["content"] + "\n"
                                             for r in records))
    lines = []
    for r in conversations("add", count, seed=2):
        question, right = r["messages"][0]["content"], r["messages"][1]["content"]
        wrong = str(int(right) + rng.choice([-10, -1, 1, 10]))
        lines.append({"prompt": [{"role": "user", "content": question}], "chosen": answer(right),
                      "rejected": answer(wrong)} if conversational else {"prompt": question, "chosen": right,
                                                                          "rejected": wrong})
    (folder / "pairs.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return lines


def config(folder, *extra):
    return ["--config", str(ROOT / "configs" / "tiny.yaml"), f"data.cache_dir={folder / 'cache'}", *SETTINGS, *extra]


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A base of one layer pretrained a few steps on sums (a byte-level BPE, which has an
    end-of-text token; biases everywhere and a key/value head a head, as GPT-NeoX has them)."""
    import train

    folder = tmp_path_factory.mktemp("preference")
    sums_and_pairs(folder)
    assert train.main(config(folder, f"data.source={folder / 'sums.txt'}", f"out_dir={folder / 'base'}",
                             "data.tokenizer=bpe", "data.vocab_size=300", "train.max_iters=4")) == 0
    return folder


# the same update as trl's: AdamW alone, a constant rate, no decay, no clipping, no average
SAME_AS_TRL = ["train.optimizer=adamw", "train.lr=1e-3", "train.min_lr=1e-3", "train.warmup_iters=0",
               "train.weight_decay=0", "train.beta2=0.999", "train.grad_clip=0", "train.ema=0", "train.log_interval=1",
               "data.val_fraction=0.1", "train.batch_size=36"]


def dpo_run(folder, out, *extra):
    return config(folder, f"data.source={folder / 'pairs.jsonl'}", f"out_dir={folder / out}",
                  f"train.init_from={folder / 'base'}", *SAME_AS_TRL, *extra)


def logged(run) -> list[dict]:
    return [line for line in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if "train/loss" in line]


FIGURES = ["loss", "rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies", "logps/chosen",
           "logps/rejected"]


@pytest.mark.slow  # (a base, its export, three steps here and three in trl: about 20 seconds)
def test_the_first_steps_equal_trls_dpo_trainer(base, tmp_path):
    """The base exported to transformers and tuned by trl's DPOTrainer on the same 36 pairs (one
    batch of them all, so the order of drawing does not matter), the same AdamW: the first
    step's loss is ln 2 (the policy is the reference) and every step's loss, rewards, margin,
    share ranked right and log-probabilities are trl's."""
    trl = pytest.importorskip("trl")
    import datasets
    import transformers

    import train

    assert train.main(dpo_run(base, "ours", "train.max_iters=3")) == 0
    ours = logged(base / "ours")
    exported = run_cli("export.py", "--checkpoint", str(base / "base"), "--out", str(tmp_path / "hf"))
    assert exported.returncode == 0, exported.stderr
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    tokenizer.pad_token = tokenizer.eos_token
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32)
    pairs = [json.loads(line) for line in (base / "pairs.jsonl").read_text().splitlines()][:36]  # the training split
    settings = trl.DPOConfig(output_dir=str(tmp_path / "trl"), beta=0.1, learning_rate=1e-3, per_device_train_batch_size=36,
                             max_steps=3, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, adam_beta2=0.999,
                             max_grad_norm=0.0, logging_steps=1, report_to="none", use_cpu=True, bf16=False,
                             save_strategy="no", seed=0, max_length=None, dataloader_num_workers=0)
    trainer = trl.DPOTrainer(model=model, args=settings, train_dataset=datasets.Dataset.from_list(pairs),
                             processing_class=tokenizer)
    torch.set_num_threads(1)
    trainer.train()
    theirs = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert ours[0]["train/loss"] == pytest.approx(math.log(2), abs=1e-7) and len(theirs) == len(ours) == 3
    for mine, trls in zip(ours, theirs):
        for name in FIGURES:
            assert mine[f"train/{name}"] == pytest.approx(trls[name], rel=1e-4, abs=1e-6), name


def test_a_preference_run_logs_its_rewards_and_resumes_exactly(base):
    """Stopped at step 2 and resumed to 4: the weights of a run straight to 4; TensorBoard's and
    metrics.jsonl's figures are trl's (rewards, margins, the share ranked right, log-probabilities),
    and the validation's too."""
    import train
    from safetensors.torch import load_file

    assert train.main(dpo_run(base, "straight", "train.max_iters=4", "train.batch_size=8")) == 0
    assert train.main(dpo_run(base, "resumed", "train.max_iters=2", "train.batch_size=8")) == 0
    assert train.main(dpo_run(base, "resumed", "train.max_iters=4", "train.batch_size=8")) == 0
    straight, resumed = (load_file(base / name / "model.safetensors") for name in ("straight", "resumed"))
    assert all(torch.equal(straight[name], resumed[name]) for name in straight)
    lines = [json.loads(line) for line in (base / "straight" / "metrics.jsonl").read_text().splitlines()]
    assert all(f"train/{name}" in lines[0] for name in FIGURES)
    assert any("val/rewards/margins" in line and "val/rewards/accuracies" in line for line in lines)
    summary = json.loads((base / "straight" / "summary.json").read_text())
    assert summary["job"] == "preference" and summary["val_loss"] < 1


def test_a_reference_computed_once_gives_the_steps_a_reference_run_each_step_gives(base, capsys):
    """dpo.precompute: the reference scores every pair before the first step (said, with the
    counts) and is let go; the run's losses, rewards and validation figures are those of a run
    that runs the reference at each step, and stopped at 2 and resumed to 3 its weights are
    those of the run straight to 3 (the table computed again from the same starting weights)."""
    import train
    from safetensors.torch import load_file

    steps = ["train.batch_size=8", "train.eval_interval=2"]
    assert train.main(dpo_run(base, "each-step", "train.max_iters=3", *steps)) == 0
    assert train.main(dpo_run(base, "once", "train.max_iters=3", "dpo.precompute=true", *steps)) == 0
    said = capsys.readouterr().out
    assert "the reference's log-probabilities of 36 train and 4 val pairs computed once" in said
    each_step, once = logged(base / "each-step"), logged(base / "once")
    assert len(once) == len(each_step) == 3
    for a, b in zip(each_step, once):
        for name in FIGURES:
            assert b[f"train/{name}"] == pytest.approx(a[f"train/{name}"], rel=1e-5, abs=1e-6), name
    val = [[json.loads(line) for line in (base / run / "metrics.jsonl").read_text().splitlines()
            if "val/rewards/margins" in line] for run in ("each-step", "once")]
    assert len(val[0]) == len(val[1]) >= 2
    for a, b in zip(*val):
        for name in ("val/loss", "train/eval_loss", *(f"val/{name}" for name in FIGURES[1:])):
            assert b[name] == pytest.approx(a[name], rel=1e-5, abs=1e-6), name
    assert train.main(dpo_run(base, "once-resumed", "train.max_iters=2", "dpo.precompute=true", *steps)) == 0
    assert train.main(dpo_run(base, "once-resumed", "train.max_iters=3", "dpo.precompute=true", *steps)) == 0
    straight, resumed = (load_file(base / name / "model.safetensors") for name in ("once", "once-resumed"))
    assert all(torch.equal(straight[name], resumed[name]) for name in straight)


def test_a_mixture_of_pair_sources_weighs_each_and_tunes(base, capsys):
    """data.sources of two files of pairs, the second weighted 2 and holding a bad pair: one
    preference job, each source's pairs drawn `weight` times an epoch, the bad pair counted and
    said; it tunes, and evaluate.py --split val ranks both sources' validation pairs. A source of
    conversations among pairs is refused in one line."""
    import train
    from jobs import job_for, prepare
    from runs.folder import RunDir

    lines = (base / "pairs.jsonl").read_text().splitlines()
    (base / "first.jsonl").write_text("".join(line + "\n" for line in lines[:20]))
    bad = json.dumps({"prompt": "1+1=", "chosen": "2", "rejected": "2"})  # chosen equal to rejected
    (base / "second.jsonl").write_text("".join(line + "\n" for line in [*lines[20:], bad]))
    sources = f"data.sources=[{base / 'first.jsonl'}, {{source: {base / 'second.jsonl'}, weight: 2}}]"
    mixed = DataConfig(sources=[str(base / "first.jsonl"), {"source": str(base / "second.jsonl"), "weight": 2}],
                       cache_dir=str(base / "cache"), skip_bad_records=0.1)
    assert job_for(mixed).name == "preference"
    _, tokenizer = RunDir(base / "base").load_model()
    data = prepare(mixed, progress=False, tokenizer=tokenizer)
    assert data.items("train") == 18 + 18 and data.items("val") == 2 + 2
    assert data.meta["skipped"]["reasons"] == {"with chosen equal to rejected": 1}
    epoch = data.sampler(64, 4, seed=0).rows_of(0)
    drawn = collections.Counter(int(i) for i in epoch)
    assert {drawn[i] for i in range(18)} == {1} and {drawn[i] for i in range(18, 36)} == {2} and len(epoch) == 54
    run = dpo_run(base, "mixed", "train.max_iters=2", "train.batch_size=8", "data.skip_bad_records=0.1")
    assert train.main([*run, "data.source=mixture", sources]) == 0
    assert "1 with chosen equal to rejected" in capsys.readouterr().out  # (the bad pair said)
    assert json.loads((base / "mixed" / "summary.json").read_text())["job"] == "preference"
    assert evaluate.main(["--checkpoint", str(base / "mixed"), "--split", "val", "--json"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["pairs"] == 4
    (base / "talk.jsonl").write_text(json.dumps({"messages": USER + answer("21")}) + "\n")
    talk = f"data.sources=[{base / 'first.jsonl'}, {base / 'talk.jsonl'}]"
    refused = run_cli("train.py", *run, "data.source=mixture", talk)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert "talk.jsonl' holds none" in refused.stderr.strip().splitlines()[-1]


@pytest.mark.slow  # (two torchrun launches of two processes: about 40 seconds)
@pytest.mark.xdist_group("processes")  # (one such test at a time: tests/test_distributed.py)
def test_two_processes_tune_what_one_process_tunes(base):
    """torchrun, two processes on gloo, each half of every batch of pairs: the weights one
    process tunes given the whole batch (DPO's loss is a mean over pairs, and DDP averages the
    processes' gradients), the reference run at each step or computed once."""
    import os
    import subprocess
    import sys

    import train
    from safetensors.torch import load_file

    for precompute in ("false", "true"):
        settings = ["train.max_iters=3", f"dpo.precompute={precompute}"]
        assert train.main(dpo_run(base, f"one-{precompute}", "train.batch_size=8", *settings)) == 0
        two = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                              "train.py", *dpo_run(base, f"two-{precompute}", "train.batch_size=4", *settings)],
                             cwd=ROOT, capture_output=True, text=True, timeout=300,
                             env={**os.environ, "OMP_NUM_THREADS": "1"})
        assert two.returncode == 0, two.stdout[-2000:] + two.stderr[-2000:]
        one, both = (load_file(base / f"{name}-{precompute}" / "model.safetensors") for name in ("one", "two"))
        assert all(torch.allclose(one[name], both[name], atol=1e-6) for name in one)
        assert not all(torch.equal(one[name], load_file(base / "base" / "model.safetensors")[name]) for name in one)


@pytest.mark.slow  # (a LoRA run, two exports, transformers and peft: about 15 seconds)
def test_a_tuned_model_exports_as_any_run_does(base, tmp_path):
    """A LoRA preference run exports to transformers (merged: our model's logits) and to peft
    (its adapters over base/: the merged logits), as a fine-tuned run does."""
    peft = pytest.importorskip("peft")
    transformers = pytest.importorskip("transformers")
    import export
    import train
    from runs.folder import RunDir

    assert train.main(dpo_run(base, "lora-export", "train.max_iters=3", "lora.rank=4", "train.lr=1e-2")) == 0
    run = str(base / "lora-export")
    assert export.main(["--checkpoint", run, "--out", str(tmp_path / "merged")]) == 0
    assert export.main(["--checkpoint", run, "--out", str(tmp_path / "peft"), "--adapters"]) == 0
    ours, _ = RunDir(base / "lora-export").load_model()
    merged = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "merged").eval()
    base_model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "peft" / "base").eval()
    x = torch.randint(0, merged.config.vocab_size, (2, 12))
    with torch.no_grad():
        torch.testing.assert_close(merged(x).logits, ours.eval()(x)[0], atol=2e-5, rtol=0)
        before = base_model(x).logits
        adapted = peft.PeftModel.from_pretrained(base_model, tmp_path / "peft").eval()
        torch.testing.assert_close(adapted(x).logits, merged(x).logits, atol=2e-5, rtol=0)
        assert (before - merged(x).logits).abs().max() > 1e-3  # (the tuning changed the model)


def test_lora_measures_against_the_model_with_its_adapters_off(base):
    """The reference of a LoRA run is the model itself with every update off (no second copy):
    after some steps its log-probabilities are still the base's; a module trained whole beside
    the adapters would change it, and is refused in one line."""
    import train
    from safetensors.torch import load_file

    from lora import LoRAConfig, add_adapters, load_adapter_state
    from runs.folder import RunDir
    from training.trained import AdaptersOff

    assert train.main(dpo_run(base, "lora", "train.max_iters=3", "lora.rank=4", "train.lr=1e-2")) == 0
    model, _ = RunDir(base / "base").load_model()
    adapted, _ = RunDir(base / "base").load_model()
    add_adapters(adapted, LoRAConfig(rank=4))
    names = [name for name, p in adapted.named_parameters() if p.requires_grad]
    load_adapter_state(adapted, load_file(base / "lora" / "adapter_model.safetensors"), names)
    x = torch.tensor([[[10, 20, 30, 40, 50], [10, 20, 31, 41, 0]]])  # [1 pair, 2 sides, 5]
    y = torch.tensor([[[-100, 30, 40, 50, 51], [-100, 31, 41, 51, -100]]])
    rows = shared_rows(x, y)
    with torch.no_grad():
        base_logps, _ = side_logps(model, rows)
        tuned, _ = side_logps(adapted, rows)
    reference = DPO(DPOConfig(), adapted, AdaptersOff()).reference_logps(rows, torch.tensor([0]), "train")
    assert reference.tolist() == pytest.approx(base_logps.tolist(), abs=1e-5)
    assert tuned.tolist() != pytest.approx(base_logps.tolist(), abs=1e-4)  # (the adapters trained do change it)
    refused = run_cli("train.py", *dpo_run(base, "lora-whole", "train.max_iters=1", "lora.rank=4",
                                           "lora.modules_to_save=[ln_f]"))
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert refused.stderr.strip().splitlines()[-1].endswith("leave lora.modules_to_save empty and tune a model whose "
                                                            "tokenizer already has its chat template's markers")


def test_preference_tuning_needs_a_model_to_start_from(base):
    out = run_cli("train.py", *config(base, f"data.source={base / 'pairs.jsonl'}", f"out_dir={base / 'none'}",
                                      "train.max_iters=1"))
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "set train.init_from" in out.stderr.strip().splitlines()[-1]


def test_evaluate_ranks_pairs_by_their_rewards_against_the_reference(base, capsys):
    """evaluate.py on a preference run's validation pairs: the share of pairs whose chosen
    answer's reward is the higher and the mean margin, as the trainer's last evaluation measured
    them (the same four pairs, the same reference: the run's train.init_from); the base against
    itself: every reward 0, none ranked right."""
    import train

    assert train.main(dpo_run(base, "scored", "train.max_iters=6", "train.batch_size=8", "train.eval_interval=6")) == 0
    capsys.readouterr()
    assert evaluate.main(["--checkpoint", str(base / "scored"), "--split", "val", "--json"]) == 0
    scored = json.loads(capsys.readouterr().out)
    last = [json.loads(line) for line in (base / "scored" / "metrics.jsonl").read_text().splitlines()
            if "val/rewards/margins" in line][-1]
    assert scored["pairs"] == 4 and scored["against"] == "reference" and scored["beta"] == 0.1
    assert scored["margin"] == pytest.approx(last["val/rewards/margins"], rel=1e-4)
    assert scored["ranked_right"] == pytest.approx(last["val/rewards/accuracies"])
    assert evaluate.main(["--checkpoint", str(base / "scored"), "--text", str(base / "pairs.jsonl"),
                          "--reference", str(base / "scored"), "--json"]) == 0
    itself = json.loads(capsys.readouterr().out)
    assert itself["pairs"] == 40 and itself["margin"] == 0 and itself["ranked_right"] == 0
    assert evaluate.main(["--checkpoint", str(base / "scored"), "--text", str(base / "pairs.jsonl")]) == 0
    said = capsys.readouterr().out.splitlines()
    assert said[1].startswith("chosen ranked first ") and "against the reference, β = 0.1" in said[1]
