"""On one GPU, in one run: training tokens/s and MFU of configs/small.yaml's model against
transformers' GPT2LMHeadModel of the same size (bf16 autocast, sdpa, eager and compiled;
ours also with Muon, whose many small operations a GPU may wait on), and batch-1 and
batch-16 decoding against transformers' generate. bench/gpu.sh runs the race with nanoGPT
(bench/gpu_race.py) and the CUDA tests first, then this. Figures go to one JSON file.

    python -m bench.gpu --out $OUT/gpu.json [--quick]

--quick runs tiny sizes for seconds on any device (a CPU test runs it so it never rots).
"""

from __future__ import annotations

import argparse
import time

import torch

from bench.common import alternate, save, table, timed
from machine.device import autocast, measure_peak_flops
from model import GPT, GPTConfig
from training.config import TrainConfig
from training.optim import make_optimizers
from training.trained import AllWeights

VOCAB = 65


def small_config(quick: bool) -> dict:
    """configs/small.yaml's model (nanoGPT's baby GPT), or a tiny one for --quick."""
    if quick:
        return dict(n_layer=2, n_head=2, n_embd=64, block_size=64)
    return dict(n_layer=6, n_head=6, n_embd=384, block_size=256)


def train_throughput(device, shape: dict, batch: int, steps: int, rounds: int, compile_too: bool) -> list[dict]:
    """Tokens/s and MFU of a full training step (forward, backward, fused AdamW; and ours
    with tiny.yaml's optimizers, Muon for the blocks' matrices) in bf16."""
    import transformers

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    peak = measure_peak_flops(device, dtype, size=512 if device.type == "cpu" else 8192)
    T = shape["block_size"]
    ours = lambda: GPT(GPTConfig(vocab_size=VOCAB, pos_encoding="learned", attn_impl="sdpa", **shape))  # noqa: E731
    theirs = lambda: transformers.GPT2LMHeadModel(transformers.GPT2Config(  # noqa: E731
        vocab_size=VOCAB, n_positions=T, n_layer=shape["n_layer"], n_head=shape["n_head"], n_embd=shape["n_embd"],
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, attn_implementation="sdpa"))
    flops = ours().flops_per_token(T)
    x = torch.randint(0, VOCAB, (batch, T), device=device)

    def runner(make, hf: bool, compiled: bool, muon: bool = False):
        model = make().to(device)
        if compiled:
            model.forward = torch.compile(model.forward)
        optimizers = make_optimizers(AllWeights(model).groups(), TrainConfig(optimizer="muon"), device) if muon else \
            [torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)]

        def step():
            with autocast(device, dtype):
                loss = model(input_ids=x, labels=x).loss if hf else model(x, x)[1]
            loss.backward()
            for opt in optimizers:
                opt.step()
                opt.zero_grad(set_to_none=True)

        for _ in range(3):  # warm-up (and compilation)
            step()
        sync()
        return lambda: steps * batch * T / timed(lambda: ([step() for _ in range(steps)], sync()))

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    candidates = {"ours": runner(ours, False, False), "HF GPT2": runner(theirs, True, False),
                  "ours, Muon": runner(ours, False, False, muon=True)}
    if compile_too:
        candidates.update({"ours compiled": runner(ours, False, True), "HF GPT2 compiled": runner(theirs, True, True)})
    return [{"variant": name, "tokens_per_sec": tok_s, "mfu": flops * tok_s / peak}
            for name, tok_s in alternate(candidates, rounds).items()]


def decode_throughput(device, shape: dict, new_tokens: int, rounds: int) -> list[dict]:
    """Greedy tokens/s for batch 1 and 16: our KV cache against transformers' generate."""
    import transformers

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    T = shape["block_size"]
    ours = GPT(GPTConfig(vocab_size=VOCAB, pos_encoding="learned", activation="gelu_tanh", **shape)).to(device, dtype)
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=VOCAB, n_positions=T, n_layer=shape["n_layer"], n_head=shape["n_head"], n_embd=shape["n_embd"],
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)).to(device, dtype).eval()
    results = []
    for batch in (1, 16):
        idx = torch.randint(0, VOCAB, (batch, 8), device=device)

        def run(fn):
            def measure():
                elapsed = timed(lambda: (fn(), torch.cuda.synchronize() if device.type == "cuda" else None))
                return batch * new_tokens / elapsed
            return measure

        medians = alternate({
            "ours, KV cache": run(lambda: ours.generate(idx, new_tokens, temperature=0)),
            "HF generate": run(lambda: hf.generate(idx, attention_mask=torch.ones_like(idx), do_sample=False,
                                                   max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                                   pad_token_id=0)),
        }, rounds)
        results += [{"batch": batch, "variant": name, "tokens_per_sec": v} for name, v in medians.items()]
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes, seconds, any device")
    parser.add_argument("--out", help="JSON path (default bench/results/gpu.json)")
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    shape = small_config(args.quick)
    # HF's GPT-2 refuses to run past n_positions: the 8-token prompt and the new tokens fit in block_size
    rounds, steps, new_tokens = (1, 2, 8) if args.quick else (5, 10, shape["block_size"] - 8)
    machine = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
               "torch": torch.__version__, "date": time.strftime("%Y-%m-%d")}
    payload = {"machine": machine, "results": []}
    training = train_throughput(device, shape, 4 if args.quick else 64, steps, rounds, not args.quick)
    payload["results"] += [{"bench": "training", **r} for r in training]
    print(table(["variant", "tokens/s", "MFU"], [[r["variant"], r["tokens_per_sec"], f"{100 * r['mfu']:.1f}%"]
                                               for r in training]), flush=True)
    save("gpu", payload, args.out)  # kept if the decoding bench does not end
    decoding = decode_throughput(device, shape, new_tokens, rounds)
    payload["results"] += [{"bench": "decoding", **r} for r in decoding]
    print(table(["batch", "variant", "tokens/s"], [[r["batch"], r["variant"], r["tokens_per_sec"]] for r in decoding]),
          flush=True)
    print(f"wrote {save('gpu', payload, args.out)}")


if __name__ == "__main__":
    main()
