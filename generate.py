"""Sample from a trained GPT: python generate.py --prompt "ROMEO:" [--checkpoint out/tiny]

Loads model.safetensors, config.json and tokenizer.json (no pickle) and samples token
by token with a KV cache. Several --prompt flags run as one left-padded batch.
--chat talks with a model fine-tuned on conversations: each line you type is a user's
message (a line ending in \\ goes on on the next), put in the run's chat template after
--system's message; the reply ends at the end-of-turn token. With --tools FILE.json the
model may call tools: each call is shown, and a line "/tool RESULT" gives its result.
Exit codes: 0 ok, 2 bad input.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
import typing
from dataclasses import dataclass, field
from pathlib import Path

import torch

from cli.program import OneLineParser, UserError, check_output_folder, positive, run_main
from data.shared import DataError
from data.tokenizer import encode_or_start, end_of_text_ids, suppressed_ids
from data.tool_calls import call_of
from inspection.attention_maps import attention_maps, heatmap_grid, png_bytes
from jobs import Job, job_of
from jobs.chat_session import Chat
from jobs.prompt import encode_prompt, left_padded
from machine.device import DTYPES, resolve_device, resolve_dtype
from machine.threads import set_threads, thread_help
from model import Sampling
from runs.folder import DEFAULT_RUN, RunDir
from storage.atomic import write_atomic


DEFAULT_NEW_TOKENS = 500  # what --max-new-tokens is when it is not given


def option(default, help: str, **argparse):
    """A field of Settings that is also a command-line option (--name-with-dashes)."""
    kind = {"default_factory": list} if isinstance(default, list) else {"default": default}
    return field(**kind, metadata={"help": help, **argparse})


@dataclass
class Settings:
    """What to generate. Each field with a help text is a command-line option, declared
    here once: parse_args makes the option, Settings checks its value."""

    max_new_tokens: int | None = option(None, "tokens to add to each sample (default 500; --chat: at most what "
                                              "the context leaves after large tools)")
    temperature: float = option(0.8, "0 = greedy (default 0.8)")
    top_k: int | None = option(None, "sample among the k likeliest tokens")
    top_p: float | None = option(None, "nucleus sampling: smallest set with mass p")
    seed: int | None = option(None, "same seed, same samples")  # None: different samples every time
    num_samples: int = option(1, "samples per prompt")
    stop: list[str] = option([], "end a sample at this text (repeatable)", action="append")
    device: str = option("auto", "auto, cpu, cuda or mps")
    dtype: str = option("auto", "auto: bfloat16 on GPUs that have it, float32 on CPUs", choices=["auto", *DTYPES])
    no_kv_cache: bool = option(False, "recompute the whole context every token")
    stats: bool = option(False, "print token counts and tokens/s to stderr")
    interactive: bool = option(False, "read prompts from the terminal")  # and Ctrl-C ends a sample, not the program
    stream: bool = False  # print one sample as it grows (on a terminal)
    suppress_tokens: tuple[int, ...] = ()  # never generated: the tokenizer's (data.tokenizer.suppressed_ids)
    chosen_max_new_tokens: bool | None = None  # whether --max-new-tokens was given (--chat fits one not given)

    def __post_init__(self) -> None:
        if self.chosen_max_new_tokens is None:  # (made from the options; dataclasses.replace keeps it)
            self.chosen_max_new_tokens = self.max_new_tokens is not None
        if self.max_new_tokens is None:
            self.max_new_tokens = DEFAULT_NEW_TOKENS
        try:
            self.sampling = Sampling(self.temperature, self.top_k, self.top_p, self.suppress_tokens)
        except ValueError as e:
            raise UserError(f"--{str(e).replace('_', '-')}") from None
        for name, low in (("max_new_tokens", 0), ("num_samples", 1)):
            if getattr(self, name) < low:
                raise UserError(f"--{name.replace('_', '-')}={getattr(self, name)}: must be {low} or more")
        if any(s == "" for s in self.stop):
            raise UserError("--stop needs some text, e.g. --stop '\\n\\n'")

    @property
    def use_cache(self) -> bool:
        return not self.no_kv_cache

    @staticmethod
    def add_options(parser) -> None:
        hints = typing.get_type_hints(Settings)
        for f in dataclasses.fields(Settings):
            if "help" not in f.metadata:
                continue
            flag, kind = f"--{f.name.replace('_', '-')}", hints[f.name]
            if kind is bool:
                parser.add_argument(flag, action="store_true", help=f.metadata["help"])
            elif f.metadata.get("action") == "append":
                parser.add_argument(flag, action="append", default=[], help=f.metadata["help"])
            else:
                types = [t for t in typing.get_args(kind) if t is not type(None)] or [kind]
                parser.add_argument(flag, type=types[0], default=f.default, help=f.metadata["help"],
                                    **({"choices": f.metadata["choices"]} if "choices" in f.metadata else {}))

    @classmethod
    def from_args(cls, args, **more) -> "Settings":
        options = {f.name: getattr(args, f.name) for f in dataclasses.fields(cls) if "help" in f.metadata}
        # let a shell user type --stop '\n\n' for two newlines
        options["stop"] = [s.replace("\\n", "\n").replace("\\t", "\t") for s in options["stop"]]
        return cls(**options, **more)


def load_model(checkpoint: Path, device: torch.device, dtype: torch.dtype):
    """The run's model, in eval mode and in dtype, and its tokenizer. A model its run
    found barely trained is said to be so (on stderr: stdout keeps only samples)."""
    run_dir = RunDir(checkpoint)
    model, tokenizer = run_dir.load_model(device)
    barely_trained = run_dir.summary().get("barely_trained")
    if barely_trained:
        print(f"note: this model is barely trained ({barely_trained['text']}); expect noise", file=sys.stderr)
    return model.to(dtype).eval(), tokenizer


class Stream:
    """Prints one sample's text as it grows, holding back what may still change: an
    incomplete UTF-8 character (byte-level BPE) or a possible start of a stop string."""

    def __init__(self, out, stop: list[str]):
        self.out, self.printed = out, 0
        self.hold = max((len(s) for s in stop), default=1) - 1

    def update(self, text: str, final: bool = False) -> None:
        end = len(text)
        if not final:
            while end > self.printed and text[end - 1] == "\ufffd":
                end -= 1
            end -= self.hold
        if end > self.printed:
            self.out.write(text[self.printed:end])
            self.out.flush()
            self.printed = end


def cut_at_stop(text: str, start: int, stop: list[str]) -> tuple[str, bool]:
    """Cut text before the first stop string found after position `start` (the prompt)."""
    hits = [i for s in stop if (i := text.find(s, start)) >= 0]
    return (text[:min(hits)], True) if hits else (text, False)


class Samples:
    """The rows of one batch as they grow: each row's new ids, its text so far, and whether
    it has ended (at an end-of-text token, as transformers' generate ends, or a stop string)."""

    def __init__(self, tokenizer, encoded: list[list[int]], stop: list[str]):
        self.tokenizer, self.stop = tokenizer, stop
        self.prefixes = [tokenizer.decode(p) for p in encoded]
        self.texts = list(self.prefixes)
        self.new_ids: list[list[int]] = [[] for _ in encoded]
        self.done = [False] * len(encoded)
        self.ends = set(end_of_text_ids(tokenizer))

    def add(self, token: list[int]) -> bool:
        """One new token for each row (ignored where the row has ended); True once all have."""
        for row, t in enumerate(token):
            if self.done[row]:
                continue
            if t in self.ends:  # the sample ends with the end of a text, which it does not show
                self.done[row] = True
                continue
            self.new_ids[row].append(t)
            text = self.prefixes[row] + self.tokenizer.decode(self.new_ids[row])
            self.texts[row], self.done[row] = cut_at_stop(text, len(self.prefixes[row]), self.stop)
        return all(self.done)


def generate(model, tokenizer, prompts: list[str], settings: Settings, device, out=None) -> list[str]:
    """Sample settings.num_samples continuations of each prompt, in the order of the
    prompts; returns the texts."""
    out = out or sys.stdout
    encoded = [encode_prompt(tokenizer, p, model.config.block_size) for p in prompts
               for _ in range(settings.num_samples)]
    idx, mask = left_padded(encoded, device)
    generator = seeded(settings.seed, device)
    samples, rows = Samples(tokenizer, encoded, settings.stop), len(encoded)
    stream = Stream(out, settings.stop) if rows == 1 and settings.stream else None
    if stream:
        stream.update(samples.texts[0])
    start = time.perf_counter()
    tokens = model.generate_tokens(idx, settings.max_new_tokens, settings.sampling, settings.use_cache, mask, generator)
    try:
        for token in tokens:
            ended = samples.add(token.tolist())
            if stream:
                stream.update(samples.texts[0])
            if ended:
                break
    except KeyboardInterrupt:
        if not settings.interactive:
            raise
        print("\n[stopped]", file=sys.stderr)
    elapsed = time.perf_counter() - start
    if stream:
        stream.update(samples.texts[0], final=True)
        out.write("\n")
    else:
        for row, text in enumerate(samples.texts):
            if rows > 1:
                out.write(f"{'-' * 20} sample {row + 1} of {rows} {'-' * 20}\n")
            out.write(text + "\n")
    out.flush()
    if settings.stats:
        generated = sum(len(ids) for ids in samples.new_ids)
        print(f"prompt tokens: {sum(len(p) for p in encoded)} | new tokens: {generated} | "
              f"{elapsed:.2f} s | {generated / max(elapsed, 1e-9):,.1f} tokens/s | "
              f"batch {rows} | kv cache {'on' if settings.use_cache else 'off'} | {device}", file=sys.stderr)
    return samples.texts


def interactive(model, tokenizer, settings: Settings, device) -> None:
    print("Type a prompt and press Enter (Ctrl-D to quit, Ctrl-C stops a sample).", file=sys.stderr)
    while True:
        try:
            print("prompt> ", end="", file=sys.stderr, flush=True)  # stdout keeps only samples
            prompt = input()
        except EOFError:
            print(file=sys.stderr)
            return
        except KeyboardInterrupt:
            print(file=sys.stderr)
            continue
        try:
            generate(model, tokenizer, [prompt], settings, device)
        except UserError as e:
            print(f"error: {e}", file=sys.stderr)


TOOL_RESULT = "/tool "  # --chat: a line that starts so gives the result of the model's call


def chat(job: Job, model, tokenizer, checkpoint: Path, settings: Settings, device, system: str | None = None,
         tools: list[dict] | None = None) -> int:
    """generate.py --chat: each line read (from the terminal, or piped in) is the user's
    message, or lines joined where one ends in a backslash; `system` opens the conversation;
    `tools` (--tools) are the tools the model may call: a reply that calls them is shown
    call by call (on stderr), and a line "/tool RESULT" gives each call's result, after which
    the model answers. A line refused is said and the next read; the exit code is 2 where
    every line was refused."""
    session = job.chat_session(model, tokenizer, checkpoint, sampling=settings.sampling,
                               max_new_tokens=settings.max_new_tokens, generator=seeded(settings.seed, device),
                               note=lambda text: print(f"\nnote: {text}", file=sys.stderr), system=system, tools=tools,
                               fit_reply=not settings.chosen_max_new_tokens)  # (else it fits what the tools leave)
    if sys.stdin.isatty():
        print("Type a message and press Enter (end a line with \\ to go on on the next; Ctrl-D to quit)"
              + (f"; give a tool's result as {TOOL_RESULT}RESULT." if tools else "."), file=sys.stderr)
    lines = refused = 0
    for text in messages(sys.stdin):
        lines += 1
        try:
            stream = Stream(sys.stdout, [])
            if text.startswith(TOOL_RESULT):
                answer = session.tool_result(text[len(TOOL_RESULT):], stream.update)
                if answer is None:
                    say_waiting(session)
                    continue
            else:
                answer = session.reply(text, stream.update)
            stream.update(answer, final=True)
            sys.stdout.write("\n")
            sys.stdout.flush()
            say_waiting(session)
        except UserError as e:
            print(f"error: {e}", file=sys.stderr)
            refused += 1
    if lines and refused == lines:
        print(f"error: every line ({refused}) was refused, none answered", file=sys.stderr)
        return 2
    return 0


def say_waiting(session: Chat) -> None:
    """The model's calls still waiting for a result, each as the template writes it read back
    (its name and its arguments as JSON), on stderr."""
    for number, call in enumerate(session.waiting):
        called = call_of(call)
        print(f"call: {called['name']}({json.dumps(called['arguments'], ensure_ascii=False)})"
              + (f"; give its result as {TOOL_RESULT}RESULT" if number == 0 else " (its result after that one's)"),
              file=sys.stderr)


def read_tools(path: Path) -> list[dict]:
    """--tools FILE.json: the tools the model may call, a JSON list of descriptions as the
    conversations it learnt from hold them (one per tool: {"type": "function", "function":
    {"name", "description", "parameters"}})."""
    try:
        tools = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(f"--tools {path} does not exist") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UserError(f"--tools {path} is not a JSON file ({e}); give a JSON list of tool descriptions") from None
    if not isinstance(tools, list) or not tools or not all(isinstance(tool, dict) for tool in tools):
        raise UserError(f"--tools {path}: give a JSON list of tool descriptions (objects), e.g. [{{\"type\": "
                        "\"function\", \"function\": {\"name\": ..., \"parameters\": ...}}]")
    return tools


def messages(lines):
    """The messages in the lines typed: one a line, a line ending in a backslash joined to
    the next (the backslash dropped, the line break kept); empty messages skipped."""
    held = []
    for line in lines:
        line = line.rstrip("\n")
        if line.endswith("\\"):
            held.append(line[:-1])
            continue
        text, held = "\n".join([*held, line]), []
        if text.strip():
            yield text
    if held and "\n".join(held).strip():
        yield "\n".join(held)


def seeded(seed: int | None, device) -> torch.Generator:
    """A generator from --seed, or from the system's entropy when none is given."""
    generator = torch.Generator(device=device)
    if seed is not None:
        generator.manual_seed(seed)
    else:
        generator.seed()
    return generator


def parse_args(argv):
    p = OneLineParser(prog="generate.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", type=Path, default=DEFAULT_RUN, help=f"run directory (default {DEFAULT_RUN})")
    p.add_argument("--prompt", action="append", default=None,
                   help="text to continue; repeat for a batch of prompts")
    p.add_argument("--prompt-file", type=Path, help="read one prompt from a file")
    p.add_argument("--chat", action="store_true",
                   help="talk with a model fine-tuned on conversations: each line is a message (end a line with \\ "
                        "to go on on the next)")
    p.add_argument("--system", help="--chat: the system message the conversation starts with")
    p.add_argument("--tools", type=Path, metavar="FILE.json", help="--chat: the tools the model may call (a JSON list "
                   f"of tool descriptions); a line {TOOL_RESULT}RESULT gives a call's result")
    Settings.add_options(p)
    p.add_argument("--show-attention", type=Path, metavar="FILE.png",
                   help="for the first sample, prompt and generated text: every layer's attention maps "
                        "(rows: layers, columns: heads) as a PNG (the explorer's page of a text: explore.py)")
    p.add_argument("--threads", type=positive, help=thread_help("generate"))
    p.add_argument("--debug", action="store_true", help="show full tracebacks")
    return p.parse_args(argv)


def read_prompts(args) -> list[str]:
    prompts = list(args.prompt or [])
    if args.prompt_file is not None:
        if not args.prompt_file.is_file():
            raise UserError(f"prompt file {args.prompt_file} does not exist")
        try:
            prompts.append(args.prompt_file.read_text(encoding="utf-8"))
        except UnicodeDecodeError:
            raise UserError(f"prompt file {args.prompt_file} is not UTF-8 text") from None
    return prompts


def command(args) -> int:
    settings = Settings.from_args(args, stream=sys.stdout.isatty())  # (checked before any work)
    set_threads("generate", args.threads)
    prompts = read_prompts(args)
    if args.chat and (prompts or args.show_attention is not None):
        raise UserError("--chat reads its messages from the input, one a line; give it no --prompt, --prompt-file "
                        "or --show-attention")
    if args.system is not None and not args.chat:
        raise UserError("--system is the system message of a conversation: give it with --chat")
    if args.tools is not None and not args.chat:
        raise UserError("--tools are the tools a model may call in a conversation: give them with --chat")
    tools = read_tools(args.tools) if args.tools is not None else None
    interactive_mode = args.interactive or (not prompts and sys.stdin.isatty())
    device = resolve_device(args.device)
    dtype = resolve_dtype(args.dtype, device, training=False)  # 'auto': bf16 on GPUs, float32 on CPUs
    if args.show_attention is not None:
        check_attention_path(args.show_attention, interactive_mode)
    model, tokenizer = load_model(args.checkpoint, device, dtype)
    settings = dataclasses.replace(settings, suppress_tokens=suppressed_ids(tokenizer))
    if args.chat:
        return chat(job_of(RunDir(args.checkpoint)), model, tokenizer, args.checkpoint, settings, device, args.system,
                    tools)
    elif interactive_mode:
        interactive(model, tokenizer, dataclasses.replace(settings, interactive=True), device)
    else:
        texts = generate(model, tokenizer, prompts or [""], settings, device)
        if args.show_attention is not None:
            show_attention(model, tokenizer, texts[0], args.show_attention, device)
    return 0


def check_attention_path(path: Path, interactive: bool) -> None:
    """Refuse a bad --show-attention path before any work is done."""
    if interactive:
        raise UserError("--show-attention works with --prompt or --prompt-file, not in interactive mode")
    if path.suffix.lower() in (".html", ".htm"):
        raise UserError(f"--show-attention {path}: the explorer's page is explore.py's now; save the sample "
                        "and run python explore.py --prompt-file FILE --out PAGE.html")
    if path.suffix.lower() != ".png":
        raise UserError(f"--show-attention {path}: the file name must end in .png")
    check_output_folder("--show-attention", path)
    if path.is_dir():
        raise UserError(f"--show-attention {path} is a folder; give a file name ending in .png")


def show_attention(model, tokenizer, text: str, path: Path, device) -> None:
    ids = encode_or_start(tokenizer, text)[-model.config.block_size:]
    maps = attention_maps(model, torch.tensor([ids], device=device))  # [n_layer, H, T, T]
    try:
        write_atomic(path, png_bytes(heatmap_grid(maps.cpu())))
    except OSError as e:
        raise UserError(f"--show-attention {path} cannot be written ({e.strerror}); choose another path") from None
    print(f"wrote {path}: attention of {len(ids)} tokens, {maps.shape[0]} layers (rows) × {maps.shape[1]} heads "
          "(columns); row i = query token i, column j = key token j", file=sys.stderr)


def main(argv=None) -> int:
    return run_main(parse_args, command, argv, {UserError: 2, DataError: 2})  # (DataError: a template that refuses)


if __name__ == "__main__":
    sys.exit(main())
