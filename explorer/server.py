"""explore.py --serve: the explorer page on 127.0.0.1, for prompts typed in the browser.

It serves exactly four things: the page (GET /), a prompt's data (POST /api/explore),
one more token of the text with the new data (POST /api/next), and where one head's score
for a query and a key comes from (POST /api/sources), for the trained model,
the model of any step the run kept a snapshot of ("step": N: the page's slider), or
("model": "init") the run's model at initialisation. Nothing from the
disk, nothing a request names. It listens on the loopback address only and answers only
requests whose Host header names that address and port (a web page elsewhere cannot
reach it through DNS rebinding); it sends no CORS headers, so other sites' scripts
cannot read its answers. Requests and prompts are limited in size; a bad one gets a 4xx
answer (a code and values the page words in its own language, and a reason in English for
the terminal), never a 500; a client that leaves mid-answer is forgotten without a word;
and the server goes on.
"""

from __future__ import annotations

import copy
import json
import math
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import torch

from cli.program import UserError
from jobs.prompt import encode_prompt
from runs.folder import RunDir
from data.token_text import readable_decode
from data.tokenizer import suppressed_ids, unknown_characters
from inspection.circuits import score_sources
from model import Sampling
from model.sampling import sample_next

from .data import page_data, to_json
from .page import render

HOST = "127.0.0.1"
MAX_BODY = 64 * 1024  # bytes of a request body
MAX_PROMPT = 10_000  # characters of a prompt
MAX_IDS = 4096  # tokens of a text being continued


class BadRequest(Exception):
    """A request the server refuses: its HTTP status, a code and values the page words in
    its own language (strings.json: error_<code>), and a one-line reason in English."""

    def __init__(self, status: int, code: str, reason: str, **values):
        super().__init__(reason)
        self.status = status
        self.code = code
        self.values = values


class Explorer:
    """The models behind the page (the trained one, and on request the one at
    initialisation); one request uses them at a time."""

    def __init__(self, model, tokenizer, lang: str, prompt: str, max_tokens: int, initial=None, run=None,
                 timeline: dict | None = None, snapshots: dict | None = None):
        self.model = model
        self.tokenizer = tokenizer
        self.lang = lang
        self.prompt = prompt
        self.max_tokens = max_tokens
        self.initial = initial  # () -> (the model at initialisation or None, why not)
        self.run = run  # the trained model's run in a few facts (explorer.data.run_facts)
        self.init_model = None
        self.timeline = timeline  # the run's steps, losses and head scores (explorer.data.run_timeline), or None
        self.snapshots = snapshots or {}  # {step: load that step's weights into a model}
        self.stepped: tuple[int, object] | None = None  # the last snapshot asked for, kept: (step, model)
        self.lock = threading.Lock()

    def page(self) -> str:
        data = self.explore({"prompt": self.prompt})["data"] if self.prompt else None
        return render(data, self.lang, server=True, prompt=self.prompt)

    def chosen(self, request: dict):
        """(the model the request asks for, its name): "trained" (the default; with "step",
        the model of that snapshot) or "init"."""
        which = request.get("model", "trained")
        step = request.get("step")
        if which == "trained" and step is not None:
            return self.snapshot(step), which
        if which == "trained":
            return self.model, which
        if which != "init":
            raise BadRequest(400, "bad_model", 'model must be "trained" or "init"')
        with self.lock:
            if self.init_model is None:
                made, why = self.initial() if self.initial else (None, ("unreadable", RunDir.RUN_CONFIG))
                if made is None:
                    reason, path = why  # (explore.initial's reasons)
                    raise BadRequest(404, f"no_init_{reason}", f"the model at initialisation cannot be made "
                                     f"({reason.replace('_', ' ')}: {path})", path=str(path))
                self.init_model = made
        return self.init_model, which

    def snapshot(self, step) -> object:
        """The model of snapshot `step` (one of the run's; the last asked for is kept)."""
        if type(step) is not int or step not in self.snapshots:
            raise BadRequest(400, "bad_step", f"step must be one of the run's snapshots: {sorted(self.snapshots)}",
                             steps=", ".join(map(str, sorted(self.snapshots))))
        with self.lock:
            if self.stepped is None or self.stepped[0] != step:
                self.stepped = (step, self.snapshots[step](copy.deepcopy(self.model)).eval())
            return self.stepped[1]

    def explore(self, request: dict) -> dict:
        """{"prompt": text, or "ids", "model"} -> {"ids": its tokens, "data": the page's data}."""
        model, which = self.chosen(request)
        ids = request.get("ids")
        if ids is None:
            ids = self.encode(field(request, "prompt", str))
        else:
            self.check_ids(ids)
        return {"ids": ids, "prompt": readable_decode(self.tokenizer, ids), "data": self.data(ids, model, which)}

    def encode(self, prompt: str) -> list[int]:
        if not prompt:
            raise BadRequest(400, "empty", "the prompt is empty; type some text")
        if len(prompt) > MAX_PROMPT:
            raise BadRequest(413, "too_long", f"the prompt has {len(prompt):,} characters; at most {MAX_PROMPT:,} "
                             "are taken", count=len(prompt), limit=MAX_PROMPT)
        unknown = unknown_characters(self.tokenizer, prompt)
        if unknown:
            shown = " ".join(repr(c) for c in unknown[:10])
            raise BadRequest(400, "unknown", f"the prompt has characters this model never saw in training: {shown}; "
                             "remove or replace them", characters=shown)
        return encode_prompt(self.tokenizer, prompt, MAX_IDS, "the server's limit")

    def check_ids(self, ids) -> None:
        if not (isinstance(ids, list) and 0 < len(ids) < MAX_IDS and all(
                type(i) is int and 0 <= i < self.model.config.vocab_size for i in ids)):  # (not True, not 1.0)
            raise BadRequest(400, "bad_ids", f"ids must be a list of 1 to {MAX_IDS - 1} token ids below "
                             f"{self.model.config.vocab_size}")

    def next(self, request: dict) -> dict:
        """{"ids": the text's tokens (or "prompt"), "temperature", "top_k", "top_p", "model"}
        -> one more token, sampled with generate.py's rule, and the new text's data."""
        model, which = self.chosen(request)
        ids = request.get("ids") or self.encode(field(request, "prompt", str))
        self.check_ids(ids)
        temperature = request.get("temperature", 1.0)
        top_k = request.get("top_k")
        top_p = request.get("top_p")
        for name, kind_ok in (("temperature", number(temperature)), ("top_k", top_k is None or type(top_k) is int),
                              ("top_p", top_p is None or number(top_p))):
            if not kind_ok:
                raise BadRequest(400, f"bad_{name}", f"{name} must be a finite number"
                                 + (", a whole one" if name == "top_k" else "") + ("" if name == "temperature" else ", or null"))
        try:
            sampling = Sampling(float(temperature), top_k, top_p, suppressed_ids(self.tokenizer))
        except ValueError as e:  # out of its range: Sampling's message starts with the setting's name
            raise BadRequest(400, f"bad_{str(e).partition('=')[0]}", f"bad sampling settings: {e}") from None
        window = ids[-model.config.block_size:]
        with self.lock, torch.no_grad():
            logits, _ = model(torch.tensor([window]))
            token = sample_next(logits[:, -1], sampling).item()
        ids = [*ids, token]
        return {"ids": ids, "prompt": readable_decode(self.tokenizer, ids), "data": self.data(ids, model, which)}

    def sources(self, request: dict) -> dict:
        """{"ids", "model" (and "step"), "layer", "head", "query", "key"} -> where that head's
        score for (query, key) comes from (inspection/circuits.py's score_sources), for the
        text the page shows (its last max_tokens tokens, as `data` shows them)."""
        model, _ = self.chosen(request)
        ids = request.get("ids")
        self.check_ids(ids)
        shown = ids[-min(self.max_tokens, self.model.config.block_size):]
        c = model.config
        picks = {"layer": c.n_layer, "head": c.n_head, "query": len(shown)}
        for name, limit in picks.items():
            if type(request.get(name)) is not int or not 0 <= request[name] < limit:
                raise BadRequest(400, "bad_pick", f"{name} must be a whole number from 0 to {limit - 1}", name=name,
                                 limit=limit - 1)
        key = request.get("key")
        if type(key) is not int or not 0 <= key <= request["query"]:
            raise BadRequest(400, "bad_pick", f"key must be a whole number from 0 to the query, {request['query']}",
                             name="key", limit=request["query"])
        if c.norm_position != "pre":
            raise BadRequest(400, "post_ln", "a post-LN model's stream is no sum of pieces: its scores do not split")
        with self.lock, torch.no_grad():
            trace = model.eval().trace(torch.tensor([shown]))
            return score_sources(model, trace, request["layer"], request["head"], request["query"], key)

    def data(self, ids: list[int], model=None, which: str = "trained") -> dict:
        shown = ids[-min(self.max_tokens, self.model.config.block_size):]
        with self.lock:
            return page_data(model or self.model, self.tokenizer, shown, len(ids) - len(shown), which,
                             timeline=self.timeline if which == "trained" else None, run=self.run)


def field(request: dict, name: str, kind: type):
    value = request.get(name)
    if not isinstance(value, kind):
        raise BadRequest(400, "bad_field", f"the request needs {name!r} as a {kind.__name__}", name=name)
    return value


def number(value) -> bool:
    """A finite JSON number (a bool is not one, though Python counts it as an int)."""
    return type(value) in (int, float) and math.isfinite(value)


def parse_request(body: bytes) -> dict:
    """The request body as a JSON object; anything else, or a body nested too deep, or
    NaN and Infinity (not JSON, though Python's parser takes them), is refused."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise BadRequest(400, "not_utf8", "the request body is not UTF-8 text") from None
    try:
        request = json.loads(text, parse_constant=not_json)
    except json.JSONDecodeError:
        raise BadRequest(400, "not_json", "the request body is not JSON") from None
    except RecursionError:  # (the parser recurses once a level: thousands of levels exhaust Python's stack)
        raise BadRequest(400, "too_deep", "the request body is nested too deep") from None
    if not isinstance(request, dict):
        raise BadRequest(400, "not_object", "the request body must be a JSON object")
    return request


def not_json(constant: str):
    raise BadRequest(400, "not_json", f"the request body is not JSON ({constant} is not a JSON number)")


class Handler(BaseHTTPRequestHandler):
    server_version = "explore.py"
    routes = {"/api/explore": Explorer.explore, "/api/next": Explorer.next, "/api/sources": Explorer.sources}

    def do_GET(self) -> None:
        self.answer(lambda: ("text/html; charset=utf-8", self.get()))

    def do_POST(self) -> None:
        self.answer(lambda: ("application/json", self.post()))

    def refuse_method(self) -> None:
        def refuse():
            raise BadRequest(405, "bad_method", f"{self.command} is not supported; use GET / or POST /api/...",
                             method=self.command)

        self.answer(refuse)

    do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_HEAD = refuse_method

    def get(self) -> bytes:
        if self.path != "/":
            raise BadRequest(404, "not_found", f"nothing at {self.path[:100]}; the page is at /")
        return self.server.explorer.page().encode("utf-8")

    def post(self) -> bytes:
        route = self.routes.get(self.path)
        if route is None:
            raise BadRequest(404, "not_found", f"no API at {self.path[:100]}; use /api/explore, /api/next or /api/sources")
        length = self.headers.get("Content-Length", "")
        if not (length.isascii() and length.isdigit()):
            raise BadRequest(411, "no_length", "the request needs a Content-Length")
        if int(length) > MAX_BODY:
            raise BadRequest(413, "body_too_large", f"the request body has {int(length):,} bytes; at most "
                             f"{MAX_BODY:,} are taken", count=int(length), limit=MAX_BODY)
        request = parse_request(self.rfile.read(int(length)))
        return to_json(route(self.server.explorer, request)).encode("utf-8")

    def answer(self, make) -> None:
        """Check the Host, make the answer, send it: a BadRequest becomes its status and a
        JSON {"error": reason}; any other failure a 500, and the server goes on."""
        try:
            if self.headers.get("Host") not in self.server.hosts:
                raise BadRequest(421, "bad_host", f"this server answers only to {self.server.hosts[0]}",
                                 host=self.server.hosts[0])
            kind, body = make()
            status = 200
        except BadRequest as e:
            answer = {"error": str(e), "code": e.code, "values": e.values}
            kind, body, status = "application/json", to_json(answer).encode(), e.status
        except Exception as e:  # a bug: say so, keep serving
            answer = {"error": f"internal error: {e}", "code": "internal", "values": {"detail": str(e)}}
            kind, body, status = "application/json", to_json(answer).encode(), 500
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def log_message(self, format: str, *args) -> None:
        print(f"{self.command} {self.path[:100]} -> {args[1] if len(args) > 1 else ''}", file=sys.stderr)


class Server(ThreadingHTTPServer):
    daemon_threads = True  # a hung client never keeps the process from ending

    def handle_error(self, request, client_address) -> None:
        """A browser that closed the connection mid-answer (a reload, a closed tab) is not
        an error of the server's: no traceback for it."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)

    def __init__(self, port: int, explorer: Explorer):
        super().__init__((HOST, port), Handler)
        self.explorer = explorer
        port = self.server_address[1]
        self.hosts = [f"{HOST}:{port}", f"localhost:{port}"]


def serve(model, tokenizer, port: int, lang: str, prompt: str, max_tokens: int, initial=None, run=None,
          timeline: dict | None = None, snapshots: dict | None = None) -> int:
    """Serve until Ctrl-C; returns 0. initial: () -> (the model at initialisation or None,
    why not); run: the trained model's run in a few facts; timeline and snapshots: the
    run's (explorer.data.run_timeline)."""
    explorer = Explorer(model, tokenizer, lang, prompt, max_tokens, initial, run, timeline, snapshots)
    if prompt:
        try:
            explorer.explore({"prompt": prompt})
        except BadRequest as e:
            raise UserError(str(e)) from None
    try:
        server = Server(port, explorer)
    except OSError as e:
        raise UserError(f"cannot listen on {HOST}:{port} ({e.strerror or e}); choose another --port") from None
    try:  # from the moment the address is printed, Ctrl-C stops the server cleanly
        print(f"serving the explorer at http://{server.hosts[0]}/ (Ctrl-C stops)", flush=True)
        server.serve_forever()
    except KeyboardInterrupt:
        print("stopped", file=sys.stderr)
    finally:
        server.server_close()
    return 0
