"""A model and a prompt -> the explorer page's data (version 3), from the model's own passes.

Nothing here computes the model: `model.trace(idx)` hands back its Trace
(model/trace.py): the embedding's pieces, every layer's stream, norms, q, k, v, attention
weights, heads, attention and feed-forward outputs, and ln_f. This module names them and
packs them; what it adds is read off the model too: each token's loss, the logit lens (the
model's own ln_f and LM head applied to each layer's output), and the heads switched off
one at a time (the model's own forward pass with a head_mask). The schema is in
docs/explorer.md. The page's data.js makes the same data from its own forward pass, with
the same names (page_data ↔ pageData, ablated, logit_lens ↔ logitLens, token_losses ↔
tokenLosses).
"""

from __future__ import annotations

import base64
import copy
import functools
import json
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from cli.program import UserError
from jobs.prompt import encode_prompt
from data.batches import fixed_windows
from data.copies import SYMBOLS
from jobs.text_data import validation_tokens
from data.shared import DataError
from data.token_text import readable_decode, token_text, token_views
from data.tokenizer import suppressed_ids
from inspection.attention_maps import VIRIDIS
from inspection.circuits import (composition_baseline, composition_scores, copying_on_text, copying_scores,
                                 logit_sources, score_sources, stream_pieces)
from inspection.head_scores import KINDS, head_scores, induction_probe, uniform_scores
from inspection.in_context import (copy_losses, copy_marks, copy_windows, in_context_score, induction_weights,
                                   phase_change, position_losses)
from inspection.readout import carried
from model import GPT, evaluating

SCHEMA_VERSION = 3
TOP_TOKENS = 100  # the likeliest next tokens whose text the page can show
MAX_TOKENS = 64  # the prompt's tokens a page shows by default (the file grows with their square)
TOP_UNITS = 8  # the feed-forward network's largest hidden units kept per position
LENS_TOKENS = 5  # the logit lens's likeliest tokens per layer and position
ABLATION_TOKENS = 20  # the likeliest next tokens kept for each head switched off
MAX_ABLATION_LOGITS = 1 << 20  # every head's next-token logits (L·H·V numbers) are embedded up to this many
PREDICTION_TOKENS = 20  # the likeliest next tokens the timeline keeps for each snapshot
MAX_WEIGHT_VALUES = 4_000_000  # W_Q, W_K, W_V are embedded (for q's sum of products) up to this many numbers


def array(t: torch.Tensor, dtype: str = "float32") -> dict:
    """A tensor as the page's arrays: float32 (or float16, half the size, for the weights of
    a run's snapshots), little-endian, base64 (exact, and a third of the size of JSON numbers)."""
    values = t.detach().float().cpu().numpy().astype("<f4" if dtype == "float32" else "<f2")
    return {"dtype": dtype, "shape": list(values.shape), "base64": base64.b64encode(values.tobytes()).decode()}


def top(values: torch.Tensor, k: int) -> dict:
    """The k largest of the last dimension: {"ids": [...], "values": [...]}, per leading row."""
    best = values.float().topk(min(k, values.size(-1)), dim=-1)
    return {"ids": best.indices.tolist(), "values": best.values.tolist()}


@torch.no_grad()
def page_data(model: GPT, tokenizer, ids: list[int], truncated: int = 0, which: str = "trained",
              timeline: dict | None = None, run: dict | None = None, sources: bool = False) -> dict:
    """Everything the page shows for the prompt `ids` (at most block_size tokens), for
    `which` model: "trained", or "init" (the run's model at initialisation); the prompt
    through the model as it formed (timeline_data), where the run kept snapshots; the
    trained model's run in a few facts (run_facts); and with `sources`, for a page that
    cannot run the model, where the last token's scores come from (default_sources)."""
    c = model.config
    device = model.lm_head.weight.device
    with evaluating(model):
        trace = model.trace(torch.tensor([ids], device=device))
        logits = trace.logits  # [1, T, vocab_size]
        ablation = ablated(model, ids)
    last = logits[0, -1].float().cpu()  # [vocab_size]
    suppressed = list(suppressed_ids(tokenizer))
    lens_top = logit_lens(model, trace)
    shown = {*last.topk(min(TOP_TOKENS, last.numel())).indices.tolist(), *suppressed,
             *(i for t in lens_top for row in t["ids"] for i in row), *(i for layer in ablation for h in layer for i in h["ids"])}
    if timeline is not None and "prediction" in timeline:  # (the example's own, at each step)
        shown |= {*(i for p in timeline["prediction"] for i in p["ids"]),
                  *(i for lens in timeline["lens"] for t in lens for row in t["ids"] for i in row)}
    weights_size = (c.heads_width + 2 * c.n_kv_head * c.head_size) * c.n_embd * c.n_layer
    return {
        "version": SCHEMA_VERSION,
        "model": which,
        "config": page_config(model),
        "tokens": token_views(tokenizer, ids),
        "truncated": truncated,
        "embedding": {"token": array(trace.token[0]), "position": None if trace.position is None else array(trace.position[0])},
        "layers": [layer_data(model, layer, i, lens_top[i], weights_size <= MAX_WEIGHT_VALUES)
                   for i, layer in enumerate(trace.layers)],
        "ln_f": array(trace.ln_f[0]),
        "prediction": {"logits": array(last), "suppressed": suppressed},
        "losses": token_losses(logits[0], ids),
        "ablation": ablation,
        "texts": {str(i): token_text(tokenizer, i) for i in sorted(shown)},
        "left_out": [] if weights_size <= MAX_WEIGHT_VALUES else ["c_attn"],
        "colormap": VIRIDIS.tolist(),
        "timeline": timeline,
        "run": run if which == "trained" else None,
        "sources": default_sources(model, trace) if sources else None,
    }


SOURCE_HEADS = 16  # a page that cannot run its model carries where the scores of this many heads come from, at most


def default_sources(model: GPT, trace) -> dict | None:
    """Where each head's score comes from (inspection/circuits.py's score_sources) for the
    text's last token and the key it gives the most weight, {"layer.head": ...}: for the
    heads of the last layers, SOURCE_HEADS at most (the page runs any other pick itself where
    it runs the model; explore.py --serve computes any). None for a post-LN model, whose
    stream is no sum of pieces."""
    c = model.config
    if c.norm_position != "pre":
        return None
    query = trace.token.size(1) - 1
    first = max(0, c.n_layer - max(1, SOURCE_HEADS // c.n_head))
    found = {}
    for layer in range(first, c.n_layer):
        for head in range(c.n_head):
            key = int(trace.layers[layer].weights[0, head, query, :query + 1].argmax())
            result = score_sources(model, trace, layer, head, query, key)
            found[f"{layer}.{head}"] = {**result, "query": query, "key": key,
                                        "contributions": array(torch.tensor(result["contributions"]))}
    return found


def token_losses(logits: torch.Tensor, ids: list[int]) -> list[float]:
    """Each token's loss, −log p(token | the tokens before it), from logits [T, V]: T − 1
    numbers (the first token has nothing before it)."""
    targets = torch.tensor([ids[1:]], dtype=torch.long, device=logits.device)
    return GPT.loss(logits[None, :-1], targets, reduction="none")[0].tolist()


def logit_lens(model: GPT, trace) -> list[dict]:
    """What each layer's output x would predict, softmax(lm_head(ln_f(x))), at each position:
    its LENS_TOKENS likeliest tokens, per layer (for the last layer, the model's own)."""
    return [top(torch.softmax(model.lm_head(model.transformer.ln_f(layer.residual_out[0])).float(), -1), LENS_TOKENS)
            for layer in trace.layers]


def prompt_data(model: GPT, tokenizer, prompt: str, max_tokens: int, which: str = "trained", run=None,
                carry_weights: bool = False, sources: bool = False) -> dict:
    """The page's data for a prompt (its last max_tokens tokens, at most block_size); with
    the run's snapshots (run: its runs.folder.RunDir), the model as it formed too (the
    timeline; carry_weights: with every snapshot's weights, for the page to run); sources:
    where the last token's scores come from, for a page that cannot run the model."""
    if not prompt:
        raise UserError("the prompt is empty; give some text, e.g. --prompt \"ROMEO:\"")
    limit = min(max_tokens, model.config.block_size)
    ids = encode_prompt(tokenizer, prompt, limit, say=False)  # (the page says what was cut; explore.py too, in its language)
    timeline = None
    if run is not None and len(run.snapshot_paths()) > 1:
        snapshots = {step: functools.partial(run.load_snapshot, step) for step in run.snapshot_paths()}
        windows, seed, own = evaluation_windows(run)
        with tempfile.TemporaryDirectory(prefix="explore-", ignore_cleanup_errors=True) as scratch:
            timeline = timeline_data(model, tokenizer, snapshots, ids, validation_text(run, tokenizer, Path(scratch)),
                                     windows, seed, carry_weights, lesson_windows(run, tokenizer, model.config.block_size))
        timeline["loss_is_runs"] = own
    return page_data(model, tokenizer, ids, truncated=len(tokenizer.encode(prompt).ids) - len(ids), which=which,
                     timeline=timeline, run=None if run is None else run_facts(run.summary()), sources=sources)


def run_timeline(model: GPT, tokenizer, run) -> tuple[dict | None, dict]:
    """(the steps, losses and scores of the run's snapshots, or None without two of them;
    {step: a function that loads that step's weights into a model}): what explore.py --serve
    offers its page's slider."""
    paths = run.snapshot_paths()
    snapshots = {step: functools.partial(run.load_snapshot, step) for step in paths}
    if len(paths) < 2:
        return None, snapshots
    windows, seed, own = evaluation_windows(run)
    with tempfile.TemporaryDirectory(prefix="explore-", ignore_cleanup_errors=True) as scratch:
        timeline = timeline_data(model, tokenizer, snapshots, None, validation_text(run, tokenizer, Path(scratch)),
                                 windows, seed, copies=lesson_windows(run, tokenizer, model.config.block_size))
    return {**timeline, "loss_is_runs": own}, snapshots


def lesson_windows(run, tokenizer, block_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """For a run on the induction lesson's text (data.source copies), its validation text's
    windows with each target's part (inspection/in_context.py's copy_windows: first copy,
    copyable second copy, or neither); None for any other run."""
    from data import copies

    try:
        data = run.data_config()
    except UserError:
        return None
    if data.source != "copies":
        return None
    _, val = copies.splits(data.val_fraction)
    return copy_windows(np.asarray(tokenizer.encode(val).ids), copy_marks(val), block_size)


def evaluation_windows(run) -> tuple[int, int, bool]:
    """(how many validation windows, their seed, whether they are the run's own): those the run's own evaluations scored
    (training/evaluation.py: train.eval_windows, or eval_iters × the global batch; train.seed),
    where there are at most MAX_RUN_WINDOWS of them, so that the loss the page shows at a
    step is the run's figure; else TIMELINE_WINDOWS of them, and the page says how many."""
    try:
        train = run.run_config().get("train") or {}
    except UserError:  # (config.yaml cannot be read: the loss is then measured on windows of its own)
        train = {}
    if not isinstance(train, dict):
        train = {}
    settings = {key: train.get(key) for key in ("eval_windows", "eval_iters", "batch_size", "grad_accum", "seed")}
    if not all(isinstance(settings[key], int) for key in ("eval_iters", "batch_size", "grad_accum", "seed")):
        return TIMELINE_WINDOWS, 0, False
    count = settings["eval_windows"] or settings["eval_iters"] * settings["batch_size"] * settings["grad_accum"]
    own = count <= MAX_RUN_WINDOWS  # (for a run of one process: more processes score more windows)
    return (count if own else TIMELINE_WINDOWS), settings["seed"], own


def default_prompt(run, tokenizer, max_tokens: int, starts: int = 100) -> str | None:
    """The page's text when none is given: whole lines of the run's validation text, those
    among its first `starts` lines that fill max_tokens best (a line cut in two hides what
    it was saying, and the lesson's second copy with it); or its first max_tokens tokens
    where no line fits. None where that text cannot be read."""
    with tempfile.TemporaryDirectory(prefix="explore-", ignore_cleanup_errors=True) as scratch:
        val = validation_text(run, tokenizer, Path(scratch), say=False)
    if val is None:
        return None
    lines = tokenizer.decode(val[:max_tokens * starts].tolist()).split("\n")[:-1]
    sizes = [len(tokenizer.encode(line + "\n").ids) for line in lines]
    best, best_size = None, 0
    for start in range(min(starts, len(lines))):
        size = end = 0
        for end in range(start, len(lines)):
            if size + sizes[end] > max_tokens:
                break
            size += sizes[end]
        else:
            end = len(lines)
        if size > best_size:
            best, best_size = "\n".join(lines[start:end]) + "\n", size
    return best if best is not None else tokenizer.decode(val[:max_tokens].tolist())


def validation_text(run, tokenizer, scratch: Path, say: bool = True):
    """The run's validation tokens (for the timeline's losses and head scores, and the page's
    default text), or None where its data cannot be found any more (said on stderr, with say)."""
    try:
        tokens, _, _ = validation_tokens(run.data_config(), tokenizer, scratch)
        return np.array(tokens)  # (a copy: the scratch folder goes)
    except (UserError, DataError) as e:
        if say:
            print(f"note: the timeline shows no validation loss: the run's validation text cannot be read ({e})",
                  file=sys.stderr)
        return None


def page_config(model: GPT) -> dict:
    """The model's config as the page reads it: GPTConfig's fields, the head size and the heads'
    width side by side (H·d_k: n_embd unless head_dim), and the frequencies of its positions as
    the model computes them (RoPE's θ_i; the sinusoidal encoding's), so that the page's
    arithmetic starts from the model's own numbers."""
    c = model.config
    wpe = getattr(model.transformer, "wpe", None)
    return {**c.to_dict(), "head_size": c.head_size, "heads_width": c.heads_width,
            "rope_frequencies": None if model.rotary is None else model.rotary.inv_freq.tolist(),
            "sinusoidal_frequencies": wpe.inv_freq.tolist() if c.pos_encoding == "sinusoidal" else None}


MAX_PAGE_PARAMETERS = 5_000_000  # a model up to this size travels in its page, which runs it (5.3 bytes of base64 a weight)


def page_model(model: GPT, tokenizer) -> tuple[dict | None, dict | None]:
    """(What a page needs to run the model itself, None), or (None, why it cannot).

    What it needs (explorer/page/model.js and tokenizer.js): the config, the weights as
    model.state_dict() names them (a tied LM head once, as the embedding), the tokenizer,
    the tokens never sampled, and the sizes of the page's data. Why not: {"code", "values"}
    for the page to word in its language: "too_large" (more than MAX_PAGE_PARAMETERS
    parameters) or "tokenizer" (one the page's tokenizer.js does not know)."""
    count = model.num_parameters()
    if count > MAX_PAGE_PARAMETERS:
        return None, {"code": "too_large", "values": {"count": count, "limit": MAX_PAGE_PARAMETERS}}
    spec = page_tokenizer(tokenizer)
    if spec is None:
        return None, {"code": "tokenizer", "values": {}}
    return {"config": page_config(model), "weights": page_weights(model), "tokenizer": spec,
            "suppressed": list(suppressed_ids(tokenizer)), "parameters": count,
            "limits": {"top_units": TOP_UNITS, "lens_tokens": LENS_TOKENS, "ablation_tokens": ABLATION_TOKENS}}, None


CHAR_SPLIT = {"type": "Split", "pattern": {"Regex": "[\\s\\S]"}, "behavior": "Isolated", "invert": False}


def page_tokenizer(tokenizer) -> dict | None:
    """The tokenizer as the page's tokenizer.js encodes with it, or None for one it does not
    know. It knows the two kinds data/tokenizer.py trains: char (WordLevel over single
    characters, <unk> for the rest) and byte-level BPE with GPT-2's regex (also GPT-2's own),
    with no normaliser, no byte fallback, and no added tokens but special ones (which text
    never spells: load_tokenizer encodes them as text)."""
    spec = json.loads(tokenizer.to_str())
    model, pre, decoder = spec["model"], spec.get("pre_tokenizer") or {}, spec.get("decoder") or {}
    added = spec.get("added_tokens") or []
    if spec.get("normalizer") is not None or not all(token["special"] for token in added):
        return None
    special = {token["id"]: token["content"] for token in added}
    if model["type"] == "WordLevel" and pre == CHAR_SPLIT and decoder.get("type") == "Fuse":
        return {"kind": "char", "vocab": model["vocab"], "unk": model["vocab"].get(model["unk_token"]), "special": special}
    post = spec.get("post_processor")
    plain_bpe = (model["type"] == "BPE" and not model.get("byte_fallback") and model.get("dropout") is None
                 and not model.get("continuing_subword_prefix") and not model.get("end_of_word_suffix"))
    if (plain_bpe and pre.get("type") == "ByteLevel" and pre.get("use_regex", True) and decoder.get("type") == "ByteLevel"
            and (post is None or post.get("type") == "ByteLevel")):
        return {"kind": "bpe", "vocab": model["vocab"], "merges": model["merges"], "special": special,
                "add_prefix_space": pre.get("add_prefix_space", False), "ignore_merges": model.get("ignore_merges", False)}
    return None


def run_facts(summary: dict) -> dict | None:
    """What the page says of the run that trained the model, from its summary.json: its
    iterations, the tokens it trained on, its validation loss, whether the saved weights
    are their average (train.ema), why it is barely trained, if it is, and under a time
    budget what it got against the best pace it measured (None: a folder without a summary,
    e.g. a model brought in from transformers)."""
    if "iteration" not in summary:
        return None
    return {key: summary.get(key) for key in ("iteration", "tokens", "val_loss", "weights", "barely_trained", "pace")}


def layer_data(model: GPT, layer, index: int, lens: dict, with_weights: bool) -> dict:
    """One layer's pieces (batch row 0). residual_out is left out but for the last layer:
    it is the next layer's residual_in."""
    block = model.transformer.h[index]
    data = {name: array(getattr(layer, name)[0]) for name in ("residual_in", "ln_1", "attn", "ln_2", "mlp")}
    data["residual_out"] = array(layer.residual_out[0]) if index == model.config.n_layer - 1 else None
    hidden = layer.mlp_hidden[0]  # [T, F]
    order = hidden.abs().topk(min(TOP_UNITS, hidden.size(-1)), dim=-1).indices  # [T, TOP_UNITS]
    data["mlp_top"] = {"ids": order.tolist(), "values": hidden.gather(-1, order).tolist(), "width": hidden.size(-1)}
    group = layer.q.size(1) // layer.k.size(1)  # query heads per key/value head (grouped-query attention)
    data["heads"] = [{"q": array(layer.q[0, h]), "k": array(layer.k[0, h // group]), "v": array(layer.v[0, h // group]),
                      "weights": array(layer.weights[0, h]), "output": array(layer.heads[0, h])}
                     for h in range(layer.q.size(1))]  # a group's heads each carry their shared k and v
    data["lens"] = {"ids": lens["ids"], "probs": lens["values"]}
    attn = block.attn.c_attn
    data["c_attn"] = {"weight": array(attn.weight), "bias": None if attn.bias is None else array(attn.bias)} \
        if with_weights else None
    return data


def ablated(model: GPT, ids: list[int]) -> list[list[dict]]:
    """For every layer and head, the next-token distribution after the prompt with that
    head switched off (the model's own pass, head_mask): its likeliest tokens, its KL
    divergence from the model's distribution, KL(p ‖ p_off) = Σ p log(p / p_off), and each
    token's loss with it off (token_losses); and,
    up to MAX_ABLATION_LOGITS in all, its logits, so that the page samples from them with
    the temperature, top-k and top-p the learner sets (else "logits" is None and the page
    says that the column is at temperature 1)."""
    c = model.config
    device = model.lm_head.weight.device
    masks = torch.ones(c.n_layer * c.n_head + 1, c.n_layer, c.n_head, device=device)  # row 0: all heads on
    for row in range(1, len(masks)):
        masks[row].view(-1)[row - 1] = 0.0
    idx = torch.tensor([ids], device=device).expand(len(masks), -1)
    logits = model.trace(idx, head_mask=masks).logits  # [1 + L·H, T, vocab_size]
    losses = GPT.loss(logits[:, :-1], idx[:, 1:], reduction="none")  # [1 + L·H, T - 1]: each token's
    logp = torch.log_softmax(logits[:, -1].float(), -1)  # [1 + L·H, V]
    kl = (logp[0].exp() * (logp[0] - logp[1:])).sum(-1)  # [L·H]
    best = logp[1:].exp().topk(min(ABLATION_TOKENS, logp.size(-1)), dim=-1)
    with_logits = len(kl) * logits.size(-1) <= MAX_ABLATION_LOGITS  # (L·H·V)
    heads = [{"ids": best.indices[i].tolist(), "probs": best.values[i].tolist(), "kl": kl[i].item(),
              "logits": array(logits[1 + i, -1]) if with_logits else None, "losses": losses[1 + i].tolist()}
             for i in range(len(kl))]
    return [heads[layer * c.n_head:(layer + 1) * c.n_head] for layer in range(c.n_layer)]


TIMELINE_TOKENS = 60  # the sample each snapshot continues the prompt with
TIMELINE_WINDOWS = 32  # validation windows each snapshot's loss is the mean over, where the run's own are too many
MAX_RUN_WINDOWS = 512  # up to this many, the run's own evaluation windows (its figure, step for step)
TIMELINE_SEED = 0  # one generator seed for every snapshot's sample: what changes is the model
MAX_SNAPSHOT_BYTES = 6_000_000  # the snapshots' weights travel in the page (float16) up to this many bytes in all


def carries_snapshots(model: GPT, count: int) -> bool:
    """Whether a page carries the weights of `count` snapshots of `model` (in float16), so
    that every panel follows the slider for any text; above MAX_SNAPSHOT_BYTES the timeline
    holds the example text's maps, predictions, lenses and losses instead."""
    return count * model.num_parameters() * 2 <= MAX_SNAPSHOT_BYTES and model.num_parameters() <= MAX_PAGE_PARAMETERS


def page_weights(model: GPT, dtype: str = "float32") -> dict:
    """The model's weights as model.state_dict() names them, for the page to run it (a tied
    LM head once, as the embedding)."""
    state = model.state_dict()
    if model.config.tie_embeddings:
        del state["lm_head.weight"]  # the page reads transformer.wte.weight for both
    return {name: array(t, dtype) for name, t in state.items()}


@torch.no_grad()
def timeline_data(model: GPT, tokenizer, snapshots: dict[int, Callable[[GPT], GPT]], ids: list[int] | None,
                  val: np.ndarray | None, windows: int = TIMELINE_WINDOWS, seed: int = 0,
                  carry_weights: bool = False, copies: tuple | None = None) -> dict:
    """The model at each snapshot (step: a function that loads its weights into a model): its
    validation loss (over `windows` fixed windows of `val` drawn with `seed`, the run's own
    where they are few enough; None without the run's validation text) and its loss at each
    position of those windows with the in-context learning score (inspection/in_context.py);
    on the lesson's text (`copies`: lesson_windows), the loss on first and second copies and
    the phase change; every head's current-token, previous-token and induction scores (on
    the validation text and the induction probe, as TensorBoard's), the heads' composition
    and copying scores (inspection/circuits.py), and a sample continuing the prompt `ids`
    (one seed for all). With
    carry_weights, every snapshot's weights in float16 (the last one's None: it is the page's
    model), from which the page computes every panel at any step for any text; without, the
    prompt's own maps, prediction, logit lens and each token's loss at each step. ids None:
    the steps, losses and scores alone (explore.py --serve computes each step's panels on
    request)."""
    c = model.config
    device = model.lm_head.weight.device
    prompt = None if ids is None else torch.tensor([ids], device=device)
    scored = fixed_windows(val, c.block_size, windows, seed, "val") if val is not None else None
    probe = induction_probe(tokenizer, c.vocab_size, c.block_size).to(device)
    text = torch.from_numpy(np.asarray(val[:min(c.block_size, 128)], dtype=np.int64))[None].to(device) \
        if val is not None else probe[:, :probe.size(1) // 2]  # (without the run's text: the random tokens)
    # on the lesson's text, the circuit the trained model ends with, followed back through training
    circuit = None if copies is None or c.n_layer < 2 or c.norm_position != "pre" else \
        {"head": final_induction_head(model, text, probe), "stages": [], "logit": [], "readout": [], "symbols": SYMBOLS}
    never = suppressed_ids(tokenizer)
    steps, losses, samples, weights = [], [], [], []
    scores: dict[str, list] = {kind: [] for kind in KINDS}
    composition: dict[str, list] = {"q": [], "k": [], "v": []}
    copying, copying_text, by_position, first_copies, second_copies = [], [], [], [], []
    maps, predictions, lenses, prompt_losses = [], [], [], []
    for number, (step, load) in enumerate(snapshots.items()):
        snapshot = load(copy.deepcopy(model)).eval()
        steps.append(step)
        losses.append(None if scored is None else validation_loss(snapshot, scored))
        if scored is not None:
            by_position.append(position_losses(snapshot, *scored))
        if copies is not None:
            first, second = copy_losses(snapshot, *copies)
            first_copies.append(first)
            second_copies.append(second)
        if circuit is not None:
            for key, value in circuit_at(snapshot, copies, circuit["head"]).items():
                circuit[key].append(value)
        for kind, values in head_scores(snapshot, text, probe).items():
            if kind in scores:
                scores[kind].append(values.tolist())
        for kind, values in composition_scores(snapshot).items():
            composition[kind].append(values)
        copying.append(copying_scores(snapshot).tolist())
        copying_text.append(copying_on_text(snapshot, snapshot.trace(text), text).tolist())
        if prompt is None:
            continue
        generator = torch.Generator(device=device).manual_seed(TIMELINE_SEED)
        out = snapshot.generate(prompt, TIMELINE_TOKENS, temperature=0.8, generator=generator, suppress_tokens=never)
        samples.append(readable_decode(tokenizer, out[0, len(ids):].tolist()))
        if carry_weights:
            weights.append(page_weights(snapshot, "float16") if number < len(snapshots) - 1 else None)
            continue
        trace = snapshot.trace(prompt)
        last = torch.softmax(trace.logits[0, -1].float(), -1)
        last[list(never)] = 0.0
        maps.append(trace.weights[:, 0].float())  # [n_layer, H, T, T]
        predictions.append(top(last, PREDICTION_TOKENS))
        lenses.append(logit_lens(snapshot, trace))
        prompt_losses.append(token_losses(trace.logits[0], ids))
    data = {"steps": steps, "loss": losses, "loss_windows": windows, "loss_is_runs": False,
            "sample_prompt": None if ids is None else readable_decode(tokenizer, ids), "samples": samples if ids is not None else None,
            "sample_tokens": TIMELINE_TOKENS, "sample_seed": TIMELINE_SEED,
            "scores": scores, "uniform": uniform_scores(text.size(1), probe[0].cpu()),
            "scores_text": "val" if val is not None else "random",
            "composition": {kind: array(torch.stack(values), "float16") for kind, values in composition.items()},
            "copying": copying, "copying_text": copying_text,
            "position_loss": array(torch.tensor(by_position), "float16") if by_position else None,
            "in_context": [in_context_score(row) for row in by_position] if by_position else None,
            "copies": None if copies is None else {"first": first_copies, "second": second_copies,
                                                   "phase_change": phase_change(steps, first_copies, second_copies)},
            "composition_baseline": composition_baseline(model) if c.n_layer > 1 else None, "circuit": circuit}
    if carry_weights or ids is None:
        return {**data, "weights": weights if carry_weights else None}
    return {**data, "weights": None, "maps": array(torch.stack(maps), "float16"), "prediction": predictions, "lens": lenses,
            "losses": prompt_losses}


def final_induction_head(model: GPT, text: torch.Tensor, probe: torch.Tensor) -> list[int]:
    """[layer, head] of the trained model's induction head: the highest induction score past layer 0."""
    scores = head_scores(model, text, probe)["induction"][1:]  # [L - 1, H]
    layer, head = divmod(int(scores.argmax()), scores.size(1))
    return [layer + 1, head]


CIRCUIT_WINDOWS = 16  # windows of the lesson's text the logit's split and the probes are taken over


@torch.no_grad()
def circuit_at(model: GPT, copies: tuple, head: list[int]) -> dict:
    """The lesson's circuit at one snapshot, over its validation windows (`copies`:
    lesson_windows): where the induction head `head` puts its weight from the second copies'
    queries (inspection/in_context.py); each piece's mean part of the right token's logit over
    the second copies (inspection/circuits.py's logit_sources); and how well a probe reads the
    current and the previous token from each piece (inspection/readout.py)."""
    x, y, part, back = copies
    stages = induction_weights(model, x, part, back, *head)
    trace = model.trace(x[:CIRCUIT_WINDOWS].to(model.lm_head.weight.device))
    split = logit_sources(model, trace, y[:CIRCUIT_WINDOWS].to(model.lm_head.weight.device))
    second = (part[:CIRCUIT_WINDOWS] == 1).to(split["contributions"].device)
    names, pieces = stream_pieces(model, trace, model.config.n_layer, row=None)
    read = carried(names, pieces, x[:CIRCUIT_WINDOWS])
    return {"stages": stages, "logit": {"pieces": split["pieces"],
                                        "values": split["contributions"][:, second].mean(-1).tolist()},
            "readout": {"pieces": names, "current": [read[n]["current"] for n in names],
                        "previous": [read[n]["previous"] for n in names]}}


def validation_loss(model: GPT, windows: tuple[torch.Tensor, torch.Tensor], batch_size: int = 32) -> float:
    """The mean loss over fixed windows x, y [N, T], summed batch by batch as the run's
    evaluation sums it (training/evaluation.py), so that the figure is the run's own."""
    device = model.lm_head.weight.device
    total = torch.zeros((), dtype=torch.float64, device=device)
    x, y = windows
    for start in range(0, len(x), batch_size):
        logits, _ = model(x[start:start + batch_size].to(device))
        total += model.loss(logits, y[start:start + batch_size].to(device), reduction="sum").double()
    return total.item() / y.numel()


def initial_model(model: GPT, seed: int) -> GPT:
    """The run's model at initialisation, as training made it (GPT.initialised with the
    run's seed), on the same device; the global random state is left as it was."""
    device = model.lm_head.weight.device
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):  # manual_seed seeds CUDA's too
        return GPT.initialised(model.config, seed).to(device).eval()


def to_json(data: dict) -> str:
    """Compact JSON that can sit inside <script type="application/json">: every "<" is
    written as \\u003c, so no text (a prompt holding "</script>") can close the tag."""
    return json.dumps(data, ensure_ascii=False, separators=(",", ":"), allow_nan=False).replace("<", "\\u003c")


def decoded(a: dict) -> np.ndarray:
    """An array of the page's data back as numpy (for tests and other tools)."""
    dtype = "<f2" if a["dtype"] == "float16" else "<f4"
    return np.frombuffer(base64.b64decode(a["base64"]), dtype=dtype).reshape(a["shape"])
