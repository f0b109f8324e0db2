"""From the key to the logit (issue 76): the logit split by what wrote the final stream,
activation and path patching (equal to TransformerLens's hooks on an export of the same
weights), what a piece carries, where an induction head's weight goes, the copies' losses and
the composition scores of random heads, each against values known by construction."""

from types import SimpleNamespace

import pytest
import torch

from data.copies import SYMBOLS
from data.tokenizer import train_tokenizer
from inspection.circuits import composition_baseline, composition_scores, logit_sources
from inspection.in_context import copy_losses, copy_marks, copy_windows, induction_weights
from inspection.patching import components, corrupted, path_patching, patching, scored_targets
from inspection.readout import carried, probe_accuracy
from model import GPT
from model.trace import Patch, patch_outputs
from test_circuits import SHAPES, scrambled, transformer_lens_of

LINES = "abcdabcd\nXY+/XY+/\nq1q1\n"  # three lines of the lesson's kind: a string written twice


def lesson_model(**settings) -> tuple[GPT, object]:
    """A scrambled two-layer model over the lesson's alphabet, char tokens."""
    tokenizer = train_tokenizer("char", [SYMBOLS + "\n"], 0)
    return scrambled(vocab_size=tokenizer.get_vocab_size(), block_size=32, n_layer=2, **settings), tokenizer


@pytest.mark.parametrize("settings", [*SHAPES, {"pos_encoding": "rope", "mlp": "none", "ffn_hidden": None}])
def test_a_logit_is_the_sum_of_what_wrote_the_final_stream(settings):
    """Every position's logit of the token that follows, split by the final stream's pieces
    through ln_f at the stream's own statistics: the pieces add up to the pass's own logit
    (an attention-only model: no feed-forward piece)."""
    model = scrambled(**settings)
    idx = torch.randint(0, 40, (2, 12))
    with torch.no_grad():
        trace = model.trace(idx)
    split = logit_sources(model, trace, idx.roll(-1, 1))
    assert split["contributions"].shape == (len(split["pieces"]), 2, 12) and split["pieces"][-1] == "shift"
    torch.testing.assert_close(split["contributions"].sum(0), split["logits"], atol=1e-4, rtol=1e-5)
    assert any("FFN" in name for name in split["pieces"]) == (settings.get("mlp") != "none")
    token = split["pieces"].index("token")  # by hand: the embedding through ln_f at the stream's statistics
    ln, x = model.transformer.ln_f, trace.layers[-1].residual_out[0, 5]
    e = trace.token[0, 5]
    if isinstance(ln, torch.nn.LayerNorm):
        part = ln.weight * (e - e.mean()) / (x.var(unbiased=False) + ln.eps).sqrt()
    else:
        part = ln.weight * e / (x.pow(2).mean() + ln.eps).sqrt()
    by_hand = part @ model.lm_head.weight[idx[0, 6]]
    assert split["contributions"][token, 0, 5].item() == pytest.approx(by_hand.item(), abs=1e-5)


def test_the_corrupted_text_changes_each_first_copy_and_nothing_else():
    assert corrupted(LINES, SYMBOLS) == "bcdeabcd\nYZ/aXY+/\nr2q1\n"
    assert corrupted("no copy here\n", SYMBOLS) == "no copy here\n"  # (a line that is no string written twice)
    scored = scored_targets(LINES)  # target j: character j + 1; a second copy's symbol
    assert [j + 1 for j in scored.nonzero()[:, 0].tolist()] == [4, 5, 6, 7, 13, 14, 15, 16, 20, 21]
    assert copy_marks("ab\nxx\n").tolist() == [-1, -1, -1, 0, 1, -1]


def test_patching_restores_what_the_patched_components_carry(tmp_path):
    """Known by construction: every component patched at once gives the clean run's loss
    wherever the two texts' tokens agree (the stream there is then the clean one); a head that writes nothing (its W_O columns
    zero) restores none; a last-layer head patched on both of its paths at once (straight to
    the logits, and through its block's feed-forward network) is that head patched outright."""
    model, tokenizer = lesson_model(pos_encoding="rope")
    with torch.no_grad():
        model.transformer.h[0].attn.c_proj.weight[:, 8:16] = 0  # L0H1 writes nothing
    clean, corrupt = (torch.tensor(tokenizer.encode(text).ids) for text in (LINES, corrupted(LINES, SYMBOLS)))
    scored = scored_targets(LINES)
    found = patching(model, clean, corrupt, scored)
    assert found["components"] == [*(f"L{l}H{h}" for l in range(2) for h in range(4)), "L0 FFN", "L1 FFN"]
    assert found["all"][1] == pytest.approx(0.0, abs=1e-6)
    assert found["corrupt"] > found["clean"]
    with torch.no_grad():
        trace = model.trace(clean[None])
        outputs = [Patch(l, h, trace.layers[l].heads[0, h] if h is not None else trace.layers[l].mlp[0],
                         torch.ones(len(clean))) for _, l, h in components(model)]
        everything = patch_outputs(model, outputs)
        logits, _ = model(corrupt[None])
        for hook in everything:
            hook.remove()
        losses = GPT.loss(logits[:, :-1], corrupt[None, 1:], reduction="none")[0]
        clean_losses = GPT.loss(trace.logits[:, :-1], clean[None, 1:], reduction="none")[0]
    same = (clean == corrupt)[:-1] & (clean == corrupt)[1:]  # (where the input and the target agree)
    torch.testing.assert_close(losses[same], clean_losses[same], atol=1e-5, rtol=0)
    paths = path_patching(model, clean, corrupt, scored)
    with torch.no_grad():  # L1H2 on both paths at once
        both = patch_outputs(model, [Patch(1, 2, trace.layers[1].heads[0, 2], torch.ones(len(clean)), path)
                                     for path in ("direct", "ffn")])
        logits, _ = model(corrupt[None])
        for hook in both:
            hook.remove()
        loss = GPT.loss(logits[:, :-1], corrupt[None, 1:], reduction="none")[0][scored].mean().item()
    assert (paths["corrupt"] - loss) / (paths["corrupt"] - paths["clean"]) == pytest.approx(paths["all"][6], abs=1e-5)
    assert paths["all"][6] == pytest.approx(found["all"][6], abs=1e-6)
    # a last-layer head patched at one position changes that position's prediction alone
    position = found["positions"][6]
    assert len(position) == len(clean)


def test_patching_a_last_layer_head_at_one_position_changes_only_that_positions_logits():
    model, tokenizer = lesson_model(pos_encoding="learned", bias=True)
    clean, corrupt = (torch.tensor(tokenizer.encode(text).ids) for text in (LINES, corrupted(LINES, SYMBOLS)))
    with torch.no_grad():
        trace = model.trace(clean[None])
        before, _ = model(corrupt[None])
        where = torch.zeros(len(clean))
        where[6] = 1
        hooks = patch_outputs(model, [Patch(1, 3, trace.layers[1].heads[0, 3], where)])
        after, _ = model(corrupt[None])
        for hook in hooks:
            hook.remove()
    changed = (after - before).abs().amax(-1)[0]
    assert changed[6] > 0 and changed[:6].max() == 0 and changed[7:].max() == 0


def test_patching_is_transformer_lens_s_on_an_export_of_the_same_weights(tmp_path):
    """The model exported to transformers and opened by TransformerLens (TransformerBridge):
    the corrupted run with a head's clean output put back (hook_z), a network's (hook_mlp_out),
    or a head's on one path (its clean z through W_O added to ln_final's or to ln2's input)
    gives the losses ours gives, every component and path."""
    model, tokenizer = lesson_model(pos_encoding="rope")
    bridge = transformer_lens_of(model, tokenizer, tmp_path)
    clean, corrupt = (torch.tensor([tokenizer.encode(text).ids]) for text in (LINES, corrupted(LINES, SYMBOLS)))
    scored = scored_targets(LINES)
    _, cache = bridge.run_with_cache(clean)

    def loss(hooks) -> float:
        logits = bridge.run_with_hooks(corrupt, fwd_hooks=hooks)
        return GPT.loss(logits[:, :-1], corrupt[:, 1:], reduction="none")[0][scored].mean().item()

    def head_z(l, h):
        def hook(z, hook):
            z = z.clone()
            z[:, :, h] = cache[f"blocks.{l}.attn.hook_z"][:, :, h]
            return z
        return [(f"blocks.{l}.attn.hook_z", hook)]

    def on_path(l, h, reader):
        def z_of(z, hook):
            held["delta"] = (cache[f"blocks.{l}.attn.hook_z"][:, :, h] - z[:, :, h]) @ bridge.W_O[l, h]
            return z

        def add(x, hook):
            return x + held["delta"]
        held = {}
        return [(f"blocks.{l}.attn.hook_z", z_of), (reader, add)]

    ours, paths = patching(model, clean[0], corrupt[0], scored, positions=False), \
        path_patching(model, clean[0], corrupt[0], scored)
    gap = ours["corrupt"] - ours["clean"]
    assert loss([]) == pytest.approx(ours["corrupt"], abs=1e-4)
    for k, (name, l, h) in enumerate(components(model)):
        hooks = head_z(l, h) if h is not None else [(f"blocks.{l}.hook_mlp_out",
                                                      lambda out, hook, l=l: cache[f"blocks.{l}.hook_mlp_out"])]
        assert (ours["corrupt"] - loss(hooks)) / gap == pytest.approx(ours["all"][k], abs=1e-4), name
    for k, (name, l, h) in enumerate((n, l, h) for n, l, h in components(model) if h is not None):
        direct = loss(on_path(l, h, "ln_final.hook_in"))
        through = loss(on_path(l, h, f"blocks.{l}.ln2.hook_in"))
        assert (ours["corrupt"] - direct) / gap == pytest.approx(paths["direct"][k], abs=1e-4), name
        assert (ours["corrupt"] - through) / gap == pytest.approx(paths["ffn"][k], abs=1e-4), name


def test_a_probe_reads_what_a_piece_spells_out_and_little_else():
    """Known by construction: a piece that is the previous token's one-hot vector (with
    noise) is read back as the previous token every time, and the current one at about chance."""
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 20, (16, 40), generator=generator)
    previous = torch.nn.functional.one_hot(tokens.roll(1, 1), 32).float()  # position t holds token t − 1
    piece = previous + 0.05 * torch.randn(16, 40, 32, generator=generator)
    found = carried(["spells the previous token"], piece[None], tokens)["spells the previous token"]
    assert found["previous"] == 1.0 and found["current"] < 0.2
    assert probe_accuracy(torch.randn(400, 8, generator=generator), torch.randint(0, 4, (400,), generator=generator)) < 0.45


def test_where_an_induction_heads_weight_goes_from_the_second_copies():
    """Known by construction: a stand-in pass whose head puts 0.7 on the key after the earlier
    copy of each query's symbol and 0.2 on that copy itself; only the second copies' queries count."""
    text = "abcdabcd\n"
    ids = torch.tensor([[ord(ch) % 32 for ch in text]])
    marks = copy_marks(text)
    x, y, part, back = copy_windows(ids[0].numpy(), marks, block=7, count=1, seed=0)
    T = x.size(1)
    weights = torch.full((1, 2, T, T), 0.0)
    for i in range(T):
        weights[0, 1, i, 0] = 1.0
        if back[0, i] > 0:
            n = int(back[0, i])
            weights[0, 1, i] = 0.0
            weights[0, 1, i, i - n + 1], weights[0, 1, i, i - n], weights[0, 1, i, i] = 0.7, 0.2, 0.1
    layer = SimpleNamespace(weights=weights)
    stand_in = SimpleNamespace(lm_head=SimpleNamespace(weight=torch.zeros(1)),
                               trace=lambda idx: SimpleNamespace(layers=[None, layer]))
    assert induction_weights(stand_in, x, part, back, layer=1, head=1) == pytest.approx(
        {"right": 0.7, "same": 0.2, "rest": 0.1})


def test_the_copies_losses_are_the_first_copies_and_the_second_in_that_order():
    """A stand-in pass that predicts every second copy's symbol for sure and nothing else:
    the first copies' loss is ln V, the second copies' 0 (a swap would give them the other way)."""
    text = "abcdabcd\nxyzwxyzw\n"
    V = 40
    ids = torch.tensor([ord(ch) % V for ch in text])
    x, y, part, back = copy_windows(ids.numpy(), copy_marks(text), block=16, count=2, seed=0)

    def logits_for(idx):
        out = torch.zeros(*idx.shape, V)
        for r in range(len(idx)):
            row = [i for i in range(len(x)) if torch.equal(x[i], idx[r])][0]
            for j in range(idx.size(1)):
                if part[row, j] == 1:
                    out[r, j, y[row, j]] = 100.0
        return out

    stand_in = SimpleNamespace(lm_head=SimpleNamespace(weight=torch.zeros(1)), training=False,
                               eval=lambda: None, train=lambda mode: None,
                               trace=lambda idx, head_mask=None: SimpleNamespace(logits=logits_for(idx)))
    first, second = copy_losses(stand_in, x, y, part)
    assert first == pytest.approx(torch.log(torch.tensor(float(V))).item(), abs=1e-4) and second < 1e-6


def test_random_heads_compose_by_the_baseline_over_pairs_of_different_layers():
    """The baseline is the mean and spread of composition_scores over models as training starts
    them, every pair of heads in different layers (none within a layer, where the score is 0)."""
    model = scrambled(n_layer=2)
    baseline = composition_baseline(model, samples=2, seed=5)
    pairs = [composition_scores(GPT.initialised(model.config, seed)) for seed in (5, 6)]
    for kind in "qkv":
        values = torch.cat([scores[kind][0, :, 1, :].flatten() for scores in pairs])
        assert baseline[kind]["mean"] == pytest.approx(values.mean().item(), rel=1e-5)
        assert baseline[kind]["sd"] == pytest.approx(values.std().item(), rel=1e-5)
    assert 0.5 / 32 ** 0.5 < baseline["k"]["mean"] < 2 / 32 ** 0.5  # (about 1/√C)


def test_a_head_that_copies_the_token_it_reads_scores_one_on_the_text():
    """The hand-built copier of test_circuits (its W_V W_O writing back the token it attends to):
    on a text, every position's own token ranks first through it; a random head's less often."""
    from inspection.circuits import copying_on_text
    from test_circuits import copier

    model = copier()
    with torch.no_grad():
        idx = torch.randint(0, 40, (2, 16), generator=torch.Generator().manual_seed(1))
        scores = copying_on_text(model, model.trace(idx), idx)
    assert scores.shape == (3, 4)
    assert scores[0, 0] == 1.0 and scores[0, 1:].max() < 0.5
