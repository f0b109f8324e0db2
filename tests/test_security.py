"""Nothing a user may receive from someone else is unpickled: every file the project
loads is replaced by a pickle whose loading would create a file, and is refused."""

import pickle

import pytest
import torch

import evaluate
import explore
import export
import generate
import train
from conftest import ROOT

TINY = str(ROOT / "configs" / "tiny.yaml")


class Payload:
    """Unpickling this calls open(marker, 'w'): it would create the marker file."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, corpus):
    tmp = tmp_path_factory.mktemp("secure")
    overrides = [f"data.source={corpus}", f"data.cache_dir={tmp / 'cache'}", f"out_dir={tmp / 'run'}",
                 "data.tokenizer=char", "model.n_layer=1", "model.n_head=2", "model.n_embd=16", "model.block_size=16",
                 "train.max_iters=4", "train.eval_interval=4", "train.eval_iters=1", "train.batch_size=2",
                 "train.sample_tokens=0", "train.dtype=float32", "train.threads=1"]
    assert train.main(["--config", TINY, *overrides]) == 0
    return tmp / "run", overrides


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")  # torch notes the planted file
@pytest.mark.parametrize("name", ["model.safetensors", "config.json", "tokenizer.json", "config.yaml", "summary.json",
                                  "trainer_state.pt"])
@pytest.mark.parametrize("style", ["raw pickle", "torch.save"])
def test_planted_pickles_are_refused_and_never_run(tmp_path, run_dir, name, style, capsys):
    """Every program that opens a run (generate, evaluate, export, explore, and training
    to resume it) meets a pickle in place of each file of the run folder: the model's
    files are refused by name, exit 2; the others are read as text or not at all (only
    training reads trainer_state.pt, with weights_only=True); nothing runs the payload."""
    import shutil

    source, overrides = run_dir
    run = tmp_path / "run"
    shutil.copytree(source, run)
    marker = tmp_path / "pwned"
    with open(run / name, "wb") as f:
        if style == "raw pickle":
            pickle.dump(Payload(marker), f)
        else:
            torch.save({"model": Payload(marker)}, f)
    (tmp_path / "text.txt").write_text("First Citizen:\nBefore we proceed any further, hear me speak.\n")
    overrides = [o for o in overrides if not o.startswith("out_dir=")] + [f"out_dir={run}", "train.max_iters=8"]
    codes = {"generate": generate.main(["--checkpoint", str(run), "--prompt", "A", "--max-new-tokens", "2"]),
             "evaluate": evaluate.main(["--checkpoint", str(run), "--text", str(tmp_path / "text.txt")]),
             "export": export.main(["--checkpoint", str(run), "--out", str(tmp_path / "hf")]),
             "explore": explore.main(["--checkpoint", str(run), "--prompt", "A", "--out", str(tmp_path / "p.html")])}
    if name == "trainer_state.pt":
        codes["train"] = train.main(["--config", TINY, *overrides])
    err = capsys.readouterr().err
    assert not marker.exists(), "the payload ran"
    if name in ("model.safetensors", "config.json", "tokenizer.json"):
        errors = [line for line in err.splitlines() if line.startswith("error: ")]
        assert set(codes.values()) == {2} and len(errors) == 4 and all(name in line for line in errors)
    elif name == "trainer_state.pt":
        assert codes == {"generate": 0, "evaluate": 0, "export": 0, "explore": 0, "train": 2}
        assert "cannot be loaded safely" in err
    else:  # config.yaml, summary.json: what they would add is left out, and said where it matters
        assert set(codes.values()) == {0}
    if name == "summary.json":
        assert "**Measured**: not recorded by this run." in (tmp_path / "hf" / "README.md").read_text()


def test_yaml_is_loaded_safely(tmp_path, capsys):
    marker = tmp_path / "pwned"
    config = tmp_path / "evil.yaml"
    config.write_text(f"model: !!python/object/apply:builtins.open ['{marker}', 'w']\n")
    assert train.main(["--config", str(config)]) == 2
    assert not marker.exists() and "not valid YAML" in capsys.readouterr().err


def test_shipped_configs_load():
    from training.config import load_config

    for path in sorted((ROOT / "configs").glob("*.yaml")):
        cfg = load_config(path)
        assert cfg.out_dir == f"out/{path.stem}"
        cfg.model_with_vocab(vocab_size=100)  # a valid model


def test_a_trainer_state_that_is_not_plain_data_is_named_with_the_first_line_of_the_reason(tmp_path):
    import fractions

    from cli.program import UserError
    from runs.folder import RunDir

    torch.save({"x": fractions.Fraction(1, 3)}, tmp_path / RunDir.STATE)  # a class: refused by weights_only
    try:
        torch.load(tmp_path / RunDir.STATE, weights_only=True)
    except Exception as e:
        reason = str(e).splitlines()[0][:200]
    with pytest.raises(UserError) as e:
        RunDir(tmp_path).load_state()
    assert str(e.value) == (f"{tmp_path / RunDir.STATE} cannot be loaded safely ({reason}); it is damaged or not "
                            "ours: start over with --fresh or use another out_dir")
    assert reason.startswith("Weights only load failed.")


def test_the_run_folder_writes_a_model_into_a_folder_old_or_new_and_names_a_locks_holder(tmp_path):
    from runs.folder import RunDir
    from data.tokenizer import train_tokenizer
    from model import GPT, GPTConfig

    tokenizer = train_tokenizer("char", ["abc\n"], 0)
    model = GPT(GPTConfig(vocab_size=tokenizer.get_vocab_size(), block_size=8, n_layer=1, n_head=1, n_embd=8))
    for _ in range(2):  # a new folder, then the same one again
        RunDir(tmp_path / "a" / "b").save_model(model, tokenizer)
    loaded, _ = RunDir(tmp_path / "a" / "b").load_model()
    assert loaded.config == model.config
    (tmp_path / ".lock").write_text("")
    assert RunDir(tmp_path).lock().holder() == "another process"  # a lock file that names nobody
