"""Every CUDA path, on one GPU (skipped without one): bf16 and fp16 training (the gradient
scaler skipping an overflow), compiled training, explicit = sdpa with causal and padding
masks, cached = uncached generation in bf16 and float32 with every number of key/value
heads, the explorer's data and the model's trace equal to the CPU's, a bit-identical
resume with the CUDA RNG, both programs end to end, and DDP over NCCL when there are two
GPUs."""

import dataclasses
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

import train
from runs.folder import RunDir
from conftest import ROOT, run_cli
from model import GPT, GPTConfig
from training.config import load_config
from training.preparation import prepare_run
from training.step import train_step
from training.trainer import Trainer
from test_explorer import assert_same_page_data

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
TINY = str(ROOT / "configs" / "tiny.yaml")
CUDA = torch.device("cuda")


def cuda_trainer(micro, dtype, *extra) -> Trainer:
    return Trainer(prepare_run(load_config(TINY, micro("train.device=cuda", *extra))), CUDA, dtype)


def step(trainer: Trainer) -> float:
    """One iteration as the loop takes it (training/step.py); its loss."""
    result = train_step(trainer.iteration, trainer.schedule, trainer.setup)
    trainer.iteration += 1
    return result.loss.item()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_training_in_half_precision(micro, dtype):
    trainer = cuda_trainer(micro, dtype)
    losses = [step(trainer) for _ in range(25)]
    assert losses[-1] < losses[0] - 0.5
    assert trainer.setup.scaler.is_enabled() == (dtype == torch.float16)


def test_fp16_overflow_is_skipped_by_the_scaler_not_a_nan_stop(micro):
    trainer = cuda_trainer(micro, torch.float16)
    trainer.setup = dataclasses.replace(trainer.setup, scaler=torch.amp.GradScaler("cuda", init_scale=2.0**40))  # the first steps overflow
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    step(trainer)  # no TrainingError: an overflow is the scaler's to handle
    assert trainer.setup.scaler.get_scale() < 2.0**40
    assert all(torch.equal(p, before[n]) for n, p in trainer.model.named_parameters())  # the step was skipped
    losses = [step(trainer) for _ in range(40)]
    assert losses[-1] < losses[0]


@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("padded", [False, True])
def test_explicit_and_sdpa_agree(dtype, tolerance, padded):
    torch.manual_seed(0)
    models = [GPT(GPTConfig(vocab_size=50, block_size=64, n_layer=2, n_head=4, n_embd=64, attn_impl=impl,
                            pos_encoding="rope")).to(CUDA, dtype).eval() for impl in ("explicit", "sdpa")]
    models[1].load_state_dict(models[0].state_dict())
    idx = torch.randint(0, 50, (3, 40), device=CUDA)
    mask = None
    if padded:
        mask = torch.ones(3, 40, dtype=torch.long, device=CUDA)
        mask[1, :13] = 0
    with torch.no_grad():
        a, b = (m(idx, attention_mask=mask)[0].float() for m in models)
    torch.testing.assert_close(a, b, atol=tolerance, rtol=tolerance)


def test_compiled_training_on_cuda(micro):
    trainer = cuda_trainer(micro, torch.bfloat16, "train.compile=true")
    losses = [step(trainer) for _ in range(25)]
    assert losses[-1] < losses[0] - 0.5


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("pos", ["learned", "rope"])
@pytest.mark.parametrize("kv_heads", [4, 2, 1])  # multi-head, grouped-query, multi-query
def test_cached_and_uncached_generation_agree(dtype, pos, kv_heads):
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=50, block_size=32, n_layer=2, n_head=4, n_embd=64, pos_encoding=pos,
                          n_kv_head=kv_heads))
    model = model.to(CUDA, dtype).eval()
    idx = torch.randint(0, 50, (2, 5), device=CUDA)
    cached = model.generate(idx, 80, temperature=0, use_cache=True)
    uncached = model.generate(idx, 80, temperature=0, use_cache=False)
    agreement = (cached == uncached).float().mean().item()
    assert agreement == 1.0 if dtype == torch.float32 else agreement > 0.9  # bf16 may flip a near-tie


@pytest.mark.parametrize("block", ["gpt2", "llama"])
def test_the_explorer_data_on_cuda_is_the_cpus(block):
    """page_data runs the model's traced pass, its logit lens and every head switched off
    (head_mask) on the model's device: on CUDA they give the CPU's numbers."""
    from data.tokenizer import train_char
    from explorer.data import initial_model, page_data

    text = "So foul and fair a day I have not seen."
    tokenizer = train_char([text])
    shape = {"gpt2": dict(pos_encoding="learned"),
             "llama": dict(pos_encoding="rope", norm="rmsnorm", mlp="swiglu", n_kv_head=2, bias=False)}[block]
    model = GPT.initialised(GPTConfig(vocab_size=tokenizer.get_vocab_size(), block_size=64, n_layer=2, n_head=4,
                                      n_embd=64, **shape), 0).eval()
    ids = tokenizer.encode(text).ids
    on_cpu = page_data(model, tokenizer, ids)
    torch.cuda.manual_seed(123)
    torch.rand(1, device=CUDA)  # a state no seed of 0 could restore by chance
    state = torch.cuda.get_rng_state()
    cuda_model = initial_model(model.to(CUDA), 0)  # the run's model at initialisation, built again on CUDA
    assert torch.equal(torch.cuda.get_rng_state(), state)  # and CUDA's random state left as it was
    # every array and number within float32 rounding (the likeliest tokens' ids may swap on a near-tie)
    assert_same_page_data(page_data(cuda_model, tokenizer, ids, which="trained"), on_cpu, skip={"ids", "texts"})


def test_resume_on_cuda_is_bit_identical(tmp_path, micro, monkeypatch):
    settings = ["train.device=cuda", "train.max_iters=20", "train.checkpoint_interval=5", "train.eval_interval=10",
                "model.dropout=0.1", "model.attn_impl=explicit", "train.sample_tokens=0"]
    assert train.main(["--config", TINY, *micro(*settings, out="straight")]) == 0
    real_save = RunDir.save_checkpoint

    def save_then_die(run_dir, model, tokenizer, summary, state):
        real_save(run_dir, model, tokenizer, summary, state)
        if state["iteration"] == 10:
            raise KeyboardInterrupt

    monkeypatch.setattr(RunDir, "save_checkpoint", save_then_die)
    assert train.main(["--config", TINY, *micro(*settings, out="stopped")]) == 130
    monkeypatch.undo()
    state = torch.load(tmp_path / "stopped" / "trainer_state.pt", weights_only=True)
    assert "cuda" in state["ranks"][0]["rng"]
    assert train.main(["--config", TINY, *micro(*settings, out="stopped")]) == 0
    a, b = load_file(tmp_path / "straight" / "model.safetensors"), load_file(tmp_path / "stopped" / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_both_programs_on_cuda(tmp_path, micro):
    result = run_cli("train.py", "--config", TINY, *micro("train.device=cuda", "train.dtype=auto"))
    assert result.returncode == 0, result.stderr[-2000:]
    assert "cuda" in result.stdout and "bfloat16" in result.stdout
    result = run_cli("generate.py", "--checkpoint", str(tmp_path / "run"), "--device", "cuda", "--prompt", "ROMEO:",
                     "--max-new-tokens", "50", "--stats", "--seed", "0")
    assert result.returncode == 0 and result.stdout.startswith("ROMEO:") and "cuda" in result.stderr
    # prompts of two lengths (a padding mask on the GPU too) and the attention maps of the first sample
    result = run_cli("generate.py", "--checkpoint", str(tmp_path / "run"), "--device", "cuda", "--prompt", "ROMEO:",
                     "--prompt", "O", "--max-new-tokens", "20", "--show-attention", str(tmp_path / "maps.png"))
    assert result.returncode == 0 and "sample 2 of 2" in result.stdout, result.stderr[-2000:]
    assert (tmp_path / "maps.png").read_bytes().startswith(b"\x89PNG")
    result = run_cli("evaluate.py", "--checkpoint", str(tmp_path / "run"), "--device", "cuda", "--split", "val")
    assert result.returncode == 0 and "bits/char" in result.stdout, result.stderr[-2000:]


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
@pytest.mark.xdist_group("processes")  # (one such test at a time: tests/test_distributed.py)
def test_ddp_over_nccl(tmp_path, micro):
    common = ["train.device=cuda", "train.max_iters=3", "train.log_interval=1", "train.eval_interval=3",
              "train.sample_tokens=0", "train.dtype=float32"]
    single = run_cli("train.py", "--config", TINY, *micro(*common, "train.batch_size=8", out="single"))
    assert single.returncode == 0, single.stderr[-2000:]
    ddp = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                          "train.py", "--config", TINY, *micro(*common, "train.batch_size=4", out="ddp")],
                         cwd=ROOT, capture_output=True, text=True, timeout=300, env={**os.environ})
    assert ddp.returncode == 0, ddp.stderr[-2000:]
    a, b = load_file(tmp_path / "single" / "model.safetensors"), load_file(tmp_path / "ddp" / "model.safetensors")
    assert all(torch.allclose(a[k], b[k], atol=1e-4) for k in a)
