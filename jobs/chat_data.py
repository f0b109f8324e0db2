"""What a chat job (jobs/chat.py) does with its data:

    ChatFormat        how conversations become token files (data/prepare.py's Format): each
                      rendered by the chat template, with the assistant's flags and where each starts
    ConversationData  its prepared corpus: the trainer's rows (packed or not), fixed rows to score
    prepare_mixture   several sources of one kind (conversations, pairs), each tokenized once, one
                      after the other
    scoring           evaluate.py's: the loss on the answers, and the last answer written by the model
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer
from tqdm import tqdm

from cli.program import UserError
from data.batches import (IGNORE, ConversationSampler, Conversations, answered, conversation_rows, fixed_conversations,
                          in_memory, longer_than)
from data.config import MIXTURE, DataConfig
from data.conversations import BadRecord, ChatSource, Record, Skipped, chat_source, what_is_said
from data.prepare import (META, SPLITS, TOKENIZER, TokenFiles, build, cache_folder, fingerprint_of, mask_file,
                          starts_file, token_folder, tokenizer_settings, write_conversations)
from data.shared import END, DataError, Piece
from data.template import DEFAULT_TEMPLATE, ChatTemplate, chat_tokenizer, encode, prompt_ids, template_for, turn_ends
from data.tokenizer import Unencodable, load_tokenizer, train_tokenizer
from data.tool_calls import compare_turn

from .chat_session import replies, run_template
from .job import Scoring

CHAT_FORMAT = 2  # conversations' token files: ids, the assistant's flags, where each starts; 2: the roles' order checked
DEFAULT = "default"  # evaluate.py --chat-template default: the template fine-tuning gives a model that has none


class ChatFormat:
    """Conversations' token files (data/prepare.py's Format): each rendered by the chat template
    (the one given, or data/template.py's default, whose markers the tokenizer gets as special
    tokens), with the assistant's flags and where each starts (write_conversations)."""

    kind = "chat"  # (meta.json's: the job's name, jobs/chat.py)

    def __init__(self, source: ChatSource, chat_template: str | None):
        self.source = source
        self.chat_template = chat_template  # a model's own (train.init_from); None: the default
        self.settings = template_settings(chat_template)  # (the fingerprint sees the template)
        self.template: ChatTemplate | None = None  # made for the tokenizer the files are written with

    @staticmethod
    def texts(records: Iterable[Record]) -> Iterator[Piece]:
        """What a tokenizer learns from: what the messages say, each a document."""
        return (piece for text in what_is_said(records) for piece in (text, END))

    def tokenizer_for(self, tokenizer: Tokenizer) -> Tokenizer:
        """The default template's markers added to a tokenizer that has no template of its own."""
        if self.chat_template is None:
            tokenizer = chat_tokenizer(tokenizer)
        self.template = template_for(tokenizer, self.chat_template, "the chat template of train.init_from"
                                     if self.chat_template else "the default chat template")
        return tokenizer

    def write_split(self, split: str, records: Iterable[Record], tokenizer: Tokenizer, folder: Path, dtype,
                    advance) -> dict:
        def sequences(record: Record, lost: Unencodable) -> list[tuple[np.ndarray, np.ndarray]]:
            """A conversation's one sequence: its ids and the assistant's flags (the template may refuse it)."""
            where, messages, tools = record
            try:
                return [encode(tokenizer, self.template, messages, tools, lost)]
            except DataError as e:
                raise BadRecord("that the chat template refused", f"{where}: {e}") from None

        return write_conversations(records, sequences, tokenizer, folder, split, dtype, self.source.skipped)

    def check(self, sizes: dict[str, dict]) -> None:
        """The bad records, those the template refused included, past data.skip_bad_records refuse
        the source (the run says what was skipped: training/preparation.py)."""
        self.source.skipped.check(self.source.label)

    def meta(self) -> dict:
        skipped = self.source.skipped
        return {"chat_template": self.template.source, **({"skipped": skipped.report()} if skipped.count else {})}


def template_settings(chat_template: str | None) -> dict:
    """What the fingerprint of conversations' token files sees of the template that renders them."""
    return {"chat_format": CHAT_FORMAT,
            "chat_template": hashlib.sha256((chat_template or DEFAULT_TEMPLATE).encode()).hexdigest()}


@dataclass
class ConversationData(TokenFiles):
    """Conversations' token files: besides the tokens, each split's Conversations (the ids, the
    assistant's flags, where each starts) and, for a mixture (data.sources), each source's
    training conversations with its weight."""

    conversations: dict[str, Conversations] | None = None
    weights: list[tuple[np.ndarray, float]] | None = None

    @classmethod
    def read(cls, directory: Path, built: bool = False, **more) -> ConversationData:
        data = super().read(directory, built, **more)
        data.conversations = {split: Conversations(tokens, np.memmap(directory / mask_file(split), dtype=np.uint8,
                                                                     mode="r"), np.load(directory / starts_file(split)))
                              for split, tokens in (("train", data.train), ("val", data.val))}
        return data

    def items(self, split: str) -> int:
        """How many conversations a split holds (what a sampler draws, and a mixture weighs)."""
        return len(self.conversations[split])

    def sampler(self, block_size: int, batch_size: int, seed: int, rank: int = 0, world_size: int = 1,
                pack: bool = False) -> ConversationSampler:
        """Epochs of the training conversations, packed several a row with `pack`, a mixture's
        sources weighted."""
        return ConversationSampler(self.conversations["train"], block_size, batch_size, seed, rank, world_size, pack,
                                   self.weights)

    def evaluation_rows(self, split: str, block_size: int, count: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The same `count` conversations of a split at every evaluation (all of them, if fewer)."""
        return fixed_conversations(self.conversations[split], block_size, count, seed, split)

    def check_fits(self, block_size: int, too_long: str = "cut", say: bool = True) -> None:
        """Conversations longer than the context: counted, then cut at the end (said, with
        those cut before any answer, which are left out) or refused (too_long: data.chat_too_long)."""
        counts = {split: (longer_than(rows, block_size), len(rows), len(rows) - len(answered(rows, block_size)))
                  for split, rows in self.conversations.items()}
        longer = " and ".join(f"{n:,} of {total:,} {split}" for split, (n, total, _) in counts.items() if n)
        if not longer:
            return
        if too_long == "refuse":
            raise DataError(f"{longer} conversations are longer than the context ({block_size + 1} tokens with the "
                            "last target); shorten them, raise model.block_size, or set data.chat_too_long=cut")
        dropped = sum(empty for _, _, empty in counts.values())
        if say:
            print(f"note: {longer} conversations are longer than the context ({block_size + 1} tokens with the last "
                  f"target): each is cut at its end (data.chat_too_long=cut)"
                  + (f"; {dropped:,} keep no answer and are left out" if dropped else ""))

    def bad_records(self) -> str | None:
        """The bad conversations skipped when the token files were made (data.skip_bad_records),
        in words: how many of how many, by reason, the first named (None: none)."""
        if "skipped" not in self.meta:
            return None
        skipped = Skipped.added([self.meta["skipped"]])
        return (f"{skipped.count:,} of {skipped.seen:,} conversations are bad and left out (data.skip_bad_records="
                f"{skipped.allowed:g}): {skipped.said()}")

    def loss_figures(self, loss: float) -> tuple[dict[str, float], str]:
        """The loss is on the assistant's tokens alone, not on a text: no bits per character."""
        return {}, "nats an answer token"

    def suggested_prompt(self, sample_prompt: str) -> str | None:
        """None: a model of conversations is tried with generate.py --chat, in its template."""
        return None


def conversation_format(part: DataConfig, chat_template: str | None) -> ChatFormat:
    """A mixture's source of conversations (prepare_mixture's format_of), or a one-line refusal."""
    src = chat_source(part)
    if src is None:
        raise DataError(f"data.sources mixes conversations; {part.source!r} is not conversations (a \"messages\" "
                        "column, or \"prompt\" and \"response\"): train on a text alone with data.source")
    return ChatFormat(src, chat_template)


def prepare_mixture(config: DataConfig, progress: bool, tokenizer: Tokenizer | None, format_of,
                    data_class: type[ConversationData] = ConversationData) -> ConversationData:
    """A mixture of sources of one kind (data.sources): format_of(part) is each source's Format
    (conversation_format, or the preference job's), refusing a source of another kind; each is
    tokenized once into token files of its own (as it would be alone, with one tokenizer: the
    one given, or one trained on all of their training records), then put one after the other
    as one data_class; `weights` says which training items (conversations, pairs) are each
    source's, and its weight. The mixture's folder holds the trained tokenizer and a meta.json
    of the whole: the parts' folders and fingerprints, the counts added up."""
    parts = config.parts()
    forms = [format_of(part) for part, _ in parts]
    for (part, _), form in zip(parts[1:], forms[1:]):
        if form.settings != forms[0].settings:
            raise DataError(f"data.sources: {part.source!r} is written otherwise than {parts[0][0].source!r} (pairs "
                            "of messages beside pairs of plain text); give a mixture sources written alike")
    settings = tokenizer_settings(config, tokenizer) | forms[0].settings
    folder_key = fingerprint_of({"sources": [form.source.identity for form in forms], "settings": settings})
    directory = cache_folder(config, f"{MIXTURE}-{settings['tokenizer']}-{folder_key}")
    if tokenizer is None:  # one tokenizer for all, trained once on what every source's records say
        records = (record for form in forms for record in form.source.train())
        build(directory / TOKENIZER, lambda tmp: train_tokenizer(config.tokenizer, forms[0].texts(records),
                                                                 config.vocab_size).save(str(tmp)))
        tokenizer = load_tokenizer(directory / TOKENIZER)
    datas = [data_class.read(*token_folder(part, form, tokenizer, progress)) for (part, _), form in zip(parts, forms)]
    starts = np.cumsum([0] + [data.items("train") for data in datas])
    weights = [(np.arange(starts[i], starts[i + 1]), weight) for i, (_, weight) in enumerate(parts)]
    conversations = {split: joined([data.conversations[split] for data in datas]) for split in SPLITS}
    counts = {key: sum(data.meta[key] for data in datas) for key in datas[0].meta
              if key.startswith(("train_", "val_")) and not key.endswith("_unencodable")
              and all(key in data.meta for data in datas)}
    for split in SPLITS:  # (each character the tokenizer cannot write: its times in every part, added up)
        counts[f"{split}_unencodable"] = dict(sum((Counter(data.meta.get(f"{split}_unencodable", {})) for data in datas),
                                                  Counter()))
    folders = [{"source": part.source, "directory": str(data.directory), "fingerprint": data.meta["fingerprint"],
                **({"val_split": data.meta["val_split"]} if "val_split" in data.meta else {})}
               for data, (part, _) in zip(datas, parts)]
    skipped = [data.meta["skipped"] for data in datas if "skipped" in data.meta]
    meta = {**datas[0].meta, **counts, "fingerprint": fingerprint_of([data.meta["fingerprint"] for data in datas]),
            "source": {"source": MIXTURE}, "parts": folders}
    for own in ("skipped", "val_split"):  # (each part's; the parts' folders keep them)
        meta.pop(own, None)
    if skipped:  # (the parts' bad records, added up)
        meta["skipped"] = Skipped.added(skipped).report()
    build(directory / META, lambda tmp: tmp.write_text(json.dumps(meta, indent=2) + "\n"))
    # the weights (how often each source's conversations come) are the run's, not the folder's
    weighted = {**meta, "fingerprint": fingerprint_of([[data.meta["fingerprint"], weight]
                                                        for data, (_, weight) in zip(datas, parts)]),
                "parts": [folder | {"weight": weight} for folder, (_, weight) in zip(folders, parts)]}
    return data_class(directory, datas[0].tokenizer, conversations["train"].tokens, conversations["val"].tokens,
                      weighted, built=any(data.built for data in datas), conversations=conversations, weights=weights)


def joined(parts: list[Conversations]) -> Conversations:
    """Conversations one after the other, as one split (read into memory)."""
    offsets = np.cumsum([0] + [len(part.tokens) for part in parts])
    starts = np.concatenate([parts[0].starts[:1]] + [part.starts[1:] + offset for part, offset in zip(parts, offsets)])
    return Conversations(np.concatenate([part.tokens for part in parts]), np.concatenate([part.mask for part in parts]),
                         starts.astype(np.int64))


# ---- scoring conversations (evaluate.py) -----------------------------------------------------------


def chosen_template(scoring: Scoring, tokenizer: Tokenizer) -> ChatTemplate:
    """--chat-template's (a file, or `default`: the template fine-tuning gives a model that has
    none), else the model's own, else a one-line refusal."""
    if scoring.chat_template == DEFAULT:
        return template_for(chat_tokenizer(tokenizer))
    if scoring.chat_template is not None:  # (another template, or one for a model that has none)
        return template_for(tokenizer, read_template(Path(scoring.chat_template)),
                            f"--chat-template {scoring.chat_template}")
    return run_template(scoring.checkpoint, tokenizer, scoring.own_template, otherwise=f"conversations are scored "
                        f"with --chat-template {DEFAULT} (the template fine-tuning gives it) or --chat-template FILE")


def read_template(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"--chat-template {path} cannot be read ({e}); give a UTF-8 Jinja file") from None


def last_answer(tokenizer, template: ChatTemplate, messages: list[dict], tools: list[dict] | None) -> tuple[int, list[int]]:
    """(the index of a conversation's last assistant message, its tokens as the model is taught
    to write them): the template's text for that turn (its content and its calls), up to its
    end-of-turn token, which is left out as a reply leaves it out."""
    last = max(i for i, message in enumerate(messages) if message["role"] == "assistant")
    ids, mask = encode(tokenizer, template, messages[:last + 1], tools)
    flagged = np.flatnonzero(mask)
    first = flagged[-1]
    while first > 0 and mask[first - 1]:  # (back to the start of the last run of the assistant's tokens)
        first -= 1
    answer = ids[first:flagged[-1] + 1].tolist()
    return last, answer[:-1] if answer and answer[-1] in turn_ends(tokenizer) else answer


def answer_cap(expected: list[list[int]], block_size: int) -> int:
    """--max-new-tokens' default: twice the longest expected answer with its end-of-turn token
    (at least 16 tokens, at most the context), so that a model that never ends its turn (a base
    before fine-tuning) is cut where no right answer could still be coming."""
    return min(block_size, max(16, 2 * (max(map(len, expected), default=0) + 1)))


@torch.no_grad()
def score_conversations(model, tokenizer, template: ChatTemplate,
                        conversations: list[tuple[list[dict], list[dict] | None]], batch_size: int, device,
                        max_new_tokens: int | None = None) -> dict:
    """The loss over the assistant's tokens (each conversation cut to block_size + 1 tokens,
    as training cuts it), and each conversation's last answer written by the model (greedy, to
    its end-of-turn token or max_new_tokens, default answer_cap) against the one expected,
    both as the template writes the turn: its text and its tool calls (data/tool_calls.py).
    conversations: (messages, the tools they may call) each. The characters of the rendered
    conversations the tokenizer cannot write are counted (an answer that holds one cannot match)."""
    block = model.config.block_size
    lost = Unencodable(tokenizer)
    rows = in_memory([encode(tokenizer, template, messages, tools, lost) for messages, tools in conversations])
    nll, scored = 0.0, 0
    for start in range(0, len(rows), batch_size):
        x, y, _ = conversation_rows(rows, range(start, min(start + batch_size, len(rows))), block)
        logits, _ = model(x.to(device))
        y = y.to(device)
        nll += model.loss(logits, y, reduction="sum").item()
        scored += int((y != IGNORE).sum())
    lasts = [last_answer(tokenizer, template, messages, tools) for messages, tools in conversations]
    cap = max_new_tokens or answer_cap([expected for _, expected in lasts], block)
    answers = []
    progress = tqdm(total=len(conversations), unit="answer", desc="answers", file=sys.stderr, leave=False)
    for start in range(0, len(conversations), batch_size):  # the last answers, written batch_size at a time
        batch = list(zip(conversations[start:start + batch_size], lasts[start:start + batch_size]))
        prompts = [prompt_ids(tokenizer, template, messages[:last], tools)[-block:]
                   for (messages, tools), (last, _) in batch]
        for written, ((messages, tools), (last, expected)) in zip(replies(model, prompts, turn_ends(tokenizer), cap),
                                                                  batch):
            got, wanted = tokenizer.decode(written), tokenizer.decode(expected)
            answers.append({"prompt": messages[:last], **({"tools": tools} if tools else {}), "expected": wanted,
                            "got": got, **compare_turn(wanted, got, messages[last].get("tool_calls")),
                            "at_the_cap": len(written) >= cap})
        progress.update(len(batch))
    progress.close()
    return {"loss": nll / max(scored, 1), "answer_tokens": scored, "conversations": len(conversations),
            "exact_match": sum(a["right"] for a in answers) / len(conversations), "answers": answers,
            "max_new_tokens": cap, "at_the_cap": sum(a["at_the_cap"] for a in answers),
            "unencodable": lost.lost, "characters": lost.characters, **answer_kinds(answers)}


def answer_kinds(answers: list[dict]) -> dict:
    """The scores of text answers and of answers that call tools, apart: how many, how many right,
    and for the calls the share with the right names, arguments and text around them."""
    def share(items: list[dict], right) -> float | None:
        return sum(1 for item in items if right(item)) / len(items) if items else None

    text = [a for a in answers if a["kind"] == "text"]
    calls = [a for a in answers if a["kind"] == "tool_call"]
    return {"text_answers": {"count": len(text), "exact_match": share(text, lambda a: a["right"])},
            "tool_call_answers": {"count": len(calls), "exact_match": share(calls, lambda a: a["right"]),
                                  **{key: share(calls, lambda a, key=key: a["calls"][key])
                                     for key in ("name_right", "arguments_right", "text_right")},
                                  "template_writes_json": all(a["calls"]["template_writes_json"] for a in calls)}}
