"""The HTTP routes: OpenAI's chat and text completions (whole or streamed as server-sent events),
its Responses API (:mod:`~torchburn_serve.openai_responses`), embeddings and models, Anthropic's
Messages API (:mod:`~torchburn_serve.anthropic_messages`), Ollama's API
(:mod:`~torchburn_serve.ollama`), ``/health``, llama-server's ``/completion`` and ``/props``
(:mod:`~torchburn_serve.llama_server`), ``/tokenize`` and ``/detokenize``, Prometheus'
``/metrics`` (:mod:`~torchburn_serve.metrics`), and the chat page at ``/``. The OpenAI routes also
answer without their ``/v1`` prefix, as llama-server's do (a client whose base URL lacks it still
works).

Each generation is a job for the :class:`~torchburn_serve.engine.Engine`; its deltas come back on the
event loop and are written out as they arrive. A client that goes away cancels its job (a stream's
task is cancelled by the server; a whole answer's wait checks the connection), which frees its
sequence's place in the batch and its KV cache.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from importlib import resources
from typing import Any, TypeVar

import numpy as np
import torch
from fastapi import FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import FileResponse, JSONResponse, Response, StreamingResponse
from fastapi.routing import APIRoute
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException

from torchburn_llm.llm import LLM

from . import anthropic_messages, llama_server, metrics, ollama, openai_responses, reasoning, responses, tools
from .engine import CANCELLED, Delta, Engine, Handle, Job
from .errors import APIError, bad_request, error_body
from .guard import Guard
from .jobs import ChatJob, JobMaker
from .limits import Limits
from .protocol import ChatRequest, CompletionRequest, DetokenizeRequest, EmbeddingRequest, TokenizeRequest, parse

Made = TypeVar("Made")  # what a request's job is built with (the job and what its answer needs)
log = logging.getLogger("torchburn.serve")
STATIC = resources.files("torchburn_serve") / "static"
# the page loads nothing from elsewhere and runs no inline script
_PAGE_HEADERS = {
    "content-security-policy": "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'",
    "x-content-type-options": "nosniff",
    "cache-control": "no-cache",
}
# nginx's status for a request whose client went away before the answer (nobody receives it)
CLIENT_CLOSED = 499
_SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}


class Server:
    """The state behind the routes: the model, its engine, the limits and the requests in flight."""

    def __init__(self, llm: LLM, model_id: str, limits: Limits) -> None:
        self.llm, self.model_id, self.limits = llm, model_id, limits
        self.engine = Engine(llm, limits)
        self.jobs = JobMaker(llm, limits)
        self.in_flight = 0
        self.started = int(time.time())

    def claim(self) -> Callable[[], None]:
        """A place among the requests in flight (429 where there is none); call the result to give it back."""
        if self.in_flight >= self.limits.max_requests:
            raise APIError(
                429,
                f"the server is busy: {self.in_flight} requests in flight "
                f"(at most {self.limits.max_requests}); retry later",
                code="too_many_requests",
            )
        self.in_flight += 1
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                self.in_flight -= 1

        return release

    def submit(self, job: Job) -> Handle:
        handle = Handle(job, asyncio.get_running_loop())
        self.engine.submit(handle)
        return handle


# Web pages served from this machine (any port) may call the API from a browser, as Ollama allows by
# default: a chat front end on localhost:3000 works out of the box, while a page from anywhere else gets
# no CORS headers, so a site the user happens to visit cannot read the local model's answers.
LOOPBACK_ORIGINS = r"https?://(localhost|127\.0\.0\.1|\[::1\])(:[0-9]{1,5})?"


def create_app(
    llm: LLM,
    model_id: str,
    limits: Limits | None = None,
    api_key: str | None = None,
    cors_origins: Sequence[str] = (),
) -> FastAPI:
    """The ASGI app serving ``llm`` under the name ``model_id``. Browsers may call it from pages on
    loopback origins and from ``cors_origins`` (exact origins such as ``https://chat.example``, or ``*``)."""
    server = Server(llm, model_id, limits or Limits())

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        server.engine.start()
        try:
            yield
        finally:
            await asyncio.to_thread(server.engine.shutdown)

    app = FastAPI(title="TorchBurn", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan)
    app.state.server = server
    app.add_middleware(Guard, api_key=api_key, max_body_bytes=server.limits.max_body_bytes)
    # outside the guard (added last): a browser's preflight carries no key, and an error the guard
    # answers still needs the headers for the page to read it
    app.add_middleware(
        CORSMiddleware,
        allow_origins=list(cors_origins),
        allow_origin_regex=LOOPBACK_ORIGINS,
        allow_methods=["GET", "POST", "OPTIONS"],
        # Anthropic's browser clients send their key and version in headers of their own
        allow_headers=["Authorization", "Content-Type", "x-api-key", "anthropic-version", "anthropic-beta"],
        max_age=600,
    )

    @app.exception_handler(APIError)
    async def api_error(_: Request, exc: APIError) -> Response:
        return exc.response()

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> Response:
        return JSONResponse(error_body(exc.status_code, str(exc.detail)), status_code=exc.status_code)

    @app.exception_handler(Exception)
    async def unexpected(_: Request, exc: Exception) -> Response:
        log.exception("request failed")
        return JSONResponse(error_body(500, f"internal error: {type(exc).__name__}"), status_code=500)

    @app.get("/health")
    @app.get("/v1/health")
    async def health() -> dict[str, Any]:
        return {
            "status": "ok",
            "model": server.model_id,
            "requests_in_flight": server.in_flight,
            **server.engine.stats(),
        }

    @app.get("/metrics")
    async def prometheus_metrics() -> Response:
        return Response(metrics.text(server), media_type=metrics.CONTENT_TYPE)

    @app.get("/v1/models")
    @app.get("/models")
    async def models() -> dict[str, Any]:
        card = _model_card(server)
        # Anthropic's clients page through the list by these
        return {"object": "list", "data": [card], "has_more": False, "first_id": card["id"], "last_id": card["id"]}

    @app.get("/v1/models/{model_id:path}")
    @app.get("/models/{model_id:path}")
    async def model(model_id: str) -> dict[str, Any]:
        if model_id != server.model_id:
            raise APIError(404, f"model {model_id!r} is not served here; this server serves {server.model_id!r}")
        return _model_card(server)

    @app.post("/v1/chat/completions")
    @app.post("/chat/completions")
    async def chat_completions(request: Request) -> Response:
        req: ChatRequest = parse(await request.body(), ChatRequest)
        made, handle, release = await _submitted(server, lambda: server.jobs.chat(req), lambda m: m.job)
        answer = responses.Answer("chatcmpl", server.model_id)
        if req.stream:
            return StreamingResponse(
                _chat_stream(handle, answer, made, req.include_usage, req.logprobs, release),
                media_type="text/event-stream",
                headers=_SSE_HEADERS,
            )
        deltas = await _collect(handle, request, release)
        if deltas is None:
            return Response(status_code=CLIENT_CLOSED)
        text, logprobs, finish = _joined(deltas, answer)
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if made.thinking is not None:
            thought, text = reasoning.split(text, made.thinking)
            message["content"] = text
            if thought:
                message["reasoning_content"] = thought
        if made.tool_plan is not None:
            content, calls = tools.finished_answer(text, made.tool_plan, finish)
            message["content"] = content
            if calls:
                message["tool_calls"], finish = calls, "tool_calls"
        choice = {
            "index": 0,
            "message": message,
            "logprobs": responses.chat_logprobs(logprobs) if req.logprobs else None,
            "finish_reason": finish,
        }
        return JSONResponse({**answer.head("chat.completion"), "choices": [choice], "usage": answer.usage()})

    @app.post("/v1/completions")
    @app.post("/completions")
    async def completions(request: Request) -> Response:
        req: CompletionRequest = parse(await request.body(), CompletionRequest)
        if req.stream:
            if isinstance(req.prompt, list) and len(req.prompt) > 1 and isinstance(req.prompt[0], (str, list)):
                raise bad_request(
                    "a stream takes one prompt; send several without stream, or one per request", "prompt"
                )
            (_, prompt_text), handle, release = await _submitted(
                server, lambda: server.jobs.completion(req), lambda made: made[0]
            )
            answer = responses.Answer("cmpl", server.model_id)
            echo = prompt_text if req.echo else ""
            return StreamingResponse(
                _completion_stream(handle, answer, echo, req.include_usage, req.logprobs is not None, release),
                media_type="text/event-stream",
                headers=_SSE_HEADERS,
            )
        made, handles, release = await _submitted_all(
            server, lambda: server.jobs.completions(req), lambda made: [job for job, _ in made]
        )
        answers = await _collect_all(handles, request, release)
        if answers is None:
            return Response(status_code=CLIENT_CLOSED)
        total = responses.Answer("cmpl", server.model_id)
        choices = []
        for i, ((_, prompt_text), deltas) in enumerate(zip(made, answers, strict=True)):
            echo = prompt_text if req.echo else ""
            answer = responses.Answer("cmpl", server.model_id)
            text, logprobs, finish = _joined(deltas, answer)
            total.prompt_tokens += answer.prompt_tokens
            total.completion_tokens += answer.completion_tokens
            total.cached_tokens += answer.cached_tokens
            lps = None if req.logprobs is None else responses.completion_logprobs(logprobs, len(echo))
            choices.append({"index": i, "text": echo + text, "logprobs": lps, "finish_reason": finish})
        return JSONResponse({**total.head("text_completion"), "choices": choices, "usage": total.usage()})

    @app.post("/v1/embeddings")
    @app.post("/embeddings")
    async def embeddings(request: Request) -> Response:
        req: EmbeddingRequest = parse(await request.body(), EmbeddingRequest)
        if req.dimensions is not None and req.dimensions != server.llm.config.hidden_size:
            raise bad_request(
                f"dimensions must be this model's hidden size, {server.llm.config.hidden_size}", "dimensions"
            )
        inputs = _embedding_inputs(server, req)
        vectors = await _embedded(server, inputs)
        data = [
            {"object": "embedding", "index": i, "embedding": _encoded(v, req.encoding_format)}
            for i, v in enumerate(vectors)
        ]
        tokens = sum(len(ids) for ids in inputs)
        usage = {"prompt_tokens": tokens, "total_tokens": tokens}
        return JSONResponse({"object": "list", "data": data, "model": server.model_id, "usage": usage})

    @app.post("/tokenize")
    async def tokenize(request: Request) -> dict[str, Any]:
        req: TokenizeRequest = parse(await request.body(), TokenizeRequest)
        ids = await asyncio.to_thread(_tokens_of, server.llm, req.content, req.add_special)
        if not req.with_pieces:
            return {"tokens": ids}
        return {"tokens": [{"id": t, "piece": _piece(server.llm, t)} for t in ids]}

    @app.post("/detokenize")
    async def detokenize(request: Request) -> dict[str, Any]:
        req: DetokenizeRequest = parse(await request.body(), DetokenizeRequest)
        vocab = server.llm.config.vocab_size
        bad = next((i for i, t in enumerate(req.tokens) if not 0 <= t < vocab), None)
        if bad is not None:
            raise bad_request(f"tokens[{bad}] is {req.tokens[bad]}; token ids lie in [0, {vocab})", "tokens")
        tokenizer = _tokenizer(server.llm)
        text = await asyncio.to_thread(tokenizer.decode, req.tokens, skip_special_tokens=False)
        return {"content": str(text)}

    async def embed_texts(req: EmbeddingRequest) -> list[list[float]]:
        vectors = await _embedded(server, _embedding_inputs(server, req))
        return [v.tolist() for v in vectors]

    ollama.add_routes(app, server, embed_texts)
    openai_responses.add_routes(app, server)
    anthropic_messages.add_routes(app, server)
    llama_server.add_routes(app, server)

    @app.get("/")
    async def page() -> Response:
        return FileResponse(str(STATIC / "index.html"), headers=_PAGE_HEADERS)

    app.mount("/static", StaticFiles(directory=str(STATIC)), name="static")
    _answer_head_where_get(app)
    return app


def _answer_head_where_get(app: FastAPI) -> None:
    """Every GET route answers HEAD too, as HTTP servers do: the Ollama CLI and uptime monitors check
    that a server is up with ``HEAD /`` (the server sends the GET's status and headers, no body)."""
    for route in app.router.routes:
        if isinstance(route, APIRoute) and route.methods and "GET" in route.methods:
            route.methods.add("HEAD")


def _tokenizer(llm: LLM) -> Any:
    if llm.tokenizer is None:
        raise bad_request("this model has no tokenizer (its folder has no tokenizer.json)")
    return llm.tokenizer


def _tokens_of(llm: LLM, text: str, add_special: bool) -> list[int]:
    """``text``'s token ids (after the BOS the model expects where ``add_special``), or a 400."""
    _tokenizer(llm)
    try:
        return llm.prompt_ids(text) if add_special else llm.encode(text)
    except ValueError as exc:
        raise bad_request(str(exc), "content") from None


def _piece(llm: LLM, token: int) -> str:
    """One token's text (a part of a character that several tokens share reads as U+FFFD)."""
    return str(_tokenizer(llm).decode([token], skip_special_tokens=False))


def _model_card(server: Server) -> dict[str, Any]:
    cfg = server.llm.config
    return {
        "id": server.model_id,
        "object": "model",
        "created": server.started,
        "owned_by": "torchburn",
        # as Anthropic's clients read a model
        "type": "model",
        "display_name": server.model_id,
        "created_at": datetime.datetime.fromtimestamp(server.started, datetime.UTC).isoformat().replace("+00:00", "Z"),
        "meta": {
            "architecture": server.llm.architecture.name,
            "quant": server.llm.model.quant,
            "n_ctx": cfg.max_position,
            "n_vocab": cfg.vocab_size,
            "n_embd": cfg.hidden_size,
        },
    }


async def _submitted(
    server: Server, make: Callable[[], Made], job_of: Callable[[Made], Job]
) -> tuple[Made, Handle, Callable[[], None]]:
    """A request's job built by ``make`` (off the event loop: templates and tokenizing take time) and
    submitted under a claimed place among the concurrent requests; the place's ``release`` is for the
    caller once the answer is out, and is called here if building or submitting fails."""
    made, handles, release = await _submitted_all(server, make, lambda m: [job_of(m)])
    return made, handles[0], release


async def _submitted_all(
    server: Server, make: Callable[[], Made], jobs_of: Callable[[Made], list[Job]]
) -> tuple[Made, list[Handle], Callable[[], None]]:
    """:func:`_submitted` for a request of one or more jobs (a list of prompts): a place among the
    requests in flight for each, all given back by the one ``release``."""
    releases: list[Callable[[], None]] = []

    def release() -> None:
        for give_back in releases:
            give_back()

    try:
        releases.append(server.claim())
        made = await asyncio.to_thread(make)
        jobs = jobs_of(made)
        releases.extend(server.claim() for _ in jobs[1:])
        return made, [server.submit(job) for job in jobs], release
    except BaseException:
        release()
        raise


async def _collect(handle: Handle, request: Request, release: Callable[[], None]) -> list[Delta] | None:
    """Every delta of ``handle`` up to its last, then ``release`` of the request's place; None where the
    client went away meanwhile, which cancels the job (the body has been read, so the next message the
    connection delivers is its end)."""
    answers = await _collect_all([handle], request, release)
    return None if answers is None else answers[0]


async def _collect_all(
    handles: list[Handle], request: Request, release: Callable[[], None]
) -> list[list[Delta]] | None:
    """:func:`_collect` for the jobs of one request, which run together (in the same batch); a client that
    goes away cancels them all, and an error of any fails the request."""

    async def watch() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass
        for handle in handles:
            handle.cancel()

    async def one(handle: Handle) -> list[Delta] | None:
        deltas: list[Delta] = []
        async for delta in handle.deltas():
            if delta.finish == CANCELLED:
                return None
            if delta.error is not None:
                raise delta.error
            deltas.append(delta)
        return deltas

    watcher = asyncio.create_task(watch())
    try:
        answers = await asyncio.gather(*(one(h) for h in handles))
        if any(a is None for a in answers):
            return None
        return [a for a in answers if a is not None]
    finally:
        watcher.cancel()
        for handle in handles:
            handle.cancel()
        release()


def _joined(deltas: list[Delta], answer: responses.Answer) -> tuple[str, list[Any], str]:
    last = deltas[-1]
    answer.prompt_tokens, answer.completion_tokens, answer.cached_tokens = (
        last.prompt_tokens,
        last.completion_tokens,
        last.cached_tokens,
    )
    logprobs = [lp for d in deltas for lp in d.logprobs]
    return "".join(d.text for d in deltas), logprobs, last.finish or "stop"


async def _chat_stream(
    handle: Handle,
    answer: responses.Answer,
    made: ChatJob,
    include_usage: bool,
    logprobs: bool,
    release: Callable[[], None],
) -> AsyncIterator[bytes]:
    usage_field = {"usage": None} if include_usage else {}
    tool_plan = made.tool_plan
    splitter = None if made.thinking is None else reasoning.ReasoningSplitter(made.thinking)

    def chunk(delta: dict[str, Any], finish: str | None = None, lps: Any = None) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": lps, "finish_reason": finish}
        return responses.sse({**answer.head("chat.completion.chunk"), "choices": [choice], **usage_field})

    held: list[str] = []  # a tool-calling answer is read whole before it is sent
    try:
        yield chunk({"role": "assistant", "content": ""})
        async for delta in handle.deltas():
            if delta.error is not None:
                yield responses.sse(delta.error.body())
                return
            answer.prompt_tokens, answer.completion_tokens = delta.prompt_tokens, delta.completion_tokens
            answer.cached_tokens = delta.cached_tokens
            lps = responses.chat_logprobs(delta.logprobs) if logprobs and delta.logprobs else None
            thought, text = reasoning.pieces(splitter, delta.text, delta.finish is not None)
            if thought:
                yield chunk({"reasoning_content": thought})
            if tool_plan is not None:
                held.append(text)
            elif text or lps is not None:
                yield chunk({"content": text}, lps=lps)
            if delta.finish is not None:
                finish = delta.finish
                if tool_plan is not None:
                    text = "".join(held)
                    content, calls = tools.finished_answer(text, tool_plan, finish)
                    if content:
                        yield chunk({"content": content})
                    if calls:
                        indexed = [{"index": i, **c} for i, c in enumerate(calls)]
                        yield chunk({"tool_calls": indexed})
                        finish = "tool_calls"
                yield chunk({}, finish)
                if include_usage:
                    yield responses.sse(
                        {**answer.head("chat.completion.chunk"), "choices": [], "usage": answer.usage()}
                    )
        yield responses.sse("[DONE]")
    finally:
        handle.cancel()
        release()


async def _completion_stream(
    handle: Handle,
    answer: responses.Answer,
    echo: str,
    include_usage: bool,
    logprobs: bool,
    release: Callable[[], None],
) -> AsyncIterator[bytes]:
    usage_field = {"usage": None} if include_usage else {}
    offset = len(echo)

    def chunk(text: str, finish: str | None = None, lps: Any = None) -> bytes:
        choice = {"index": 0, "text": text, "logprobs": lps, "finish_reason": finish}
        return responses.sse({**answer.head("text_completion"), "choices": [choice], **usage_field})

    try:
        if echo:
            yield chunk(echo)
        async for delta in handle.deltas():
            if delta.error is not None:
                yield responses.sse(delta.error.body())
                return
            answer.prompt_tokens, answer.completion_tokens = delta.prompt_tokens, delta.completion_tokens
            answer.cached_tokens = delta.cached_tokens
            lps = responses.completion_logprobs(delta.logprobs, offset) if logprobs and delta.logprobs else None
            offset += len(delta.text)
            if delta.text or lps is not None or delta.finish is not None:
                yield chunk(delta.text, delta.finish, lps)
            if delta.finish is not None and include_usage:
                yield responses.sse({**answer.head("text_completion"), "choices": [], "usage": answer.usage()})
        yield responses.sse("[DONE]")
    finally:
        handle.cancel()
        release()


def _embedding_inputs(server: Server, req: EmbeddingRequest) -> list[list[int]]:
    raw = req.input
    if isinstance(raw, str):
        items: list[Any] = [raw]
    elif raw and isinstance(raw[0], int):
        items = [raw]
    else:
        items = list(raw)
    if not items or len(items) > server.limits.max_embedding_inputs:
        raise bad_request(f"input must hold 1 to {server.limits.max_embedding_inputs} items", "input")
    vocab = server.llm.config.vocab_size
    out = []
    for i, item in enumerate(items):
        if isinstance(item, str):
            try:
                ids = server.llm.encode(item)
            except ValueError as exc:
                raise bad_request(str(exc), "input") from None
        else:
            ids = list(item)
            if any(not 0 <= t < vocab for t in ids):
                raise bad_request(f"input[{i}]: token ids must lie in [0, {vocab})", "input")
        if not ids:
            raise bad_request(f"input[{i}] is empty", "input")
        server.jobs.check_prompt(len(ids), "input")
        out.append(ids)
    return out


async def _embedded(server: Server, inputs: list[list[int]]) -> list[torch.Tensor]:
    """Each input's embedding, computed on the engine thread between two steps, under a claimed
    place among the requests in flight."""
    release = server.claim()
    try:
        future = server.engine.call(lambda: [_embed(server.llm, ids) for ids in inputs])
        vectors: list[torch.Tensor] = await asyncio.wrap_future(future)
        return vectors
    finally:
        release()


def _embed(llm: LLM, ids: list[int]) -> torch.Tensor:
    """The mean of the final (normed) hidden states over the input's tokens, L2-normalized: [H]."""
    hidden: torch.Tensor = llm.model.hidden_states(torch.tensor(ids))  # [T, H]
    pooled = hidden.mean(dim=0)
    unit: torch.Tensor = pooled / pooled.norm().clamp_min(1e-12)
    return unit


def _encoded(vector: torch.Tensor, encoding: str) -> Any:
    if encoding == "base64":
        return base64.b64encode(vector.numpy().astype(np.float32).tobytes()).decode()
    return vector.tolist()
