"""The kind of job: what a run trains on, and how its model is prepared for, asked and
scored. One class a kind, each in its own file, each answering the questions of job.py:

    job.py           Job: the questions; Scoring: what evaluate.py asks to score, and how
    text.py          TextJob   a text: random windows; scored per token and per character;
                               prompted with text
      text_data.py   its token files, its corpus, evaluate.py's pass over a text
    chat.py          ChatJob   conversations (one source, or a mixture): the assistant's turns;
                               scored on them and on the answers written; asked in the template
      chat_data.py   its token files, its corpus, a mixture of sources, the answers scored
    preference.py    PreferenceJob  pairs of answers, one preferred: tuned by DPO from a model
                               brought in; scored on how often the chosen answer ranks first
      preference_data.py  its token files, its corpus, the pairs scored
      dpo.py         the objective it trains with: DPO's loss against a reference
    objective.py     what the other kinds train with: each next token's cross-entropy
    chat_session.py  a conversation with the model, turn by turn, and many answered at once
    prompt.py        a typed prompt as token ids, and prompts as one left-padded batch

A kind's data side (*_data.py) is imported only where it is used, so that a program that
only asks a model (generate.py) loads no reader of files or datasets.

A job is resolved once, here: from a data config (`job_for`: what its source holds) or from
a run folder (`job_of`: what the run recorded). The trainer and every program then ask it
what differs between the kinds; none asks which kind it holds. A new kind of job is a new
class in this room, added to KINDS.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tokenizers import Tokenizer

from cli.program import UserError
from data.config import DataConfig
from runs.folder import RunDir

from .chat import ChatJob
from .job import Job, Scoring
from .preference import PreferenceJob
from .text import TextJob

if TYPE_CHECKING:
    from data.prepare import TokenFiles

KINDS: list[type[Job]] = [PreferenceJob, ChatJob, TextJob]  # asked in order which takes a source: a text takes any


def job_for(config: DataConfig) -> Job:
    """The job of a data config: the first kind that takes its source."""
    return next(job for kind in KINDS if (job := kind.takes(config)) is not None)


def job_of(run: RunDir) -> Job:
    """The job a run folder trained on, as it recorded it (summary.json's "job"; a run from before
    it recorded one: conversations where it kept a chat template, else a text)."""
    name = run.summary().get("job") or ("chat" if run.chat_template() is not None else "text")
    for kind in KINDS:
        if kind.name == name:
            return kind.of_run(run)
    raise UserError(f"{run.path} trained on a kind of job this version does not know ({name!r}); use the version "
                    "that trained it")


def prepare(config: DataConfig, progress: bool = True, tokenizer: Tokenizer | None = None,
            chat_template: str | None = None) -> "TokenFiles":
    """The token files of config's source, as its job's corpus (Job.prepare)."""
    return job_for(config).prepare(tokenizer, chat_template, progress)


__all__ = ["KINDS", "ChatJob", "Job", "PreferenceJob", "Scoring", "TextJob", "job_for", "job_of", "prepare"]
