"""GGUF, the one-file format llama.cpp and Ollama run, written from a run with the gguf library.

llama.cpp's converter (convert_hf_to_gguf.py) reads a transformers folder, but it knows a
BPE tokenizer only by a hash of how it encodes a test text, and it knows the published
models' tokenizers only: one trained by this project stops it with "BPE pre-tokenizer was
not recognized". So the GGUF is written here, with what the converter would write: the
five kinds of interop/hf.py become llama.cpp's gpt2, gptneox, llama, qwen2 and qwen3
architectures, and this project's tokenizers llama.cpp's GPT-2 tokenizer (its vocabulary,
merges and pre-tokenizer). The matrices are written in float32, float16 or Q8_0
(export.py --gguf-type); norms and biases stay float32, as llama.cpp's converter keeps them.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from tokenizers import Tokenizer, pre_tokenizers

from interop.hf import MODERN, export_kind, with_zero_biases
from data.template import END_OF_TURN
from data.tokenizer import UNK, end_of_text_id, start_ids
from model import GPTConfig
from storage.atomic import replaced

GGUF_TYPES = ("f32", "f16", "q8_0")  # what export.py --gguf-type writes the matrices in
ARCHITECTURES = {"gpt2": "GPT2", "gpt_neox": "GPTNEOX", "llama": "LLAMA", "qwen2": "QWEN2",
                 "qwen3": "QWEN3"}  # export_kind -> gguf.MODEL_ARCH
BLOCK_TENSORS = {"ln_1": "ATTN_NORM", "attn.c_attn": "ATTN_QKV", "attn.c_proj": "ATTN_OUT", "ln_2": "FFN_NORM",
                 "mlp.c_gate": "FFN_GATE", "mlp.c_fc": "FFN_UP", "mlp.c_proj": "FFN_DOWN",
                 "attn.q_norm": "ATTN_Q_NORM", "attn.k_norm": "ATTN_K_NORM"}  # ours -> MODEL_TENSOR
MODEL_TENSORS = {"transformer.wte": "TOKEN_EMBD", "transformer.wpe": "POS_EMBD", "transformer.ln_f": "OUTPUT_NORM",
                 "lm_head": "OUTPUT"}
BYTE_LEVEL = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)  # a byte -> GPT-2's printable letter


def import_gguf():
    try:
        import gguf
    except ImportError:
        raise ValueError("writing GGUF needs the gguf package (llama.cpp's own): pip install gguf") from None
    return gguf


def write_gguf(path: Path, config: GPTConfig, state: dict[str, torch.Tensor], tokenizer: Tokenizer, name: str,
               dtype: str = "f32", tokenizer_settings: dict[str, str] | None = None) -> str:
    """Write the model and its tokenizer to path (through a temporary file, so that no
    half-written file is ever left there), its matrices in `dtype` (GGUF_TYPES), and what
    the run's job declares beside its tokenizer as GGUF's tokenizer.* keys (a chat model's
    tokenizer.chat_template, which llama.cpp applies: Job.tokenizer_settings); returns
    llama.cpp's architecture name. Raises ValueError (interop.hf.Unsupported among them)
    naming what GGUF cannot hold."""
    gguf = import_gguf()
    kind = export_kind(config)
    if config.rope_scaling:  # (llama.cpp takes it as a rope_freqs tensor of factors, not written here yet)
        raise ValueError("Llama 3's rope_scaling is not written to GGUF by this project yet; export it as a "
                         "transformers folder instead")
    if kind == "qwen3" and config.qkv_bias:  # (llama.cpp's qwen3 reads no attention biases)
        raise ValueError("llama.cpp's qwen3 architecture has no attention biases; export this model (QK-norm with "
                         "qkv_bias) as a transformers folder instead")
    arch = getattr(gguf.MODEL_ARCH, ARCHITECTURES[kind])
    tokens, types, merges = gpt2_vocabulary(tokenizer, config.vocab_size)
    with replaced(path) as tmp:  # (storage/atomic.py: no half-written file is ever left at path)
        writer = gguf.GGUFWriter(tmp, gguf.MODEL_ARCH_NAMES[arch])
        try:
            write_hyperparameters(writer, gguf, kind, config, name, dtype)
            writer.add_tokenizer_model("gpt2")
            writer.add_tokenizer_pre("gpt-2")  # GPT-2's regex splits the text into words, as ByteLevel does
            writer.add_token_list(tokens)
            writer.add_token_types([getattr(gguf.TokenType, t) for t in types])
            writer.add_token_merges(merges)
            write_special_tokens(writer, tokenizer)
            for key, value in (tokenizer_settings or {}).items():
                writer.add_string(f"tokenizer.{key}", value)
            for tensor_name, tensor in gguf_tensors(gguf, arch, kind, config, state).items():
                values, raw_dtype = stored(gguf, tensor.float().contiguous().numpy(), dtype)
                writer.add_tensor(tensor_name, values, raw_dtype=raw_dtype)
            writer.write_header_to_file()
            writer.write_kv_data_to_file()
            writer.write_tensors_to_file()
        finally:
            writer.close()  # (after an error too: the file is closed before it is renamed, or removed)
    return gguf.MODEL_ARCH_NAMES[arch]


def stored(gguf, values, dtype: str) -> tuple:
    """(the array written, its GGUF type or None for the array's own): a matrix in the file's
    dtype, a vector (norms, biases) in float32 as llama.cpp's own converter keeps them; Q8_0
    packs blocks of 32 numbers along a row (one float16 scale, 32 bytes), so a matrix whose
    rows are not a multiple of 32 long is stored in float16."""
    if values.ndim == 1 or dtype == "f32":
        return values, None
    if dtype == "q8_0" and values.shape[-1] % 32 == 0:
        return gguf.quants.quantize(values, gguf.GGMLQuantizationType.Q8_0), gguf.GGMLQuantizationType.Q8_0
    return values.astype("float16"), None


def write_hyperparameters(writer, gguf, kind: str, c: GPTConfig, name: str, dtype: str) -> None:
    """The keys llama.cpp reads for the architecture (what its defaults would get wrong included)."""
    writer.add_name(name)
    writer.add_context_length(c.block_size)
    writer.add_embedding_length(c.n_embd)
    writer.add_block_count(c.n_layer)
    writer.add_feed_forward_length(c.ffn_hidden)
    writer.add_head_count(c.n_head)
    writer.add_head_count_kv(c.n_kv_head)
    writer.add_file_type({"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16,
                          "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}[dtype])
    if kind in MODERN:
        writer.add_layer_norm_rms_eps(c.norm_eps)
    else:
        writer.add_layer_norm_eps(c.norm_eps)
    if kind == "gpt_neox":
        writer.add_parallel_residual(False)  # ours are sequential: x + attn(ln_1(x)), then + ffn(ln_2(·))
    if c.pos_encoding == "rope":
        writer.add_rope_dimension_count(c.head_size)  # every dimension of each head rotates
        writer.add_rope_freq_base(c.rope_base)
    if c.head_dim:  # (heads not n_embd / n_head wide: llama.cpp's key_length and value_length)
        writer.add_key_length(c.head_size)
        writer.add_value_length(c.head_size)


def gguf_tensors(gguf, arch, kind: str, c: GPTConfig, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Our tensors by GGUF's names (the gguf library's), shaped as llama.cpp reads them.
    gpt2 and gptneox take every bias (zeros where the model has none); a tied head is
    token_embd read twice, except in gptneox, which requires an output matrix of its own;
    llama, qwen2 and qwen3 split c_attn into q, k and v."""
    state = dict(state) if kind in MODERN else with_zero_biases(c, state)
    if c.tie_embeddings and kind != "gpt_neox":
        del state["lm_head.weight"]
    out = {}
    for ours, tensor in state.items():
        if kind in MODERN and ".attn.c_attn." in ours:
            out.update(split_qkv(gguf, c, ours, tensor, adjacent=kind == "llama"))
        else:
            out[gguf_name(gguf, ours)] = tensor
    known = {gguf.TENSOR_NAMES[t].format(bid=i) for t in gguf.MODEL_TENSORS[arch] for i in range(c.n_layer)}
    assert all(name.rsplit(".", 1)[0] in known for name in out), f"not all {sorted(out)} are {arch.name}'s"
    return out


def gguf_name(gguf, ours: str, tensor: str | None = None) -> str:
    """transformer.h.3.attn.c_proj.weight -> blk.3.attn_output.weight (tensor: another
    MODEL_TENSOR in the same block)."""
    module, suffix = ours.rsplit(".", 1)
    if module.startswith("transformer.h."):
        block, part = module.removeprefix("transformer.h.").split(".", 1)
        base = gguf.TENSOR_NAMES[getattr(gguf.MODEL_TENSOR, tensor or BLOCK_TENSORS[part])].format(bid=block)
    else:
        base = gguf.TENSOR_NAMES[getattr(gguf.MODEL_TENSOR, MODEL_TENSORS[module])]
    return f"{base}.{suffix}"


def split_qkv(gguf, c: GPTConfig, ours: str, t: torch.Tensor, adjacent: bool) -> dict[str, torch.Tensor]:
    """c_attn's rows (or its bias) as llama.cpp's attn_q, attn_k, attn_v. Its llama
    architecture rotates adjacent pairs (2i, 2i+1) of each head (`adjacent`); ours rotate i
    with i + d/2 (rotate_half, as transformers' Llama and llama.cpp's qwen2 and qwen3), so for llama
    the rows of W_Q and W_K are reordered within each head: the same attention scores (q·k
    sums over the same pairs, each rotated by the same angle)."""
    kv = c.n_kv_head * c.head_size
    q, k, v = t.split([c.heads_width, kv, kv])
    if adjacent:
        q, k = adjacent_pairs(q, c.n_head), adjacent_pairs(k, c.n_kv_head)
    return {gguf_name(gguf, ours, "ATTN_Q"): q, gguf_name(gguf, ours, "ATTN_K"): k, gguf_name(gguf, ours, "ATTN_V"): v}


def adjacent_pairs(t: torch.Tensor, heads: int) -> torch.Tensor:
    """Rows [head, (half, i)] -> [head, (i, half)]: row i + d/2 of a head moves next to row i."""
    rest = t.shape[1:]
    return t.reshape(heads, 2, -1, *rest).transpose(1, 2).reshape(t.shape).contiguous()


def gpt2_vocabulary(tokenizer: Tokenizer, vocab_size: int) -> tuple[list[str], list[str], list[str]]:
    """(tokens, their gguf.TokenType names, merges) for llama.cpp's GPT-2 tokenizer, from
    this project's byte-level BPE (GPT-2's scheme: taken as it is) or character tokenizer
    (each character spelt in GPT-2's byte letters, with the merges that join a character
    of several UTF-8 bytes back into its token). Raises ValueError for other tokenizers."""
    spec = json.loads(tokenizer.to_str())
    model, pre = spec["model"], spec["pre_tokenizer"] or {}
    special = {t.content for t in tokenizer.get_added_tokens_decoder().values() if t.special}
    if model["type"] == "BPE" and is_gpt2_byte_level(spec):
        merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
        vocab = model["vocab"] | {t: tokenizer.token_to_id(t) for t in special}
    elif model["type"] == "WordLevel" and pre.get("type") == "Split":
        vocab, merges = {}, []
        for token, i in model["vocab"].items():
            spelt = token if token == UNK else "".join(piece for piece, _ in BYTE_LEVEL.pre_tokenize_str(token))
            vocab[spelt] = i
            merges += [f"{spelt[:j]} {spelt[j]}" for j in range(1, len(spelt)) if token != UNK]
        merges = list(dict.fromkeys(merges))
        vocab |= {t: tokenizer.token_to_id(t) for t in special}  # (a chat model's markers)
        special.add(UNK)
    else:
        raise ValueError("this run's tokenizer is not one of this project's (byte-level BPE or characters); "
                         "export the transformers folder instead (--out DIR) and convert it with llama.cpp's "
                         "convert_hf_to_gguf.py, which knows the published models' tokenizers")
    by_id = {i: t for t, i in vocab.items()}
    tokens = [by_id.get(i, f"[PAD{i}]") for i in range(vocab_size)]
    types = ["UNUSED" if i not in by_id else "UNKNOWN" if by_id[i] == UNK and model["type"] == "WordLevel"
             else "CONTROL" if by_id[i] in special else "NORMAL" for i in range(vocab_size)]
    return tokens, types, merges


def is_gpt2_byte_level(spec: dict) -> bool:
    """GPT-2's pre-tokenization (its regex, no prefix space, no normaliser), which is what
    llama.cpp's "gpt2" pre-tokenizer does."""
    pre = spec["pre_tokenizer"] or {}
    return (spec.get("normalizer") is None and pre.get("type") == "ByteLevel" and not pre.get("add_prefix_space")
            and pre.get("use_regex", True) and not spec["model"].get("byte_fallback"))


def write_special_tokens(writer, tokenizer: Tokenizer) -> None:
    """The tokens a text starts and ends with, as generate.py uses them."""
    eot, start = end_of_text_id(tokenizer), start_ids(tokenizer)
    if eot is not None:
        writer.add_eos_token_id(eot)
        writer.add_bos_token_id(start[0] if start else eot)
    unk = tokenizer.token_to_id(UNK)
    if unk is not None and eot is None:
        writer.add_unk_token_id(unk)
    writer.add_add_bos_token(bool(start))
    writer.add_add_eos_token(False)
    end_of_turn = tokenizer.token_to_id(END_OF_TURN)
    if end_of_turn is not None:  # a chat model's turns end here (data/template.py's default template)
        writer.add_eot_token_id(end_of_turn)
