"""Decoding speed: our KV cache vs our uncached path vs transformers' generate().

Tokens/s for 512 new tokens from a short prompt at batch 1 and 16 (greedy, so every
variant does the same work), then the cost of one new token against the context
length, to show that the cached cost stays flat while the uncached one grows. The
model is GPT-2-shaped (learned positions, tanh GELU) so both libraries run the same
network: 4 layers, 4 heads, 128 dims, 1,024 positions.

    python -m bench.decode [--quick] [--threads 2] [--rounds 3]
"""

from __future__ import annotations

import argparse

import torch

from bench.common import alternate, machine, save, table, timed
from model import GPT, GPTConfig
from model.attention import KVCache

VOCAB = 65


def twin_models(n_layer, n_head, n_embd, block_size):
    import transformers

    torch.manual_seed(0)
    ours = GPT(GPTConfig(vocab_size=VOCAB, block_size=block_size, n_layer=n_layer, n_head=n_head,
                         n_embd=n_embd, pos_encoding="learned", activation="gelu_tanh")).eval()
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=VOCAB, n_positions=block_size, n_layer=n_layer, n_head=n_head, n_embd=n_embd,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=None)).eval()
    return ours, hf


def throughput(ours, hf, new_tokens: int, rounds: int) -> tuple[list, list]:
    """Greedy tokens/s at batch 1 and 16: ours with and without the cache, HF generate."""
    prompt = torch.randint(0, VOCAB, (16, 8), generator=torch.Generator().manual_seed(0))
    rows, results = [], []
    for batch in (1, 16):
        idx = prompt[:batch]

        def run(fn):
            return lambda: batch * new_tokens / timed(fn)

        candidates = {
            "ours, KV cache": run(lambda: ours.generate(idx, new_tokens, temperature=0)),
            "ours, no cache": run(lambda: ours.generate(idx, new_tokens, temperature=0, use_cache=False)),
            "HF GPT2 generate, cache": run(lambda: hf.generate(
                idx, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, use_cache=True,
                pad_token_id=0, attention_mask=torch.ones_like(idx))),
        }
        with torch.inference_mode():
            medians = alternate(candidates, rounds)
        for name, tok_s in medians.items():
            rows.append([batch, name, tok_s])
            results.append({"batch": batch, "variant": name, "tokens_per_sec": tok_s})
        ratio = medians["ours, KV cache"] / medians["HF GPT2 generate, cache"]
        rows.append([batch, "**ours cached / HF cached**", f"**{ratio:.2f}×**"])
        results.append({"batch": batch, "speedup_vs_hf": ratio})
    return rows, results


def cost_per_token(ours, block_size: int, steps: int, rounds: int) -> list[dict]:
    """Milliseconds for one new token at batch 1, cached and uncached, as the context grows."""
    lengths = [L for L in (64, 128, 256, 512) if L + steps < block_size] + [block_size - steps]
    per_token = []
    with torch.inference_mode():
        for L in lengths:
            context = torch.randint(0, VOCAB, (1, L + steps), generator=torch.Generator().manual_seed(1))

            def cached() -> float:
                cache = KVCache(ours.config, 1, block_size, "cpu", torch.float32)
                ours(context[:, :L], kv_cache=cache)
                return timed(lambda: [ours(context[:, t:t + 1], kv_cache=cache) for t in range(L, L + steps)]) / steps

            def uncached() -> float:
                return timed(lambda: [ours(context[:, t - L + 1:t + 1]) for t in range(L, L + steps)]) / steps

            m = alternate({"cached": cached, "uncached": uncached}, rounds)
            per_token.append({"context": L, "cached_ms": 1e3 * m["cached"], "uncached_ms": 1e3 * m["uncached"],
                              "speedup": m["uncached"] / m["cached"]})
    return per_token


def grouped(block_size: int, new_tokens: int, rounds: int) -> list[dict]:
    """Grouped-query attention: the KV cache's bytes per sequence (its own tensors, at
    block_size) and cached greedy tokens/s at batch 16, for 4, 2 and 1 key/value heads of
    the same 4-head, 128-dim rope model."""
    prompt = torch.randint(0, VOCAB, (16, 8), generator=torch.Generator().manual_seed(0))
    models, sizes = {}, {}
    for kv in (4, 2, 1):
        torch.manual_seed(0)
        models[kv] = GPT(GPTConfig(vocab_size=VOCAB, block_size=block_size, n_layer=4, n_head=4, n_kv_head=kv,
                                   n_embd=128, pos_encoding="rope")).eval()
        cache = KVCache(models[kv].config, 1, block_size, "cpu", torch.float32)
        sizes[kv] = cache.k.nbytes + cache.v.nbytes
    with torch.inference_mode():
        medians = alternate({kv: (lambda m=m: 16 * new_tokens / timed(lambda: m.generate(prompt, new_tokens, temperature=0)))
                             for kv, m in models.items()}, rounds)
    return [{"n_kv_head": kv, "cache_bytes_per_sequence": sizes[kv], "cache_ratio": sizes[4] / sizes[kv],
             "tokens_per_sec": medians[kv]} for kv in models]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small and short, seconds (exercised by a test)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", help="JSON path (default bench/results/decode.json)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    block_size, new_tokens, rounds = (128, 16, 1) if args.quick else (1024, 512, args.rounds)
    ours, hf = twin_models(4, 4, 128, block_size)
    rows, results = throughput(ours, hf, new_tokens, rounds)
    print(f"threads {args.threads}, fp32, greedy, {new_tokens} new tokens from an 8-token prompt, "
          f"medians of {rounds} alternating rounds\n")
    print(table(["batch", "variant", "tokens/s"], rows))
    per_token = cost_per_token(ours, block_size, 4 if args.quick else 32, rounds)
    print("\ntime for one new token (batch 1) against the context length\n")
    print(table(["context", "cached ms/token", "uncached ms/token", "cache speedup"],
                [[p["context"], p["cached_ms"], p["uncached_ms"], f"{p['speedup']:.1f}×"] for p in per_token]))
    gqa = grouped(block_size, new_tokens, rounds)
    print("\ngrouped-query attention (n_head 4, rope): the KV cache per sequence and cached tokens/s at batch 16\n")
    print(table(["n_kv_head", "KV cache per sequence (KiB)", "smaller by", "tokens/s"],
                [[g["n_kv_head"], g["cache_bytes_per_sequence"] / 1024, f"{g['cache_ratio']:.0f}×", g["tokens_per_sec"]]
                 for g in gqa]))
    path = save("decode", {"machine": machine(args.threads), "results": results, "per_token": per_token,
                           "grouped": gqa}, args.out)
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
