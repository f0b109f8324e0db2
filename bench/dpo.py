"""Preference tuning, here and in trl: the same DPO job by this project's train.py and by trl's
DPOTrainer, LoRA (peft, no second model: the reference is the model with its adapters off on
both sides) and every weight (a frozen copy as the reference on both sides), each also with
the reference's log-probabilities computed once before training (trl's
precompute_ref_log_probs, dpo.precompute here).

The job: bench/sft.py's random Qwen2-shaped base (its byte-level BPE, a ChatML template with
tools whose {% generation %} blocks mark the answers) and pairs of weather calls (data/tasks.py
--pairs: the right call chosen, one with a wrong city or day rejected); 8 pairs a step at a
constant 1e-4, β 0.1, float32, one thread, each job in a process of its own: its real tokens a
second in training (both sides count the pairs' tokens, padding left out; the first logged
interval left out), its whole wall time and its peak memory (the kernel's VmHWM).

    pip install trl
    python -m bench.dpo [--steps 30] [--count 1000] [--quick]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from bench.common import machine, save, table
from bench.memory import peak_of
from bench.sft import ALPHA, CONTEXT, RANK, SHAPE, TEMPLATE, job_conversations, make_base, measured_here, timed_in_trl

PAIRS = 8  # a step
LR, BETA = 1e-4, 0.1


def dpo_here(base: Path, data: Path, out: Path, steps: int, every: int, lora: bool, precompute: bool) -> dict:
    """This project's train.py on the job (configs/dpo.yaml's settings, the bench's overrides)."""
    command = [sys.executable, "train.py", "--config", "configs/dpo.yaml", f"out_dir={out}", f"data.source={data}",
               f"data.cache_dir={out.parent / 'cache'}", f"train.init_from={base}", f"model.block_size={CONTEXT}",
               f"lora.rank={RANK if lora else 0}", f"lora.alpha={ALPHA}", "lora.dropout=0", f"train.lr={LR}",
               f"train.min_lr={LR}", "train.warmup_iters=0", f"train.max_iters={steps}", f"train.batch_size={PAIRS}",
               "train.eval_interval=1000000", "train.eval_windows=8", "train.snapshots=0", "train.dtype=float32",
               "train.threads=1", "train.max_minutes=null", f"train.log_interval={every}", f"dpo.beta={BETA}",
               f"dpo.precompute={str(precompute).lower()}"]
    return measured_here(command, out)


def dpo_in_trl(base: Path, data: Path, out: Path, steps: int, every: int, lora: bool, precompute: bool) -> dict:
    """trl's DPOTrainer on the job, in a process of its own (this module's --child)."""
    result = out / f"trl-{int(lora)}{int(precompute)}.json"
    peak, _, wall = peak_of([sys.executable, "-m", "bench.dpo", "--child", str(base), str(data), str(result), str(steps),
                             str(every), str(int(lora)), str(int(precompute))])
    return {**json.loads(result.read_text()), "wall_seconds": wall, "peak_mb": peak}


def dpo_in_trl_process(base: str, data: str, result: str, steps: int, every: int, lora: bool, precompute: bool) -> None:
    """The trl run: DPOConfig as the job asks (its defaults otherwise), on one thread."""
    import torch

    torch.set_num_threads(1)
    import datasets
    import peft
    import transformers
    import trl

    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_file=str(Path(base) / "tokenizer.json"),
                                                     eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tokenizer.chat_template = TEMPLATE
    model = transformers.AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    records = [json.loads(line) for line in Path(data).read_text().splitlines()]
    dataset = datasets.Dataset.from_list([{**r, "tools": json.dumps(r["tools"])} for r in records])
    config = trl.DPOConfig(output_dir=str(Path(result).parent / "trl"), max_steps=steps,
                           per_device_train_batch_size=PAIRS, max_length=CONTEXT, learning_rate=LR, beta=BETA,
                           lr_scheduler_type="constant", warmup_steps=0, precompute_ref_log_probs=precompute,
                           bf16=False, use_cpu=True, report_to="none", save_strategy="no", logging_steps=every,
                           dataloader_num_workers=0, seed=0)
    settings = peft.LoraConfig(r=RANK, lora_alpha=ALPHA, lora_dropout=0.0, target_modules="all-linear",
                               task_type="CAUSAL_LM") if lora else None
    timed_in_trl(lambda callbacks: trl.DPOTrainer(model=model, args=config, train_dataset=dataset,
                                                  processing_class=tokenizer, peft_config=settings, callbacks=callbacks),
                 result)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--child", nargs=7, help=argparse.SUPPRESS)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--count", type=int, default=1000, help="preference pairs")
    p.add_argument("--quick", action="store_true", help="a few steps on a few pairs (to check the script)")
    p.add_argument("--out")
    args = p.parse_args()
    if args.child:
        base, data, result, steps, every, lora, precompute = args.child
        return dpo_in_trl_process(base, data, result, int(steps), int(every), bool(int(lora)), bool(int(precompute)))
    try:
        import trl
    except ImportError:
        raise SystemExit("this benchmark compares with trl: pip install trl") from None
    from data.tasks import call_pairs

    steps, count, every = (4, 40, 2) if args.quick else (args.steps, args.count, 5)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        make_base(tmp / "base", job_conversations(200))  # (its tokenizer learns the calls' words)
        data = tmp / "pairs.jsonl"
        data.write_text("".join(json.dumps(r) + "\n" for r in call_pairs(count)))
        results = {}
        for weights, lora in (("LoRA", True), ("every weight", False)):
            for precomputed, precompute in (("", False), (", reference precomputed", True)):
                here = tmp / f"here-{lora}-{precompute}"
                results[f"here, {weights}{precomputed}"] = dpo_here(tmp / "base", data, here, steps, every, lora,
                                                                    precompute)
                results[f"trl, {weights}{precomputed}"] = dpo_in_trl(tmp / "base", data, tmp, steps, every, lora,
                                                                     precompute)
    rows = [[name, r["tokens_per_second"], r["wall_seconds"], r["peak_mb"]] for name, r in results.items()]
    print(table(["job", "real tokens/s in training", "wall s (all of it)", "peak MB"], rows))
    for mine in (name for name in results if name.startswith("here")):
        other = mine.replace("here", "trl", 1)
        a, b = results[mine], results[other]
        print(f"{mine} / {other}: {a['tokens_per_second'] / b['tokens_per_second']:.2f}x the tokens a second, "
              f"{a['peak_mb'] / b['peak_mb']:.2f}x the peak memory")
    path = save("dpo", {"machine": machine(1), "trl": trl.__version__, "steps": steps, "pairs": count,
                        "pairs_a_step": PAIRS, "context": CONTEXT, "shape": SHAPE, "results": results}, args.out)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
