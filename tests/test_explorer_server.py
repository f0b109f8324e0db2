"""explore.py --serve without a browser: it answers its API on 127.0.0.1 for either model,
refuses the rest with a 4xx and a code the page can word, serves concurrent requests and
stops on Ctrl-C."""

import http.client
import json
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

import explore
from conftest import ROOT
from test_explorer import make_run, trained_run  # noqa: F401 (a fixture)


def start_server(run: Path) -> tuple[subprocess.Popen, int]:
    # Ctrl-C's default action, even where these tests run in a background job (whose shell
    # ignores SIGINT for it, and the child would inherit that and never stop)
    default_ctrl_c = (lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)) if sys.platform != "win32" else None
    proc = subprocess.Popen([sys.executable, str(ROOT / "explore.py"), "--serve", "--port", "0", "--checkpoint",
                             str(run), "--prompt", "ROMEO:", "--lang", "en"], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=default_ctrl_c)
    line = proc.stdout.readline()
    match = re.search(r"http://127\.0\.0\.1:(\d+)/", line)
    assert match, line + proc.stderr.read()
    return proc, int(match.group(1))


@pytest.fixture(scope="module")
def served_run(tmp_path_factory):
    run = make_run(tmp_path_factory.mktemp("served") / "run")
    (run / "config.yaml").write_text("train:\n  seed: 3\n")  # so that it can re-create its initial model
    return run


@pytest.fixture
def server(served_run):
    proc, port = start_server(served_run)
    yield proc, port
    if proc.poll() is None:
        proc.kill()
        proc.wait()


@pytest.fixture
def served(served_run):
    """The server of explore.py --serve in a thread of this process (the API tests reach its
    code here, where mutation testing sees them): (its port, what its log printed)."""
    from runs.folder import RunDir
    from explore import initial
    from explorer.server import Explorer, Server

    model, tokenizer = RunDir(served_run).load_model()
    server = Server(0, Explorer(model.eval(), tokenizer, "en", "ROMEO:", 64, lambda: initial(model, served_run)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def request(port: int, method: str, path: str, body: bytes | None = None, host: str | None = None):
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    headers = {"Host": host or f"127.0.0.1:{port}"}
    if body is not None:
        headers["Content-Type"] = "application/json"
    connection.request(method, path, body=body, headers=headers)
    response = connection.getresponse()
    answer = response.status, dict(response.getheaders()), response.read()
    connection.close()
    return answer


def api(port: int, path: str, payload) -> tuple[int, dict]:
    status, _, body = request(port, "POST", path, json.dumps(payload).encode())
    return status, json.loads(body)


def test_the_server_answers_its_api_and_refuses_the_rest(served):
    port = served
    status, headers, body = request(port, "GET", "/")
    assert status == 200 and headers["Content-Type"].startswith("text/html") and b"explorer-data" in body
    assert not any(h.lower().startswith("access-control") for h in headers)  # no CORS
    status, answer = api(port, "/api/explore", {"prompt": "But soft"})
    assert status == 200 and "".join(t["text"] for t in answer["data"]["tokens"]) == "But soft"
    status, answer = api(port, "/api/next", {"ids": answer["ids"], "temperature": 0})
    assert status == 200 and answer["prompt"].startswith("But soft") and len(answer["ids"]) == 9
    status, init = api(port, "/api/explore", {"ids": answer["ids"], "model": "init"})  # the same tokens, at init
    assert status == 200 and init["data"]["model"] == "init" and init["data"]["tokens"] == answer["data"]["tokens"]
    assert init["data"]["layers"][0]["attn"] != answer["data"]["layers"][0]["attn"]
    refused = [
        (request(port, "GET", "/", host="evil.example:80"), 421, "answers only to"),
        (request(port, "GET", "/tokenizer.json"), 404, "nothing at"),
        (request(port, "GET", "/../model.safetensors"), 404, "nothing at"),
        (request(port, "POST", "/api/run", b"{}"), 404, "no API"),
        (request(port, "PUT", "/", b"{}"), 405, "not supported"),
        (request(port, "POST", "/api/explore", b"{not json"), 400, "not JSON"),
        (request(port, "POST", "/api/explore", b'{"prompt": "\xff\xfe"}'), 400, "not UTF-8"),
        (request(port, "POST", "/api/explore", json.dumps({"prompt": "x" * 10_001}).encode()), 413, "at most 10,000"),
        (request(port, "POST", "/api/explore", b" " * (64 * 1024 + 1)), 413, "at most 65,536"),
        (request(port, "POST", "/api/explore", json.dumps({"prompt": "Zebra"}).encode()), 400, "never saw"),
        (request(port, "POST", "/api/explore", json.dumps({"prompt": ""}).encode()), 400, "empty"),
        (request(port, "POST", "/api/next", json.dumps({"ids": [10**6]}).encode()), 400, "token ids"),
        (request(port, "POST", "/api/next", json.dumps({"prompt": "R", "top_k": 0}).encode()), 400, "top_k"),
        (request(port, "POST", "/api/explore", json.dumps({"prompt": "R", "model": "other"}).encode()), 400, "model"),
    ]
    for (status, _, body), expected, reason in refused:
        assert status == expected and reason in json.loads(body)["error"], body
    _, _, body = request(port, "POST", "/api/explore", json.dumps({"prompt": "Zebra"}).encode())
    assert json.loads(body)["code"] == "unknown" and json.loads(body)["values"] == {"characters": "'Z'"}
    assert request(port, "GET", "/")[0] == 200  # still serving


def test_concurrent_requests_are_all_answered(served):
    port = served
    results = []
    threads = [threading.Thread(target=lambda i=i: results.append(api(port, "/api/next", {"prompt": "ROMEO:",
                                                                                          "temperature": 1.0})[0]))
               for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert results == [200] * 8


def test_the_page_is_served_with_the_prompt_and_without_one(served, served_run, capsys):
    from runs.folder import RunDir
    from explorer.server import Explorer

    status, headers, body = request(served, "GET", "/")
    page = body.decode()
    assert status == 200 and headers["Cache-Control"] == "no-store" and headers["X-Content-Type-Options"] == "nosniff"
    assert '"server":true' in page and '"prompt":"ROMEO:"' in page and '"model":"trained"' in page
    model, tokenizer = RunDir(served_run).load_model()
    facts = {"iteration": 3, "tokens": 96, "val_loss": 4.0, "weights": "trained", "barely_trained": None}
    empty = Explorer(model, tokenizer, "zh", "", 8, run=facts)
    assert '<script type="application/json" id="explorer-data">null</script>' in empty.page()  # waits for a prompt
    assert empty.data(tokenizer.encode("ROMEO").ids)["model"] == "trained"
    assert empty.data(tokenizer.encode("ROMEO").ids)["run"] == facts  # the trained model's run, on every answer
    assert request(served, "HEAD", "/")[0] == 405
    assert "GET / -> 200" in capsys.readouterr().err  # one line of log a request
    status, answer = api(served, "/api/explore", {"prompt": "ROMEO: But soft, what light through yonder window"})
    assert answer["data"]["truncated"] == 0 and len(answer["data"]["tokens"]) == len(answer["ids"])
    status, answer = api(served, "/api/next", {"prompt": "ROMEO:", "temperature": 0, "top_k": 1, "top_p": 0.5,
                                               "model": "init"})
    assert status == 200 and answer["data"]["model"] == "init" and len(answer["ids"]) == 7
    status, answer = api(served, "/api/next", {"prompt": "R", "temperature": -1})
    assert status == 400 and answer["code"] == "bad_temperature" and "temperature=-1.0" in answer["error"]


def test_refusals_carry_the_code_and_values_the_page_words_them_with(served):
    """Each refusal is JSON with the code of a strings.json message and its values; a body
    that is JSON but no object is refused too."""
    for path, payload, status, code, values in [
        ("/api/next", {"ids": [10**6]}, 400, "bad_ids", {}),
        ("/api/explore", {"prompt": "x" * 10_001}, 413, "too_long", {"count": 10_001, "limit": 10_000}),
        ("/api/next", {"prompt": "R", "top_k": "3"}, 400, "bad_top_k", {}),
        ("/api/explore", {"prompt": 7}, 400, "bad_field", {"name": "prompt"}),
    ]:
        got, headers, body = request(served, "POST", path, json.dumps(payload).encode())
        answer = json.loads(body)
        assert (got, answer["code"], answer["values"]) == (status, code, values), answer
        assert headers["Content-Type"] == "application/json"
    got, _, body = request(served, "POST", "/api/explore", b"[1, 2]")
    assert got == 400 and json.loads(body) == {"error": "the request body must be a JSON object", "code": "not_object",
                                               "values": {}}
    got, _, body = request(served, "POST", "/api/explore", b" " * (64 * 1024 + 1))
    assert got == 413 and json.loads(body)["values"] == {"count": 64 * 1024 + 1, "limit": 64 * 1024}


@pytest.mark.parametrize("body, code", [
    (b'{"ids": [true, false]}', "bad_ids"),  # (Python counts a bool as an int)
    (b'{"ids": [1.0, 2.0]}', "bad_ids"),  # a float where a token id belongs
    (b'{"ids": [-1]}', "bad_ids"),
    (b'{"ids": [1, 2], "temperature": NaN}', "not_json"),  # (Python's parser takes NaN; JSON has none)
    (b'{"ids": [1, 2], "temperature": Infinity}', "not_json"),
    (b'{"ids": [1, 2], "temperature": 1e999}', "bad_temperature"),  # a JSON number that is infinite as a float
    (b'{"ids": [1, 2], "temperature": true}', "bad_temperature"),
    (b'{"ids": [1, 2], "temperature": "hot"}', "bad_temperature"),
    (b'{"ids": [1, 2], "top_k": 2.0}', "bad_top_k"),
    (b'{"ids": [1, 2], "top_p": 1e999}', "bad_top_p"),
    (b'{"ids": [1, 2], "top_p": 1.5}', "bad_top_p"),
    (b'{"ids": [1, 2], "model": 5}', "bad_model"),
    (b"[" * 20_000 + b"]" * 20_000, "too_deep"),
    (b'{"a":' * 6_000 + b"1" + b"}" * 6_000, "too_deep"),  # (within the size limit)
])
def test_a_malformed_request_is_a_4xx_with_a_code_never_a_500(served, body, code):
    status, _, answer = request(served, "POST", "/api/next", body)
    answer = json.loads(answer)
    assert (status, answer["code"]) == (400, code), answer


def test_every_refusal_has_words_in_both_languages():
    """The page says each refusal in its own language: each code the server can send (every
    BadRequest in its source, and what Sampling refuses) has a message in en and zh."""
    import ast

    source = (ROOT / "explorer" / "server.py").read_text()
    codes = {call.args[1].value for call in ast.walk(ast.parse(source))
             if isinstance(call, ast.Call) and getattr(call.func, "id", None) == "BadRequest"
             and isinstance(call.args[1], ast.Constant)}
    codes |= {"bad_temperature", "bad_top_k", "bad_top_p", "internal"}  # (made from a setting's name; a 500)
    assert len(codes) >= 20
    strings = json.loads((ROOT / "explorer" / "page" / "strings.json").read_text())
    for lang in ("en", "zh"):
        assert {f"error_{code}" for code in codes} <= set(strings[lang]), lang


def test_a_client_that_leaves_mid_answer_leaves_no_traceback(served_run, capsys):
    """A browser that closes the connection before the answer is written: the server says
    nothing of it (no traceback) and goes on."""
    from runs.folder import RunDir
    from explorer.server import Explorer, Server

    model, tokenizer = RunDir(served_run).load_model()
    server = Server(0, Explorer(model.eval(), tokenizer, "en", "ROMEO:", 64))
    try:
        raise BrokenPipeError(32, "Broken pipe")
    except BrokenPipeError:
        server.handle_error(None, ("127.0.0.1", 1))
    try:
        raise ValueError("a bug")
    except ValueError:
        server.handle_error(None, ("127.0.0.1", 1))
    server.server_close()
    err = capsys.readouterr().err
    assert "BrokenPipeError" not in err and "ValueError: a bug" in err  # other failures still say so


def test_the_next_token_is_sampled_from_the_last_position_with_generates_rule(served, served_run, monkeypatch):
    """/api/next samples from the logits of the prompt's last position, at temperature 1
    unless told, never a suppressed token (a char tokenizer's <unk>)."""
    import explorer.server
    from runs.folder import RunDir
    from data.tokenizer import suppressed_ids

    seen = []
    real = explorer.server.sample_next
    monkeypatch.setattr(explorer.server, "sample_next", lambda logits, sampling: seen.append((logits, sampling))
                        or real(logits, sampling))
    model, tokenizer = RunDir(served_run).load_model()
    ids = tokenizer.encode("ROMEO: But").ids
    status, answer = api(served, "/api/next", {"ids": ids})
    (logits, sampling), = seen
    assert status == 200 and sampling.temperature == 1.0 and sampling.suppress_tokens == suppressed_ids(tokenizer) != ()
    with torch.no_grad():
        torch.testing.assert_close(logits, model.eval()(torch.tensor([ids]))[0][:, -1])
    status, answer = api(served, "/api/next", {"ids": ids, "temperature": 0})
    assert answer["ids"][-1] == int(seen[-1][0].argmax()) and answer["data"]["model"] == "trained"


def test_a_failure_inside_is_a_500_and_the_server_goes_on(served, monkeypatch):
    import explorer.server

    def broken(*args, **kwargs):
        raise RuntimeError("a bug")

    monkeypatch.setattr(explorer.server, "page_data", broken)
    status, headers, body = request(served, "POST", "/api/explore", json.dumps({"prompt": "R"}).encode())
    assert (status, json.loads(body)) == (500, {"error": "internal error: a bug", "code": "internal",
                                                "values": {"detail": "a bug"}})
    assert headers["Content-Type"] == "application/json"
    monkeypatch.undo()
    assert api(served, "/api/explore", {"prompt": "R"})[0] == 200


def test_an_answer_to_head_has_no_body(served):
    """HEAD is refused (405) with the headers of the answer and, as HTTP asks, no body."""
    import socket

    with socket.create_connection(("127.0.0.1", served), timeout=30) as connection:
        connection.sendall(f"HEAD / HTTP/1.1\r\nHost: 127.0.0.1:{served}\r\nConnection: close\r\n\r\n".encode())
        raw = b""
        while chunk := connection.recv(65536):
            raw += chunk
    head, body = raw.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.0 405") and b"Content-Length: " in head and body == b""


def test_a_run_without_its_initial_model_says_why(tmp_path):
    from runs.folder import RunDir
    from explorer.server import BadRequest, Explorer

    run = make_run(tmp_path / "run")  # no config.yaml: no seed recorded
    model, tokenizer = RunDir(run).load_model()
    explorer = Explorer(model, tokenizer, "en", "", 8, lambda: explore.initial(model, run))
    with pytest.raises(BadRequest) as refused:
        explorer.explore({"prompt": "R", "model": "init"})
    assert refused.value.status == 404 and refused.value.code == "no_init_no_seed"
    assert refused.value.values == {"path": str(run / "config.yaml")}
    (run / "config.yaml").write_text("train:\n  init_from: gpt2\n")
    with pytest.raises(BadRequest) as refused:
        explorer.explore({"prompt": "R", "model": "init"})
    assert refused.value.code == "no_init_init_from" and refused.value.values == {"path": "gpt2"}


def test_ctrl_c_stops_the_server(server):
    proc, port = server
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=20) == 0
    assert "stopped" in proc.stderr.read()


def test_a_log_line_without_a_status_ends_with_the_arrow(capsys):
    """http.server logs errors (a timed-out request) through log_message too, with no status."""
    from explorer.server import Handler

    handler = Handler.__new__(Handler)  # no connection: only the log line is made
    handler.command, handler.path = "GET", "/"
    handler.log_message("Request timed out: %r", TimeoutError())
    handler.log_message('"%s" %s %s', "GET / HTTP/1.1", "200", "-")
    assert capsys.readouterr().err == "GET / -> \nGET / -> 200\n"


def test_serve_checks_its_prompt_before_listening_and_stops_on_ctrl_c(served_run, monkeypatch, capsys):
    from runs.folder import RunDir
    from cli.program import UserError
    from explorer.server import Server, serve

    model, tokenizer = RunDir(served_run).load_model()
    with pytest.raises(UserError, match="characters this model never saw in training: 'Z'"):
        serve(model, tokenizer, 0, "en", "Zebra", 8)

    def interrupted(self):
        raise KeyboardInterrupt

    monkeypatch.setattr(Server, "serve_forever", interrupted)
    assert serve(model, tokenizer, 0, "en", "ROMEO:", 8) == 0
    printed = capsys.readouterr()
    assert re.search(r"at http://127\.0\.0\.1:\d+/ \(Ctrl-C stops\)", printed.out) and "stopped" in printed.err


def test_the_server_runs_the_model_of_any_snapshot(trained_run):
    """--serve's slider: "step": N answers with the data of snapshot N (its own forward
    pass, with the run's timeline), and a step the run has no snapshot of is a 400."""
    from runs.folder import RunDir
    from explorer.data import page_data, run_timeline
    from explorer.server import BadRequest, Explorer
    from model import GPT
    from test_explorer import assert_same_page_data

    run = RunDir(trained_run)
    model, tokenizer = run.load_model()
    timeline, snapshots = run_timeline(model.eval(), tokenizer, run)
    assert timeline["steps"] == [0, 4, 8, 12, 16, 20] and timeline["samples"] is None
    explorer = Explorer(model, tokenizer, "en", "", 64, None, None, timeline, snapshots)
    answer = explorer.explore({"prompt": "MACBETH:\nSo foul", "step": 8})
    at_8 = run.load_snapshot(8, GPT.from_pretrained(trained_run)).eval()
    expected = page_data(at_8, tokenizer, answer["ids"], timeline=timeline)
    assert_same_page_data(answer["data"], expected, atol=1e-6, rtol=1e-6)
    trained = explorer.explore({"prompt": "MACBETH:\nSo foul"})["data"]
    assert trained["prediction"] != answer["data"]["prediction"]  # (another model: other numbers)
    for step in (7, "8", True):
        with pytest.raises(BadRequest, match="step must be one of the run's snapshots: \\[0, 4, 8, 12, 16, 20\\]"):
            explorer.explore({"prompt": "MACBETH", "step": step})


def test_the_server_splits_any_score_of_any_step(trained_run):
    """/api/sources: where a head's score for (query, key) comes from, for the model of the
    step asked for (inspection/circuits.py on that snapshot's trace); picks outside the text
    or the model are refused by name."""
    from runs.folder import RunDir
    from explorer.data import run_timeline
    from explorer.server import BadRequest, Explorer
    from inspection.circuits import score_sources
    from model import GPT

    run = RunDir(trained_run)
    model, tokenizer = run.load_model()
    timeline, snapshots = run_timeline(model.eval(), tokenizer, run)
    explorer = Explorer(model, tokenizer, "en", "", 64, None, None, timeline, snapshots)
    ids = explorer.explore({"prompt": "MACBETH:\nSo foul"})["ids"]
    answer = explorer.sources({"ids": ids, "step": 8, "layer": 1, "head": 0, "query": 12, "key": 3})
    at_8 = run.load_snapshot(8, GPT.from_pretrained(trained_run)).eval()
    with torch.no_grad():
        expected = score_sources(at_8, at_8.trace(torch.tensor([ids])), 1, 0, 12, 3)
    assert answer == expected and sum(map(sum, answer["contributions"])) == pytest.approx(answer["score"], abs=1e-5)
    for pick, said in (({"layer": 2}, "layer must be a whole number from 0 to 1"), ({"query": 99}, "query must be"),
                       ({"key": 13}, "key must be a whole number from 0 to the query, 12"), ({"head": "0"}, "head must")):
        with pytest.raises(BadRequest, match=said):
            explorer.sources({"ids": ids, "layer": 1, "head": 0, "query": 12, "key": 3, **pick})
