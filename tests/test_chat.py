"""Conversations (data/conversations.py, data/template.py): records, templates, which tokens are the answers, the batches
they make (data/batches.py), and a fine-tuning run on them scored by evaluate.py."""

import json

import numpy as np
import pytest
import torch
from tokenizers import AddedToken

import evaluate
from conftest import ROOT, run_cli
from data.shared import DataError
from data.batches import IGNORE, ConversationSampler, answered, conversation_rows, in_memory
from data.conversations import conversation
from data.template import DEFAULT_TEMPLATE, ChatTemplate, chat_tokenizer, encode, prompt_ids
from data.tasks import conversations as task_conversations
from data.tasks import write as write_tasks
from data.tokenizer import train_tokenizer
from jobs.chat_session import Chat, replies
from model import GPT, GPTConfig, Sampling

TWO_TURNS = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+3="},
             {"role": "assistant", "content": "5"}, {"role": "user", "content": "and 4+4="},
             {"role": "assistant", "content": "8, of course"}]
CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
          "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


def default_tokenizer(kind="char"):
    return chat_tokenizer(train_tokenizer(kind, ["Be brief. 2+3= 5 and 4+4= 8, of course 0123456789 reverse:"], 300))


def test_a_record_is_its_messages_or_a_prompt_and_a_response():
    assert conversation({"messages": TWO_TURNS}, "x") == TWO_TURNS
    assert conversation({"prompt": "2+3=", "response": "5", "system": "Be brief."}, "x") == [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+3="},
        {"role": "assistant", "content": "5"}]
    for record, says in [({"text": "hello"}, 'neither "messages" nor "prompt" and "response"'),
                         ({"messages": [{"role": "user", "content": "hi"}]}, "no assistant message"),
                         ({"messages": [{"role": "bot", "content": "hi"}]}, 'needs a "role"'),
                         ({"messages": "hi"}, "must be a list"), (["hi"], "is a JSON object")]:
        with pytest.raises(DataError, match=says) as error:
            conversation(record, "chat.jsonl, line 3")
        assert "\n" not in str(error.value) and "chat.jsonl, line 3" in str(error.value)


def learnt(tokenizer, ids, mask) -> str:
    """The text of the tokens marked as the assistant's, the special ones included."""
    return tokenizer.decode([int(i) for i, m in zip(ids, mask) if m], skip_special_tokens=False)


@pytest.mark.parametrize("kind", ["char", "bpe"])
def test_the_default_template_marks_each_answer_and_its_end_of_turn_only(kind):
    tokenizer = default_tokenizer(kind)
    template = ChatTemplate(DEFAULT_TEMPLATE)
    ids, mask = encode(tokenizer, template, TWO_TURNS)
    assert tokenizer.decode(ids.tolist(), skip_special_tokens=False) == (
        "<|system|>Be brief.<|end|><|user|>2+3=<|end|><|assistant|>5<|end|><|user|>and 4+4=<|end|>"
        "<|assistant|>8, of course<|end|>")
    assert learnt(tokenizer, ids, mask) == "5<|end|>8, of course<|end|>"
    assert sum(int(i) == tokenizer.token_to_id("<|end|>") for i in ids) == 5  # each marker is one token
    assert prompt_ids(tokenizer, template, TWO_TURNS[:2]) == encode(tokenizer, template, TWO_TURNS[:3])[0][:-2].tolist()


def test_a_models_own_template_renders_and_tokenizes_as_transformers_does():
    """A ChatML template (Qwen's and SmolLM's scheme) in our sandbox gives transformers'
    apply_chat_template ids, with and without the generation prompt; the answer is the
    content and <|im_end|>, not the newline the template writes after it."""
    from transformers import PreTrainedTokenizerFast

    tokenizer = train_tokenizer("bpe", ["Be brief. 2+3= 5 and 4+4= 8, of course system user assistant"], 300)
    tokenizer.add_special_tokens([AddedToken(token, special=True, normalized=False) for token in ("<|im_start|>", "<|im_end|>")])
    theirs = PreTrainedTokenizerFast(tokenizer_object=tokenizer, chat_template=CHATML, eos_token="<|im_end|>")
    template = ChatTemplate(CHATML, {"eos_token": "<|im_end|>"})

    def ids_of(encoded):
        return list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)

    ids, mask = encode(tokenizer, template, TWO_TURNS)
    assert ids.tolist() == ids_of(theirs.apply_chat_template(TWO_TURNS, tokenize=True))
    assert prompt_ids(tokenizer, template, TWO_TURNS[:4]) == ids_of(
        theirs.apply_chat_template(TWO_TURNS[:4], tokenize=True, add_generation_prompt=True))
    assert learnt(tokenizer, ids, mask) == "5<|im_end|>8, of course<|im_end|>"


QWEN3_TEMPLATE = (ROOT / "tests" / "data" / "qwen3_chat_template.jinja").read_text()  # Qwen3's (its first line says whence)
WEATHER = {"type": "function", "function": {"name": "weather", "description": "Today's weather in a city",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
WITH_A_CALL = [*TWO_TURNS[:3], {"role": "user", "content": "weather in Paris?"},
               {"role": "assistant", "content": "", "tool_calls": [
                   {"type": "function", "function": {"name": "weather", "arguments": {"city": "Paris"}}}]},
               {"role": "tool", "content": "sunny"}, {"role": "assistant", "content": "Sunny."}]


def test_qwen3s_template_is_learnt_as_it_writes_each_answer_in_the_whole_conversation():
    """Qwen3's template writes an empty thinking block before the last answer alone: an
    earlier answer reads otherwise once later messages follow it, so the text up to it is
    not the start of the whole text. Each answer is then learnt as the whole text writes it,
    to its <|im_end|> (the ids are transformers' apply_chat_template's), and the prompt is
    what transformers gives the model to answer."""
    from transformers import PreTrainedTokenizerFast

    tokenizer = train_tokenizer("bpe", ["Be brief. 2+3= 5 weather in Paris? sunny Sunny. system user assistant "
                                        "tool_call tools think " + QWEN3_TEMPLATE], 400)
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in ("<|im_start|>", "<|im_end|>")])
    theirs = PreTrainedTokenizerFast(tokenizer_object=tokenizer, chat_template=QWEN3_TEMPLATE, eos_token="<|im_end|>")
    template = ChatTemplate(QWEN3_TEMPLATE, {"eos_token": "<|im_end|>"})
    ids, mask = encode(tokenizer, template, WITH_A_CALL, tools=[WEATHER])
    assert ids.tolist() == list(theirs.apply_chat_template(WITH_A_CALL, tools=[WEATHER], tokenize=True)["input_ids"])
    call = '<tool_call>\n{"name": "weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    assert learnt(tokenizer, ids, mask) == f"5<|im_end|>{call}<|im_end|><think>\n\n</think>\n\nSunny.<|im_end|>"
    assert prompt_ids(tokenizer, template, WITH_A_CALL[:6], tools=[WEATHER]) == list(theirs.apply_chat_template(
        WITH_A_CALL[:6], tools=[WEATHER], tokenize=True, add_generation_prompt=True)["input_ids"])
    without_an_end = ChatTemplate(QWEN3_TEMPLATE.replace("<|im_end|>", "<|stop|>"), {})
    with pytest.raises(DataError, match="its turn ends with no end-of-turn token this project knows"):
        encode(tokenizer, without_an_end, WITH_A_CALL, tools=[WEATHER])


def test_a_template_is_someone_elses_code_and_runs_in_the_sandbox():
    escape = "{{ messages.__class__.__mro__[1].__subclasses__() }}"
    with pytest.raises(DataError, match="refused|unsafe|not valid") as error:
        ChatTemplate(escape).render(TWO_TURNS)
    assert "\n" not in str(error.value)
    with pytest.raises(DataError, match="refused a conversation: no system"):
        ChatTemplate("{{ raise_exception('no system messages') }}").render(TWO_TURNS)
    with pytest.raises(DataError, match="as the start of the text with it"):  # answers must be told apart
        encode(default_tokenizer(), ChatTemplate("{{ messages | length }}"), TWO_TURNS)


@pytest.mark.parametrize("source, said", [
    ("{{ 10 ** (10 ** 10) }}", "too large a number"),
    ("{{ 'x' * 10 ** 9 }}", "repetition of 1,000,000,000"),
    ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", "took more than 2 s"),
    ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "RecursionError"),
    ("{{ 1 // 0 }}", "ZeroDivisionError"),
    ("{% for i in range(300) %}{{ 'abcdefghij' * 10 ** 4 }}{% endfor %}", "wrote 30,000,000 characters"),
])
def test_a_template_that_would_run_for_ever_or_fill_the_memory_is_stopped_in_one_line(source, said):
    """A chat template comes with a model from someone else: one that computes a huge number,
    repeats a text without end, loops, recurses or writes without end is stopped by a
    limit, named in a one-line error, instead of hanging or killing the run."""
    with pytest.raises(DataError, match=said) as error:
        ChatTemplate(source, name="the chat template of m").render(TWO_TURNS)
    assert "\n" not in str(error.value) and str(error.value).startswith("the chat template of m ")


def rows_of(conversations, tokenizer, template=ChatTemplate(DEFAULT_TEMPLATE)):
    return in_memory([encode(tokenizer, template, messages) for messages in conversations])


def test_the_prompts_tokens_get_no_gradient():
    """The loss reaches the logits only where the next token is the assistant's: the
    gradient of every other position's logits is exactly zero."""
    tokenizer = default_tokenizer()
    rows = rows_of([TWO_TURNS, TWO_TURNS[1:3]], tokenizer)
    x, y, _ = conversation_rows(rows, [0, 1], 64)
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=tokenizer.get_vocab_size(), block_size=64, n_layer=1, n_head=2, n_embd=16))
    logits, _ = model(x)
    logits.retain_grad()
    GPT.loss(logits, y).backward()
    touched = logits.grad.abs().sum(-1) > 0  # [B, T]
    assert torch.equal(touched, y != IGNORE)
    answers = [tokenizer.decode([int(t) for t in row[row != IGNORE]], skip_special_tokens=False) for row in y]
    assert answers == ["5<|end|>8, of course<|end|>", "5<|end|>"]


def test_a_conversation_never_sees_another_or_the_padding():
    """Each row's logits in a padded batch are the row's alone."""
    tokenizer = default_tokenizer()
    rows = rows_of([TWO_TURNS, TWO_TURNS[1:3]], tokenizer)
    x, _, _ = conversation_rows(rows, [0, 1], 64)
    model = GPT(GPTConfig(vocab_size=tokenizer.get_vocab_size(), block_size=64, n_layer=2, n_head=2, n_embd=16)).eval()
    short = len(rows[1][0]) - 1
    alone, _, _ = conversation_rows(rows, [1], 64)
    assert x.shape[1] > short and alone.shape == (1, short)
    with torch.no_grad():
        assert torch.allclose(model(x)[0][1, :short], model(alone)[0][0], atol=1e-6)


def test_a_conversation_longer_than_the_context_is_cut_at_its_end():
    tokenizer = default_tokenizer()
    rows = rows_of([TWO_TURNS, TWO_TURNS[1:3]], tokenizer)
    first_answer_at = int(np.argmax(rows[0][1]))  # where the first answer's token is
    x, y, _ = conversation_rows(rows, [0], first_answer_at - 1)  # cut just before it: nothing to learn
    assert x.shape == (1, first_answer_at - 1) and (y == IGNORE).all()
    assert answered(rows, first_answer_at - 1).tolist() == [1]  # so a sampler leaves it out
    x, y, _ = conversation_rows(rows, [0], first_answer_at)  # one more: the answer's first token is the last target
    assert (y[0, :-1] == IGNORE).all() and y[0, -1] == rows[0][0][first_answer_at]
    assert answered(rows, first_answer_at).tolist() == [0, 1]
    sampler = ConversationSampler(rows, first_answer_at - 1, 4, seed=0)
    assert set(sampler.usable.tolist()) == {1}
    # tokens/s and tokens_seen count what a batch holds of its conversations, not its padding
    sampler = ConversationSampler(rows, 1000, 8, seed=0)
    x, _, _ = sampler.next_batch()
    long, short = sorted((rows[i][0] for i in range(2)), key=len, reverse=True)
    real = [next(len(ids) - 1 for ids in (long, short) if row[:len(ids) - 1].tolist() == ids[:-1].tolist()) for row in x]
    assert sampler.drawn == sum(real) < x.numel()


def chat_run(tmp_path, *extra, data=None, out="run"):
    data = data or tmp_path / "add.jsonl"
    if not data.exists():
        write_tasks(data, task_conversations("add", 400, seed=0))
    return ["--config", str(ROOT / "configs" / "tiny.yaml"), f"data.source={data}", f"data.cache_dir={tmp_path / 'cache'}",
            f"out_dir={tmp_path / out}", "data.tokenizer=char", "model.n_layer=1", "model.n_head=2", "model.n_kv_head=1",
            "model.n_embd=32", "model.block_size=16", "train.batch_size=16", "train.max_iters=20",
            "train.lr_decay_iters=20", "train.eval_interval=10", "train.eval_windows=1000", "train.warmup_iters=2", "train.sample_tokens=0",
            "train.dtype=float32", "train.threads=1", "train.max_minutes=null", "train.snapshots=0", *extra]


def test_a_run_on_conversations_keeps_its_template_and_evaluate_scores_it_by_the_same_rule(tmp_path, capsys):
    import train

    assert train.main(chat_run(tmp_path)) == 0
    run = tmp_path / "run"
    assert (run / "chat_template.jinja").read_text() == DEFAULT_TEMPLATE
    summary = json.loads((run / "summary.json").read_text())
    capsys.readouterr()
    assert evaluate.main(["--checkpoint", str(run), "--split", "val", "--json"]) == 0
    scored = json.loads(capsys.readouterr().out)
    assert scored["loss"] == pytest.approx(summary["val_loss"], rel=1e-5)  # the trainer's, on all 40
    assert scored["conversations"] == 40 and 0 <= scored["exact_match"] <= 1
    held_out = tmp_path / "held_out.jsonl"
    write_tasks(held_out, task_conversations("add", 10, seed=1))
    assert evaluate.main(["--checkpoint", str(run), "--text", str(held_out), "--json"]) == 0
    scored = json.loads(capsys.readouterr().out)
    assert scored["conversations"] == 10
    assert evaluate.main(["--checkpoint", str(run), "--text", str(held_out)]) == 0  # the same, in words
    said = capsys.readouterr().out.splitlines()
    assert said[0].startswith(f"{held_out}: 10 conversations, {scored['answer_tokens']} answer tokens scored in ")
    assert said[1] == (f"loss {scored['loss']:.4f} nats/answer token | perplexity {scored['perplexity']:.3f} | "
                       f"exact match of the last answer {scored['exact_match']:.1%}")
    reached = scored["at_the_cap"]
    assert said[2] == (f"answers written up to {scored['max_new_tokens']} tokens (--max-new-tokens): "
                       + (f"{reached} of 10 reached it without ending their turn" if reached
                          else "every answer ended its turn before it"))
    assert evaluate.main(["--checkpoint", str(run), "--text", str(held_out), "--json", "--max-new-tokens", "2"]) == 0
    assert json.loads(capsys.readouterr().out)["max_new_tokens"] == 2


@pytest.mark.slow  # (two runs in their own processes)
def test_too_long_conversations_are_refused_when_the_config_says_so(tmp_path):
    out = run_cli("train.py", *chat_run(tmp_path, "data.chat_too_long=refuse", "model.block_size=8"))
    error = out.stderr.splitlines()[-1]
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "longer than the context" in error and "data.chat_too_long=cut" in error
    cut = run_cli("train.py", *chat_run(tmp_path, "model.block_size=8", "train.max_iters=2"))
    assert cut.returncode == 0, cut.stderr
    assert "conversations are longer than the context (9 tokens with the last target): each is cut" in cut.stdout


def test_a_run_on_conversations_resumes_exactly(tmp_path):
    """Stopped at iteration 10 and resumed: the same weights as a run straight to 20 (the
    sampler's conversations and the random state resume with it)."""
    import train
    from safetensors.torch import load_file

    assert train.main(chat_run(tmp_path, out="straight")) == 0
    assert train.main(chat_run(tmp_path, "train.max_iters=10", out="resumed")) == 0
    assert train.main(chat_run(tmp_path, out="resumed")) == 0
    straight, resumed = (load_file(tmp_path / name / "model.safetensors") for name in ("straight", "resumed"))
    assert all(torch.equal(straight[name], resumed[name]) for name in straight)


def chat_model(block_size=64):
    tokenizer = default_tokenizer()
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=tokenizer.get_vocab_size(), block_size=block_size, n_layer=2, n_head=2,
                          n_embd=32, pos_encoding="rope")).eval()
    return model, tokenizer


def fresh_reply(model, tokenizer, template, messages, count):
    """The greedy reply to messages, computed afresh with no cache, up to the end of its turn."""
    from data.template import turn_ends

    ids = prompt_ids(tokenizer, template, messages)
    new = model.generate(torch.tensor([ids]), count, temperature=0, use_cache=False)[0, len(ids):].tolist()
    ends = [i for i, token in enumerate(new) if token in turn_ends(tokenizer)]
    return tokenizer.decode(new[:ends[0]] if ends else new)


def test_replies_in_a_batch_are_each_conversations_own():
    """evaluate.py writes many answers at once (jobs/chat_session.replies): each is the greedy reply
    its conversation gets alone without a cache, and each ends at its own end-of-turn token."""
    model, tokenizer = chat_model()
    with torch.no_grad():  # weights large enough that each prompt gets replies of its own
        for weight in model.parameters():
            if weight.dim() == 2:
                weight.normal_(0, 0.5, generator=torch.Generator().manual_seed(weight.numel()))
    template = ChatTemplate(DEFAULT_TEMPLATE)
    asked = [[{"role": "user", "content": question}] for question in ("2+3=", "and 4+4=", "55+66=")]
    prompts = [prompt_ids(tokenizer, template, messages) for messages in asked]
    assert len({len(p) for p in prompts}) > 1  # (of different lengths: left-padded together)
    alone = [model.generate(torch.tensor([p]), 8, temperature=0, use_cache=False)[0, len(p):].tolist() for p in prompts]
    assert replies(model, prompts, set(), 8) == alone
    assert len({tuple(reply) for reply in alone}) > 1  # (replies that differ: no row can pass for another)
    end = alone[1][3]  # a token the second reply writes, taken as the end of a turn
    for got, full in zip(replies(model, prompts, {end}, 8), alone):
        assert got == (full[:full.index(end)] if end in full else full)


def test_a_template_renders_as_transformers_renders_it_with_its_date_and_json():
    """The globals and filters transformers gives chat templates: strftime_now (Llama 3's
    templates write today's date) and tojson as written, not escaped for HTML (tool calls);
    the same text as transformers' apply_chat_template."""
    transformers = pytest.importorskip("transformers")
    source = ("{{ strftime_now('%d %b %Y') }}|{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
              "{% if m.tool_calls %}{{ m.tool_calls | tojson }}{% endif %}{{ tools | tojson(indent=2) }}<|im_end|>\n"
              "{% endfor %}")
    messages = [{"role": "user", "content": "2+3="},
                {"role": "assistant", "content": "", "tool_calls": [{"name": "add", "arguments": {"a": 2, "b": "<&>"}}]}]
    tools = [{"name": "add", "description": "a + b, é"}]
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=default_tokenizer(), chat_template=source)
    theirs = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False)
    ours = ChatTemplate(source).render(messages, tools=tools)
    assert ours == theirs and '"b": "<&>"' in ours and "é" in ours
    import datetime
    assert ours.startswith(datetime.datetime.now().strftime("%d %b %Y") + "|")


GENERATION = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.role == 'assistant' %}{% generation %}"
              "{{ m.content }}<|im_end|>{% endgeneration %}{% else %}{{ m.content }}<|im_end|>{% endif %}\n"
              "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def test_generation_blocks_mark_the_answers_as_transformers_marks_them():
    """A template's {% generation %} blocks (transformers' return_assistant_tokens_mask, trl's
    assistant_only_loss) say which tokens are learnt: the same mask as transformers', the same
    text as without the blocks, and a block that wraps the user's turn is learnt too (the
    blocks, not the roles, decide)."""
    transformers = pytest.importorskip("transformers")
    tokenizer = train_tokenizer("bpe", ["Be brief. 2+3= 5 and 4+4= 8, of course system user assistant"], 300)
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in ("<|im_start|>", "<|im_end|>")])
    theirs = transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, chat_template=GENERATION)
    template = ChatTemplate(GENERATION)
    assert template.marks_answers and not ChatTemplate(CHATML).marks_answers
    ids, mask = encode(tokenizer, template, TWO_TURNS)
    expected = theirs.apply_chat_template(TWO_TURNS, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
    assert ids.tolist() == list(expected["input_ids"]) and mask.tolist() == list(expected["assistant_masks"])
    assert learnt(tokenizer, ids, mask) == "5<|im_end|>8, of course<|im_end|>"
    plain = GENERATION.replace("{% generation %}", "").replace("{% endgeneration %}", "")
    assert template.render(TWO_TURNS) == ChatTemplate(plain).render(TWO_TURNS)
    everyone = GENERATION.replace("{% if m.role == 'assistant' %}", "{% if m.role != 'system' %}")
    ids, mask = encode(tokenizer, ChatTemplate(everyone), TWO_TURNS)
    assert learnt(tokenizer, ids, mask) == "2+3=<|im_end|>5<|im_end|>and 4+4=<|im_end|>8, of course<|im_end|>"


def test_chat_keeps_the_cache_across_turns_and_answers_as_a_fresh_pass(monkeypatch):
    """generate.py --chat: each turn runs only the tokens the cache lacks, and every reply is
    the one a pass over the whole conversation without a cache gives."""
    model, tokenizer = chat_model()
    template = ChatTemplate(DEFAULT_TEMPLATE)
    session = Chat(model, tokenizer, template, Sampling(temperature=0), 6, torch.Generator(), note=print)
    lengths = []
    forward = model.forward
    monkeypatch.setattr(model, "forward", lambda idx, *a, **k: (lengths.append(idx.size(1)), forward(idx, *a, **k))[1])
    for turn, text in enumerate(["2+3=", "and 4+4=", "5"]):
        lengths.clear()
        before = [dict(m) for m in session.messages] + [{"role": "user", "content": text}]
        held, ids = list(session.cached), prompt_ids(tokenizer, template, before)
        reply = session.reply(text)
        assert reply == fresh_reply(model, tokenizer, template, before, 6)
        # what the cache holds of the conversation is not run again: the turn's first pass runs the rest
        shared = next((i for i, (a, b) in enumerate(zip(held, ids)) if a != b), min(len(held), len(ids)))
        assert lengths[0] == len(ids) - shared
        if turn:
            assert shared >= len(prompt_ids(tokenizer, template, before[:-2]))  # at least the earlier turns
    assert [m["role"] for m in session.messages] == ["user", "assistant"] * 3


def test_chat_keeps_its_cache_in_the_models_dtype():
    """generate.py --chat --dtype bfloat16: the cache holds bfloat16 keys and values, as the
    model computes them, and the reply is a fresh pass's."""
    model, tokenizer = chat_model()
    model = model.to(torch.bfloat16)
    template = ChatTemplate(DEFAULT_TEMPLATE)
    session = Chat(model, tokenizer, template, Sampling(temperature=0), 6, torch.Generator(), note=print)
    messages = [{"role": "user", "content": "2+3="}]
    assert session.reply("2+3=") == fresh_reply(model, tokenizer, template, messages, 6)


def test_chat_forgets_the_oldest_turns_when_the_context_fills():
    model, tokenizer = chat_model(block_size=24)
    template = ChatTemplate(DEFAULT_TEMPLATE)
    notes = []
    session = Chat(model, tokenizer, template, Sampling(temperature=0), 4, torch.Generator(), note=notes.append)
    for text in ["2+3=", "4+4=", "5+5=", "and 8+8="]:
        before = session.messages + [{"role": "user", "content": text}]
        reply = session.reply(text)
    assert "the conversation outgrew the context (24 tokens): the oldest turn is forgotten" in notes
    assert session.messages[0]["role"] == "user" and len(session.messages) < 8
    assert len(prompt_ids(tokenizer, template, session.messages[:-1])) <= 24 - 4
    assert reply == fresh_reply(model, tokenizer, template, session.messages[:-1], 4)
    assert before[-1] == session.messages[-2]
    with pytest.raises(evaluate.UserError, match="write less"):
        session.reply("9" * 30)


def test_chat_drops_whole_turns_oldest_first_keeping_the_system_message_and_no_more_than_it_must():
    """Chat.prompt: room for the reply is min(max_new_tokens, half the context); the oldest
    message after a system message goes with its reply (a user message without one alone),
    one turn at a time until the prompt fits, and the note counts the turns forgotten."""
    model, tokenizer = chat_model(block_size=42)
    notes = []
    session = Chat(model, tokenizer, ChatTemplate(DEFAULT_TEMPLATE), Sampling(temperature=0), 40, torch.Generator(),
                   note=notes.append)
    turns = [{"role": "user", "content": "2+3="}, {"role": "assistant", "content": "5"},
             {"role": "user", "content": "4+4="}, {"role": "user", "content": "and?"},
             {"role": "assistant", "content": "8"}, {"role": "user", "content": "1+1="}]
    system = {"role": "system", "content": "sum"}
    session.messages = [system, *turns]
    room = 42 - 21  # (max_new_tokens 40 is more than half the context)
    sizes = [len(prompt_ids(tokenizer, session.template, [system, *turns[k:]])) for k in (0, 2, 3, 5)]
    assert sizes[0] > sizes[1] > room == sizes[2], sizes  # (the sizes this test needs: two turns to go, then full)
    ids = session.prompt()
    assert session.messages == [system, *turns[3:]]  # the first turn (a message and its reply), then a lone message
    assert ids == prompt_ids(tokenizer, session.template, session.messages)
    assert notes == ["the conversation outgrew the context (42 tokens): the 2 oldest turns are forgotten"]
    session.messages, notes[:] = [system, *turns[2:]], []
    session.prompt()
    assert session.messages == [system, *turns[3:]] and notes[-1].endswith("the oldest turn is forgotten")
    session.messages = [system, {"role": "user", "content": "2+3=" * 5}, turns[-1]]  # the last but one goes too
    session.prompt()
    assert session.messages == [system, turns[-1]]


def test_a_sampled_chat_draws_from_its_own_generator():
    """generate.py --chat --seed N: the replies depend on the session's generator alone."""
    model, tokenizer = chat_model()
    answers = []
    for global_seed in (1, 2):
        torch.manual_seed(global_seed)  # (another draw of torch's global generator each time)
        session = Chat(model, tokenizer, ChatTemplate(DEFAULT_TEMPLATE), Sampling(temperature=1.5), 12,
                       torch.Generator().manual_seed(0), note=print)
        answers.append([session.reply("2+3="), session.reply("4+4=")])
    assert answers[0] == answers[1]
    session = Chat(model, tokenizer, ChatTemplate(DEFAULT_TEMPLATE), Sampling(temperature=1.5), 12,
                   torch.Generator().manual_seed(1), note=print)
    assert [session.reply("2+3="), session.reply("4+4=")] != answers[0]  # (a generator that changes them)


def test_a_runs_template_knows_its_end_of_text_and_its_name(tmp_path):
    """jobs.chat_session.run_template: the run's template, given the tokenizer's eos_token, and
    named by the run in its errors; a run without one is refused, saying why."""
    from jobs.chat_session import run_template
    from cli.program import UserError

    tokenizer = train_tokenizer("bpe", ["2+3= 5 and 4+4= 8 " * 20], 300)
    with pytest.raises(UserError, match="has no chat template: it was trained on plain text; chat and "
                                        r"conversation scores need a model fine-tuned on conversations \(docs"):
        run_template(tmp_path, tokenizer)
    (tmp_path / "chat_template.jinja").write_text("{% for m in messages %}{{ m.content }}{{ eos_token }}{% endfor %}")
    template = run_template(tmp_path, tokenizer)
    assert template.render([{"role": "user", "content": "2+3="}]) == "2+3=<|endoftext|>"
    (tmp_path / "chat_template.jinja").write_text("{{ messages[0].content / 0 }}")
    with pytest.raises(DataError, match=f"the chat template of {tmp_path} failed on a conversation"):
        run_template(tmp_path, tokenizer).render([{"role": "user", "content": "2"}])


def test_chat_needs_a_model_fine_tuned_on_conversations(tmp_path, micro):
    import train

    assert train.main(["--config", str(ROOT / "configs" / "tiny.yaml"), *micro("train.max_iters=2")]) == 0
    out = run_cli("generate.py", "--checkpoint", str(tmp_path / "run"), "--chat", input="hello\n")
    assert out.returncode == 2 and "Traceback" not in out.stderr and "no chat template" in out.stderr.splitlines()[-1]
    out = run_cli("generate.py", "--checkpoint", str(tmp_path / "run"), "--chat", "--prompt", "hello")
    assert out.returncode == 2 and out.stderr.strip().endswith("give it no --prompt, --prompt-file or --show-attention")


@pytest.fixture(scope="module")
def chat_runs(tmp_path_factory):
    """A base run trained on the addition text as plain text, and a run fine-tuned from it on
    the same sums as conversations (the default template, its markers added)."""
    import train

    tmp = tmp_path_factory.mktemp("chat_runs")
    records = task_conversations("add", 400, seed=0)
    (tmp / "sums.txt").write_text("".join(f"{r['messages'][0]['content']}{r['messages'][1]['content']}\n"
                                          for r in records), encoding="utf-8")
    write_tasks(tmp / "add.jsonl", records)
    assert train.main(chat_run(tmp, f"data.source={tmp / 'sums.txt'}", "train.max_iters=2", out="base")) == 0
    assert train.main(chat_run(tmp, f"train.init_from={tmp / 'base'}", "train.max_iters=2", out="sft")) == 0
    return tmp


def test_generate_chat_answers_each_line_as_the_chat_engine_does(chat_runs, monkeypatch, capsys):
    """generate.py --chat: each line read is a message; each reply is printed on its own line
    and is the chat engine's for the conversation so far; --seed makes sampled replies
    repeat; --prompt is refused."""
    import io

    import generate
    from jobs.chat_session import run_template
    from runs.folder import RunDir

    run = chat_runs / "sft"
    model, tokenizer = RunDir(run).load_model()
    session = Chat(model.eval(), tokenizer, run_template(run, tokenizer), Sampling(temperature=0), 6,
                   torch.Generator(), note=lambda text: None)
    expected = [session.reply(text) for text in ("2+3=", "4+4=")]

    def chat(*flags, typed="2+3=\n\n4+4=\n"):
        monkeypatch.setattr("sys.stdin", io.StringIO(typed))
        assert generate.main(["--checkpoint", str(run), "--chat", "--max-new-tokens", "6", *flags]) == 0
        return capsys.readouterr().out

    assert chat("--temperature", "0") == "".join(f"{reply}\n" for reply in expected)
    assert chat("--temperature", "2", "--seed", "3") == chat("--temperature", "2", "--seed", "3")
    # --system opens the conversation; a line ending in a backslash goes on on the next
    session = Chat(model.eval(), tokenizer, run_template(run, tokenizer), Sampling(temperature=0), 6,
                   torch.Generator(), note=lambda text: None, system="B")
    assert session.messages == [{"role": "system", "content": "B"}]
    expected = session.reply("2\n3")  # (the 16 tokens of this model's context hold no more)
    import jobs.chat_session
    seen = []
    monkeypatch.setattr(jobs.chat_session, "prompt_ids", lambda tok, template, messages, tools: (
        seen.append([dict(m) for m in messages]), prompt_ids(tok, template, messages, tools))[1])
    assert chat("--temperature", "0", "--system", "B", typed="2\\\n3\n") == f"{expected}\n"
    assert seen[-1] == session.messages[:2] == [{"role": "system", "content": "B"}, {"role": "user", "content": "2\n3"}]
    assert generate.main(["--checkpoint", str(run), "--chat", "--prompt", "2+3="]) == 2
    assert capsys.readouterr().err.strip().endswith("--chat reads its messages from the input, one a line; give it "
                                                    "no --prompt, --prompt-file or --show-attention")
    assert generate.main(["--checkpoint", str(run), "--system", "Be brief.", "--prompt", "2+3="]) == 2
    assert capsys.readouterr().err.strip().endswith("--system is the system message of a conversation: give it "
                                                    "with --chat")


def test_a_conversation_the_template_refuses_is_one_line_and_exit_2(chat_runs, tmp_path, monkeypatch, capsys):
    """A run's template is someone else's code and may refuse what is typed (a system message,
    say): generate.py --chat says so in one line and exits 2, as every bad input does."""
    import io
    import shutil

    import generate

    run = shutil.copytree(chat_runs / "sft", tmp_path / "sft")
    template = (run / "chat_template.jinja").read_text()
    (run / "chat_template.jinja").write_text("{% if messages[0]['role'] == 'system' %}"
                                             "{{ raise_exception('System role not supported') }}{% endif %}" + template)
    monkeypatch.setattr("sys.stdin", io.StringIO("2+3=\n"))
    assert generate.main(["--checkpoint", str(run), "--chat", "--system", "B"]) == 2
    err = capsys.readouterr().err
    assert err.strip().endswith("refused a conversation: System role not supported") and "Traceback" not in err


def test_the_messages_typed_are_lines_joined_by_a_final_backslash():
    from generate import messages

    typed = ["2+3=\n", "\n", "first\\\n", "second\\\n", "third\n", "  \n", "last\\\n"]
    assert list(messages(typed)) == ["2+3=", "first\nsecond\nthird", "last"]


def test_evaluate_keeps_each_answer_and_scores_a_base_with_a_template_given(chat_runs, tmp_path, capsys):
    """evaluate.py --answers FILE.jsonl: each last answer with its prompt and the expected
    one (never over an existing file); --chat-template FILE scores a run that has no
    template, the base before fine-tuning; both are refused for plain text."""
    held_out = tmp_path / "held_out.jsonl"
    write_tasks(held_out, task_conversations("add", 6, seed=3))
    answers = tmp_path / "answers.jsonl"
    assert evaluate.main(["--checkpoint", str(chat_runs / "sft"), "--text", str(held_out), "--json",
                          "--answers", str(answers)]) == 0
    scored = json.loads(capsys.readouterr().out)
    kept = [json.loads(line) for line in answers.read_text().splitlines()]
    records = [json.loads(line) for line in held_out.read_text().splitlines()]
    assert [a["prompt"] for a in kept] == [r["messages"][:-1] for r in records]
    assert [a["expected"] for a in kept] == [r["messages"][-1]["content"] for r in records]
    assert all(a["right"] == (a["got"] == a["expected"]) for a in kept)
    assert sum(a["right"] for a in kept) / len(kept) == scored["exact_match"]
    before = answers.read_bytes()
    assert evaluate.main(["--checkpoint", str(chat_runs / "sft"), "--text", str(held_out), "--answers",
                          str(answers)]) == 2
    assert capsys.readouterr().err == f"error: --answers {answers} already exists; choose another file name\n"
    assert answers.read_bytes() == before
    # the base has no template of its own: given one, it is scored by the same rule
    assert evaluate.main(["--checkpoint", str(chat_runs / "base"), "--text", str(held_out), "--json"]) == 2
    assert "has no chat template: it was trained on plain text; conversations are scored with --chat-template " \
           "default" in capsys.readouterr().err
    template = tmp_path / "template.jinja"
    template.write_text(DEFAULT_TEMPLATE)
    assert evaluate.main(["--checkpoint", str(chat_runs / "base"), "--text", str(held_out), "--json",
                          "--chat-template", str(template), "--answers", str(tmp_path / "base.jsonl")]) == 0
    assert json.loads(capsys.readouterr().out)["conversations"] == 6
    assert len((tmp_path / "base.jsonl").read_text().splitlines()) == 6
    (tmp_path / "text.txt").write_text("2+3=5\n")
    assert evaluate.main(["--checkpoint", str(chat_runs / "sft"), "--text", str(tmp_path / "text.txt"),
                          "--answers", str(tmp_path / "x.jsonl")]) == 2
    assert capsys.readouterr().err.startswith("error: --answers is for conversations")
    assert evaluate.main(["--checkpoint", str(chat_runs / "sft"), "--text", str(tmp_path / "text.txt"),
                          "--max-new-tokens", "3"]) == 2
    assert capsys.readouterr().err.startswith("error: --max-new-tokens is for conversations")


def test_evaluate_scores_a_base_as_fine_tuning_starts_it_and_a_transformers_folder_as_the_run(chat_runs, tmp_path,
                                                                                                capsys):
    """Before and after from one command each: --chat-template default scores the base with
    the markers added as fine-tuning adds them (the loss of the fine-tuning run's model at its
    start); a transformers folder exported from the fine-tuned run scores as the run does."""
    import export
    from conftest import make_trainer
    from jobs.chat_data import score_conversations

    held_out = tmp_path / "held_out.jsonl"
    write_tasks(held_out, task_conversations("add", 6, seed=3))
    records = [(r["messages"], None) for r in task_conversations("add", 6, seed=3)]

    def scored(checkpoint, *extra):
        assert evaluate.main(["--checkpoint", str(checkpoint), "--text", str(held_out), "--json", *extra]) == 0
        return json.loads(capsys.readouterr().out)

    start = make_trainer(chat_run(chat_runs, f"train.init_from={chat_runs / 'base'}", out="start")[2:])
    expected = score_conversations(start.model.eval(), start.run.data.tokenizer, ChatTemplate(DEFAULT_TEMPLATE),
                                   records, 16, "cpu")
    capsys.readouterr()
    before = scored(chat_runs / "base", "--chat-template", "default")
    assert before["loss"] == pytest.approx(expected["loss"], rel=1e-5)
    assert before["exact_match"] == expected["exact_match"]
    after = scored(chat_runs / "sft")
    assert export.main(["--checkpoint", str(chat_runs / "sft"), "--out", str(tmp_path / "hf")]) == 0
    assert "model_type" in json.loads((tmp_path / "hf" / "config.json").read_text())
    capsys.readouterr()
    exported = scored(tmp_path / "hf")  # (its chat template came with it)
    assert exported["loss"] == pytest.approx(after["loss"], rel=1e-4)
    assert exported["exact_match"] == after["exact_match"]
    (tmp_path / "hf" / "model.safetensors").unlink()
    assert evaluate.main(["--checkpoint", str(tmp_path / "hf"), "--text", str(held_out)]) == 2
    assert capsys.readouterr().err.startswith(f"error: --checkpoint {tmp_path / 'hf'} is neither a run directory")


def test_a_base_model_grows_its_embedding_by_the_chat_markers_each_the_mean(chat_runs):
    """Fine-tuning a model brought in on conversations with the default template: its
    tokenizer gains the five markers, its embedding five rows, each the mean of the old
    ones; every old row is the base model's."""
    from conftest import make_trainer
    from runs.folder import RunDir

    base, tokenizer = RunDir(chat_runs / "base").load_model()
    trainer = make_trainer(chat_run(chat_runs, f"train.init_from={chat_runs / 'base'}", out="fresh")[2:])
    grown = trainer.model.transformer.wte.weight.detach()
    old = base.transformer.wte.weight.detach()
    assert grown.shape[0] == old.shape[0] + 5 == trainer.run.data.tokenizer.get_vocab_size()
    assert torch.equal(grown[:old.shape[0]], old)
    assert torch.allclose(grown[old.shape[0]:], old.mean(0).expand(5, -1))
    assert trainer.run.data.tokenizer.token_to_id("<|end|>") == old.shape[0] + 4


def test_the_exports_carry_the_chat_template(chat_runs, tmp_path):
    """The transformers folder's tokenizer_config.json holds the template (apply_chat_template
    there gives our ids) and generation stops at the end of a turn; the GGUF file holds it
    as tokenizer.chat_template; a run that starts from the export finds it again."""
    import export
    from transformers import AutoTokenizer

    from runs.folder import RunDir
    from interop.base_model import open_base_model

    out = tmp_path / "hf"
    assert export.main(["--checkpoint", str(chat_runs / "sft"), "--out", str(out)]) == 0
    assert json.loads((out / "tokenizer_config.json").read_text())["chat_template"] == DEFAULT_TEMPLATE
    card = (out / "README.md").read_text()
    assert "nats per answer token" in card  # (no bits per character of answers alone)
    assert f"- **Start**: fine-tuned from `{chat_runs / 'base'}`, every weight trained." in card
    assert 'chat([{"role": "user", "content": "..."}], max_new_tokens=100)' in card  # (the template makes the prompt)
    _, tokenizer = RunDir(chat_runs / "sft").load_model()
    messages = [{"role": "user", "content": "12+30="}, {"role": "assistant", "content": "42"}]
    theirs = AutoTokenizer.from_pretrained(out).apply_chat_template(messages, tokenize=True)
    theirs = theirs["input_ids"] if hasattr(theirs, "keys") else theirs
    assert list(theirs) == encode(tokenizer, ChatTemplate(DEFAULT_TEMPLATE), messages)[0].tolist()
    eos = json.loads((out / "generation_config.json").read_text())["eos_token_id"]
    assert tokenizer.token_to_id("<|end|>") in (eos if isinstance(eos, list) else [eos])
    assert open_base_model(str(out)).chat_template() == DEFAULT_TEMPLATE
    gguf = pytest.importorskip("gguf")
    path = tmp_path / "model.gguf"
    assert export.main(["--checkpoint", str(chat_runs / "sft"), "--out", str(path)]) == 0
    fields = gguf.GGUFReader(path).fields
    field = fields["tokenizer.chat_template"]
    assert bytes(field.parts[field.data[0]]).decode() == DEFAULT_TEMPLATE
    eot = fields["tokenizer.ggml.eot_token_id"]
    assert int(eot.parts[eot.data[0]][0]) == tokenizer.token_to_id("<|end|>")


def test_a_folder_of_conversation_shards_is_read_in_order_and_split_at_its_end(tmp_path):
    from data.config import DataConfig
    from data.conversations import chat_source

    folder = tmp_path / "shards"
    folder.mkdir()
    write_tasks(folder / "part-1.jsonl", task_conversations("add", 6, seed=1))
    write_tasks(folder / "part-0.jsonl", task_conversations("add", 4, seed=0))
    (folder / "README.md").write_text("not data")
    source = chat_source(DataConfig(source=str(folder), val_fraction=0.2))
    every = task_conversations("add", 4, seed=0) + task_conversations("add", 6, seed=1)
    assert [m for _, m, _ in source.train()] == [r["messages"] for r in every[:8]]
    assert [m for _, m, _ in source.val()] == [r["messages"] for r in every[8:]]
    assert [where for where, _, _ in source.val()] == [f"{folder / 'part-1.jsonl'}, line {n}" for n in (5, 6)]
    (folder / "part-2.jsonl").write_text('{"messages": [{"role": "user", "content": "hi"}]}\n')
    with pytest.raises(DataError, match="part-2.jsonl, line 1: no assistant message"):
        list(chat_source(DataConfig(source=str(folder), val_fraction=0.2, skip_bad_records=0)).train())
