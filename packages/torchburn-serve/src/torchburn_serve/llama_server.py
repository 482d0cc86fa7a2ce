"""llama-server's own routes beside the OpenAI ones: ``POST /completion`` (a text prompt continued,
whole or streamed as server-sent events without a ``[DONE]``, ending with ``"stop": true``) and
``GET /props``, which editor plugins and scripts written for llama-server call, and ``POST
/apply-template`` (the prompt a chat request's messages make, without running it).

A ``/completion`` request runs as the ``/v1/completions`` request with the same prompt and settings
(``n_predict`` for ``max_tokens``, -1 for no limit of its own; ``json_schema`` enforced token by
token as ``response_format`` is). GBNF ``grammar`` is not supported and is refused.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from .engine import CANCELLED, Delta, Handle
from .errors import bad_request
from .protocol import ChatRequest, CompletionRequest, _Body, parse, validated


class CompletionBody(_Body):
    prompt: str | list[int]
    n_predict: int | None = None
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    repeat_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    seed: int | None = None
    stop: list[str] | None = None
    stream: bool = False
    json_schema: dict[str, Any] | None = None
    grammar: str | None = None


def add_routes(app: FastAPI, server: Any) -> None:
    """``/completion``, ``/props`` and ``/apply-template`` on ``app`` for ``server``
    (:class:`~torchburn_serve.app.Server`)."""
    from .app import _collect, _submitted

    @app.get("/props")
    async def props() -> dict[str, Any]:
        return {
            "default_generation_settings": {"n_ctx": server.llm.config.max_position},
            "total_slots": server.limits.max_batch,
            "model_path": server.model_id,
            "chat_template": server.llm.chat_template or "",
            "chat_template_tool_use": server.llm.tool_chat_template or "",
            "build_info": "torchburn",
        }

    @app.post("/apply-template")
    async def apply_template(request: Request) -> dict[str, Any]:
        # a chat completion's body (messages, and tools where the request has them), as llama-server takes it
        req: ChatRequest = parse(await request.body(), ChatRequest)
        text, _ = await asyncio.to_thread(server.jobs.chat_prompt, req)
        return {"prompt": text}

    @app.post("/completion")
    async def completion(request: Request) -> Response:
        body: CompletionBody = parse(await request.body(), CompletionBody)
        req: CompletionRequest = validated(completion_request(body), CompletionRequest)
        started = time.monotonic()
        (_, prompt), handle, release = await _submitted(
            server, lambda: server.jobs.completion(req, body.json_schema), lambda made: made[0]
        )
        if body.stream:
            return StreamingResponse(
                _events(handle, server.model_id, prompt, started, release),
                media_type="text/event-stream",
                headers={"cache-control": "no-cache", "x-accel-buffering": "no"},
            )
        deltas = await _collect(handle, request, release)
        if deltas is None:
            return Response(status_code=499)
        text = "".join(d.text for d in deltas)
        return JSONResponse(_final(text, deltas[-1], server.model_id, prompt, started, deltas[0].made))


def completion_request(body: CompletionBody) -> dict[str, Any]:
    """``body`` as the ``/v1/completions`` request it runs as."""
    if body.grammar:
        raise bad_request("GBNF grammar is not supported; send json_schema for structured output", "grammar")
    out: dict[str, Any] = {"prompt": body.prompt, "max_tokens": None}
    if body.n_predict is not None and body.n_predict >= 0:
        if body.n_predict == 0:
            raise bad_request("n_predict must be at least 1 (or -1 for no limit of its own)", "n_predict")
        out["max_tokens"] = body.n_predict
    names = ("temperature", "top_k", "top_p", "min_p", "repeat_penalty", "presence_penalty", "frequency_penalty")
    for name in (*names, "seed", "stop"):
        if getattr(body, name) is not None:
            out[name] = getattr(body, name)
    return out


def _final(text: str, last: Delta, model: str, prompt: str, started: float, first: float) -> dict[str, Any]:
    """The last (or only) object of an answer: its text, why it stopped, its counts and timings."""
    prompt_ms, predicted_ms = (first - started) * 1e3, (last.made - first) * 1e3
    return {
        "content": text,
        "stop": True,
        "model": model,
        "prompt": prompt,
        "tokens_predicted": last.completion_tokens,
        "tokens_evaluated": last.prompt_tokens,
        "tokens_cached": last.cached_tokens,
        "stop_type": "limit" if last.finish == "length" else "eos",
        "truncated": False,
        "timings": {
            "prompt_n": last.prompt_tokens - last.cached_tokens,
            "prompt_ms": prompt_ms,
            "predicted_n": last.completion_tokens,
            "predicted_ms": predicted_ms,
            "predicted_per_second": last.completion_tokens / predicted_ms * 1e3 if predicted_ms > 0 else 0.0,
        },
    }


async def _events(
    handle: Handle, model: str, prompt: str, started: float, release: Callable[[], None]
) -> AsyncIterator[bytes]:
    def event(payload: dict[str, Any]) -> bytes:
        return f"data: {json.dumps(payload, ensure_ascii=False, separators=(',', ':'))}\n\n".encode()

    pieces: list[str] = []
    first = 0.0
    try:
        async for delta in handle.deltas():
            if delta.error is not None:
                yield event(delta.error.body())
                return
            if delta.finish == CANCELLED:
                return
            first = first or delta.made
            if delta.text:
                pieces.append(delta.text)
                yield event({"content": delta.text, "stop": False})
            if delta.finish is not None:
                final = _final("".join(pieces), delta, model, prompt, started, first)
                yield event({**final, "content": ""})
    finally:
        handle.cancel()
        release()
