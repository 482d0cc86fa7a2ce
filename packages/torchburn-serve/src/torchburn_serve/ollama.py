"""Ollama's API beside OpenAI's: ``/api/chat``, ``/api/generate``, ``/api/embed`` (and the older
``/api/embeddings``), ``/api/tags``, ``/api/show`` and ``/api/version``, what the ``ollama`` client and
the tools built on it call.

Each request becomes the OpenAI request the server already runs (the same job maker, engine and
limits), so an Ollama chat gets the answer ``/v1/chat/completions`` gives the same messages and
settings. Answers stream as newline-delimited JSON objects (Ollama streams unless ``"stream": false``);
the last one has ``"done": true``, the reason, the token counts and the durations in nanoseconds.
Errors are Ollama's ``{"error": "..."}`` with the HTTP status the OpenAI routes give.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import datetime, timezone
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import Field

from . import reasoning, tools
from .engine import CANCELLED, Delta, Handle
from .errors import APIError, bad_request
from .protocol import ChatRequest, CompletionRequest, EmbeddingRequest, _Body, parse, validated

VERSION = "0.6.0"  # the Ollama API version whose routes and fields these follow
_NDJSON = "application/x-ndjson"


class Options(_Body):
    """The Ollama options that map onto the server's sampling; the others (``num_ctx``, ``num_gpu``,
    ...) are accepted and change nothing, as the model's context and the machine are fixed."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    num_predict: int | None = None  # -1 or -2: no limit of the request's own
    seed: int | None = None
    stop: str | list[str] | None = None
    repeat_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None


class _FunctionCall(_Body):
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)


class _ToolCall(_Body):
    function: _FunctionCall


class Message(_Body):
    role: Literal["system", "user", "assistant", "tool"]
    content: str = ""
    images: list[str] | None = None
    tool_calls: list[_ToolCall] | None = None
    tool_name: str | None = None


class _Generation(_Body):
    model: str | None = None
    stream: bool = True
    format: Literal["", "json"] | dict[str, Any] | None = None
    options: Options | None = None
    keep_alive: str | float | None = None


class ChatBody(_Generation):
    messages: list[Message] = Field(default_factory=list)
    tools: list[dict[str, Any]] | None = None
    # a reasoning model's thinking comes back as message.thinking; false asks the template not to think
    # (Qwen3's enable_thinking)
    think: bool | None = None


class GenerateBody(_Generation):
    prompt: str = ""
    system: str | None = None
    raw: bool = False
    suffix: str | None = None
    images: list[str] | None = None


class EmbedBody(_Body):
    model: str | None = None
    input: str | list[str]


class EmbeddingsBody(_Body):
    model: str | None = None
    prompt: str


class ShowBody(_Body):
    model: str | None = None
    name: str | None = None  # older clients' name for it


def add_routes(app: FastAPI, server: Any, embed: Callable[[EmbeddingRequest], Awaitable[list[list[float]]]]) -> None:
    """Ollama's routes on ``app`` for ``server`` (:class:`~torchburn_serve.app.Server`); ``embed``
    gives the pooled embedding of each text, as ``/v1/embeddings`` computes it."""
    from .app import _collect, _submitted

    def ollama_errors(
        route: Callable[[Request], Awaitable[Response]],
    ) -> Callable[[Request], Awaitable[Response]]:
        async def wrapped(request: Request) -> Response:
            try:
                return await route(request)
            except APIError as exc:
                return JSONResponse({"error": exc.message}, status_code=exc.status)

        wrapped.__name__ = route.__name__
        return wrapped

    @app.get("/api/version")
    async def version() -> dict[str, str]:
        return {"version": VERSION}

    @app.get("/api/tags")
    async def tags() -> dict[str, Any]:
        return {"models": [_tag(server)]}

    @app.get("/api/ps")
    async def running() -> dict[str, Any]:
        return {"models": [{**_tag(server), "expires_at": "0001-01-01T00:00:00Z", "size_vram": 0}]}

    @app.post("/api/show")
    @ollama_errors
    async def show(request: Request) -> Response:
        parse(await request.body(), ShowBody)  # checked; any name is the served model, as on /v1
        cfg = server.llm.config
        info = {
            "general.architecture": server.llm.architecture.name,
            "context_length": cfg.max_position,
            "embedding_length": cfg.hidden_size,
            "vocab_size": cfg.vocab_size,
        }
        return JSONResponse(
            {
                "modelfile": "",
                "parameters": "",
                "template": server.llm.chat_template or "",
                "details": _details(server),
                "model_info": info,
                "capabilities": ["completion", "embedding"] + (["tools"] if server.jobs.template_knows_tools else []),
                "modified_at": _timestamp(server.started),
            }
        )

    @app.post("/api/chat")
    @ollama_errors
    async def chat(request: Request) -> Response:
        body: ChatBody = parse(await request.body(), ChatBody)
        if not body.messages:
            # Ollama loads (or unloads) the model and answers at once when a chat has no messages
            return JSONResponse({**_head(server), "message": {"role": "assistant", "content": ""}, "done": True,
                                 "done_reason": _load_or_unload(body)})  # fmt: skip
        req: ChatRequest = validated(_chat_request(body), ChatRequest)
        started = time.monotonic()
        made, handle, release = await _submitted(server, lambda: server.jobs.chat(req), lambda m: m.job)
        plan = made.tool_plan

        if body.stream:
            return _streamed(handle, server, started, plan, release, thinking=made.thinking)
        deltas = await _collect(handle, request, release)
        if deltas is None:
            return Response(status_code=499)
        return JSONResponse(_whole(deltas, server, started, plan, thinking=made.thinking))

    @app.post("/api/generate")
    @ollama_errors
    async def generate(request: Request) -> Response:
        body: GenerateBody = parse(await request.body(), GenerateBody)
        if body.images:
            raise bad_request("this model takes text only: images are not supported", "images")
        if body.suffix:
            raise bad_request("suffix (fill in the middle) is not supported", "suffix")
        if not body.prompt:
            return JSONResponse({**_head(server), "response": "", "done": True, "done_reason": _load_or_unload(body)})
        started = time.monotonic()
        if body.raw:
            completion: CompletionRequest = validated({"prompt": body.prompt, **_sampling(body)}, CompletionRequest)
            _, handle, release = await _submitted(
                server, lambda: server.jobs.completion(completion), lambda made: made[0]
            )
        else:
            messages = ([{"role": "system", "content": body.system}] if body.system else []) + [
                {"role": "user", "content": body.prompt}
            ]
            req: ChatRequest = validated({"messages": messages, **_sampling(body)}, ChatRequest)
            _, handle, release = await _submitted(server, lambda: server.jobs.chat(req), lambda made: made.job)

        if body.stream:
            return _streamed(handle, server, started, None, release, key="response")
        deltas = await _collect(handle, request, release)
        if deltas is None:
            return Response(status_code=499)
        return JSONResponse(_whole(deltas, server, started, None, key="response"))

    @app.post("/api/embed")
    @ollama_errors
    async def embed_route(request: Request) -> Response:
        body: EmbedBody = parse(await request.body(), EmbedBody)
        texts = [body.input] if isinstance(body.input, str) else body.input
        started = time.monotonic()
        vectors = await embed(validated({"input": texts}, EmbeddingRequest))
        elapsed = int((time.monotonic() - started) * 1e9)
        return JSONResponse({"model": server.model_id, "embeddings": vectors, "total_duration": elapsed,
                             "load_duration": 0})  # fmt: skip

    @app.post("/api/embeddings")
    @ollama_errors
    async def embeddings(request: Request) -> Response:
        body: EmbeddingsBody = parse(await request.body(), EmbeddingsBody)
        vectors = await embed(validated({"input": [body.prompt]}, EmbeddingRequest))
        return JSONResponse({"embedding": vectors[0]})


def _load_or_unload(body: _Generation) -> str:
    """What a request with nothing to generate asks for: to load the model, or with ``keep_alive`` 0 to
    unload it (the model stays loaded here: the server serves one model for its lifetime)."""
    return "unload" if body.keep_alive in (0, "0", "0s", "0m") else "load"


def _chat_request(body: ChatBody) -> dict[str, Any]:
    """``body`` as an OpenAI chat request."""
    messages: list[dict[str, Any]] = []
    # Ollama's calls carry no ids and its results answer them in order: each call gets one, and each
    # result the id of the oldest call not yet answered (templates that pair them, as Mistral's do,
    # need both)
    unanswered: list[str] = []
    for i, m in enumerate(body.messages):
        if m.images:
            raise bad_request(f"messages[{i}] has images; this model takes text only", f"messages[{i}].images")
        message: dict[str, Any] = {"role": m.role, "content": m.content}
        if m.tool_calls:
            ids = [f"call{i}x{j}" for j in range(len(m.tool_calls))]
            message["tool_calls"] = [
                {
                    "id": id_,
                    "type": "function",
                    "function": {"name": c.function.name, "arguments": c.function.arguments},
                }
                for id_, c in zip(ids, m.tool_calls, strict=True)
            ]
            unanswered = ids
        if m.role == "tool" and unanswered:
            message["tool_call_id"] = unanswered.pop(0)
        if m.tool_name is not None:
            message["name"] = m.tool_name
        messages.append(message)
    request: dict[str, Any] = {"messages": messages, **_sampling(body)}
    if body.think is False:
        request["chat_template_kwargs"] = {"enable_thinking": False}
    if body.tools:
        request["tools"] = body.tools
    return request


def _sampling(body: _Generation) -> dict[str, Any]:
    """The OpenAI sampling fields of an Ollama request's options and format."""
    out: dict[str, Any] = {}
    o = body.options
    if o is not None:
        for name in ("temperature", "top_p", "top_k", "min_p", "seed", "stop", "repeat_penalty"):
            if getattr(o, name) is not None:
                out[name] = getattr(o, name)
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(o, name):  # Ollama's clients send 0 for "off"
                out[name] = getattr(o, name)
        if o.num_predict is not None and o.num_predict >= 0:
            if o.num_predict == 0:
                raise bad_request("num_predict must be at least 1 (or -1 for no limit of its own)", "options")
            out["max_tokens"] = o.num_predict
    if body.format == "json":
        out["response_format"] = {"type": "json_object"}
    elif isinstance(body.format, dict):
        out["response_format"] = {"type": "json_schema", "json_schema": {"name": "format", "schema": body.format}}
    return out


def _streamed(
    handle: Handle,
    server: Any,
    started: float,
    plan: tools.ToolPlan | None,
    release: Callable[[], None],
    key: str = "message",
    thinking: bool | None = None,
) -> StreamingResponse:
    splitter = None if thinking is None else reasoning.ReasoningSplitter(thinking)

    async def lines() -> AsyncIterator[bytes]:
        first = 0.0
        held: list[str] = []  # a tool-calling answer is read whole before it is sent
        try:
            async for delta in handle.deltas():
                if delta.error is not None:
                    yield _line({"error": delta.error.message})
                    return
                if delta.finish == CANCELLED:
                    return
                first = first or delta.made
                thought, text = reasoning.pieces(splitter, delta.text, delta.finish is not None)
                if thought:
                    yield _line({**_head(server), key: {**_piece(key, ""), "thinking": thought}, "done": False})
                if plan is not None:
                    held.append(text)
                elif text:
                    yield _line({**_head(server), key: _piece(key, text), "done": False})
                if delta.finish is not None:
                    last = {**_head(server), key: _piece(key, "")}
                    if plan is not None:
                        last[key] = _with_calls("".join(held), plan, delta.finish)
                    yield _line({**last, **_counts(delta, started, first)})
        finally:
            handle.cancel()
            release()

    return StreamingResponse(lines(), media_type=_NDJSON)


def _whole(
    deltas: list[Delta],
    server: Any,
    started: float,
    plan: tools.ToolPlan | None,
    key: str = "message",
    thinking: bool | None = None,
) -> dict[str, Any]:
    text = "".join(d.text for d in deltas)
    thought = ""
    if thinking is not None:
        thought, text = reasoning.split(text, thinking)
    last = deltas[-1]
    value = _piece(key, text) if plan is None else _with_calls(text, plan, last.finish or "stop")
    if thought:
        value["thinking"] = thought
    return {**_head(server), key: value, **_counts(last, started, deltas[0].made)}


def _piece(key: str, text: str) -> Any:
    """Text of an answer under ``key``: a chat's assistant message, or a generation's plain text."""
    return {"role": "assistant", "content": text} if key == "message" else text


def _with_calls(text: str, plan: tools.ToolPlan, finish: str) -> dict[str, Any]:
    """The assistant message of a tool-calling answer: its text, and its calls as Ollama writes them
    (arguments as an object)."""
    content, calls = tools.finished_answer(text, plan, finish)
    message: dict[str, Any] = {"role": "assistant", "content": content or ""}
    if calls:
        message["tool_calls"] = [
            {"function": {"name": c["function"]["name"], "arguments": json.loads(c["function"]["arguments"])}}
            for c in calls
        ]
    return message


def _counts(last: Delta, started: float, first: float) -> dict[str, Any]:
    """The final object's fields: why it ended, the token counts and the durations (nanoseconds) from
    the request to its first token and from there to its last."""
    now = last.made
    return {
        "done": True,
        "done_reason": "length" if last.finish == "length" else "stop",
        "total_duration": int((now - started) * 1e9),
        "load_duration": 0,
        "prompt_eval_count": last.prompt_tokens,
        "prompt_eval_duration": int((first - started) * 1e9),
        "eval_count": last.completion_tokens,
        "eval_duration": int((now - first) * 1e9),
    }


def _line(payload: dict[str, Any]) -> bytes:
    return (json.dumps(payload, ensure_ascii=False, separators=(",", ":")) + "\n").encode()


def _head(server: Any) -> dict[str, Any]:
    return {"model": server.model_id, "created_at": _timestamp(time.time())}


def _timestamp(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, timezone.utc).isoformat().replace("+00:00", "Z")


def _details(server: Any) -> dict[str, Any]:
    quant = server.llm.model.quant
    return {
        "format": "gguf" if quant == "stored" else "safetensors",
        "family": server.llm.architecture.name,
        "families": [server.llm.architecture.name],
        "parameter_size": "",
        "quantization_level": quant,
    }


def _tag(server: Any) -> dict[str, Any]:
    return {
        "name": server.model_id,
        "model": server.model_id,
        "modified_at": _timestamp(server.started),
        "size": int(server.llm.model.weight_bytes),
        "digest": "",
        "details": _details(server),
    }
