"""Training throughput: our GPT vs transformers' GPT2LMHeadModel at identical sizes.

Tokens/s of a full training step (forward, backward, AdamW) and MFU (model FLOPs over
the matmul peak of this machine in the same dtype, measured here), fp32 and bf16
autocast, every variant alternating in one process; medians of the rounds.

Ours runs with its defaults (exact GELU) and GPT-2's learned positions; Hugging Face's
GPT-2 with its own activation (gelu_new, the tanh formula in Python ops) and, to show
where a difference comes from, with exact GELU like ours. --compile adds
torch.compile'd variants of both (about 30 s of compilation each).

    python -m bench.train_throughput [--quick] [--threads 2] [--rounds 5] [--compile]
"""

from __future__ import annotations

import argparse

import torch

from bench.common import alternate, machine, save, table, timed
from machine.device import autocast, measure_peak_flops
from model import GPT, GPTConfig

SIZES = {  # name: (n_layer, n_head, n_embd, block_size, batch_size)
    "nanoGPT CPU recipe (4L/4H/128, T=64, B=12)": (4, 4, 128, 64, 12),
    "baby GPT shape (6L/6H/384, T=256, B=8)": (6, 6, 384, 256, 8),
}
QUICK = {"quick (2L/2H/64, T=32, B=4)": (2, 2, 64, 32, 4)}
VOCAB = 65


def ours(shape, impl: str):
    L, H, C, T, _ = shape
    return GPT(GPTConfig(vocab_size=VOCAB, block_size=T, n_layer=L, n_head=H, n_embd=C,
                         pos_encoding="learned", attn_impl=impl))


def hugging_face(shape, impl: str, activation: str = "gelu_new"):
    import transformers

    L, H, C, T, _ = shape
    config = transformers.GPT2Config(vocab_size=VOCAB, n_positions=T, n_layer=L, n_head=H, n_embd=C,
                                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, attn_implementation=impl,
                                     activation_function=activation, bos_token_id=0, eos_token_id=0)
    return transformers.GPT2LMHeadModel(config)


def compiled(model):
    model.forward = torch.compile(model.forward)
    return model


def step_fn(model, shape, dtype, hf: bool, steps: int):
    _, _, _, T, B = shape
    x = torch.randint(0, VOCAB, (B, T), generator=torch.Generator().manual_seed(0))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)

    def one_step():
        with autocast(torch.device("cpu"), dtype):
            loss = model(input_ids=x, labels=x).loss if hf else model(x, x)[1]
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(2):
        one_step()

    def measure() -> float:  # tokens per second
        return steps * B * T / timed(lambda: [one_step() for _ in range(steps)])

    return measure


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a tiny size, seconds (exercised by a test)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=5, help="training steps per measurement")
    parser.add_argument("--compile", action="store_true", help="add torch.compile'd variants (bf16)")
    parser.add_argument("--out", help="JSON path (default bench/results/train_throughput.json)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rounds, steps = (1, 1) if args.quick else (args.rounds, args.steps)
    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16}
    peaks = {name: measure_peak_flops(torch.device("cpu"), dt, size=512 if args.quick else 2048)
             for name, dt in dtypes.items()}
    results, rows = [], []
    for size, shape in (QUICK if args.quick else SIZES).items():
        flops = ours(shape, "sdpa").flops_per_token(shape[3])
        candidates = {}
        for dname, dt in dtypes.items():
            for impl in ("explicit", "sdpa"):
                candidates[f"ours {impl} {dname}"] = step_fn(ours(shape, impl), shape, dt, False, steps)
            for impl in ("eager", "sdpa"):
                candidates[f"HF GPT2 {impl} {dname}"] = step_fn(hugging_face(shape, impl), shape, dt, True, steps)
            candidates[f"HF GPT2 eager exact-GELU {dname}"] = step_fn(
                hugging_face(shape, "eager", "gelu"), shape, dt, True, steps)
        if args.compile:
            bf16 = torch.bfloat16
            candidates["ours explicit compiled bf16"] = step_fn(compiled(ours(shape, "explicit")), shape, bf16, False, steps)
            candidates["HF GPT2 eager compiled bf16"] = step_fn(compiled(hugging_face(shape, "eager")), shape, bf16,
                                                               True, steps)
        medians = alternate(candidates, rounds)
        best_ours = max(v for k, v in medians.items() if k.startswith("ours"))
        best_gpt2 = max(v for k, v in medians.items() if k.startswith("HF") and "exact-GELU" not in k)
        best_hf = max(v for k, v in medians.items() if k.startswith("HF"))
        for name, tok_s in medians.items():
            mfu = flops * tok_s / peaks[name.split()[-1]]
            rows.append([size, name, tok_s, f"{100 * mfu:.1f}%"])
            results.append({"size": size, "variant": name, "tokens_per_sec": tok_s, "mfu": mfu})
        rows.append([size, "**ours best / HF GPT-2 best**", f"**{best_ours / best_gpt2:.2f}×**", ""])
        rows.append([size, "**ours best / HF best, exact GELU included**", f"**{best_ours / best_hf:.2f}×**", ""])
        results.append({"size": size, "speedup_vs_gpt2": best_ours / best_gpt2,
                        "speedup_vs_any_hf": best_ours / best_hf})
    print(f"threads {args.threads}, medians of {rounds} alternating rounds of {steps} steps; "
          f"measured matmul peak: fp32 {peaks['fp32'] / 1e12:.2f}, bf16 {peaks['bf16'] / 1e12:.2f} TFLOP/s\n")
    print(table(["size", "variant", "tokens/s", "MFU"], rows))
    path = save("train_throughput", {"machine": machine(args.threads), "peak_flops": peaks,
                                     "results": results}, args.out)
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
