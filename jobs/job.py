"""What every kind of job answers: the questions the trainer and the programs ask, each
kind in its own way (jobs/text.py, jobs/chat.py), so that none of them asks which kind it
holds. A job is what a run trains on and how its model is asked and scored; its prepared
corpus (a TokenFiles of its own kind) answers what the training loop asks of the data."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ClassVar

from tokenizers import Tokenizer

from cli.program import UserError
from data.config import DataConfig
from runs.folder import RunDir

if TYPE_CHECKING:  # (what a job hands over, or is handed: none of it is needed to make one)
    import torch

    from data.prepare import TokenFiles
    from model import GPT

    from .chat_session import Chat


@dataclass(frozen=True)
class Scoring:
    """What evaluate.py is asked to score, and how: its options, as each kind of job reads them."""

    checkpoint: Path  # the run folder (or a transformers model folder) scored
    text: Path | None  # --text FILE; None: the run's own validation split (--split val)
    batch_size: int
    device: Any  # torch.device
    threads: Any = None  # machine/threads.py's AdaptiveThreads: the thread count that scores faster now
    stride: int | None = None  # a text's windows move by this
    answers: Path | None = None  # conversations: each last answer is kept in this file
    chat_template: str | None = None  # conversations: --chat-template (a file, or "default")
    max_new_tokens: int | None = None  # conversations: the longest answer written
    own_template: str | None = None  # the scored model's own chat template, where it has one
    reference: Path | None = None  # preference pairs: --reference, the model the rewards are measured from
    open_model: Any = None  # (path, device) -> (model, tokenizer, own template): how evaluate.py opens a model

    # each option a kind of job may take, and what it is for (said where it is given to another kind)
    OPTIONS = {"stride": ("--stride", "for a text's windows"),
               "answers": ("--answers", "for conversations (a .jsonl of them, or a chat run's --split val)"),
               "chat_template": ("--chat-template", "for conversations (a .jsonl of them, or a chat run's --split val)"),
               "max_new_tokens": ("--max-new-tokens", "for conversations (a .jsonl of them, or a chat run's --split "
                                                      "val)"),
               "reference": ("--reference", "for preference pairs (a .jsonl of them, or a preference run's --split "
                                            "val)")}

    def refuse_all_but(self, *taken: str, kind: str) -> None:
        """A one-line refusal of each option given that this kind of job does not take."""
        for name, (option, purpose) in self.OPTIONS.items():
            if name not in taken and getattr(self, name) is not None:
                raise UserError(f"{option} is {purpose}; {self.text or 'the validation split'} is {kind}")


class Job(ABC):
    """One kind of job. Resolved once (jobs/__init__.py: `job_for` a data config, `job_of` a
    run folder), then asked; a new kind is a new subclass, added to jobs.KINDS."""

    name: ClassVar[str]  # what a run folder records (summary.json's "job") and meta.json's "kind"

    # ---- resolving -----------------------------------------------------------------------

    @classmethod
    @abstractmethod
    def takes(cls, config: DataConfig) -> "Job | None":
        """This kind of job on config's source, if the source holds its kind of records (None: not)."""

    @classmethod
    @abstractmethod
    def of_run(cls, run: RunDir) -> "Job":
        """This kind of job as a run folder that trained on it recorded it (its files beside the model)."""

    # ---- training --------------------------------------------------------------------------

    @abstractmethod
    def prepare(self, tokenizer: Tokenizer | None = None, chat_template: str | None = None,
                progress: bool = True) -> "TokenFiles":
        """The source's token files (made once, found after: data/prepare.py), as this kind's
        corpus: its sampler, its evaluation rows, its figures. tokenizer, chat_template: a model
        brought in's own (train.init_from), else one trained here and the default template."""

    @abstractmethod
    def save_beside(self, run: RunDir, data: "TokenFiles") -> None:
        """The files a run on this job keeps beside its model from its start (a chat template)."""

    @abstractmethod
    def try_it(self, out_dir: Path, prompt: str | None) -> str:
        """The command a finished run suggests to try its model with."""

    def objective(self, run, model: "GPT", reference: Callable[[], Any], dtype: "torch.dtype", say: bool):
        """What training lowers, called on each micro-batch (jobs/objective.py): here each next
        token's cross-entropy. run: training/preparation.py's PreparedRun (its config, its data);
        model: the model that trains, holding the weights training starts from; reference: () ->
        those weights, for a kind that measures against them (jobs/dpo.py); dtype: the run's
        autocast; say: whether this process prints what it does."""
        from .objective import NextToken

        return NextToken()

    # ---- the programs ------------------------------------------------------------------------

    @abstractmethod
    def chat_session(self, model: "GPT", tokenizer: Tokenizer, checkpoint: Path, **settings) -> "Chat":
        """generate.py --chat's conversation (jobs/chat_session.py's Chat), or a one-line refusal."""

    @abstractmethod
    def card(self, out: Path, summary: dict) -> dict[str, str]:
        """What export.py's model card says of the job: {"example": the code that asks the model,
        "measured": the validation loss in its unit}."""

    @abstractmethod
    def check_options(self, scoring: Scoring) -> None:
        """A one-line refusal of an evaluate.py option this kind of job does not take."""

    @abstractmethod
    def evaluate(self, model: "GPT", tokenizer: Tokenizer, scoring: Scoring) -> dict:
        """evaluate.py's scores of the model on what `scoring` names, by this kind's rule."""

    @abstractmethod
    def report(self, result: dict, what: str) -> tuple[dict, list[str]]:
        """evaluate.py's output of a result: (what --json prints, the lines it prints otherwise)."""

    @abstractmethod
    def tokenizer_settings(self) -> dict[str, str]:
        """What an export declares beside the tokenizer (tokenizer_config.json's keys, GGUF's
        tokenizer.* keys): a chat template, or nothing."""
