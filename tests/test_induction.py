"""The induction lesson (configs/induction.yaml, data/copies.py, bench/induction.py): its
text, its first steps, and (slow) the whole lesson forming a previous-token head in layer 0
and an induction head in layer 1 while the loss on the repeated text falls."""

import math

import pytest
import torch

import train
from bench.induction import analyse
from explorer.data import decoded
from inspection.in_context import copy_marks
from runs.folder import RunDir
from conftest import ROOT
from data import copies
from inspection.head_scores import induction_probe, induction_scores, induction_targets

LESSON = str(ROOT / "configs" / "induction.yaml")


def test_the_lessons_text_is_lines_of_strings_written_twice_from_a_seed():
    text = copies.text(5_000, copies.SEED)
    assert text == copies.text(5_000, copies.SEED) != copies.text(5_000, copies.SEED + 1)
    lines = text.split("\n")[:-1]
    assert all(len(line) % 2 == 0 and line[:len(line) // 2] == line[len(line) // 2:] for line in lines)
    lengths = [len(line) // 2 for line in lines]
    assert min(lengths) >= copies.SHORTEST and max(lengths) <= copies.LONGEST and len(set(lengths)) > 20  # no fixed offset
    assert set(text) == set(copies.SYMBOLS) | {"\n"} and len(copies.SYMBOLS) == 64
    marks = copy_marks("ab" + "ab" + "\n" + "xyz" + "xyz" + "\n")
    assert marks.tolist() == [0, 0, 2, 2, -1, 0, 0, 0, 3, 3, 3, -1]  # second copies: how far back their first is


@pytest.fixture(scope="module")
def lesson_start(tmp_path_factory):
    """The lesson's first 60 steps."""
    out = tmp_path_factory.mktemp("lesson") / "run"
    assert train.main(["--config", LESSON, f"out_dir={out}", "train.max_iters=60", "train.eval_interval=60",
                       f"data.cache_dir={out.parent / 'cache'}"]) == 0
    return out


@pytest.mark.slow  # (the lesson's text prepared and 60 steps trained: about 35 s of one core while the others run)
def test_the_lessons_first_steps_start_where_nothing_can_be_predicted(lesson_start):
    """A fixed length, float32 and a pinned thread count (the figures are the learner's);
    64 symbols, each once in each copy of the probe, so that a perfect induction head scores
    1; the loss at initialisation near ln 65, a snapshot every 30 steps."""
    run = RunDir(lesson_start)
    settings = run.run_config()["train"]
    assert (settings["max_minutes"], settings["dtype"], settings["threads"]) == (None, "float32", 1)
    model, tokenizer = run.load_model()
    assert model.config.n_layer == 2 and tokenizer.get_vocab_size() == 66  # 64 symbols, the newline, <unk>
    probe = induction_probe(tokenizer, model.config.vocab_size, model.config.block_size)[0]
    assert len(probe) == 128 and len(set(probe[:64].tolist())) == 64
    assert induction_targets(probe).sum(-1).tolist() == [1] * 64  # the one key after the same symbol
    perfect = torch.zeros(128, 128)
    perfect[64:] = induction_targets(probe).float()
    assert induction_scores(perfect, probe).item() == 1.0
    assert list(run.snapshot_paths()) == [0, 30, 60]
    result = analyse(lesson_start)
    assert abs(result["first_copies"][0] - math.log(65)) < 0.1 and abs(result["second_copies"][0] - math.log(65)) < 0.1
    assert result["uniform"]["induction"] < 0.02 and all(max(map(max, scores)) < 0.1 for scores in result["induction"])


@pytest.mark.slow  # (about 40 s on 2 cores)
def test_the_lesson_forms_an_induction_head_in_layer_1_over_a_previous_token_head(tmp_path):
    """The whole lesson from a fresh process: after a plateau the loss on the second copies
    falls to under a tenth of the first copies' within a stretch of 10 or more snapshots; an
    induction head in layer 1 (at least 0.5, from even attention's 0.01) reads a head of
    layer 0 that looks one token back; switching the induction head off brings the loss on
    the second copies back up, and switching the previous-token head off does too."""
    assert train.main(["--config", LESSON, f"out_dir={tmp_path / 'run'}", f"data.cache_dir={tmp_path / 'cache'}"]) == 0
    result = analyse(tmp_path / "run")
    first, second = result["first_copies"], result["second_copies"]
    assert second[0] > 0.97 * first[0] and second[-1] < 0.1 * first[-1]
    change = result["phase_change"]
    assert change["start"] >= 300 and change["snapshots"] >= 10  # (a plateau, then the drop)
    induction, previous = result["circuit"]["induction"], result["circuit"]["previous_token"]
    assert induction["layer"] == 1 and induction["score"] >= 0.5
    assert previous["layer"] == 0 and previous["score"] >= 10 * result["uniform"]["previous_token"]
    off = {(a["layer"], a["head"]): a["second_copies"] for a in result["ablation"]}
    assert off[(1, induction["head"])] > 3 * second[-1] and off[(0, previous["head"])] > 3 * second[-1]
    # the explorer reads the docs' table off the run itself, and shows why the head works: its
    # keys read the previous-token head (K-composition up from initialisation), and of the
    # right key's lead over the others, layer 0's heads give much, the key's own token nothing
    from explorer.data import run_timeline
    from inspection.circuits import score_sources

    run = RunDir(tmp_path / "run")
    model, tokenizer = run.load_model()
    timeline, _ = run_timeline(model.eval(), tokenizer, run)
    assert timeline["copies"]["first"] == pytest.approx(first, abs=1e-6)
    assert timeline["copies"]["second"] == pytest.approx(second, abs=1e-6)
    assert timeline["copies"]["phase_change"] == change
    layer, head, p_layer, p_head = induction["layer"], induction["head"], previous["layer"], previous["head"]
    k = torch.from_numpy(decoded(timeline["composition"]["k"]).astype("float32"))  # [steps, L, H, L, H]
    assert k[-1, p_layer, p_head, layer, head] > k[0, p_layer, p_head, layer, head]
    line = copies.splits(run.data_config().val_fraction)[1].split("\n")[1] + "\n"  # a string written twice
    n = len(line) // 2  # query n + 5 reads the token at 5 again: the right key is the one after it, 6
    with torch.no_grad():
        found = score_sources(model.eval(), model.trace(torch.tensor([tokenizer.encode(line).ids])), layer, head, n + 5, 6)
    lead = dict(zip(found["pieces"], found["others"]["key"]))
    from_heads = sum(value for name, value in lead.items() if name.startswith("L0H"))
    assert from_heads > 0.3 * found["others"]["gap"] > 0 and abs(lead["token"]) < 0.05 * found["others"]["gap"]
