"""Preference pairs: the job of tuning a model on two answers to each prompt, one preferred
(data/preferences.py: trl's layouts), by DPO (jobs/dpo.py), after fine-tuning on
conversations. PreferenceJob is the kind; what it does with the data (its token files, its
corpus, its scores) is jobs/preference_data.py's, imported where it is used. A model tuned on
conversational pairs is asked as a chat model is (its chat template), one tuned on plain-text
pairs as a text's is."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from tokenizers import Tokenizer

from cli.program import UserError
from data.config import DataConfig
from data.shared import DataError
from runs.folder import RunDir

from .chat import ChatJob
from .job import Job, Scoring
from .text import TextJob


class PreferenceJob(Job):
    """Preference pairs from .jsonl, Parquet or an hf: dataset, tuned from a model brought in
    (train.init_from), its chat template rendering conversational pairs."""

    name = "preference"

    def __init__(self, config: DataConfig | None = None, source=None, template: str | None = None):
        self.config = config
        self.source = source  # data/conversations.py's ChatSource of (where, Pair) records
        self.template = template  # a run folder's template (None: plain-text pairs, or a job not read back)

    @classmethod
    def takes(cls, config: DataConfig) -> PreferenceJob | None:
        """A source whose records are pairs ("chosen" and "rejected"), or a mixture (data.sources)
        whose first source's are."""
        from data.preferences import preference_source

        if config.sources is not None:
            return cls(config) if preference_source(config.parts()[0][0]) is not None else None
        source = preference_source(config)
        return cls(config, source) if source is not None else None

    def sources(self) -> list:
        """The source of pairs, or a mixture's every source."""
        return [self.source] if self.config.sources is None else [pairs_in(part) for part, _ in self.config.parts()]

    @classmethod
    def of_run(cls, run: RunDir) -> PreferenceJob:
        return cls(config=run.data_config(), template=run.chat_template())

    def answers(self) -> Job:
        """How the tuned model is asked and exported: as a chat model (conversational pairs, a
        chat template) or as a text's."""
        return ChatJob(template=self.template) if self.template is not None else TextJob()

    # ---- training --------------------------------------------------------------------------

    def prepare(self, tokenizer: Tokenizer | None = None, chat_template: str | None = None,
                progress: bool = True):
        """The pairs' token files, with the tokenizer of the model brought in (its chat template,
        or the default's, for conversational pairs)."""
        from data.prepare import token_folder

        from .chat_data import prepare_mixture
        from .preference_data import PreferenceData, PreferenceFormat

        if tokenizer is None:
            raise UserError("preference tuning (DPO) tunes a model brought in, measured against where it starts: set "
                            "train.init_from to it (a run folder, e.g. one fine-tuned on conversations, or a "
                            "transformers model)")

        def format_of(source) -> PreferenceFormat:
            """Its pairs' token files: messages (rendered by the template) or texts, as its first pair's."""
            first = next(source.train(), None)
            return PreferenceFormat(source, chat_template, first is not None and first[1].conversational)

        if self.config.sources is not None:
            data = prepare_mixture(self.config, progress, tokenizer, lambda part: format_of(pairs_in(part)),
                                   PreferenceData)
        else:
            data = PreferenceData.read(*token_folder(self.config, format_of(self.source), tokenizer, progress))
        self.template = data.meta["chat_template"]
        return data

    def save_beside(self, run: RunDir, data) -> None:
        """The template that renders conversational pairs (generate.py --chat reads it)."""
        if data.meta["chat_template"] is not None:
            run.save_chat_template(data.meta["chat_template"])

    def try_it(self, out_dir: Path, prompt: str | None) -> str:
        return self.answers().try_it(out_dir, prompt)

    def objective(self, run, model, reference, dtype, say):
        """DPO (jobs/dpo.py, the run's dpo: section) against the weights training started from:
        the reference run beside the model at each step, or, with dpo.precompute, run over every
        pair once, here, and let go."""
        from .dpo import DPO, reference_table

        settings = run.config.dpo
        if not settings.precompute:
            return DPO(settings, model, reference())
        started = time.perf_counter()
        scorer = reference()
        tables = {split: reference_table(scorer, model, pairs, run.model_config.block_size, run.config.train.batch_size,
                                         dtype) for split, pairs in run.data.conversations.items()}
        if say:
            counts = " and ".join(f"{int(table[:, 0].isfinite().sum()):,} {split}" for split, table in tables.items())
            print(f"the reference's log-probabilities of {counts} pairs computed once in "
                  f"{time.perf_counter() - started:.1f} s (dpo.precompute)")
        return DPO(settings, model, tables=tables)

    # ---- the programs ------------------------------------------------------------------------

    def chat_session(self, model, tokenizer: Tokenizer, checkpoint: Path, **settings):
        return self.answers().chat_session(model, tokenizer, checkpoint, **settings)

    def card(self, out: Path, summary: dict) -> dict[str, str]:
        return {**self.answers().card(out, summary), "unit": "DPO's loss a pair (dpo: in the run's config)"}

    def tokenizer_settings(self) -> dict[str, str]:
        return self.answers().tokenizer_settings()

    # ---- evaluate.py ----------------------------------------------------------------------------

    def check_options(self, scoring: Scoring) -> None:
        scoring.refuse_all_but("chat_template", "reference", kind="preference pairs")

    def evaluate(self, model, tokenizer: Tokenizer, scoring: Scoring) -> dict:
        """Each held-out pair's answers scored by the model and by the reference (--reference,
        else the run's train.init_from): the share whose chosen answer gets the higher implicit
        reward, and the mean margin (jobs/preference_data.py's score_pairs)."""
        from .chat_data import chosen_template
        from .preference_data import pairs_of, score_pairs

        pairs = pairs_of(self.sources(), whole=scoring.text is not None)
        template = chosen_template(scoring, tokenizer) if pairs and pairs[0].conversational else None
        reference, beta = self.reference_of(scoring)
        result = score_pairs(model, reference, tokenizer, template, pairs, beta, scoring.batch_size, scoring.device)
        if result["pairs"] == 0:
            raise UserError(f"{scoring.text or 'the validation split'} holds no pair that fits the model's context")
        return {**result, "beta": beta}

    def reference_of(self, scoring: Scoring) -> tuple:
        """(the reference model, β): --reference, else the train.init_from of the run scored (its
        dpo.beta, else trl's 0.1); (None, 1.0) where there is neither: the model's own
        log-probabilities are compared."""
        settings = RunDir(scoring.checkpoint).run_config() if scoring.checkpoint.is_dir() else {}
        beta = (settings.get("dpo") or {}).get("beta", 0.1)
        path = scoring.reference or (settings.get("train") or {}).get("init_from")
        if path is None:
            print("note: no reference (--reference, or the run's train.init_from): the pairs are ranked by the "
                  "model's own log-probabilities", file=sys.stderr)
            return None, 1.0
        reference, _, _ = scoring.open_model(Path(path), scoring.device)
        return reference.eval(), beta

    def report(self, r: dict, what: str) -> tuple[dict, list[str]]:
        figures = {k: r[k] for k in ("pairs", "left_out", "ranked_right", "margin", "chosen_reward", "rejected_reward",
                                     "against", "beta")}
        against = f"against the reference, β = {r['beta']:g}" if r["against"] == "reference" else \
            "the model's own log-probabilities (no reference)"
        return figures, [f"{what}: {r['pairs']:,} pairs scored in {r['seconds']:.1f} s"
                         + (f" ({r['left_out']:,} left out: a side longer than the context)" if r["left_out"] else ""),
                         f"chosen ranked first {r['ranked_right']:.1%} | mean margin {r['margin']:.4f} | reward of the "
                         f"chosen {r['chosen_reward']:.4f}, of the rejected {r['rejected_reward']:.4f} ({against})"]


def pairs_in(part: DataConfig):
    """A mixture's source of pairs (data/conversations.py's ChatSource), or a one-line refusal."""
    from data.preferences import preference_source

    source = preference_source(part)
    if source is None:
        raise DataError(f"data.sources mixes preference pairs; {part.source!r} holds none (\"chosen\" and \"rejected\" "
                        "answers): give a mixture sources of one kind")
    return source
