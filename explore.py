"""Follow one token through your model: python explore.py [--checkpoint out/tiny] [--prompt TEXT]

Writes a self-contained HTML page (default: explorer.html in the run folder) for a
checkpoint and a prompt (default: the start of the run's validation text):
for the token you pick, its embedding, where its q, k and v come from, the five steps of
attention in every layer and head, the rest of each block, what each layer would predict
(the logit lens), and the prediction, with switches to run experiments (no scaling, no
causal mask, a head switched off), all with the model's own numbers. A second page beside
it (explorer.init.html) shows the same prompt through the run's model at initialisation;
a button switches between them. Both open from file:// with no network. Where the run kept
snapshots (train.snapshots), a slider walks the model through its training: for a small
model every panel follows it (the page carries every snapshot's weights), for a larger one
the maps, prediction, logit lens and each token's loss of the example text. With --serve,
the same page is served on 127.0.0.1 for prompts typed in the browser, which the model
can continue token by token.
Exit codes: 0 ok, 2 bad input.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

from cli.program import OneLineParser, UserError, check_output_folder, locale_language, positive, run_main
from runs.folder import DEFAULT_RUN, RunDir
from machine.threads import set_threads, thread_help
from explorer.data import (MAX_TOKENS, carries_snapshots, default_prompt, initial_model, page_model, prompt_data,
                           run_facts, run_timeline)
from explorer.page import render, strings
from storage.atomic import write_atomic

PAGE_NAME = "explorer.html"  # written into the run folder unless --out says otherwise
SAID = {  # what explore.py prints, in the page's language (--lang); why no page can be made: strings.json
    "en": {"wrote": "wrote {out} ({mb:.2f} MB): {tokens} {tokens_word}, {layers} layers × {heads} heads; open it in "
                    "a browser",
           "runs": ", and type any text into it: it runs the model itself",
           "wroteInit": "wrote {out} ({mb:.2f} MB): the same prompt through the model at initialisation (the page's "
                        "button switches between them)",
           "noInit": "note: no page of the model at initialisation. ",
           "truncated": "note: the prompt has {count} tokens; the page shows the last {kept} ({limit})"},
    "zh": {"wrote": "已写出 {out}（{mb:.2f} MB）：{tokens} 个 token，{layers} 层 × {heads} 个头；用浏览器打开它",
           "runs": "，还可以在里面输入任意文字：页面自己运行这个模型",
           "wroteInit": "已写出 {out}（{mb:.2f} MB）：同一段提示词经过初始化时的模型（页面上的按钮在两者之间切换）",
           "noInit": "注意：没有初始化时模型的页面。",
           "truncated": "注意：提示词有 {count} 个 token；页面只显示最后 {kept} 个（{limit}）"},
}



def initial(model, checkpoint: Path):
    """(The run's model at initialisation, None) or (None, (why it cannot be made, the path
    that says so); strings.json words each reason as error_no_init_<why>): training built it
    with GPT.initialised and the seed its config.yaml records; a run that started from other
    weights (train.init_from) has none of its own."""
    run = RunDir(checkpoint)
    try:
        train = run.run_config().get("train") or {}
    except UserError:
        return None, ("unreadable", run.path / run.RUN_CONFIG)
    if not isinstance(train, dict):
        train = {}
    if train.get("init_from"):
        return None, ("init_from", train["init_from"])
    if not isinstance(train.get("seed"), int):
        return None, ("no_seed", run.path / run.RUN_CONFIG)
    return initial_model(model, train["seed"]), None


def counterpart_of(path: Path) -> Path:
    """explorer.html -> explorer.init.html: the page of the model at initialisation."""
    return path.with_name(f"{path.stem}.init{path.suffix}")


def check_out(path: Path) -> None:
    """Refuse a bad --out before any work is done."""
    if path.is_dir():
        raise UserError(f"--out {path} is a folder; give a file name ending in .html")
    if path.suffix.lower() not in (".html", ".htm"):
        raise UserError(f"--out {path}: the file name must end in .html")
    check_output_folder("--out", path)


def write_page(path: Path, html: str) -> None:
    try:
        write_atomic(path, html.encode("utf-8"))  # an old page stays whole if this fails
    except OSError as e:
        raise UserError(f"--out {path} cannot be written ({e.strerror or e}); choose another path") from None


def parse_args(argv):
    p = OneLineParser(prog="explore.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", type=Path, default=DEFAULT_RUN, help=f"run directory (default {DEFAULT_RUN})")
    p.add_argument("--prompt", help="the text to look at (its last --max-tokens tokens; default: the start of the "
                                    "run's validation text)")
    p.add_argument("--prompt-file", type=Path, help="read the text from a UTF-8 file instead (a sample of generate.py)")
    p.add_argument("--max-tokens", type=int, default=MAX_TOKENS,
                   help=f"at most this many tokens, from the end (default {MAX_TOKENS})")
    p.add_argument("--out", type=Path, help=f"the HTML file to write (default: {PAGE_NAME} in the run folder)")
    p.add_argument("--lang", choices=["en", "zh"], help="the page's starting language (default: from the locale)")
    p.add_argument("--serve", action="store_true", help="serve the page on 127.0.0.1 instead of writing a file")
    p.add_argument("--port", type=int, default=8000, help="port for --serve (default 8000; 0 picks a free one)")
    p.add_argument("--threads", type=positive, help=thread_help("explore"))
    p.add_argument("--debug", action="store_true", help="show full tracebacks")
    args = p.parse_args(argv)
    if args.max_tokens < 1:
        p.error(f"--max-tokens={args.max_tokens}: must be at least 1")
    if not 0 <= args.port <= 65535:
        p.error(f"--port={args.port}: must be between 0 and 65535")
    if args.prompt is not None and args.prompt_file is not None:
        p.error("give --prompt or --prompt-file, not both")
    return args


def read_prompt(args) -> str | None:
    """--prompt, or the text of --prompt-file."""
    if args.prompt_file is None:
        return args.prompt
    try:
        return args.prompt_file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(f"prompt file {args.prompt_file} does not exist") from None
    except (UnicodeDecodeError, IsADirectoryError):
        raise UserError(f"prompt file {args.prompt_file} is not a UTF-8 text file") from None


def command(args) -> int:
    set_threads("explore", args.threads)
    lang = args.lang or locale_language()
    run = RunDir(args.checkpoint)
    prompt = read_prompt(args)
    if args.serve:
        from explorer.server import serve

        model, tokenizer = run.load_model()
        timeline, snapshots = run_timeline(model.eval(), tokenizer, run)
        return serve(model, tokenizer, args.port, lang, prompt or "", args.max_tokens,
                     lambda: initial(model, args.checkpoint), run_facts(run.summary()), timeline, snapshots)
    if args.out is not None:
        check_out(args.out)  # (before any work)
    model, tokenizer = run.load_model()
    out = args.out if args.out is not None else run.path / PAGE_NAME
    check_out(out)
    if prompt is None:
        prompt = default_prompt(run, tokenizer, args.max_tokens)
        if prompt is None:
            raise UserError(f"{run.path} has no validation text to show; give --prompt TEXT or --prompt-file FILE")
    carried = carries_snapshots(model, len(run.snapshot_paths()))
    runnable, why_not = page_model(model, tokenizer)  # (a page that runs the model finds each score's sources itself)
    data = prompt_data(model.eval(), tokenizer, prompt, args.max_tokens, run=run, carry_weights=carried,
                       sources=runnable is None)
    init_model, why = initial(model, args.checkpoint)
    other = counterpart_of(out)
    page = functools.partial(render, lang=lang, prompt=prompt, max_tokens=args.max_tokens)
    html = page(data, counterpart=other.name if init_model is not None else None, model=runnable, why_not=why_not)
    write_page(out, html)
    said = SAID[lang]
    tokens = len(data["tokens"])
    if data["truncated"]:
        limit = "--max-tokens" if args.max_tokens <= model.config.block_size else "block_size"
        print(said["truncated"].format(count=tokens + data["truncated"], kept=tokens, limit=limit), file=sys.stderr)
    print(said["wrote"].format(out=out, mb=len(html.encode("utf-8")) / 1e6, tokens=tokens, layers=model.config.n_layer,
                               heads=model.config.n_head, tokens_word="token" if tokens == 1 else "tokens")
          + ("" if runnable is None else said["runs"]))
    if why_not is not None:
        values = {name: f"{value:,}" for name, value in why_not["values"].items()}
        print(strings()[lang][f"whyNot_{why_not['code']}"].format(**values), file=sys.stderr)
    if init_model is None:
        reason, path = why
        print(said["noInit"] + strings()[lang][f"error_no_init_{reason}"].format(path=path), file=sys.stderr)
        return 0
    init_html = page(prompt_data(init_model, tokenizer, prompt, args.max_tokens, "init", sources=runnable is None),
                     counterpart=out.name, model=runnable and page_model(init_model, tokenizer)[0])
    write_page(other, init_html)
    print(said["wroteInit"].format(out=other, mb=len(init_html.encode("utf-8")) / 1e6))
    return 0


def main(argv=None) -> int:
    return run_main(parse_args, command, argv, {UserError: 2})


if __name__ == "__main__":
    sys.exit(main())
