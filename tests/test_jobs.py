"""The kind of job as one object (jobs/): resolved once, from a data config or a run folder,
and asked by every program; a new kind of job is one class, and every program then does
what it says, none of them asking which kind it holds."""

import json
import math

import pytest

import evaluate
import export
import generate
import jobs
import train
from cli.program import UserError
from conftest import ROOT
from data.config import DataConfig
from jobs import ChatJob, TextJob, job_for, job_of
from runs.folder import RunDir
from storage.atomic import write_atomic

TINY = str(ROOT / "configs" / "tiny.yaml")


class Shouted(TextJob):
    """A kind of job made here, in one class: a text whose every answer is its own."""

    name = "shouted"

    @classmethod
    def takes(cls, config: DataConfig):
        return cls(config) if ".shout." in config.source else None

    @classmethod
    def of_run(cls, run: RunDir):
        return cls()

    def save_beside(self, run, data) -> None:
        write_atomic(run.path / "shouted.txt", f"{data.vocab_size} TOKENS, LOUDLY".encode())

    def try_it(self, out_dir, prompt) -> str:
        return f"try it: shout at {out_dir}"

    def chat_session(self, model, tokenizer, checkpoint, **settings):
        raise UserError(f"{checkpoint} shouts; it does not chat")

    def card(self, out, summary) -> dict[str, str]:
        return {"example": "shout(model)", "unit": "decibels"}

    def tokenizer_settings(self) -> dict[str, str]:
        return {"shouting": "yes"}

    def check_options(self, scoring) -> None:
        scoring.refuse_all_but(kind="shouting")

    def evaluate(self, model, tokenizer, scoring) -> dict:
        return {"loudness": model.config.n_layer * 11}

    def report(self, result, what) -> tuple[dict, list[str]]:
        return result, [f"{what} is {result['loudness']} decibels loud"]


@pytest.fixture
def shouted(monkeypatch):
    monkeypatch.setattr(jobs, "KINDS", [Shouted, *jobs.KINDS])
    return Shouted


def test_a_new_kind_of_job_is_one_class_that_every_program_asks(shouted, micro, tmp_path, corpus, capsys):
    """Train, evaluate, generate and export a run of a kind none of them knows: each does
    what the kind answers (its files beside the model, its try-it line, its scores and their
    report, its chat, its model card and tokenizer settings)."""
    source = tmp_path / "lines.shout.txt"
    source.write_text(corpus.read_text(encoding="utf-8")[:20_000], encoding="utf-8")
    assert train.main(["--config", TINY, *micro("train.max_iters=2", "train.eval_interval=2", f"data.source={source}",
                                                "train.sample_tokens=0")]) == 0
    run = tmp_path / "run"
    assert capsys.readouterr().out.rstrip().endswith(f"try it: shout at {run}")
    assert (run / "shouted.txt").read_text().endswith("TOKENS, LOUDLY")
    assert RunDir(run).summary()["job"] == "shouted" and isinstance(job_of(RunDir(run)), Shouted)

    assert evaluate.main(["--checkpoint", str(run), "--split", "val"]) == 0
    assert capsys.readouterr().out == "the validation split is 22 decibels loud\n"
    assert evaluate.main(["--checkpoint", str(run), "--split", "val", "--stride", "4"]) == 2
    assert capsys.readouterr().err == "error: --stride is for a text's windows; the validation split is shouting\n"

    assert generate.main(["--checkpoint", str(run), "--chat"]) == 2
    assert capsys.readouterr().err.endswith(f"error: {run} shouts; it does not chat\n")

    assert export.main(["--checkpoint", str(run), "--out", str(tmp_path / "hf")]) == 0
    assert json.loads((tmp_path / "hf" / "tokenizer_config.json").read_text())["shouting"] == "yes"
    card = (tmp_path / "hf" / "README.md").read_text()
    assert "shout(model)" in card and "validation loss" in card and " decibels, after 2 iterations" in card


def test_a_job_is_resolved_from_what_its_source_holds(tmp_path, corpus):
    """Conversations (a .jsonl of them, a mixture) are a chat job, anything else a text."""
    chats = tmp_path / "c.jsonl"
    chats.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"},
                                              {"role": "assistant", "content": "hello"}]}) + "\n")
    rows = tmp_path / "t.jsonl"
    rows.write_text(json.dumps({"text": "a line of text"}) + "\n")
    assert type(job_for(DataConfig(str(chats)))) is ChatJob
    assert type(job_for(DataConfig(sources=[str(chats), str(chats)]))) is ChatJob
    assert type(job_for(DataConfig(str(rows)))) is TextJob
    assert type(job_for(DataConfig(str(corpus)))) is TextJob
    assert type(job_for(DataConfig("shakespeare"))) is TextJob


def test_a_run_folder_says_its_job_and_an_older_one_is_read_by_its_files(tmp_path):
    """summary.json's "job"; a run from before it was recorded: conversations where it kept a
    chat template, else a text; a name this version does not know is refused in one line."""
    run = RunDir(tmp_path)
    assert type(job_of(run)) is TextJob
    (tmp_path / RunDir.CHAT_TEMPLATE).write_text("{{ messages }}")
    assert type(job_of(run)) is ChatJob and job_of(run).tokenizer_settings() == {"chat_template": "{{ messages }}"}
    (tmp_path / RunDir.SUMMARY).write_text(json.dumps({"job": "text"}))
    assert type(job_of(run)) is TextJob and job_of(run).tokenizer_settings() == {}
    (tmp_path / RunDir.SUMMARY).write_text(json.dumps({"job": "poem"}))
    with pytest.raises(UserError, match="trained on a kind of job this version does not know \\('poem'\\)"):
        job_of(run)


def test_each_kind_says_its_loss_in_its_own_unit(tmp_path, corpus):
    """A text's validation loss is also bits per character of its text; conversations' is per
    answer token, with no characters to count."""
    text = jobs.prepare(DataConfig(str(corpus), cache_dir=str(tmp_path / "c")), progress=False)
    text.meta.update(val_tokens=300, val_characters=600)
    figures, words = text.loss_figures(2 * math.log(2))
    assert figures == {"val_bits_per_char": pytest.approx(1.0)} and words == "1.000 bits/char"
    chats = tmp_path / "c.jsonl"
    chats.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"{i}+1="},
                                                      {"role": "assistant", "content": str(i + 1)}]}) + "\n"
                             for i in range(30)))
    chat = jobs.prepare(DataConfig(str(chats), cache_dir=str(tmp_path / "c")), progress=False)
    assert chat.loss_figures(1.0) == ({}, "nats an answer token") and chat.meta["kind"] == ChatJob.name
    assert text.meta["kind"] == TextJob.name
