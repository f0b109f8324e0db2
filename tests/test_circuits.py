"""Why a head attends where it does (inspection/circuits.py): the pieces of the residual
stream add up to it, a score splits exactly into (query piece, key piece) cells, the
composition scores are TransformerLens's, and a head that copies scores as one."""

import math
import subprocess
import sys

import pytest
import torch

from conftest import ROOT
from inspection.circuits import composition_scores, copying_scores, head_matrices, score_sources, stream_pieces
from model import GPT, GPTConfig


def transformer_lens_of(model: GPT, tokenizer, folder):
    """The model saved as a run in folder/run, exported to transformers (folder/hf), and opened by
    TransformerLens's TransformerBridge with HookedTransformer's processing (compatibility mode)."""
    bridge_module = pytest.importorskip("transformer_lens.model_bridge")
    from runs.folder import RunDir

    RunDir(folder / "run").save_model(model, tokenizer)
    exported = subprocess.run([sys.executable, "export.py", "--checkpoint", str(folder / "run"), "--out",
                               str(folder / "hf")], cwd=ROOT, capture_output=True, text=True)
    assert exported.returncode == 0, exported.stderr
    bridge = bridge_module.TransformerBridge.boot_transformers(str(folder / "hf"), device="cpu")
    bridge.enable_compatibility_mode()
    return bridge


def scrambled(seed=0, **settings) -> GPT:
    """A small model with every weight larger than at initialisation (every piece matters)."""
    torch.manual_seed(seed)
    config = {"vocab_size": 40, "block_size": 16, "n_layer": 3, "n_head": 4, "n_embd": 32, **settings}
    model = GPT(GPTConfig(**config)).eval()
    for p in model.parameters():
        p.data.normal_(0, 0.3)
    return model


SHAPES = [{"pos_encoding": "rope"}, {"pos_encoding": "learned", "bias": True, "qkv_bias": True},
          {"pos_encoding": "sinusoidal", "norm": "rmsnorm"}, {"pos_encoding": "rope", "n_kv_head": 2},
          {"pos_encoding": "rope", "qk_norm": True, "head_dim": 12, "n_kv_head": 2, "norm": "rmsnorm"}]


@pytest.mark.parametrize("settings", SHAPES)
def test_a_score_is_the_sum_of_its_pieces_pairs(settings):
    """The stream entering each block is the sum of what wrote it; the cells of a score's
    table add up to the trace's own q·k/√d_k, and against the other keys to its lead over
    their mean, whatever the positions, norm, biases, key/value heads, QK-norm and head size."""
    model = scrambled(**settings)
    idx = torch.randint(0, 40, (1, 12))
    with torch.no_grad():
        trace = model.trace(idx)
    for layer in range(3):
        names, pieces = stream_pieces(model, trace, layer)
        assert len(names) == len(pieces) == 1 + (settings["pos_encoding"] != "rope") + layer * (4 + 1 + model.config.bias)
        torch.testing.assert_close(pieces.sum(0), trace.layers[layer].residual_in[0], atol=1e-5, rtol=0)
    for layer, head, query, key in ((2, 3, 11, 4), (1, 0, 7, 7), (0, 1, 5, 0)):
        result = score_sources(model, trace, layer, head, query, key)
        cells = torch.tensor(result["contributions"], dtype=torch.float64)
        assert cells.shape == (len(result["pieces"]),) * 2 and result["pieces"][-1] == "shift"
        size = cells.abs().sum().item()  # (float32 rounding grows with what is added up)
        assert cells.sum().item() == pytest.approx(result["score"], abs=1e-6 * max(1.0, size))
        weights = trace.layers[layer].weights[0, head, query, :query + 1]
        scores = torch.log(weights)  # the softmax's input, up to a constant: the scores' differences
        others = torch.cat([scores[:key], scores[key + 1:]])
        gap = result["others"]["gap"]
        assert gap == pytest.approx((scores[key] - others.mean()).item(), abs=1e-4 * max(1.0, abs(gap)))
        assert sum(result["others"]["key"]) == pytest.approx(gap, abs=1e-5 * max(1.0, size))
        assert sum(result["others"]["query"]) == pytest.approx(gap, abs=1e-5 * max(1.0, size))
    assert score_sources(model, trace, 1, 0, 0, 0)["others"] is None  # the first query sees no other key


def test_a_cell_is_one_piece_of_the_query_against_one_of_the_key():
    """Layer 0 of a model with learned positions: the (token, position) cell is the token's
    part of q (its embedding, centred and scaled at the query's own statistics, through
    LN's weight and W_Q) against the key's position vector's part of k, by hand."""
    model = scrambled(pos_encoding="learned")
    idx = torch.randint(0, 40, (1, 9))
    with torch.no_grad():
        trace = model.trace(idx)
        result = score_sources(model, trace, 0, 2, 8, 3)
        ln, d = model.transformer.h[0].ln_1, 8
        x = trace.layers[0].residual_in[0]

        def part(vector, t):  # one piece through the norm at position t's statistics
            return ln.weight * (vector - vector.mean()) / (x[t].var(unbiased=False) + ln.eps).sqrt()

        w = model.transformer.h[0].attn.c_attn.weight
        q = part(trace.token[0, 8], 8) @ w[2 * d:3 * d].T
        k = part(trace.position[0, 3], 3) @ w[32 + 2 * d:32 + 3 * d].T
    assert result["pieces"][:2] == ["token", "position"]
    assert result["contributions"][0][1] == pytest.approx((q @ k).item() / math.sqrt(d), abs=1e-6)


def test_the_composition_scores_are_the_products_norms_of_the_heads_matrices():
    """Against the C × C matrices multiplied out: W_OV of the earlier head times the later
    one's W_QK (Q), W_QKᵀ (K) or W_OV (V), its norm over both of theirs; zero for a pair
    whose reading head is not in a later layer."""
    model = scrambled(n_kv_head=2)
    scores, f = composition_scores(model), head_matrices(model)
    ov = lambda l, h: f["v"][l, h] @ f["o"][l, h].T  # noqa: E731
    qk = lambda l, h: f["q"][l, h] @ f["k"][l, h].T  # noqa: E731
    norm = torch.linalg.matrix_norm
    for (l1, h1, l2, h2) in ((0, 1, 1, 3), (0, 0, 2, 2), (1, 3, 2, 0)):
        left = ov(l1, h1)
        for kind, right in (("q", qk(l2, h2)), ("k", qk(l2, h2).T), ("v", ov(l2, h2))):
            expected = norm(left @ right) / (norm(left) * norm(right))
            assert scores[kind][l1, h1, l2, h2].item() == pytest.approx(expected.item(), rel=1e-4)
    assert (scores["k"][1, :, 1] == 0).all() and (scores["k"][2, :, 0] == 0).all()


def test_a_head_that_writes_nothing_composes_with_nothing():
    """A head held off in training (train.heads_off: its columns of W_O zero) has W_OV = 0: its
    pairs through W_OV score 0, not 0/0, and every other pair keeps its score."""
    model = scrambled(n_kv_head=2)
    before = composition_scores(model)
    with torch.no_grad():
        model.transformer.h[1].attn.c_proj.weight[:, 8:16] = 0  # layer 1, head 1's columns (head_size 8)
    scores = composition_scores(model)
    for kind in ("q", "k", "v"):
        assert not scores[kind].isnan().any()
        assert (scores[kind][1, 1] == 0).all()  # as the writer
        assert torch.equal(scores[kind][1, 0], before[kind][1, 0])
    assert (scores["v"][:, :, 1, 1] == 0).all()  # as the reader of values
    assert torch.equal(scores["k"][:, :, 1, 1], before["k"][:, :, 1, 1]) and before["k"][0, 0, 1, 1] > 0


@pytest.mark.parametrize("pos_encoding", ["rope", "learned"])
def test_the_composition_scores_are_transformer_lens_s(tmp_path, pos_encoding):
    """The model exported to transformers and opened by TransformerLens (its
    TransformerBridge, with HookedTransformer's processing: LayerNorm folded, writing
    weights centred): its all_composition_scores equal ours."""
    from data.tokenizer import train_tokenizer

    tokenizer = train_tokenizer("char", ["abcdefghijklmnopqrstuvwxyz ,.\n" * 3], 0)
    model = scrambled(vocab_size=tokenizer.get_vocab_size(), block_size=32, pos_encoding=pos_encoding)
    bridge = transformer_lens_of(model, tokenizer, tmp_path)
    ours = composition_scores(model)
    for kind in "QKV":
        theirs = torch.as_tensor(bridge.all_composition_scores(kind).scores)
        torch.testing.assert_close(theirs, ours[kind.lower()], atol=1e-6, rtol=1e-5)


def copier() -> GPT:
    """A scrambled model whose head 0 of every layer writes back the token it attends to (W_V
    W_O the identity on 8 dimensions, the tokens told apart in those 8 alone)."""
    model = scrambled(pos_encoding="rope", norm="rmsnorm")
    c = model.config
    with torch.no_grad():
        for block in model.transformer.h:
            block.ln_1.weight.fill_(1.0)
            block.attn.c_attn.weight[2 * c.n_embd:2 * c.n_embd + 8] = torch.eye(c.n_embd)[:8] * 5  # head 0's W_V: 8 dims
            block.attn.c_proj.weight[:, :8] = torch.eye(c.n_embd)[:, :8]  # and W_O writes them back
        model.transformer.wte.weight[:, 8:] = 0  # the tokens told apart in those 8 dims, all of one length
        model.transformer.wte.weight /= model.transformer.wte.weight.norm(dim=-1, keepdim=True)
        model.transformer.ln_f.weight.fill_(1.0)
    return model


def test_a_head_that_copies_scores_one_and_a_random_one_little():
    """A head whose OV circuit writes back the token it attends to (W_V W_O the identity,
    the head tied to the embedding) ranks every token's own logit first."""
    scores = copying_scores(copier())
    assert scores.shape == (3, 4) and (scores[:, 0] == 1.0).all()
    assert scores[:, 1:].max() < 0.5
