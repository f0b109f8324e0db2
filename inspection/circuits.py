"""Why a head attends where it does, with the model's own numbers (Elhage et al., 2021, "A
Mathematical Framework for Transformer Circuits").

Where a score comes from (`score_sources`). In a pre-LN model the residual stream entering
a block is a sum of what wrote it: the token's embedding, the position vectors (learned or
sinusoidal; with RoPE none), each earlier head's output through its columns of W_O, each
earlier W_O's bias and each earlier feed-forward network. The block's norm takes the mean
and the scale at each position's own statistics; with those fixed, each piece passes
linearly through the norm, through W_Q (or W_K) and through the rotation, and the norm's
shift and the projection's bias make one more piece. So the score a query gives a key,
q·k/√d_k, is exactly a sum over pairs (the query's piece a, the key's piece b) of
q_a·k_b/√d_k: a table whose cells add up to the score the five steps start from. Against
the other keys the query may see, the same split says which piece makes the picked key
stand out: "the key carries its previous token" is the previous-token head's column.

How heads compose, from the weights alone (`composition_scores`): a head of a later layer
reads what an earlier head wrote through its queries (Q-composition), its keys
(K-composition: an induction head's keys read a previous-token head) or its values
(V-composition). The score of a pair is ||W_OV^src W^dst||_F / (||W_OV^src||_F ||W^dst||_F)
with W^dst its W_QK, W_QKᵀ or W_OV, as TransformerLens computes it: the norm's scale folded
into W_Q, W_K and W_V and, with LayerNorm, every matrix taken without its part along the
stream's mean (which the norm removes), and RoPE's rotation left out (W_QK then has one
value instead of one per offset between query and key).

Whether a head copies (`copying_scores`): its OV circuit W_E W_OV W_U, through the
norms' scales, gives each token the logits the head writes when it attends to that token;
the score is the share of tokens whose own logit ranks first (the direct path: the other
heads and the norm's division by the stream's size, which scales a row without reordering
it, left out). A head can copy what an earlier head wrote rather than the embedding (its
values read that head: V-composition), which the direct path does not see: on a text
(`copying_on_text`), the value the head reads at each position, as the pass computed it,
through W_O, ln_f's scale and the LM head, ranks that position's own token first or not.
"""

from __future__ import annotations

import torch

from model import GPT
from model.positional import apply_rotary
from model.trace import Trace


@torch.no_grad()
def stream_pieces(model: GPT, trace: Trace, layer: int, row: int | None = 0) -> tuple[list[str], torch.Tensor]:
    """(names, pieces [P, T, C]): what wrote the residual stream entering block `layer` (the
    final stream, ln_f's input, for layer = n_layer) of batch row `row` of a pre-LN model's
    trace (row None: of every row, [P, B, T, C]); the pieces add up to it."""
    c = model.config
    if c.norm_position != "pre":
        raise ValueError("a post-LN block's input is a norm of the sum, not the sum: its stream has no such split")
    rows = slice(None) if row is None else row
    names, pieces = ["token"], [trace.token[rows]]
    if trace.position is not None:
        names.append("position")
        pieces.append(trace.position[rows])
    for l in range(layer):
        block = model.transformer.h[l]
        w_o = block.attn.c_proj.weight  # [C, C]: head h writes through columns h·d_k ... (h + 1)·d_k
        heads = trace.layers[l].heads[rows]  # [H, T, d_k] (or [B, H, T, d_k])
        for h in range(c.n_head):
            names.append(f"L{l}H{h}")
            pieces.append(heads[..., h, :, :] @ w_o[:, h * c.head_size:(h + 1) * c.head_size].T)  # [(B,) T, C]
        if block.attn.c_proj.bias is not None:
            names.append(f"L{l} b_O")
            pieces.append(block.attn.c_proj.bias.expand_as(pieces[0]))
        if block.mlp is not None:  # (an attention-only model's blocks have none)
            names.append(f"L{l} FFN")
            pieces.append(trace.layers[l].mlp[rows])
    return names, torch.stack(pieces).float()


def normed_pieces(norm: torch.nn.Module, pieces: torch.Tensor, stream: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(each piece through `norm` at the stream's own statistics [P, ..., C], the norm's shift [C]):
    LayerNorm γ (p − mean(p)) / √(var(x) + ε) (+ β apart), RMSNorm γ p / √(mean(x²) + ε)."""
    x = stream.float()  # [..., C]
    if isinstance(norm, torch.nn.LayerNorm):
        divisor = (x.var(-1, unbiased=False, keepdim=True) + norm.eps).sqrt()  # [T, 1]
        centred = pieces - pieces.mean(-1, keepdim=True)
        shift = norm.bias if norm.bias is not None else torch.zeros_like(norm.weight)
    else:
        divisor = (x.pow(2).mean(-1, keepdim=True) + norm.eps).sqrt()
        centred = pieces
        shift = torch.zeros_like(norm.weight)
    return centred / divisor * norm.weight, shift.float()


def projected(model: GPT, layer: int, which: str, head: int, normed: torch.Tensor, shift: torch.Tensor,
              positions: torch.Tensor) -> torch.Tensor:
    """Each piece's q (which="q") or k of `head` [P + 1, T', d_k] at `positions` [T']: normed
    [P, T', C] through W_Q (or W_K), QK-norm (each piece divided by the RMS of their sum, the
    vector the norm sees, and scaled by its gain: still pieces that add up) and the rotation,
    and the shift (with the bias) as one more piece."""
    c = model.config
    attn = model.transformer.h[layer].attn
    kv_head = head // (c.n_head // c.n_kv_head)
    start = head * c.head_size if which == "q" else c.heads_width + kv_head * c.head_size
    w = attn.c_attn.weight[start:start + c.head_size].float()  # [d_k, C]
    b = attn.c_attn.bias[start:start + c.head_size].float() if attn.c_attn.bias is not None else 0.0
    parts = torch.cat([normed @ w.T, (shift @ w.T + b).expand(1, normed.size(1), -1)])  # [P + 1, T', d_k]
    qk_norm = attn.q_norm if which == "q" else attn.k_norm
    if qk_norm is not None:
        rms = (parts.sum(0).pow(2).mean(-1, keepdim=True) + qk_norm.eps).sqrt()  # [T', 1]
        parts = parts / rms * qk_norm.weight.float()
    if model.rotary is not None:
        cos, sin = model.rotary(positions[None])  # [1, 1, T', d_k]
        parts = apply_rotary(parts[:, None], cos.float(), sin.float())[:, 0]
    return parts


@torch.no_grad()
def score_sources(model: GPT, trace: Trace, layer: int, head: int, query: int, key: int, row: int = 0) -> dict:
    """Where head `head` of block `layer` gets its score for (query, key) in batch row `row`
    of a trace (model.trace, eval mode): {"pieces": names (the stream's, then "shift"),
    "contributions": [P + 1, P + 1] (query piece × key piece: q_a·k_b/√d_k; they add up to the
    score), "score": the score of the trace's own q and k, "others": for the keys the query
    may see besides `key`, the picked key's contributions less their mean: "key" [P + 1] by
    the key's pieces, "query" [P + 1] by the query's, "gap" their total (None: no other key)}."""
    c = model.config
    names, pieces = stream_pieces(model, trace, layer, row)
    stream = trace.layers[layer].residual_in[row]
    normed, shift = normed_pieces(model.transformer.h[layer].ln_1, pieces, stream)
    keys = torch.arange(query + 1, device=stream.device)  # the keys the query may see (causal)
    q = projected(model, layer, "q", head, normed[:, query:query + 1], shift, keys[query:query + 1])[:, 0]  # [P+1, d_k]
    k = projected(model, layer, "k", head, normed[:, :query + 1], shift, keys)  # [P + 1, query + 1, d_k]
    pairs = torch.einsum("ad,bjd->abj", q, k) / c.head_size ** 0.5  # [P + 1, P + 1, keys]
    others = None
    if query > 0:
        rest = torch.cat([pairs[..., :key], pairs[..., key + 1:]], -1).mean(-1)  # [P + 1, P + 1]
        lead = pairs[..., key] - rest
        others = {"key": lead.sum(0).tolist(), "query": lead.sum(1).tolist(), "gap": lead.sum().item()}
    record = trace.layers[layer]
    score = (record.q[row, head, query] @ record.k[row, head // (c.n_head // c.n_kv_head), key]).item() / c.head_size ** 0.5
    return {"pieces": [*names, "shift"], "contributions": pairs[..., key].tolist(), "score": score, "others": others}


def head_matrices(model: GPT) -> dict[str, torch.Tensor]:
    """Every head's factors, [L, H, C, d_k] each: W_Q and W_K (W_QK = W_Q W_Kᵀ) and W_V, the
    norm's scale folded in, and W_O transposed (W_OV = W_V W_Oᵀ); with LayerNorm, which
    centres the stream, each taken without the part along the mean (as TransformerLens's
    fold_ln and center_writing_weights take them)."""
    c = model.config
    L, H, d = c.n_layer, c.n_head, c.head_size
    factors: dict[str, list] = {"q": [], "k": [], "v": [], "o": []}
    for block in model.transformer.h:
        weight = block.attn.c_attn.weight.float()  # [C + 2 H_kv d_k, C]
        scale = block.ln_1.weight.float() if c.norm_position == "pre" else torch.ones(c.n_embd)
        folded = (weight * scale).view(-1, d, c.n_embd).transpose(1, 2)  # [H + 2 H_kv, C, d_k]
        if c.norm == "layernorm" and c.norm_position == "pre":  # (it reads a centred stream: the mean's part is unread)
            folded = folded - folded.mean(1, keepdim=True)
        group = H // c.n_kv_head
        q, k = folded[:H], folded[H:H + c.n_kv_head]
        if block.attn.q_norm is not None:  # QK-norm's gains (its division by the RMS depends on the input)
            q, k = q * block.attn.q_norm.weight.float(), k * block.attn.k_norm.weight.float()
        factors["q"].append(q)
        factors["k"].append(k.repeat_interleave(group, 0))
        factors["v"].append(folded[H + c.n_kv_head:].repeat_interleave(group, 0))
        w_o = block.attn.c_proj.weight.float().view(c.n_embd, H, d).permute(1, 0, 2)  # [H, C, d_k]
        factors["o"].append(w_o - w_o.mean(1, keepdim=True) if c.norm == "layernorm" else w_o)
    return {name: torch.stack(stack).view(L, H, c.n_embd, d) for name, stack in factors.items()}


def frobenius(u: torch.Tensor, middle: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """||u middle vᵀ||_F for stacks of u [..., C, r], middle [..., r, r], v [..., C, r], from r × r
    matrices alone: ||U M Vᵀ||² = tr(Mᵀ UᵀU M VᵀV)."""
    gram_u, gram_v = u.mT @ u, v.mT @ v
    return torch.einsum("...ji,...jk,...kl,...il->...", middle, gram_u, middle, gram_v).clamp(min=0).sqrt()


@torch.no_grad()
def composition_scores(model: GPT) -> dict[str, torch.Tensor]:
    """{"q", "k", "v": [L, H, L, H]}: how much head (l2, h2) reads head (l1, h1) through its
    queries, keys or values (0 unless l1 < l2). Heads at initialisation score about 1/√C
    (C = n_embd: 0.125 at 64, 0.088 at 128, 0.051 at 384, measured); composing heads more."""
    f = head_matrices(model)
    L, H = f["q"].shape[:2]
    src = lambda t: t[:, :, None, None]  # noqa: E731  [L, H, 1, 1, ...]: the writing head
    dst = lambda t: t[None, None]  # noqa: E731  [1, 1, L, H, ...]: the reading head
    eye = torch.eye(f["q"].size(-1))
    ov_norm = frobenius(f["v"], eye, f["o"])  # [L, H]: ||W_V W_Oᵀ||_F
    qk_norm = frobenius(f["q"], eye, f["k"])  # [L, H]: ||W_Q W_Kᵀ||_F
    # W_OV^src W^dst = V_s (O_sᵀ X) Yᵀ: its norm from d_k × d_k matrices (frobenius)
    reading = {"q": (f["q"], f["k"], qk_norm), "k": (f["k"], f["q"], qk_norm), "v": (f["v"], f["o"], ov_norm)}
    before = torch.arange(L)[:, None, None, None] < torch.arange(L)[None, None, :, None]  # [L, 1, L, 1]
    scores = {}
    for kind, (x, y, norm) in reading.items():
        middle = src(f["o"]).mT @ dst(x)  # [L, H, L, H, d_k, d_k]
        product = frobenius(src(f["v"]), middle, dst(y))
        norms = src(ov_norm) * dst(norm)  # 0 where a head writes or reads nothing (train.heads_off): it composes with none
        scores[kind] = torch.where(before & (norms > 0), product / norms.clamp_min(torch.finfo(norms.dtype).tiny),
                                   torch.zeros(()))
    return scores


@torch.no_grad()
def logit_sources(model: GPT, trace: Trace, tokens: torch.Tensor) -> dict:
    """Where each position's logit for a token comes from, exactly (direct logit attribution,
    Elhage et al., 2021): the final stream (ln_f's input) is the sum of what wrote it (the
    embedding, the positions, each head through its columns of W_O, each W_O's bias, each
    feed-forward network); with ln_f's mean and scale taken at each position's own statistics,
    each piece goes linearly through ln_f and the LM head, and ln_f's shift is one more piece.
    tokens [B, T]: the token whose logit is split at each position (the next token of a text,
    say). Returns {"pieces": names (then "shift"), "contributions": [P + 1, B, T] (they add up
    to the logit), "logits": [B, T] the pass's own}."""
    names, pieces = stream_pieces(model, trace, model.config.n_layer, row=None)  # [P, B, T, C]
    normed, shift = normed_pieces(model.transformer.ln_f, pieces, trace.layers[-1].residual_out)
    unembed = model.lm_head.weight.float()[tokens]  # [B, T, C]: each position's token's row of W_U
    contributions = torch.cat([(normed * unembed).sum(-1), (shift * unembed).sum(-1)[None]])  # [P + 1, B, T]
    return {"pieces": [*names, "shift"], "contributions": contributions,
            "logits": trace.logits.float().gather(-1, tokens[..., None])[..., 0]}


@torch.no_grad()
def composition_baseline(model: GPT, samples: int = 16, seed: int = 0) -> dict[str, dict[str, float]]:
    """What heads of random weights score on each kind of composition, for `samples` models of
    the shapes of `model` as training starts them (GPT.initialised, seeds seed ... seed +
    samples − 1): {"q" | "k" | "v": {"mean", "sd"}} over every pair of heads in different layers
    of every sample; a trained pair scores above it only as far as it composes."""
    c = model.config
    later = torch.arange(c.n_layer)[:, None, None, None] < torch.arange(c.n_layer)[None, None, :, None]
    pairs = later.expand(c.n_layer, c.n_head, c.n_layer, c.n_head)
    found: dict[str, list] = {"q": [], "k": [], "v": []}
    for sample in range(samples):
        for kind, scores in composition_scores(GPT.initialised(c, seed + sample)).items():
            found[kind].append(scores[pairs])
    return {kind: {"mean": torch.cat(values).mean().item(), "sd": torch.cat(values).std().item()}
            for kind, values in found.items()}


@torch.no_grad()
def copying_on_text(model: GPT, trace: Trace, tokens: torch.Tensor) -> torch.Tensor:
    """[L, H]: for each head, the share of a pass's positions (tokens [B, T], trace: the pass)
    whose own token the head would raise most had it attended there alone: the value it reads
    there (the pass's own v), through its columns of W_O, ln_f's scale (and, with LayerNorm, its
    centring; the division by the stream's size scales every logit alike) and the LM head."""
    c = model.config
    group = c.n_head // c.n_kv_head
    final = model.transformer.ln_f.weight.float() if c.norm_position == "pre" else torch.ones(c.n_embd)
    unembed = model.lm_head.weight.float() * final  # [V, C]
    scores = torch.zeros(c.n_layer, c.n_head)
    for l, block in enumerate(model.transformer.h):
        values = trace.layers[l].v.float()  # [B, H_kv, S, d_k]
        for h in range(c.n_head):
            written = values[:, h // group] @ block.attn.c_proj.weight[:, h * c.head_size:(h + 1) * c.head_size].float().T
            if c.norm == "layernorm":  # [B, T, C]: what the head writes from each position it attends to
                written = written - written.mean(-1, keepdim=True)
            scores[l, h] = ((written @ unembed.T).argmax(-1) == tokens.to(written.device)).float().mean()
    return scores


COPYING_TOKENS = 2048  # the tokens a copying score is taken over, at most (a seeded draw of a larger vocabulary)


@torch.no_grad()
def copying_scores(model: GPT) -> torch.Tensor:
    """[L, H]: the share of tokens whose own logit ranks first in the head's OV circuit,
    W_E (centred, through the block's norm scale) W_V W_Oᵀ (through ln_f's scale) W_U: of
    every token, or of COPYING_TOKENS of them drawn with seed 0 from a larger vocabulary."""
    c = model.config
    f = head_matrices(model)
    tokens = torch.arange(c.vocab_size)
    if c.vocab_size > COPYING_TOKENS:
        tokens = torch.randperm(c.vocab_size, generator=torch.Generator().manual_seed(0))[:COPYING_TOKENS]
    embedding = model.transformer.wte.weight.float()[tokens]  # [N, C]
    if c.norm == "layernorm":
        embedding = embedding - embedding.mean(-1, keepdim=True)
    final = model.transformer.ln_f.weight.float() if c.norm_position == "pre" else torch.ones(c.n_embd)
    unembed = model.lm_head.weight.float() * final  # [V, C]
    scores = torch.zeros(c.n_layer, c.n_head)
    for l in range(c.n_layer):
        for h in range(c.n_head):
            logits = (embedding @ f["v"][l, h]) @ (f["o"][l, h].T @ unembed.T)  # [N, V]: row t, attending to t
            scores[l, h] = (logits.argmax(-1) == tokens).float().mean()
    return scores
