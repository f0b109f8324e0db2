"""Talking with a model fine-tuned on conversations, the one way generate.py --chat and
evaluate.py both do it: the run's chat template (data/template.py renders it in Jinja's
sandbox), and replies written until the end of the assistant's turn, either one
conversation at a time with the KV cache kept across turns (Chat) or many conversations
at once, greedily (replies).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import torch

from cli.program import UserError
from data.template import ChatTemplate, prompt_ids, template_for, turn_ends
from data.tool_calls import assistant_turn
from model import GPT, Sampling
from model.attention import KVCache
from model.sampling import sample_next
from runs.folder import RunDir

from .prompt import left_padded


def run_template(checkpoint: Path, tokenizer, source: str | None = None, otherwise: str | None = None) -> ChatTemplate:
    """The chat template a model was fine-tuned with (its run folder's chat_template.jinja, or
    `source`: the template of a transformers folder), or a one-line refusal for a model of
    plain text, which says what to do `otherwise`."""
    source = source if source is not None else RunDir(checkpoint).chat_template()
    if source is None:
        otherwise = otherwise or "chat and conversation scores need a model fine-tuned on conversations (docs/usage.md)"
        raise UserError(f"{checkpoint} has no chat template: it was trained on plain text; {otherwise}")
    return template_for(tokenizer, source, f"the chat template of {checkpoint}")


@torch.no_grad()
def replies(model: GPT, prompts: list[list[int]], ends: set[int], max_new_tokens: int) -> list[list[int]]:
    """Each prompt's greedy reply up to (not including) its first end-of-turn token `ends`,
    at most max_new_tokens: the prompts run together as one left-padded batch with the KV
    cache, and the batch stops when every reply has ended."""
    device = next(model.parameters()).device
    idx, mask = left_padded(prompts, device)
    written: list[list[int]] = [[] for _ in prompts]
    done = [False] * len(prompts)
    for token in model.generate_tokens(idx, max_new_tokens, Sampling(temperature=0), attention_mask=mask):
        for row, t in enumerate(token.tolist()):
            if done[row]:
                continue
            if t in ends:
                done[row] = True
            else:
                written[row].append(t)
        if all(done):
            break
    return written


class Chat:
    """A conversation with the model, turn by turn: the run's template applied to the
    messages so far (with the tools the model may call), the KV cache kept across turns (each
    turn runs only the tokens the cache does not hold), the reply ended by the end-of-turn
    token. A reply that calls tools (data/tool_calls.py) waits for their results
    (`tool_result`), then the model answers them. When the conversation outgrows the context,
    its oldest exchanges are dropped (a system message stays) and `note` says so; the cache then
    starts again. `system`: the system message it starts with.

    The room kept for a reply is max_new_tokens, at most half the context; `fit_reply` (a
    reply's length not chosen: generate.py's default) lets it shrink to half of what the system
    prompt and the tools leave, said in a note, so that large tools leave a message room."""

    def __init__(self, model: GPT, tokenizer, template: ChatTemplate, sampling: Sampling, max_new_tokens: int,
                 generator: torch.Generator, note: Callable[[str], None], system: str | None = None,
                 tools: list[dict] | None = None, fit_reply: bool = False):
        self.model = model
        self.tokenizer = tokenizer
        self.template = template
        self.sampling = sampling
        self.max_new_tokens = max_new_tokens
        self.generator = generator
        self.note = note
        self.tools = tools
        self.block_size = model.config.block_size
        self.device = next(model.parameters()).device
        self.cache = KVCache(model.config, 1, self.block_size, self.device, next(model.parameters()).dtype)
        self.cached: list[int] = []  # the tokens whose keys and values the cache holds
        self.messages: list[dict] = [{"role": "system", "content": system}] if system else []
        self.waiting: list[dict] = []  # the calls of the last reply that no tool's result has answered yet
        self.ends = turn_ends(tokenizer)
        # what every prompt holds before the conversation: the system prompt and the tools, with the template
        self.fixed = len(prompt_ids(tokenizer, template, self.messages + [{"role": "user", "content": ""}], tools))
        left = self.block_size - self.fixed  # for the messages and the replies
        if left < 2:
            raise UserError(f"the system prompt and the tools are {self.fixed} tokens with the template; the model's "
                            f"context holds {self.block_size}: give fewer tools, a shorter system prompt, or a model "
                            "with a larger context")
        self.reply_room = min(max_new_tokens, self.block_size // 2)
        if fit_reply and self.reply_room > left // 2:
            self.reply_room = left // 2
            note(f"the system prompt and the tools are {self.fixed} of the context's {self.block_size} tokens: "
                 f"{self.reply_room} are kept for each reply (--max-new-tokens chooses)")

    def prompt(self) -> list[int]:
        """The conversation with the prompt for an answer, its oldest exchanges (a user's message
        and all that follows it up to the next one) dropped until it leaves room for a reply
        (reply_room)."""
        room = self.block_size - self.reply_room
        dropped = 0
        while len(ids := prompt_ids(self.tokenizer, self.template, self.messages, self.tools)) > room:
            oldest = next((i for i, m in enumerate(self.messages) if m["role"] != "system"), len(self.messages))
            end = next((i for i in range(oldest + 1, len(self.messages)) if self.messages[i]["role"] == "user"), None)
            if end is None:  # (the exchange under way is all there is)
                raise UserError(f"that message is {len(ids) - self.fixed} tokens with the template, after the "
                                f"system prompt and the tools' {self.fixed}; the model's context holds "
                                f"{self.block_size} and keeps {self.reply_room} for the reply: write less, or give a "
                                "smaller --max-new-tokens, fewer tools, or a model with a larger context")
            del self.messages[oldest:end]
            dropped += 1
        if dropped:
            turns = "the oldest turn is" if dropped == 1 else f"the {dropped} oldest turns are"
            self.note(f"the conversation outgrew the context ({self.block_size} tokens): {turns} forgotten")
        return ids

    def reply(self, text: str, on_text: Callable[[str], None] = lambda text: None) -> str:
        """The model's answer to the user's `text` (calls still waiting stay unanswered); `on_text`
        sees the answer as it grows."""
        return self.answer({"role": "user", "content": text}, on_text)

    def tool_result(self, text: str, on_text: Callable[[str], None] = lambda text: None) -> str | None:
        """The result of the oldest call not yet answered, as the tool's message (answering it by
        id where the call has one); the model's answer once every call has its result, else None."""
        if not self.waiting:
            raise UserError("no call of the model's waits for a result; a tool's result follows a reply that calls it")
        call = self.waiting[0]
        called = call.get("function", call)
        message = {"role": "tool", "content": text, **({"name": called["name"]} if "name" in called else {}),
                   **({"tool_call_id": call["id"]} if isinstance(call.get("id"), str) else {})}
        if len(self.waiting) > 1:
            self.messages.append(message)
            self.waiting = self.waiting[1:]
            return None
        return self.answer(message, on_text)

    @torch.no_grad()
    def answer(self, message: dict, on_text: Callable[[str], None]) -> str:
        """`message` added to the conversation, and the model's reply to it (a message that the
        context cannot hold is taken back, and refused)."""
        self.messages.append(message)
        try:
            ids = self.prompt()
        except UserError:
            self.messages.pop()
            raise
        self.waiting = []
        common = 0  # the tokens the cache already holds: only the rest runs
        while common < min(len(ids), len(self.cached)) and ids[common] == self.cached[common]:
            common += 1
        common = min(common, len(ids) - 1)  # (the last one runs, for the next token's logits)
        self.cache.length, self.cached = common, ids[:common]
        written, new = [], ids[common:]
        while len(written) < self.max_new_tokens and self.cache.length + len(new) <= self.block_size:
            logits, _ = self.model(torch.tensor([new], device=self.device), kv_cache=self.cache)
            self.cached += new
            token = int(sample_next(logits[:, -1, :], self.sampling, self.generator)[0])
            if token in self.ends:
                break
            written.append(token)
            new = [token]
            on_text(self.tokenizer.decode(written))
        else:
            if len(written) < self.max_new_tokens:
                self.note("the context is full; the reply is cut here")
        answer = self.tokenizer.decode(written)
        turn = assistant_turn(self.template, self.messages, self.tools, answer)
        self.messages.append(turn)
        self.waiting = list(turn.get("tool_calls", []))
        return answer
