"""Hugging Face transformers' formats, both ways, without importing transformers.

A GPT of this project is a GPT2LMHeadModel when its positions are learned; a
GPTNeoXForCausalLM when they are rotary with LayerNorm and the GELU network (sequential
residuals, rotary on every dimension of each head, the same base, tied embeddings, and
rotate_half's pairing of dimension i with i + d/2, which is ours); and a
LlamaForCausalLM when it has the modern block (rotary positions, RMSNorm, the SwiGLU
network; grouped-query attention, an untied head and Llama 3's rope scaling included);
a Qwen2ForCausalLM when that block has biases on W_Q, W_K, W_V alone (and its tokenizer
is Qwen's: to_transformers says why; else a Llama with biases); and a Qwen3ForCausalLM when
it normalises each head's q and k (QK-norm; a head size of its own comes in and goes out with
Llama's and Qwen3's head_dim). GPT-2 and GPT-NeoX hold
grouped-query attention as multi-head attention, each key/value head repeated for the
query heads that share it (the same logits). Other configurations
have no transformers class that computes exactly what they compute, and are refused,
naming what differs. Only the config.json dictionary and the tensors are converted
here; the files are written and read by the callers.
"""

from __future__ import annotations

import dataclasses
import re

import torch

from model import GPTConfig
from model.config import ROPE_SCALING

ACTIVATIONS = {"gelu": "gelu", "gelu_tanh": "gelu_pytorch_tanh"}  # ours -> transformers' name
ACTIVATIONS_IN = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh"}  # and back
LINEARS_GPT2 = ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")  # Conv1D in GPT-2: [in, out]
# ours -> Llama's (c_attn splits into q_proj, k_proj and v_proj: rename_llama)
LLAMA_NAMES = {"ln_1": "input_layernorm", "ln_2": "post_attention_layernorm", "attn.c_proj": "self_attn.o_proj",
               "mlp.c_gate": "mlp.gate_proj", "mlp.c_fc": "mlp.up_proj", "mlp.c_proj": "mlp.down_proj"}
QK_NORM_NAMES = {"attn.q_norm": "self_attn.q_norm", "attn.k_norm": "self_attn.k_norm"}  # Qwen3's, with QK-norm
MODERN = ("llama", "qwen2", "qwen3")  # the kinds of the modern block, in Llama's names
PEFT_PREFIX = "base_model.model."  # (a PeftModel's name for the transformers model it wraps)
# export_kind -> the token embedding's module
EMBEDDINGS = {"gpt2": "transformer.wte", "gpt_neox": "gpt_neox.embed_in", "llama": "model.embed_tokens",
              "qwen2": "model.embed_tokens", "qwen3": "model.embed_tokens"}
NEOX_NAMES = {"ln_1": "input_layernorm", "ln_2": "post_attention_layernorm", "attn.c_attn": "attention.query_key_value",
              "attn.c_proj": "attention.dense", "mlp.c_fc": "mlp.dense_h_to_4h", "mlp.c_proj": "mlp.dense_4h_to_h"}


class Unsupported(ValueError):
    """This configuration or checkpoint has no exact counterpart; the message says what does."""


KINDS = ("GPT-2 (learned positions, LayerNorm, GELU), GPT-NeoX (rope, LayerNorm, GELU), Llama (rope, RMSNorm, "
         "SwiGLU), Qwen2 (Llama's, with biases on W_Q, W_K, W_V alone) or Qwen3 (Llama's, with QK-norm)")


def export_kind(c: GPTConfig) -> str:
    """The transformers class a config becomes: "gpt2", "gpt_neox", "llama", "qwen2" or
    "qwen3"; raises Unsupported naming, in one line, what that class cannot express."""
    kind = "llama" if c.norm == "rmsnorm" or c.mlp == "swiglu" or c.qk_norm else \
        "gpt2" if c.pos_encoding == "learned" else "gpt_neox"
    if kind == "llama" and c.qk_norm:
        kind = "qwen3"
    elif kind == "llama" and c.qkv_bias and not c.bias:
        kind = "qwen2"
    modern = kind in MODERN
    name = {"gpt2": "GPT-2", "gpt_neox": "GPT-NeoX", "llama": "Llama", "qwen2": "Qwen2", "qwen3": "Qwen3"}[kind]
    problems = [f"pos_encoding={c.pos_encoding}" if c.pos_encoding == "sinusoidal" or
                (modern and c.pos_encoding != "rope") else None,
                f"norm_position={c.norm_position}" if c.norm_position != "pre" else None,
                f"mlp={c.mlp} (Llama's feed-forward network is SwiGLU)" if modern and c.mlp != "swiglu" else None,
                f"norm={c.norm} (Llama normalises with RMSNorm)" if modern and c.norm != "rmsnorm" else None,
                f"qkv_bias={c.qkv_bias} with bias={c.bias}"
                if c.qkv_bias != c.bias and kind not in ("qwen2", "qwen3") else None,
                "bias=true (Qwen3's feed-forward network has no biases)" if kind == "qwen3" and c.bias else None]
    if not modern:
        problems.append(f"head_dim={c.head_dim} (its heads are n_embd / n_head wide)" if c.head_dim else None)
        problems.append("tie_embeddings=false" if not c.tie_embeddings else None)
        problems.append("Llama 3's rope_scaling" if c.rope_scaling else None)
    problems = [p for p in problems if p]
    if problems:
        raise Unsupported(f"as {name}, no transformers class computes a model with {', '.join(problems)}; "
                          f"the kinds that export are {KINDS}")
    return kind


def to_transformers(config: GPTConfig, state: dict[str, torch.Tensor], eot: int | None,
                    qwen_tokenizer: bool = False) -> tuple[dict, dict]:
    """(config.json as a dict, tensors by transformers' names) for GPT2LMHeadModel,
    GPTNeoXForCausalLM, LlamaForCausalLM or Qwen2ForCausalLM. A GPT-2 or GPT-NeoX model
    without biases gets zero biases, which compute the same.

    qwen_tokenizer: the model's tokenizer splits text as Qwen's does (qwen_pretokenized).
    transformers 5 reads a qwen2 folder's tokenizer as its Qwen2Tokenizer, which keeps the
    vocabulary and merges but puts Qwen's own normaliser and pre-tokenizer in place of the
    folder's (it splits digits one by one), whatever tokenizer_config.json names. So a
    Qwen2-shaped model whose tokenizer is another (one trained here) is written as a
    LlamaForCausalLM with attention biases, the output projection's zero: the same logits,
    and a tokenizer transformers reads as written. (A qwen3 folder's tokenizer is read as
    written: tests/test_llama.py checks both.)"""
    c, kind = config, export_kind(config)
    common = {"vocab_size": c.vocab_size, "tie_word_embeddings": c.tie_embeddings, "bos_token_id": eot,
              "eos_token_id": eot, "torch_dtype": "float32"}
    if kind == "qwen2" and not qwen_tokenizer:
        kind = "llama"  # (with biases on q, k, v and o, o's zero)
    if kind in MODERN:
        return to_llama(c, state, common, kind)
    c, state = with_every_kv_head(c, state)
    state = with_zero_biases(c, state)
    if kind == "gpt2":
        hf = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_positions": c.block_size,
              "n_embd": c.n_embd, "n_layer": c.n_layer, "n_head": c.n_head, "n_inner": c.ffn_hidden,
              "activation_function": ACTIVATIONS[c.activation], "layer_norm_epsilon": c.norm_eps,
              "resid_pdrop": c.dropout, "embd_pdrop": c.dropout, "attn_pdrop": c.dropout, **common}
        tensors = {name: t.t() if name.endswith(tuple(f"{m}.weight" for m in LINEARS_GPT2)) else t
                   for name, t in state.items() if name != "lm_head.weight"}
        return hf, tensors
    hf = {"model_type": "gpt_neox", "architectures": ["GPTNeoXForCausalLM"], "hidden_size": c.n_embd,
          "num_hidden_layers": c.n_layer, "num_attention_heads": c.n_head, "intermediate_size": c.ffn_hidden,
          "hidden_act": ACTIVATIONS[c.activation], "max_position_embeddings": c.block_size, "layer_norm_eps": c.norm_eps,
          "use_parallel_residual": False, "rotary_pct": 1.0, "rotary_emb_base": c.rope_base, "attention_bias": True,
          "attention_dropout": c.dropout, "hidden_dropout": c.dropout, **common}
    return hf, rename_neox(state, c, to_neox=True)


def to_llama(c: GPTConfig, state: dict[str, torch.Tensor], common: dict, kind: str) -> tuple[dict, dict]:
    """LlamaForCausalLM, Qwen2ForCausalLM (biases on W_Q, W_K, W_V alone) or Qwen3ForCausalLM
    (QK-norm), as `kind` says: what their defaults would get wrong is written out (the norms'
    ε, the tying, the key/value heads, the head size, the SwiGLU width, the rope base, the
    context, Qwen's sliding window left off). Biases on W_Q, W_K, W_V alone in a Llama or a
    Qwen3, whose attention_bias puts them on W_O too, go out with W_O's biases zero."""
    hf = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": c.n_embd,
          "intermediate_size": c.ffn_hidden, "num_hidden_layers": c.n_layer, "num_attention_heads": c.n_head,
          "num_key_value_heads": c.n_kv_head, "head_dim": c.head_size, "hidden_act": "silu",
          "max_position_embeddings": c.block_size, "rms_norm_eps": c.norm_eps, "rope_theta": c.rope_base,
          "rope_parameters": {"rope_type": "llama3" if c.rope_scaling else "default", "rope_theta": c.rope_base,
                              **(c.rope_scaling or {})}, "attention_bias": c.bias,
          "mlp_bias": c.bias, "attention_dropout": c.dropout, **common}
    tensors = rename_llama(state, c, to_llama=True)
    if kind == "qwen2":
        del hf["attention_bias"], hf["mlp_bias"]  # (Qwen2's q, k and v have biases, the rest none)
        return hf | {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "use_sliding_window": False}, tensors
    if kind == "qwen3":
        del hf["mlp_bias"]  # (Qwen3's feed-forward network has none)
        hf |= {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "use_sliding_window": False}
    if c.qkv_bias and not c.bias:
        hf["attention_bias"] = True  # (on q, k, v and o)
        for i in range(c.n_layer):
            tensors[f"model.layers.{i}.self_attn.o_proj.bias"] = torch.zeros(c.n_embd)
    return hf, tensors


def rename_llama(tensors: dict[str, torch.Tensor], c: GPTConfig, to_llama: bool) -> dict[str, torch.Tensor]:
    """Our names to Llama's (to_llama) or back; c_attn splits into q_proj, k_proj, v_proj
    rows as they are (the rotary layouts are the same); QK-norm's gains are Qwen3's q_norm, k_norm."""
    pairs = [("transformer.wte.weight", "model.embed_tokens.weight"), ("transformer.ln_f.weight", "model.norm.weight")]
    if not c.tie_embeddings:
        pairs.append(("lm_head.weight", "lm_head.weight"))
    renamed = {}
    for ours, theirs in pairs:
        source, target = (ours, theirs) if to_llama else (theirs, ours)
        renamed[target] = tensors[source]
    kv = c.n_kv_head * c.head_size
    for i in range(c.n_layer):
        ours, theirs = f"transformer.h.{i}.", f"model.layers.{i}."
        names = {f"{mine}.{part}": f"{other}.{part}" for mine, other in LLAMA_NAMES.items()
                 for part in ("weight", "bias") if part == "weight" or (c.bias and not mine.startswith("ln_"))}
        if c.qk_norm:
            names |= {f"{mine}.weight": f"{other}.weight" for mine, other in QK_NORM_NAMES.items()}
        for kind in ("weight", "bias") if c.qkv_bias else ("weight",):  # (Qwen2: biases on q, k, v alone)
            parts = [f"{theirs}self_attn.{p}_proj.{kind}" for p in "qkv"]
            if to_llama:
                split = tensors[f"{ours}attn.c_attn.{kind}"].split([c.heads_width, kv, kv])
                renamed.update(zip(parts, split))
            else:
                renamed[f"{ours}attn.c_attn.{kind}"] = torch.cat([tensors[p] for p in parts])
        for mine, other in names.items():
            source, target = (ours + mine, theirs + other) if to_llama else (theirs + other, ours + mine)
            renamed[target] = tensors[source]
    return renamed


def rename_neox(tensors: dict[str, torch.Tensor], c: GPTConfig, to_neox: bool) -> dict[str, torch.Tensor]:
    """Our names to GPT-NeoX's (to_neox) or back, reordering the fused QKV rows."""
    pairs = [("transformer.wte.weight", "gpt_neox.embed_in.weight"),
             ("transformer.ln_f.weight", "gpt_neox.final_layer_norm.weight"),
             ("transformer.ln_f.bias", "gpt_neox.final_layer_norm.bias")]
    pairs += [(f"transformer.h.{i}.{ours}.{kind}", f"gpt_neox.layers.{i}.{theirs}.{kind}")
              for i in range(c.n_layer) for ours, theirs in NEOX_NAMES.items() for kind in ("weight", "bias")]
    renamed = {}
    for ours, theirs in pairs:
        source, target = (ours, theirs) if to_neox else (theirs, ours)
        t = tensors[source]
        renamed[target] = qkv_layout(t, c.n_head, to_neox) if ".attn.c_attn." in ours else t
    return renamed


def qkv_layout(t: torch.Tensor, n_head: int, to_neox: bool) -> torch.Tensor:
    """The fused W_Q, W_K, W_V rows: ours are [q of every head, k ..., v ...] = [3, H, d_k];
    GPT-NeoX's are [head 0's q, k, v, head 1's ...] = [H, 3, d_k]."""
    rest = t.shape[1:]
    shape = (3, n_head, -1, *rest) if to_neox else (n_head, 3, -1, *rest)
    return t.reshape(shape).transpose(0, 1).reshape(-1, *rest).contiguous()


def with_every_kv_head(c: GPTConfig, state: dict[str, torch.Tensor]) -> tuple[GPTConfig, dict[str, torch.Tensor]]:
    """Grouped-query attention as plain multi-head attention, for GPT-2 and GPT-NeoX, which
    have no shared key/value heads: each k and v head's rows of c_attn are repeated for the
    n_head / n_kv_head query heads that read it (as the model repeats k and v), so the
    logits are the same and the key/value weights that many times larger."""
    if c.n_kv_head == c.n_head:
        return c, state
    state = dict(state)
    for i in range(c.n_layer):
        for kind in ("weight", "bias") if c.bias else ("weight",):
            name = f"transformer.h.{i}.attn.c_attn.{kind}"
            state[name] = every_kv_head(c, state[name])
    return dataclasses.replace(c, n_kv_head=c.n_head), state


def every_kv_head(c: GPTConfig, rows: torch.Tensor) -> torch.Tensor:
    """c_attn's rows (of W, its bias, or a LoRA B) [C + 2 H_kv d_k, ...] -> [3 C, ...], each
    key/value head's rows repeated for the query heads that share it."""
    group, kv = c.n_head // c.n_kv_head, c.n_kv_head * c.head_size
    q, k, v = rows.split([c.n_embd, kv, kv])  # k, v: [H_kv d_k, ...]
    k, v = (t.reshape(c.n_kv_head, c.head_size, *t.shape[1:]).repeat_interleave(group, 0)
            .reshape(c.n_embd, *t.shape[1:]) for t in (k, v))  # [H d_k, ...]
    return torch.cat([q, k, v])


def lora_to_transformers(c: GPTConfig, kind: str,
                         adapters: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """peft's LoRA tensors over the export of `kind` (export_kind's; a Qwen2 written as a
    Llama is a "llama" here): {our module (transformer.h.{i}.attn.c_attn, ...): (A [r, in],
    B [out, r])} -> {"base_model.model.<their module>.lora_A.weight": A, ...lora_B.weight: B}.
    The update B A has W's shape, so whatever the export does to W's rows it does to B's:
    GPT-2's and GPT-NeoX's key/value heads repeated, GPT-NeoX's per-head order, Llama's
    split of c_attn into q_proj, k_proj and v_proj (which then share A). GPT-2's Conv1D
    holds Wᵀ; peft's fan_in_fan_out undoes that, so A and B stay as they are."""
    kv = c.n_kv_head * c.head_size
    tensors = {}
    for ours, (a, b) in adapters.items():
        i, target = re.fullmatch(r"transformer\.h\.(\d+)\.(.+)", ours).groups()
        if kind in MODERN:
            if target == "attn.c_attn":
                parts = zip((f"self_attn.{p}_proj" for p in "qkv"), b.split([c.heads_width, kv, kv]))
            else:
                parts = [(LLAMA_NAMES[target], b)]
            modules = [(f"model.layers.{i}.{theirs}", rows) for theirs, rows in parts]
        else:
            if target == "attn.c_attn":
                b = every_kv_head(c, b)
            if kind == "gpt2":
                modules = [(ours, b)]
            else:
                rows = qkv_layout(b, c.n_head, to_neox=True) if target == "attn.c_attn" else b
                modules = [(f"gpt_neox.layers.{i}.{NEOX_NAMES[target]}", rows)]
        for module, rows in modules:
            tensors[f"{PEFT_PREFIX}{module}.lora_A.weight"] = a.clone()  # (q, k, v: one A, stored thrice)
            tensors[f"{PEFT_PREFIX}{module}.lora_B.weight"] = rows.contiguous()
    return tensors



def module_in_transformers(kind: str, ours: str) -> str:
    """The transformers name of one of our modules that LoRA trains whole (lora.modules_to_save:
    the embedding, the head, the final norm, a block's norms), in an export of `kind`
    (export_kind's; a Qwen2 written as a Llama is a "llama" here)."""
    block = re.fullmatch(r"transformer\.h\.(\d+)\.(ln_1|ln_2)", ours)
    if block:
        i, norm = block.groups()
        if kind == "gpt2":
            return ours
        return f"gpt_neox.layers.{i}.{NEOX_NAMES[norm]}" if kind == "gpt_neox" else f"model.layers.{i}.{LLAMA_NAMES[norm]}"
    final_norm = {"gpt2": "transformer.ln_f", "gpt_neox": "gpt_neox.final_layer_norm"}.get(kind, "model.norm")
    return {"transformer.wte": EMBEDDINGS[kind], "lm_head": "lm_head", "transformer.ln_f": final_norm}[ours]


def with_zero_biases(c: GPTConfig, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    if c.bias:
        return dict(state)
    state = dict(state)
    widths = {"ln_1": c.n_embd, "ln_2": c.n_embd, "attn.c_attn": 3 * c.n_embd, "attn.c_proj": c.n_embd,
              "mlp.c_fc": c.ffn_hidden, "mlp.c_proj": c.n_embd}
    for i in range(c.n_layer):
        for name, width in widths.items():
            state[f"transformer.h.{i}.{name}.bias"] = torch.zeros(width)
    state["transformer.ln_f.bias"] = torch.zeros(c.n_embd)
    return state


def config_from_transformers(hf: dict) -> GPTConfig:
    """Our config for a transformers config.json (config_of), or Unsupported naming what is
    missing or different."""
    try:
        return config_of(hf)
    except KeyError as e:
        raise Unsupported(f"its config.json ({hf.get('model_type')}) has no {e.args[0]!r}") from None


def config_of(hf: dict) -> GPTConfig:
    """Our config for a GPT-2 family config.json, or a GPT-NeoX one of the shape
    to_transformers writes; anything else raises Unsupported naming what differs."""
    kind = hf.get("model_type")
    if kind == "gpt2":
        require(hf, {"layer_norm_epsilon": 1e-5, "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False,
                     "n_inner": None if hf.get("n_inner") is None else 4 * hf["n_embd"], "tie_word_embeddings": True})
        return GPTConfig(vocab_size=hf["vocab_size"], block_size=hf["n_positions"], n_layer=hf["n_layer"],
                         n_head=hf["n_head"], n_embd=hf["n_embd"], dropout=float(hf.get("resid_pdrop", 0.0)),
                         bias=True, pos_encoding="learned", activation=activation_of(hf, "activation_function"))
    if kind == "gpt_neox":
        rope = hf.get("rope_parameters") or {}
        require({**hf, "rotary_pct": rope.get("partial_rotary_factor", hf.get("rotary_pct", 0.25))},
                {"use_parallel_residual": False, "rotary_pct": 1.0, "layer_norm_eps": 1e-5,
                 "intermediate_size": 4 * hf["hidden_size"], "tie_word_embeddings": True})
        return GPTConfig(vocab_size=hf["vocab_size"], block_size=hf["max_position_embeddings"],
                         n_layer=hf["num_hidden_layers"], n_head=hf["num_attention_heads"], n_embd=hf["hidden_size"],
                         dropout=float(hf.get("hidden_dropout", 0.0)), bias=True, pos_encoding="rope",
                         activation=activation_of(hf, "hidden_act"),
                         rope_base=float(rope.get("rope_theta", hf.get("rotary_emb_base", 10000.0))))
    if kind == "llama":
        if hf.get("attention_bias") and not hf.get("mlp_bias", False):  # (a Qwen2 as export.py may write it)
            return dataclasses.replace(config_from_llama({**hf, "attention_bias": False}), qkv_bias=True)
        return config_from_llama(hf)
    if kind in ("qwen2", "qwen3"):  # Llama's block, with a sliding window it may leave off
        if hf.get("use_sliding_window"):
            raise Unsupported(f"{kind} with use_sliding_window=true is not supported (this model attends to every "
                              "key in every layer)")
        llama = {**hf, "attention_bias": False, "mlp_bias": False, "sliding_window": None}
        if kind == "qwen2":  # biases on q, k and v alone
            return dataclasses.replace(config_from_llama(llama), qkv_bias=True)
        # Qwen3: QK-norm; its attention_bias puts biases on q, k, v and o (which come in only when zero)
        return dataclasses.replace(config_from_llama(llama), qk_norm=True, qkv_bias=bool(hf.get("attention_bias")))
    raise Unsupported(f"model_type {kind!r} is not supported; init_from takes a run directory of this project, "
                      "a GPT-2 family model (gpt2, distilgpt2, ...) or a Llama-family one (model_type llama, "
                      "qwen2 or qwen3)")


def config_from_llama(hf: dict) -> GPTConfig:
    """Our config for a LlamaForCausalLM config.json; what our block cannot express (a
    rope scaling other than Llama 3's, another activation, biases on attention alone, a
    sliding window) is refused naming the setting."""
    rope = hf.get("rope_parameters") or {}  # (transformers 5; 4 wrote rope_theta and rope_scaling)
    scaling = hf.get("rope_scaling") or rope
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type not in ("default", "llama3"):
        raise Unsupported(f"llama with rope scaling {rope_type!r} is not supported (this model's rotary "
                          "positions are unscaled, rope_type 'default', or Llama 3's, rope_type 'llama3')")
    rope_scaling = {key: scaling[key] for key in ROPE_SCALING} if rope_type == "llama3" else None
    heads = hf["num_attention_heads"]
    require(hf, {"hidden_act": "silu", "pretraining_tp": 1, "mlp_bias": hf.get("attention_bias", False),
                 "sliding_window": None})  # every key, every layer
    head_dim = hf.get("head_dim") or hf["hidden_size"] // heads
    return GPTConfig(vocab_size=hf["vocab_size"], block_size=hf["max_position_embeddings"],
                     n_layer=hf["num_hidden_layers"], n_head=heads, n_embd=hf["hidden_size"],
                     n_kv_head=hf.get("num_key_value_heads") or heads, dropout=float(hf.get("attention_dropout", 0.0)),
                     bias=bool(hf.get("attention_bias", False)), pos_encoding="rope", norm="rmsnorm", mlp="swiglu",
                     ffn_hidden=hf["intermediate_size"], norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
                     rope_base=float(rope.get("rope_theta", hf.get("rope_theta", 10000.0))),
                     tie_embeddings=bool(hf.get("tie_word_embeddings", False)), rope_scaling=rope_scaling,
                     head_dim=None if head_dim * heads == hf["hidden_size"] else head_dim)


def require(hf: dict, expected: dict) -> None:
    for key, wanted in expected.items():
        if hf.get(key, wanted) != wanted:
            raise Unsupported(f"{hf.get('model_type')} with {key}={hf[key]!r} is not supported "
                              f"(this model computes {key}={wanted!r})")


def activation_of(hf: dict, key: str) -> str:
    name = hf.get(key, "gelu_new")
    if name not in ACTIVATIONS_IN:
        raise Unsupported(f"activation {name!r} is not supported; {', '.join(ACTIVATIONS_IN)} are")
    return ACTIVATIONS_IN[name]


def state_from_transformers(config: GPTConfig, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Our state dict (a tied head included) from transformers' tensors, for the config
    that config_from_transformers gave; Unsupported where a tensor that config implies is
    missing."""
    try:
        return state_of(config, tensors)
    except KeyError as e:
        raise Unsupported(f"its weights have no {e.args[0]!r}, which its config.json implies") from None


def state_of(config: GPTConfig, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    state = {}
    if config.pos_encoding == "learned":  # GPT-2, with or without the "transformer." prefix
        for name, t in tensors.items():
            name = name.removeprefix("transformer.")
            if re.fullmatch(r"h\.\d+\.attn\.(masked_)?bias", name) or name == "lm_head.weight":
                continue  # causal-mask buffers of old checkpoints; the head is the tied embedding
            transpose = name.endswith(tuple(f"{m}.weight" for m in LINEARS_GPT2))
            state[f"transformer.{name}"] = t.t().contiguous() if transpose else t
    elif config.norm == "rmsnorm":  # Llama
        state = rename_llama(tensors, config, to_llama=False)
        if config.qkv_bias and not config.bias and any(
                t.any() for name, t in tensors.items() if name.endswith("self_attn.o_proj.bias")):
            raise Unsupported("attention_bias=true without mlp_bias comes in only when its o_proj biases are zero "
                              "(biases on q, k and v alone, as Qwen2); this one's are not")
    else:
        state = rename_neox(tensors, config, to_neox=False)
    if config.tie_embeddings:
        state["lm_head.weight"] = state["transformer.wte.weight"]
    return state
