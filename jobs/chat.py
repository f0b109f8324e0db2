"""Conversations: the job of fine-tuning a model to answer (one source of them, or a mixture
of sources, data.sources). ChatJob is the kind; what it does with the data (its token files,
its corpus, its scores) is jobs/chat_data.py's, imported where it is used, so that a program
that only talks with a model (generate.py --chat) loads no reader of files or datasets."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from tokenizers import Tokenizer

from cli.program import UserError
from data.config import DataConfig
from data.template import template_for
from data.tokenizer import lost_characters
from runs.folder import RunDir
from storage.atomic import write_atomic

from .job import Job, Scoring


class ChatJob(Job):
    """Conversations (data/conversations.py's sources: .jsonl, Parquet, hf: datasets; or a mixture
    of them, data.sources), rendered by a chat template (data/template.py)."""

    name = "chat"

    def __init__(self, config: DataConfig | None = None, source=None,
                 template: str | None = None):
        self.config = config
        self.source = source  # data/conversations.py's ChatSource (a mixture's are its parts': None here)
        self.template = template  # a run folder's template (None: a job on a data config, before preparing)

    @classmethod
    def takes(cls, config: DataConfig) -> ChatJob | None:
        """A mixture (data.sources: conversations, always), or a source whose records are conversations."""
        from data.conversations import chat_source

        if config.sources is not None:
            return cls(config)
        source = chat_source(config)
        return cls(config, source) if source is not None else None

    @classmethod
    def of_run(cls, run: RunDir) -> ChatJob:
        template = run.chat_template()
        if template is None:
            raise UserError(f"{run.path} says it trained on conversations but has no {RunDir.CHAT_TEMPLATE}; "
                            "copy the run directory again")
        return cls(template=template)

    # ---- training --------------------------------------------------------------------------

    def prepare(self, tokenizer: Tokenizer | None = None, chat_template: str | None = None,
                progress: bool = True):
        """The conversations rendered by chat_template (a model's own, train.init_from's), or the
        default template, whose markers the tokenizer then gets as special tokens."""
        from data.prepare import token_folder

        from .chat_data import ChatFormat, ConversationData, conversation_format, prepare_mixture

        if self.config.sources is not None:
            return prepare_mixture(self.config, progress, tokenizer,
                                   lambda part: conversation_format(part, chat_template))
        directory, built = token_folder(self.config, ChatFormat(self.source, chat_template), tokenizer, progress)
        return ConversationData.read(directory, built)

    def save_beside(self, run: RunDir, data) -> None:
        """The template that renders the conversations: generate.py --chat and evaluate.py read it."""
        run.save_chat_template(data.meta["chat_template"])

    def try_it(self, out_dir: Path, prompt: str | None) -> str:
        return f"try it: python generate.py --checkpoint {out_dir} --chat"

    # ---- the programs ------------------------------------------------------------------------

    def chat_session(self, model, tokenizer: Tokenizer, checkpoint: Path, **settings):
        from .chat_session import Chat  # (a conversation turn by turn, with the KV cache: generate.py --chat)

        return Chat(model, tokenizer, template_for(tokenizer, self.template, f"the chat template of {checkpoint}"),
                    **settings)

    def card(self, out: Path, summary: dict) -> dict[str, str]:
        return {"example": f"from transformers import pipeline\nchat = pipeline(\"text-generation\", model="
                           f"{str(out)!r})\nprint(chat([{{\"role\": \"user\", \"content\": \"...\"}}], "
                           "max_new_tokens=100)[0][\"generated_text\"][-1])",
                "unit": "nats per answer token (the loss is on the assistant's turns alone)"}

    def tokenizer_settings(self) -> dict[str, str]:
        return {"chat_template": self.template}

    # ---- evaluate.py ----------------------------------------------------------------------------

    def check_options(self, scoring: Scoring) -> None:
        scoring.refuse_all_but("answers", "chat_template", "max_new_tokens", kind="conversations")
        if scoring.answers is not None and scoring.answers.exists():  # (never over a file)
            raise UserError(f"--answers {scoring.answers} already exists; choose another file name")

    def evaluate(self, model, tokenizer: Tokenizer, scoring: Scoring) -> dict:
        """The loss over the assistant's tokens, and each conversation's last answer written by the
        model and compared with the one expected (score_conversations); --answers keeps them."""
        from .chat_data import chosen_template, score_conversations

        template = chosen_template(scoring, tokenizer)
        result = score_conversations(model, tokenizer, template, self.held_out(scoring.text is not None),
                                     scoring.batch_size, scoring.device, scoring.max_new_tokens)
        if scoring.answers is not None:
            lines = "".join(json.dumps(answer, ensure_ascii=False) + "\n" for answer in result["answers"])
            write_atomic(scoring.answers, lines.encode())
        return {**result, "perplexity": math.exp(min(result["loss"], 50))}

    def held_out(self, whole: bool) -> list[tuple[list[dict], list[dict] | None]]:
        """The conversations to score, each (messages, the tools they may call): all of a file
        (whole), or a run's validation conversations (a mixture's every source's); the bad records
        among them skipped by the rule training skips them by (data.skip_bad_records), and said."""
        from data.conversations import chat_source

        parts = [part for part, _ in self.config.parts()] if self.config.sources is not None else [self.config]
        held_out = []
        for part in parts:
            source = self.source if part is self.config else chat_source(part)
            if source is None:
                raise UserError(f"{part.source} holds no conversations (a \"messages\" column, or \"prompt\" and "
                                "\"response\"), though the run's other sources do")
            held_out += [(messages, tools) for _, messages, tools in (source.everything() if whole else source.val())]
            if source.skipped.count:
                print(f"note: {source.skipped.count:,} of {source.skipped.seen:,} conversations of {source.label} are "
                      f"bad and skipped: {source.skipped.said()}", file=sys.stderr)
        return held_out

    def report(self, r: dict, what: str) -> tuple[dict, list[str]]:
        figures = {k: r[k] for k in ("loss", "perplexity", "answer_tokens", "conversations", "exact_match",
                                     "text_answers", "tool_call_answers", "max_new_tokens", "at_the_cap", "unencodable")}
        return figures, [f"{what}: {r['conversations']:,} conversations, {r['answer_tokens']:,} answer tokens scored "
                         f"in {r['seconds']:.1f} s",
                         f"loss {r['loss']:.4f} nats/answer token | perplexity {r['perplexity']:.3f} | exact match of "
                         f"the last answer {r['exact_match']:.1%}", *answer_lines(r)]


def answer_lines(r: dict) -> list[str]:
    """The last answers by kind (text, tool calls), how many the cap on their length cut, and
    the characters the tokenizer cannot write (then those, not the template, spoil the calls' JSON)."""
    text, calls = r["text_answers"], r["tool_call_answers"]
    lines = []
    if r["unencodable"]:
        lines.append(f"note: in these conversations the tokenizer finds {lost_characters(r['unencodable'], r['characters'])}"
                     "; an answer that holds them cannot match, and a call without them may not be JSON")
    if calls["count"] and text["count"]:
        lines.append(f"text answers: {text['count']:,}, exact match {text['exact_match']:.1%}")
    if calls["count"]:
        lines.append(f"answers that call tools: {calls['count']:,}, exact match {calls['exact_match']:.1%} | the "
                     f"right tool {calls['name_right']:.1%} | the right arguments (as JSON) {calls['arguments_right']:.1%}"
                     f" | the right text around the calls {calls['text_right']:.1%}")
        if not calls["template_writes_json"] and not r["unencodable"]:
            lines.append("note: the chat template writes some calls in a form other than JSON; those calls are "
                         "compared as text only (data/tool_calls.py)")
    cut = r["at_the_cap"]
    lines.append(f"answers written up to {r['max_new_tokens']:,} tokens (--max-new-tokens): "
                 + (f"{cut:,} of {r['conversations']:,} reached it without ending their turn" if cut
                    else "every answer ended its turn before it"))
    return lines
