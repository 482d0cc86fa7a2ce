"""The server at the HTTP level, with ``httpx``: the raw event stream, clients that go away, the limits
and the API key on every route, many clients at once, and Ctrl-C."""

from __future__ import annotations

import asyncio
import base64
import json
import re
import signal
import time
from pathlib import Path

import httpx
import pytest

from serve_process import ServerProcess
from torchburn_llm import LLM

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
LONG = [{"role": "user", "content": "Write a very long story about a dragon, with many chapters."}]


def health(server: ServerProcess) -> dict[str, int]:
    return dict(httpx.get(server.url + "/health", timeout=10).json())


def wait_idle(server: ServerProcess, timeout: float = 20.0) -> dict[str, int]:
    deadline = time.monotonic() + timeout
    while True:
        state = health(server)
        if (state["requests_decoding"] == 0 and state["requests_waiting"] == 0) or time.monotonic() > deadline:
            return state
        time.sleep(0.1)


def test_raw_event_stream(server: ServerProcess) -> None:
    body = {"model": "m", "messages": QUESTION, "max_tokens": 8, "temperature": 0, "stream": True}
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        raw = r.read().decode()
    events = raw.split("\n\n")
    assert events[-1] == ""
    lines = events[:-1]
    assert all(e.startswith("data: ") for e in lines)
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(e.removeprefix("data: ")) for e in lines[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")
    assert "usage" not in chunks[0]  # only with stream_options.include_usage


def test_disconnect_cancels_generation_and_frees_the_cache(server: ServerProcess) -> None:
    wait_idle(server)
    body = {"model": "m", "messages": LONG, "max_tokens": 1500, "temperature": 0.8, "stream": True}
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=60) as r:
        seen = 0
        for line in r.iter_lines():
            if line.startswith("data: {"):
                seen += 1
            if seen == 5:
                assert health(server)["requests_decoding"] == 1
                assert health(server)["kv_cache_bytes"] > 0
                break
    state = wait_idle(server)
    assert state["requests_decoding"] == 0
    assert state["kv_cache_bytes"] == 0


def test_disconnect_of_a_whole_answer_request_cancels_it(server: ServerProcess) -> None:
    wait_idle(server)
    body = {"model": "m", "messages": LONG, "max_tokens": 1500, "temperature": 0.8}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.url + "/v1/chat/completions", json=body, timeout=1.5)
    state = wait_idle(server)
    assert state["requests_decoding"] == 0 and state["kv_cache_bytes"] == 0


def test_concurrent_requests_are_batched_and_answer_as_alone(server: ServerProcess, llm: LLM) -> None:
    """Greedy answers of four clients at once equal each one's answer alone, and the steps held
    more than one sequence."""
    questions = ["What is the capital of France?", "Name a fruit.", "What is 2+2?", "Say hello in Spanish."]
    before = health(server)

    async def ask(client: httpx.AsyncClient, q: str) -> str:
        body = {"model": "m", "messages": [{"role": "user", "content": q}], "max_tokens": 24, "temperature": 0}
        r = await client.post(server.url + "/v1/chat/completions", json=body, timeout=120)
        return str(r.json()["choices"][0]["message"]["content"])

    async def main() -> list[str]:
        async with httpx.AsyncClient() as client:
            return await asyncio.gather(*(ask(client, q) for q in questions))

    answers = asyncio.run(main())
    after = health(server)
    for q, got in zip(questions, answers, strict=True):
        assert got == llm.chat_completion([{"role": "user", "content": q}], max_new_tokens=24, temperature=0)
    steps = after["decode_steps"] - before["decode_steps"]
    tokens = after["decode_step_tokens"] - before["decode_step_tokens"]
    assert tokens / steps > 1.5  # sequences shared steps


def test_shared_prefix_is_reused(server: ServerProcess) -> None:
    system = {"role": "system", "content": "You are a terse assistant who answers in one word. " * 8}
    body = {"model": "m", "max_tokens": 2, "temperature": 0}
    first = httpx.post(
        server.url + "/v1/chat/completions", json={**body, "messages": [system, QUESTION[0]]}, timeout=60
    ).json()
    second = httpx.post(
        server.url + "/v1/chat/completions",
        json={**body, "messages": [system, {"role": "user", "content": "Name a color."}]},
        timeout=60,
    ).json()
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= 60 and cached < second["usage"]["prompt_tokens"]
    assert first["usage"]["prompt_tokens"] > cached


@pytest.mark.parametrize(
    ("body", "status", "fragment"),
    [
        (b"{not json", 400, "not valid JSON"),
        (b"[1, 2]", 400, "JSON object"),
        (json.dumps({"messages": []}).encode(), 400, "messages"),
        (json.dumps({"messages": [{"role": "wizard", "content": "x"}]}).encode(), 400, "role"),
        (json.dumps({"messages": QUESTION, "stop": ["x"] * 40}).encode(), 400, "stop"),
        (json.dumps({"messages": QUESTION, "temperature": "hot"}).encode(), 400, "temperature"),
        # nesting past Python's recursion limit, and past the server's own limit
        (b"[" * 200_000, 400, "nests deeper"),
        (b'{"messages": ' + b"[" * 80 + b"]" * 80 + b"}", 400, "nests deeper"),
    ],
)
def test_malformed_requests_get_openai_errors(server: ServerProcess, body: bytes, status: int, fragment: str) -> None:
    r = httpx.post(
        server.url + "/v1/chat/completions", content=body, headers={"content-type": "application/json"}, timeout=30
    )
    assert r.status_code == status
    error = r.json()["error"]
    assert fragment in error["message"] and error["type"] == "invalid_request_error"
    assert "Traceback" not in r.text


def test_tokenize_and_detokenize_are_the_models_tokenizer(server: ServerProcess, llm: LLM) -> None:
    """llama-server's /tokenize and /detokenize, checked against the tokenizer in this process."""
    text = "Hello wörld: naïve café, 東京 🙂"
    ids = llm.encode(text)
    r = httpx.post(server.url + "/tokenize", json={"content": text}, timeout=30)
    assert r.status_code == 200 and r.json() == {"tokens": ids}
    special = httpx.post(server.url + "/tokenize", json={"content": text, "add_special": True}, timeout=30)
    assert special.json()["tokens"] == llm.prompt_ids(text)
    pieces = httpx.post(server.url + "/tokenize", json={"content": "Hello world", "with_pieces": True}, timeout=30)
    want = llm.encode("Hello world")
    assert [p["id"] for p in pieces.json()["tokens"]] == want
    assert "".join(p["piece"] for p in pieces.json()["tokens"]) == "Hello world"
    back = httpx.post(server.url + "/detokenize", json={"tokens": ids}, timeout=30)
    assert back.status_code == 200 and back.json() == {"content": text}
    chat = llm.encode(llm.apply_chat_template(QUESTION))  # special tokens come back as their text
    assert httpx.post(server.url + "/detokenize", json={"tokens": chat}, timeout=30).json()["content"] == (
        llm.tokenizer.decode(chat, skip_special_tokens=False)
    )


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/detokenize", {"tokens": [1, -1]}, "tokens"),
        ("/detokenize", {"tokens": [49152]}, "tokens"),
        ("/detokenize", {"tokens": "abc"}, "tokens"),
        ("/tokenize", {"content": ["not", "text"]}, "content"),
        ("/tokenize", {}, "content"),
    ],
)
def test_tokenize_routes_refuse_bad_input(
    server: ServerProcess, path: str, body: dict[str, object], param: str
) -> None:
    r = httpx.post(server.url + path, json=body, timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param and "Traceback" not in r.text


def test_unknown_route_and_method_are_openai_errors(server: ServerProcess) -> None:
    r = httpx.get(server.url + "/v1/nothing", timeout=10)
    assert r.status_code == 404 and "error" in r.json()
    r = httpx.get(server.url + "/v1/chat/completions", timeout=10)
    assert r.status_code == 405 and "error" in r.json()


@pytest.mark.parametrize(
    "path", ["/", "/health", "/v1/models", "/api/tags", "/api/version", "/props", "/static/chat.js"]
)
def test_head_answers_as_get_without_a_body(server: ServerProcess, path: str) -> None:
    got = httpx.get(server.url + path, timeout=10)
    head = httpx.head(server.url + path, timeout=10)
    assert got.status_code == head.status_code == 200
    assert head.content == b"" and got.content != b""
    assert head.headers["content-type"] == got.headers["content-type"]


def test_head_on_a_post_route_is_refused(server: ServerProcess) -> None:
    assert httpx.head(server.url + "/v1/chat/completions", timeout=10).status_code == 405


def test_limits(start_server) -> None:  # type: ignore[no-untyped-def]
    limited = start_server("--max-body-bytes", "2000", "--max-requests", "1", "--max-tokens", "1000",
                           "--max-prompt-tokens", "100")  # fmt: skip
    url = limited.url + "/v1/chat/completions"
    big = {"messages": [{"role": "user", "content": "x" * 5000}]}
    r = httpx.post(url, json=big, timeout=30)
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"

    # a body sent in pieces with no length announced is cut off at the limit too
    def pieces():  # type: ignore[no-untyped-def]
        yield b'{"messages": [{"role": "user", "content": "'
        for _ in range(10):
            yield b"y" * 500
        yield b'"}]}'

    r = httpx.post(url, content=pieces(), headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == 413

    r = httpx.post(url, json={"messages": QUESTION, "max_tokens": 1001}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"
    r = httpx.post(url, json={"messages": [{"role": "user", "content": "word " * 150}]}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"

    body = {"messages": LONG, "max_tokens": 1000, "temperature": 0.8, "stream": True}
    with httpx.stream("POST", url, json=body, timeout=60) as first:
        assert first.status_code == 200
        lines = first.iter_lines()  # kept: a dropped iterator closes the connection, which cancels the request
        next(lines)  # the first request is in flight
        second = httpx.post(url, json={"messages": QUESTION, "max_tokens": 2}, timeout=30)
        assert second.status_code == 429
        assert second.json()["error"]["type"] == "rate_limit_error"
    wait_idle(limited)
    assert httpx.post(url, json={"messages": QUESTION, "max_tokens": 2}, timeout=30).status_code == 200


def test_api_key_guards_every_route(start_server) -> None:  # type: ignore[no-untyped-def]
    guarded = start_server("--api-key", "k3y")
    routes = [("GET", "/"), ("GET", "/health"), ("GET", "/v1/models"), ("GET", "/static/chat.js"),
              ("POST", "/v1/chat/completions"), ("POST", "/v1/completions"), ("POST", "/v1/embeddings"),
              ("POST", "/chat/completions"), ("GET", "/models"), ("POST", "/tokenize"),
              ("POST", "/detokenize"), ("POST", "/api/chat"), ("POST", "/api/generate"), ("GET", "/api/tags"),
              ("POST", "/api/embed"), ("POST", "/v1/responses"), ("POST", "/completion"),
              ("GET", "/props")]  # fmt: skip
    for method, path in routes:
        for headers in ({}, {"authorization": "Bearer nope"}, {"authorization": "k3y"}):
            r = httpx.request(method, guarded.url + path, headers=headers, json={}, timeout=10)
            assert r.status_code == 401, (method, path, headers)
            assert r.json()["error"]["type"] == "authentication_error"
    ok = {"authorization": "Bearer k3y"}
    assert httpx.get(guarded.url + "/health", headers=ok, timeout=10).status_code == 200
    assert httpx.head(guarded.url + "/", timeout=10).status_code == 401
    assert httpx.head(guarded.url + "/", headers=ok, timeout=10).status_code == 200
    # a browser asks for the key as a password and sends it as Basic credentials
    assert "Basic" in httpx.get(guarded.url + "/", timeout=10).headers["www-authenticate"]
    basic = {"authorization": "Basic " + base64.b64encode(b"me:k3y").decode()}
    page = httpx.get(guarded.url + "/", headers=basic, timeout=10)
    assert page.status_code == 200 and "<html" in page.text.lower()


def test_ctrl_c_shuts_down_cleanly(start_server) -> None:  # type: ignore[no-untyped-def]
    """An open stream ends with a 503 event, the process with the CLI's status for Ctrl-C (128 + SIGINT)
    and no traceback."""
    proc = start_server()
    body = {"messages": LONG, "max_tokens": 1500, "temperature": 0.8, "stream": True}
    with httpx.stream("POST", proc.url + "/v1/chat/completions", json=body, timeout=60) as r:
        lines = r.iter_lines()
        next(lines)
        proc.process.send_signal(signal.SIGINT)
        rest = [line for line in lines if line.startswith("data: ")]
    assert proc.process.wait(30) == 130
    assert json.loads(rest[-1].removeprefix("data: "))["error"]["code"] == "server_shutting_down"
    output = proc.output()
    assert "Traceback" not in output
    assert "Finished server process" in output


def _preflight(url: str, origin: str) -> httpx.Response:
    headers = {
        "origin": origin,
        "access-control-request-method": "POST",
        "access-control-request-headers": "authorization, content-type",
    }
    return httpx.options(url + "/v1/chat/completions", headers=headers, timeout=10)


def test_browser_pages_on_loopback_may_call_the_api_and_others_may_not(server: ServerProcess) -> None:
    for origin in ("http://localhost:3000", "http://127.0.0.1:8080", "https://localhost"):
        r = _preflight(server.url, origin)
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == origin, origin
        assert "authorization" in r.headers["access-control-allow-headers"].lower()
        models = httpx.get(server.url + "/v1/models", headers={"origin": origin}, timeout=10)
        assert models.headers["access-control-allow-origin"] == origin
    for origin in ("https://evil.example", "http://localhost.evil.example", "http://127.0.0.1.evil.example:80"):
        assert "access-control-allow-origin" not in _preflight(server.url, origin).headers, origin
        models = httpx.get(server.url + "/v1/models", headers={"origin": origin}, timeout=10)
        assert models.status_code == 200 and "access-control-allow-origin" not in models.headers, origin


def test_cors_origins_can_be_added_and_the_key_still_guards(start_server) -> None:  # type: ignore[no-untyped-def]
    proc = start_server("--cors-origin", "https://chat.example", "--api-key", "k3y")
    # the preflight carries no key; the request itself still needs it, and its 401 is readable by the page
    r = _preflight(proc.url, "https://chat.example")
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "https://chat.example"
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    headers = {"origin": "https://chat.example"}
    denied = httpx.post(proc.url + "/v1/chat/completions", json=body, headers=headers, timeout=30)
    assert denied.status_code == 401 and denied.headers["access-control-allow-origin"] == "https://chat.example"
    allowed = httpx.post(
        proc.url + "/v1/chat/completions", json=body, headers={**headers, "authorization": "Bearer k3y"}, timeout=60
    )
    assert allowed.status_code == 200 and allowed.json()["choices"][0]["message"]["role"] == "assistant"
    assert "access-control-allow-origin" not in _preflight(proc.url, "https://other.example").headers


def test_a_cors_origin_that_is_not_an_origin_is_refused(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from torchburn_cli.app import app

    result = CliRunner().invoke(app, ["serve", "--cors-origin", "https://chat.example/path"])
    text = " ".join(re.sub(r"[│╭╮╰╯─]", " ", result.output).split())  # the message without its box
    assert result.exit_code == 2 and "'https://chat.example/path' is not a web origin" in text, result.output
