"""GPT: token embedding → positional encoding → N blocks → final norm → LM head.

A decoder-only Transformer: every position predicts the next token, seeing only the
positions before it (the causal mask). `generate` samples one token at a time,
reusing past keys and values through a KV cache.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from .attention import KVCache, Sequences, same_sequence
from .block import Block, make_norm
from .config import GPTConfig
from storage.atomic import safetensors_bytes, write_atomic
from .positional import LearnedPositionalEmbedding, RotaryEmbedding, SinusoidalPositionalEncoding
from .sampling import Sampling, sample_next
from .trace import Trace, recording, switch_off_heads

# packed rows this long or longer attend a sequence at a time (model/attention.py's Sequences: memory linear in the
# context, and faster: 1.6x at 1,024 tokens, 7x at 8,192); shorter rows take the dense block-diagonal mask, which
# there costs less than many small calls (packed training at 256 tokens: 14,449 real tokens/s against 10,503).
# Measured by bench/packing.py on a 2-core AMD EPYC.
ALONE_FROM = 1024
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"


@contextmanager
def in_mode(module: nn.Module, training: bool) -> Iterator[nn.Module]:
    """Training mode (dropout on) or eval mode inside the block; the module's own mode after it."""
    was_training = module.training
    module.train(training)
    try:
        yield module
    finally:
        module.train(was_training)


def evaluating(module: nn.Module):
    """Eval mode (dropout off) inside the block, the module's own mode restored after it."""
    return in_mode(module, training=False)


class GPT(nn.Module):
    """P(x_{t+1} | x_≤t) = softmax(LMHead(Norm(Blocks(Embed(x) + PE)))[t]): the logits at
    position t score the token that comes after it (the targets are y[t] = x[t+1]).

    The LM head shares its weight matrix with the token embedding (weight tying, as in
    GPT-2): the same vector that represents a token is used to score it as output; with
    tie_embeddings false it has a matrix of its own, as most Llama-family models do.
    """

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList(Block(config, layer) for layer in range(config.n_layer)),
            # post-LN blocks already end in a norm; a final one would be redundant
            ln_f=make_norm(config) if config.norm_position == "pre" else nn.Identity(),
        ))
        self.rotary = None
        if config.pos_encoding == "learned":
            self.transformer.wpe = LearnedPositionalEmbedding(config.block_size, config.n_embd)
        elif config.pos_encoding == "sinusoidal":
            self.transformer.wpe = SinusoidalPositionalEncoding(config.n_embd)
        else:
            self.rotary = RotaryEmbedding(config.head_size, config.rope_base, config.rope_scaling)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.lm_head.weight = self.transformer.wte.weight  # weight tying

        self.apply(self._init_weights)
        # GPT-2: each block adds two residual branches, so the variance of the stream
        # grows with depth; scaling the projections into it by 1/√(2·n_layer) keeps it flat
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    @classmethod
    def initialised(cls, config: GPTConfig, seed: int) -> "GPT":
        """The model a run with this seed starts from (training builds it this way, so the
        explorer can build it again): torch's random generator seeded, then the model made."""
        torch.manual_seed(seed)
        return cls(config)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    # ---- sizes ---------------------------------------------------------------

    def num_parameters(self) -> int:
        """Every parameter, a tied embedding/head counted once, whether it trains or not (a
        model with LoRA adapters counts its frozen weights and the adapters')."""
        return sum(p.numel() for p in self.parameters())

    def flops_per_token(self, seq_len: int | None = None, training: bool = True) -> float:
        """Matmul FLOPs per token, as in the PaLM paper's MFU (and nanoGPT): 2 per weight
        of every Linear layer (the LM head included; embeddings are lookups, norms and
        biases are not matmuls), plus attention's Q Kᵀ and weights @ V, 2 · 2 · T · H · d_k per
        layer at context T = seq_len (H · d_k = C unless head_dim). Training (forward and
        backward) costs 3× the forward."""
        c = self.config
        T = c.block_size if seq_len is None else seq_len
        matmul_weights = sum(m.weight.numel() for m in self.modules() if isinstance(m, nn.Linear))
        forward = 2 * matmul_weights + 4 * c.n_layer * T * c.heads_width  # (q·k and weights @ v)
        return float(3 * forward if training else forward)

    # ---- forward -------------------------------------------------------------

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, kv_cache: KVCache | None = None,
                position_ids: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """idx [B, T] token ids -> (logits [B, T, vocab_size], loss or None). targets [B, T]
        (-100 = ignore) gives the mean cross-entropy of the next token. attention_mask [B, S]
        (1 = real token, 0 = padding) covers the cached tokens and idx, S = past + T; or, with
        position_ids and no cache, [B, T, T]: which earlier tokens each token attends to.
        kv_cache: the keys and values of earlier tokens (generation). position_ids [B, T]:
        the rows are packed with several sequences, each numbered from 0 (Hugging Face's
        convention for packed rows): a token attends only to the earlier tokens of its own
        sequence, so each is computed as if it were alone in its row."""
        logits = self._logits(idx, attention_mask, kv_cache, position_ids)  # [B, T, vocab_size]
        return logits, None if targets is None else self.loss(logits, targets)

    @staticmethod
    def loss(logits: torch.Tensor, targets: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
        """The cross-entropy of logits [B, T, vocab_size] against targets [B, T] (the next
        token at each position; -100 = not scored), computed in float32: the mean over the
        scored targets (what training lowers), their sum (evaluations add batches up), or
        with "none" each target's own, [B, T] (0 where not scored)."""
        losses = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=-100,
                                 reduction=reduction)
        return losses.view_as(targets) if reduction == "none" else losses

    def trace(self, idx: torch.Tensor, targets: torch.Tensor | None = None,
              head_mask: torch.Tensor | None = None) -> Trace:
        """The same forward pass over idx [B, T], handing back everything it computed: the
        Trace (model/trace.py) of the embedding, every layer's residual stream, norms, q, k,
        v, attention weights, heads and feed-forward network, ln_f, the logits, and the
        loss if targets are given. Its attention runs the explicit five steps whatever
        attn_impl is, to have the weights. head_mask [n_layer, n_head] or [B, n_layer,
        n_head]: 0 switches a head off (its output is zeroed before W_O; transformers'
        name), 1 leaves it as it is."""
        trace = Trace.empty(self.config.n_layer)
        switched = [] if head_mask is None else switch_off_heads(self, head_mask)  # (before the recording hooks)
        try:
            with recording(self, trace):
                trace.logits = self._logits(idx, trace=trace)
        finally:
            for hook in switched:
                hook.remove()
        if trace.position is not None:  # ([1, T, C]: the same for every row)
            trace.position = trace.position.expand_as(trace.token)
        if targets is not None:
            trace.loss = self.loss(trace.logits, targets)
        return trace

    def _logits(self, idx: torch.Tensor, attention_mask: torch.Tensor | None = None, kv_cache: KVCache | None = None,
                position_ids: torch.Tensor | None = None, trace: Trace | None = None) -> torch.Tensor:
        """The forward pass: embedding -> positions -> blocks -> final norm -> LM head.
        trace: `trace` above, whose records attention fills."""
        B, T = idx.shape
        past = kv_cache.length if kv_cache is not None else 0
        if past + T > self.config.block_size and position_ids is None:  # (given positions are the caller's to keep)
            raise ValueError(f"sequence of {past + T} tokens is longer than block_size={self.config.block_size}")
        if attention_mask is not None and attention_mask.shape not in ((B, past + T), (B, T, T)):
            raise ValueError(f"attention_mask must have shape {(B, past + T)}, got {tuple(attention_mask.shape)}")

        positions = position_ids if position_ids is not None else self._positions(T, past, attention_mask, idx.device)
        mask = self._attention_mask(T, past, attention_mask, position_ids, idx.device)  # [B, 1, T, S], Sequences, None
        x = self.transformer.wte(idx)  # [B, T, C]
        rope = None
        if self.rotary is None:
            x = x + self.transformer.wpe(positions).to(x.dtype)  # + [B or 1, T, C]
        else:
            rope = self.rotary(positions)  # (cos, sin) [B or 1, 1, T, d_k]: q and k are rotated instead
        x = self.transformer.drop(x)
        for layer, block in enumerate(self.transformer.h):
            x = block(x, mask, rope, kv_cache, trace.layers[layer] if trace is not None else None)
        if kv_cache is not None:
            kv_cache.length += T
        return self.lm_head(self.transformer.ln_f(x))  # [B, T, vocab_size]

    @staticmethod
    def _positions(T: int, past: int, attention_mask: torch.Tensor | None, device: torch.device) -> torch.Tensor:
        """Position of each new token: its index ([1, T], the same for every row), or with an
        attention_mask ([B, T]), the number of real tokens before it, so that a left-padded
        prompt starts at 0 like one alone."""
        if attention_mask is None:
            return torch.arange(past, past + T, device=device)[None]
        real_before = attention_mask.long().cumsum(dim=-1) - 1  # [B, S]: -1 before the first real token
        return real_before[:, -T:].clamp(min=0)  # [B, T]

    @staticmethod
    def _attention_mask(T: int, past: int, attention_mask: torch.Tensor | None, position_ids: torch.Tensor | None,
                        device: torch.device) -> torch.Tensor | None:
        """Which keys each new token may attend to (True = may attend), or None when the plain
        causal pattern suffices (no padding, no packed rows, and no cache or a single token), or
        for packed rows of ALONE_FROM tokens or more their Sequences (model/attention.py: each
        runs alone, no [T, T] mask).
        An attention_mask [B, T, T] says it itself, query by key (sequences that share a start:
        jobs/dpo.py's two answers after one prompt)."""
        if attention_mask is not None and attention_mask.dim() == 3:
            return attention_mask[:, None]  # [B, 1, T, T]
        if attention_mask is None and position_ids is None and (past == 0 or T == 1):
            return None
        S = past + T
        query_pos = torch.arange(past, S, device=device)[:, None]  # [T, 1]
        key_pos = torch.arange(S, device=device)[None, :]  # [1, S]
        mask = key_pos <= query_pos  # [T, S]: causal, never the future
        if position_ids is not None:  # packed rows (no cache: S = T): each sequence starts at position 0
            if attention_mask is None and T >= ALONE_FROM:
                return Sequences.of(position_ids)  # each attends alone, causal: no [T, T] mask held
            mask = mask & same_sequence(position_ids)  # [B, 1, T, T]: the dense block-diagonal mask
        if attention_mask is not None:
            mask = mask & attention_mask.bool()[:, None, None, :]  # [B, 1, T, S]: no padding key
            # a padding query would have no key left; letting it see itself avoids an
            # empty row (fused GPU kernels may return NaN for one). Real tokens never
            # see padding, so their outputs are unchanged.
            mask = mask | (key_pos == query_pos)
        return mask

    # ---- generation ----------------------------------------------------------

    def generate(self, idx: torch.Tensor, max_new_tokens: int, temperature: float = 1.0,
                 top_k: int | None = None, top_p: float | None = None, use_cache: bool = True,
                 attention_mask: torch.Tensor | None = None,
                 generator: torch.Generator | None = None, suppress_tokens: tuple[int, ...] = ()) -> torch.Tensor:
        """Append max_new_tokens sampled tokens to idx [B, T]; returns [B, T + max_new_tokens].
        temperature 0 is greedy; see `Sampling` for top_k, top_p, suppress_tokens and `generate_tokens`."""
        sampling = Sampling(temperature, top_k, top_p, tuple(suppress_tokens))
        new = list(self.generate_tokens(idx, max_new_tokens, sampling, use_cache, attention_mask, generator))
        # built outside inference mode, so the result is an ordinary tensor
        return torch.cat([idx, torch.stack(new, dim=1)], dim=1) if new else idx.clone()

    @torch.inference_mode()  # like no_grad, and lighter: no autograd bookkeeping at all
    def generate_tokens(self, idx: torch.Tensor, max_new_tokens: int, sampling: Sampling = Sampling(),
                        use_cache: bool = True, attention_mask: torch.Tensor | None = None,
                        generator: torch.Generator | None = None) -> Iterator[torch.Tensor]:
        """Yield the next token ids [B], one step at a time (for streaming).

        The model always sees the last block_size tokens. Without the cache, every step
        runs the whole window again. With it, the prompt is run once (prefill) and each
        step runs only the new token against the stored keys and values. Once the
        window is full and slides, every stored key would change (positions shift and
        deeper layers' keys depend on the dropped tokens), so the window is run afresh:
        the output is exactly what the uncached path gives. Dropout is off while
        generating (the model is put in eval mode and restored afterwards).
        """
        if max_new_tokens < 0:
            raise ValueError(f"max_new_tokens={max_new_tokens}: must be 0 or more")
        with evaluating(self):
            yield from self._sampling_loop(idx, max_new_tokens, sampling, use_cache, attention_mask, generator)

    def _sampling_loop(self, idx, max_new_tokens, sampling, use_cache, attention_mask,
                       generator) -> Iterator[torch.Tensor]:
        B, T0 = idx.shape
        block_size = self.config.block_size
        seq = torch.empty(B, T0 + max_new_tokens, dtype=torch.long, device=idx.device)
        seq[:, :T0] = idx
        mask = None
        if attention_mask is not None:
            mask = torch.ones_like(seq, dtype=torch.bool)
            mask[:, :T0] = attention_mask.bool()
        cache = None
        if use_cache:
            cache = KVCache(self.config, B, block_size, idx.device, self.lm_head.weight.dtype)
        cache_start = 0  # index in seq of the first token held in the cache
        n = T0  # tokens in seq so far
        for _ in range(max_new_tokens):
            start = max(0, n - block_size)  # the window the model sees: seq[start:n]
            if cache is None or cache.length in (0, block_size):
                if cache is not None:
                    cache.reset()
                    cache_start = start
                window_mask = None if mask is None else mask[:, start:n]
                logits, _ = self(seq[:, start:n], attention_mask=window_mask, kv_cache=cache)
            else:
                window_mask = None if mask is None else mask[:, cache_start:n]
                logits, _ = self(seq[:, n - 1:n], attention_mask=window_mask, kv_cache=cache)
            next_token = sample_next(logits[:, -1, :], sampling, generator)  # [B]
            seq[:, n] = next_token
            n += 1
            yield next_token

    # ---- saving and loading (no pickle) ---------------------------------------

    def save_pretrained(self, directory: str | os.PathLike) -> None:
        """Write config.json and model.safetensors, each atomically (see `write_atomic`)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        for name, data in self.pretrained_files().items():
            write_atomic(directory / name, data)

    def pretrained_files(self) -> dict[str, bytes]:
        """{file name: contents} of what save_pretrained writes. A tied embedding and LM
        head are one tensor, stored once as lm_head.weight; the metadata says so, as
        safetensors' save_model would. The same weights always give the same bytes."""
        state, metadata = self.state_dict(), {"format": "pt"}
        if self.config.tie_embeddings:
            del state["transformer.wte.weight"]
            metadata["transformer.wte.weight"] = "lm_head.weight"
        weights = safetensors_bytes(state, metadata=metadata)
        config = json.dumps(self.config.to_dict(), indent=2) + "\n"
        return {CONFIG_FILE: config.encode(), WEIGHTS_FILE: weights}

    @classmethod
    def from_pretrained(cls, directory: str | os.PathLike, device: str | torch.device = "cpu") -> "GPT":
        """Load what save_pretrained wrote. Raises FileNotFoundError for a missing file and
        ValueError for a malformed config.json or weights that are not safetensors or do
        not match the config."""
        from safetensors import SafetensorError
        from safetensors.torch import load_model

        directory = Path(directory)
        config_path, weights_path = directory / CONFIG_FILE, directory / WEIGHTS_FILE
        for path in (config_path, weights_path):
            if not path.is_file():
                raise FileNotFoundError(f"{path} does not exist")
        try:
            config = GPTConfig.from_dict(json.loads(config_path.read_text(encoding="utf-8")))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ValueError(f"{config_path} is not valid JSON ({e})") from e
        except (ValueError, TypeError) as e:
            raise ValueError(f"{config_path}: {e}") from e
        model = cls(config)
        try:
            load_model(model, str(weights_path), strict=True, device=str(device))
        except (SafetensorError, OSError) as e:
            raise ValueError(f"{weights_path} is not a valid safetensors file ({e})") from e
        except RuntimeError as e:  # "Error(s) in loading state_dict for GPT:" then one line per problem
            lines = [line.strip() for line in str(e).strip().splitlines()]
            problems = "; ".join(lines[1:] or lines)
            raise ValueError(f"{weights_path} does not match {config_path}: {problems[:300]}") from e
        return model.to(device)
