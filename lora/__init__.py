"""LoRA: fine-tune a model brought in by training small low-rank adapters beside its
matrices (Hu et al., 2021, "LoRA: Low-Rank Adaptation of Large Language Models").

A matrix W [out, in] of the model stays frozen; beside it train A [r, in] and B [out, r]
with r small, and the layer computes x Wᵀ + (α/r) x Aᵀ Bᵀ: W plus the rank-r update
(α/r) B A. B starts at zero, so training starts from the model as it was. For a model of
C = 576 and r = 8, an adapter on a 576 × 576 matrix trains 9,216 numbers instead of 331,776.

    lora:
      rank: 8          # r (0: off, full fine-tuning)
      alpha: 16        # α: the update is scaled by α/r
      dropout: 0.05    # on the adapters' input, while training
      targets: [attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_gate, mlp.c_proj]
      modules_to_save: [lm_head]   # (peft's name) these train whole beside the adapters: wte, lm_head,
                                   # ln_f, ln_1, ln_2 (each block's norms); none by default

attn.c_attn is W_Q, W_K and W_V fused in one matrix (model/attention.py), so its adapter is
one B A for the three: q, k and v each get their rows of B. Only the adapters train, with
AdamW (Muon would orthogonalise their updates, which are low-rank by design); every weight
of the model brought in stays bit for bit as it was (with train.base_dtype=bfloat16, its
adapted matrices are kept rounded to bfloat16, as autocast computes with them: half the
memory). Where a chat template's markers were added to the tokenizer (data/template.py), their
new embedding rows train too, and only those (unless the embedding trains whole).

The run folder keeps the adapters apart (adapter_model.safetensors, adapter_config.json;
of the embedding, the new tokens' rows alone) and, as model.safetensors, the model with
them merged (W + (α/r) B A): every program that opens a run reads that, and export.py
writes it. adapters.py holds the code.
"""

from .adapters import (LoRAConfig, LoRALinear, adapters_off, add_adapters, adapter_file, adapter_state, frozen_in,
                       load_adapter_state, merged, new_rows, trained_count, trained_parameters, whole_modules)

__all__ = ["LoRAConfig", "LoRALinear", "adapters_off", "add_adapters", "adapter_file", "adapter_state", "frozen_in",
           "load_adapter_state", "merged", "new_rows", "trained_count", "trained_parameters", "whole_modules"]
