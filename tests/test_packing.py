"""Conversations in epochs and packed several a row (data/batches.py, the model's position_ids
of packed rows): each conversation scores in a packed row what it scores alone, every one is
drawn once an epoch, and a run resumes mid-epoch on the very rows it would have had."""

import json

import numpy as np
import pytest
import torch

from conftest import ROOT
from data.shared import DataError
from data.batches import IGNORE, ConversationSampler, best_fit, conversation_rows, in_memory
from data.template import DEFAULT_TEMPLATE, ChatTemplate, encode
from data.tasks import conversations as task_conversations
from model import GPT, GPTConfig
from test_chat import chat_run, default_tokenizer

ENCODINGS = ["sinusoidal", "learned", "rope"]


def conversations_of(count, seed=0):
    tokenizer = default_tokenizer()
    template = ChatTemplate(DEFAULT_TEMPLATE)
    records = task_conversations("add", count, seed=seed)
    return in_memory([encode(tokenizer, template, record["messages"]) for record in records]), tokenizer


@pytest.mark.parametrize("pos", ENCODINGS)
@pytest.mark.parametrize("impl", ["explicit", "sdpa"])
@pytest.mark.parametrize("alone_from", [1024, 0])
def test_a_packed_row_scores_each_conversation_as_it_scores_alone(pos, impl, alone_from, monkeypatch):
    """Three conversations packed in one row (and the padding after them): each one's per-token
    losses equal its own row's, so it neither sees the others nor starts at their positions;
    with the dense block-diagonal mask (a short row's) and a sequence at a time (a long row's:
    the length from which rows take that way lowered to any)."""
    monkeypatch.setattr("model.gpt.ALONE_FROM", alone_from)
    rows, tokenizer = conversations_of(3)
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=tokenizer.get_vocab_size(), block_size=128, n_layer=2, n_head=2, n_embd=32,
                          pos_encoding=pos, attn_impl=impl)).eval()
    x, y, positions = conversation_rows(rows, [[0, 1, 2], [1]], 128)
    starts = [0, len(rows[0][0]) - 1, len(rows[0][0]) + len(rows[1][0]) - 2]
    assert (positions[0] == 0).nonzero().flatten().tolist() == starts  # each conversation counts from 0
    assert (positions[1] == 0).nonzero().flatten().tolist() == [0, len(rows[1][0]) - 1]  # and the padding
    with torch.no_grad():
        packed = GPT.loss(model(x, position_ids=positions)[0], y, reduction="none")
        at = 0
        for i in range(3):
            alone_x, alone_y, alone_positions = conversation_rows(rows, [i], 128)
            assert alone_positions is None
            n = alone_x.shape[1]
            alone = GPT.loss(model(alone_x)[0], alone_y, reduction="none")[0]
            torch.testing.assert_close(packed[0, at:at + n], alone, atol=2e-5, rtol=0)
            assert torch.equal(x[0, at:at + n], alone_x[0]) and torch.equal(y[0, at:at + n], alone_y[0])
            at += n
        assert (y[1, len(rows[1][0]) - 1:] == IGNORE).all()  # the second row's padding is not scored
        # without the positions the second and third conversations see the first: their losses differ
        unmasked = GPT.loss(model(x)[0], y, reduction="none")
        assert not torch.allclose(unmasked[0, len(rows[0][0]):], packed[0, len(rows[0][0]):], atol=1e-3)


def test_packed_rows_attend_sequence_by_sequence_and_hold_no_dense_mask(monkeypatch):
    """A row of ALONE_FROM tokens or more: through torch's fused kernel each sequence attends
    alone, causal, with no mask (so nothing [T, T] is held: memory linear in the context,
    bench/packing.py), and the logits and gradients are those of the dense block-diagonal
    mask, which a shorter row takes (cheaper there than many small calls)."""
    import torch.nn.functional as F

    from model.attention import Sequences

    rows, tokenizer = conversations_of(3)
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=tokenizer.get_vocab_size(), block_size=128, n_layer=2, n_head=2, n_embd=32,
                          pos_encoding="rope"))
    x, y, positions = conversation_rows(rows, [[0, 1, 2], [1]], 128)
    dense = Sequences.of(positions).mask()[:, 0]  # [B, T, T]
    _, loss = model(x, y, attention_mask=dense, position_ids=positions)
    loss.backward()
    expected = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad()
    calls = []
    fused = F.scaled_dot_product_attention

    def recorded(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, **more):
        calls.append((q.shape[2], attn_mask is None, is_causal))
        return fused(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, **more)

    monkeypatch.setattr(F, "scaled_dot_product_attention", recorded)
    model(x, y, position_ids=positions)
    assert len(calls) == 2 and not calls[0][1]  # (a row shorter than ALONE_FROM: the dense mask, a call a layer)
    calls.clear()
    monkeypatch.setattr("model.gpt.ALONE_FROM", x.shape[1])  # (a row as long: a sequence at a time)
    _, packed = model(x, y, position_ids=positions)
    packed.backward()
    # each layer: the first row's three conversations, the second row's one and its padding (from position 0)
    lengths = [len(rows[i][0]) - 1 for i in (0, 1, 2)] + [len(rows[1][0]) - 1, x.shape[1] - len(rows[1][0]) + 1]
    assert calls == [(length, True, True) for length in lengths] * 2  # (two layers; none holds a whole row)
    torch.testing.assert_close(packed, loss, atol=1e-6, rtol=0)
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, expected[name], atol=1e-6, rtol=1e-5, msg=name)


def test_best_fit_puts_each_item_where_it_leaves_the_least_room():
    assert best_fit(np.array([6, 5, 4, 3, 2]), 10) == [[0, 2], [1, 3, 4]]
    sizes = np.random.default_rng(0).integers(1, 60, 500)
    rows = best_fit(sizes, 64)
    assert sorted(i for row in rows for i in row) == list(range(500))
    assert all(sizes[row].sum() <= 64 for row in rows)
    assert len(rows) <= np.ceil(sizes.sum() / 64) * 1.05  # within 5% of the fewest rows possible


@pytest.mark.parametrize("pack", [False, True])
def test_an_epoch_draws_each_conversation_once_and_resumes_mid_epoch(pack):
    rows, _ = conversations_of(50)
    sampler = ConversationSampler(rows, 64, 4, seed=3, pack=pack)
    per_epoch = sampler.rows_in(1)
    taken = [sampler.next_row() for _ in range(per_epoch)]
    flat = [int(i) for row in taken for i in np.atleast_1d(row)]
    assert sorted(flat) == list(range(50)) and sampler.epochs_done == 1.0
    if pack:
        assert per_epoch < 50 and any(len(row) > 1 for row in taken)
    second = [int(i) for _ in range(sampler.rows_in(2) - per_epoch) for i in np.atleast_1d(sampler.next_row())]
    assert sorted(second) == list(range(50)) and second != flat  # shuffled again
    # a state saved mid-epoch gives the very batches that follow
    sampler = ConversationSampler(rows, 64, 4, seed=3, pack=pack)
    for _ in range(3):
        sampler.next_batch()
    saved = json.loads(json.dumps(sampler.state_dict()))
    ahead = [sampler.next_batch() for _ in range(5)]
    replay = ConversationSampler(rows, 64, 4, seed=3, pack=pack)
    replay.load_state_dict(saved)
    for a, b in zip(ahead, [replay.next_batch() for _ in range(5)]):
        assert all(torch.equal(p, q) if p is not None else q is None for p, q in zip(a, b))
    assert replay.epochs_done == sampler.epochs_done


def test_a_sources_weight_is_how_often_its_conversations_come_in_an_epoch():
    rows, _ = conversations_of(40)
    first, second = np.arange(0, 20), np.arange(20, 40)
    sampler = ConversationSampler(rows, 64, 4, seed=0, weights=[(first, 2.0), (second, 0.5)])
    epoch = [int(i) for i in sampler.rows_of(0)]
    assert sorted(set(i for i in epoch if i < 20)) == list(range(20)) and sum(i < 20 for i in epoch) == 40
    assert len([i for i in epoch if i >= 20]) == len(set(i for i in epoch if i >= 20)) == 10
    other = {int(i) for i in sampler.rows_of(1) if i >= 20}
    assert other != {i for i in epoch if i >= 20}  # another half of it the next epoch
    with pytest.raises(DataError, match="the data.sources weights leave no conversation in an epoch"):
        ConversationSampler(rows, 64, 4, seed=0, weights=[(first, 0.01)])


def test_a_run_in_epochs_packed_ends_after_them_and_resumes_exactly(tmp_path, capsys):
    """train.epochs sets the length; the done line and summary.json say the epochs; stopped in
    the second epoch and resumed, the weights are those of a run straight through."""
    import train
    from safetensors.torch import load_file

    packed = ("model.block_size=64", "train.packing=true", "train.epochs=2", "train.max_iters=1000")
    assert train.main(chat_run(tmp_path, *packed, out="straight")) == 0
    said = capsys.readouterr().out
    summary = json.loads((tmp_path / "straight" / "summary.json").read_text())
    iterations = summary["iteration"]
    assert 2.0 <= summary["epochs"] < 2.0 + 16 / 100 and iterations < 1000
    assert f"done: {iterations} iterations ({summary['epochs']:.2f} epochs of the conversations)" in said
    assert train.main(chat_run(tmp_path, *packed, f"train.max_iters={iterations - 3}", out="resumed")) == 0
    assert 1.0 < json.loads((tmp_path / "resumed" / "summary.json").read_text())["epochs"] < 2.0
    assert train.main(chat_run(tmp_path, *packed, out="resumed")) == 0
    straight, resumed = (load_file(tmp_path / name / "model.safetensors") for name in ("straight", "resumed"))
    assert all(torch.equal(straight[name], resumed[name]) for name in straight)


def test_epochs_need_conversations(tmp_path, micro, capsys):
    import train

    assert train.main(["--config", str(ROOT / "configs" / "tiny.yaml"), *micro("train.epochs=2")]) == 2
    assert "train.epochs=2 counts passes over conversations" in capsys.readouterr().err
