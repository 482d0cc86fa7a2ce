"""Anthropic's Messages API (``POST /v1/messages`` and ``POST /v1/messages/count_tokens``), which the
``anthropic`` client and the agents built on it call (pointed at a local model with
``ANTHROPIC_BASE_URL``), as llama-server and ollama serve it.

A request becomes the chat request the server already runs:

- ``system`` is the system message;
- a user turn's ``text`` blocks are a user message, and its ``tool_result`` blocks tool messages
  (before the text, as Anthropic orders them);
- an assistant turn's ``text`` and ``tool_use`` blocks are an assistant message with tool calls. Its
  ``thinking`` blocks are left out, as Anthropic's API drops earlier turns' thinking;
- a conversation that ends with an assistant turn is continued from it;
- ``max_tokens``, ``stop_sequences``, ``temperature``, ``top_p``, ``top_k`` (which the current client
  sends through ``extra_body``), ``tools`` (``input_schema``), ``tool_choice`` (``auto``, ``any``,
  ``tool``, ``none``) and ``output_config.format`` (a JSON schema, enforced token by token) map to their
  chat counterparts; ``thinking`` reaches the chat template as ``enable_thinking`` (Qwen3's switch).

The answer is a ``message`` whose ``content`` holds ``thinking``, ``text`` and ``tool_use`` blocks, with
``stop_reason`` ``end_turn``, ``max_tokens``, ``stop_sequence`` or ``tool_use``; streamed, Anthropic's
events (``message_start``, ``content_block_start``, ``*_delta``, ``content_block_stop``,
``message_delta``, ``message_stop``). Usage counts prompt tokens read from the prefix cache as
``cache_read_input_tokens``, apart from ``input_tokens``, as Anthropic counts them. Errors are
Anthropic's ``{"type": "error", "error": {"type", "message"}}``. Thinking blocks carry an empty
``signature``: nothing here signs them.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import Field

from . import json_text, reasoning, tools
from .engine import CANCELLED, Delta, Handle
from .errors import APIError, anthropic_error_body, bad_request
from .jobs import ChatJob
from .protocol import ChatRequest, _Body, parse, validated


class _Block(_Body):
    type: str
    text: str | None = None
    # tool_use
    id: str | None = None
    name: str | None = None
    input: Any = None
    # tool_result
    tool_use_id: str | None = None
    content: str | list[_Block] | None = None


class _Message(_Body):
    role: Literal["user", "assistant"]
    content: str | list[_Block]


class _Tool(_Body):
    type: str | None = None  # "custom" or absent; Anthropic's server tools are refused
    name: str
    description: str | None = None
    input_schema: dict[str, Any] | None = None


class _ToolChoice(_Body):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class _Thinking(_Body):
    type: str  # "disabled", or a way of thinking ("enabled", "adaptive", ...)
    budget_tokens: int | None = None


class _Format(_Body):
    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class _OutputConfig(_Body):
    format: _Format | None = None
    effort: str | None = None  # the model thinks as its template has it


class MessagesRequest(_Body):
    model: str | None = None
    messages: list[_Message] = Field(min_length=1)
    system: str | list[_Block] | None = None
    max_tokens: int | None = Field(None, ge=1)
    stop_sequences: list[str] | None = None
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, ge=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0)
    stream: bool = False
    tools: list[_Tool] | None = None
    tool_choice: _ToolChoice | None = None
    thinking: _Thinking | None = None
    output_config: _OutputConfig | None = None


def add_routes(app: FastAPI, server: Any) -> None:
    """``/v1/messages`` and ``/v1/messages/count_tokens`` on ``app`` for ``server``."""
    from .app import _SSE_HEADERS, CLIENT_CLOSED, _collect, _submitted

    def anthropic_errors(route: Callable[[Request], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
        async def wrapped(request: Request) -> Response:
            try:
                return await route(request)
            except APIError as exc:
                return JSONResponse(anthropic_error_body(exc.status, exc.message), status_code=exc.status)

        wrapped.__name__ = route.__name__
        return wrapped

    @app.post("/v1/messages")
    @anthropic_errors
    async def messages(request: Request) -> Response:
        req: MessagesRequest = parse(await request.body(), MessagesRequest)
        chat: ChatRequest = validated(chat_request(req), ChatRequest)
        made, handle, release = await _submitted(server, lambda: server.jobs.chat(chat), lambda m: m.job)
        reply = _Reply(server.model_id, made)
        if req.stream:
            return StreamingResponse(
                _events(handle, reply, release), media_type="text/event-stream", headers=_SSE_HEADERS
            )
        deltas = await _collect(handle, request, release)
        if deltas is None:
            return Response(status_code=CLIENT_CLOSED)
        return JSONResponse(reply.whole("".join(d.text for d in deltas), deltas[-1]))

    @app.post("/v1/messages/count_tokens")
    @anthropic_errors
    async def count_tokens(request: Request) -> Response:
        req: MessagesRequest = parse(await request.body(), MessagesRequest)
        chat: ChatRequest = validated(chat_request(req), ChatRequest)

        def count() -> int:
            text, _ = server.jobs.chat_prompt(chat)
            return len(server.llm.prompt_ids(text))

        try:
            return JSONResponse({"input_tokens": await asyncio.to_thread(count)})
        except ValueError as exc:
            raise bad_request(str(exc), "messages") from None


def chat_request(req: MessagesRequest) -> dict[str, Any]:
    """``req`` as the chat completions request the server runs."""
    messages: list[dict[str, Any]] = []
    if req.system:
        messages.append({"role": "system", "content": _text(req.system, "system")})
    for i, message in enumerate(req.messages):
        where = f"messages[{i}]"
        blocks = [_Block(type="text", text=message.content)] if isinstance(message.content, str) else message.content
        if message.role == "user":
            messages += _user_turn(blocks, where)
        else:
            messages.append(_assistant_turn(blocks, where))
    out: dict[str, Any] = {"messages": messages}
    for name, value in (
        ("max_tokens", req.max_tokens),
        ("temperature", req.temperature),
        ("top_p", req.top_p),
        ("top_k", req.top_k),
        ("stop", req.stop_sequences),
    ):
        if value is not None:
            out[name] = value
    if req.tools:
        out["tools"] = [_chat_tool(t, i) for i, t in enumerate(req.tools)]
    choice = req.tool_choice
    if choice is not None:
        if choice.type == "tool":
            if choice.name is None:
                raise bad_request('tool_choice of type "tool" needs the name of a tool', "tool_choice")
            out["tool_choice"] = {"type": "function", "function": {"name": choice.name}}
        else:
            out["tool_choice"] = {"auto": "auto", "any": "required", "none": "none"}[choice.type]
        # one call per answer unless the request allows several, as the other routes have it
        out["parallel_tool_calls"] = choice.disable_parallel_tool_use is False
    fmt = req.output_config.format if req.output_config is not None else None
    if fmt is not None:
        out["response_format"] = {"type": "json_schema", "json_schema": {"name": "output", "schema": fmt.schema_}}
    if req.thinking is not None:
        out["chat_template_kwargs"] = {"enable_thinking": req.thinking.type != "disabled"}
    return out


def _user_turn(blocks: list[_Block], where: str) -> list[dict[str, Any]]:
    """A user turn's tool results (tool messages, in order), then its text (a user message)."""
    out: list[dict[str, Any]] = []
    text: list[str] = []
    for j, block in enumerate(blocks):
        at = f"{where}.content[{j}]"
        if block.type == "tool_result":
            if block.tool_use_id is None:
                raise bad_request(f"{at} is a tool_result without its tool_use_id", at)
            out.append({"role": "tool", "tool_call_id": block.tool_use_id, "content": _text(block.content, at)})
        elif block.type == "text" and block.text is not None:
            text.append(block.text)
        else:
            raise _unsupported(block, at, "text and tool_result")
    if text or not out:
        out.append({"role": "user", "content": "\n".join(text)})
    return out


def _assistant_turn(blocks: list[_Block], where: str) -> dict[str, Any]:
    """An assistant turn's text and tool calls as one assistant message (its thinking left out)."""
    text: list[str] = []
    calls: list[dict[str, Any]] = []
    for j, block in enumerate(blocks):
        at = f"{where}.content[{j}]"
        if block.type == "text" and block.text is not None:
            text.append(block.text)
        elif block.type == "tool_use":
            if block.id is None or block.name is None or not isinstance(block.input, dict):
                raise bad_request(f"{at} is a tool_use without its id, name and input object", at)
            arguments = json.dumps(block.input, ensure_ascii=False)
            calls.append({"id": block.id, "type": "function", "function": {"name": block.name, "arguments": arguments}})
        elif block.type not in ("thinking", "redacted_thinking"):
            raise _unsupported(block, at, "text, tool_use and thinking")
    message: dict[str, Any] = {"role": "assistant", "content": "\n".join(text) if text or not calls else None}
    if calls:
        message["tool_calls"] = calls
    return message


def _text(content: str | list[_Block] | None, where: str) -> str:
    """The text of a system prompt or a tool result: a string or text blocks."""
    if content is None or isinstance(content, str):
        return content or ""
    pieces = []
    for j, block in enumerate(content):
        if block.type != "text" or block.text is None:
            raise _unsupported(block, f"{where}[{j}]", "text")
        pieces.append(block.text)
    return "\n".join(pieces)


def _unsupported(block: _Block, where: str, allowed: str) -> APIError:
    return bad_request(f"{where} is a {block.type!r} block; this model takes {allowed} blocks here", where)


def _chat_tool(tool: _Tool, i: int) -> dict[str, Any]:
    if tool.type not in (None, "custom"):
        raise bad_request(
            f"tools[{i}] is Anthropic's server tool {tool.type!r}, which this server does not run; "
            "it takes custom tools (name, description, input_schema)",
            f"tools[{i}]",
        )
    function: dict[str, Any] = {"name": tool.name, "description": tool.description or ""}
    function["parameters"] = tool.input_schema or {"type": "object", "properties": {}}
    return {"type": "function", "function": function}


class _Reply:
    """One answer's identity and the objects that describe it."""

    def __init__(self, model: str, made: ChatJob) -> None:
        self.id = f"msg_{secrets.token_hex(12)}"
        self.model, self.made = model, made

    def head(self, content: list[dict[str, Any]], delta: Delta | None) -> dict[str, Any]:
        """The message with ``content``; ``delta``: the last one once the answer is whole."""
        stop_reason = None if delta is None else _stop_reason(delta, content)
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            "stop_reason": stop_reason,
            "stop_sequence": delta.stop_sequence if stop_reason == "stop_sequence" and delta else None,
            "usage": self.usage(delta),
        }

    def usage(self, delta: Delta | None) -> dict[str, Any]:
        prompt = len(self.made.job.prompt) if delta is None else delta.prompt_tokens
        cached = 0 if delta is None else delta.cached_tokens
        return {
            "input_tokens": prompt - cached,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": cached,
            "output_tokens": 0 if delta is None else delta.completion_tokens,
        }

    def blocks(self, text: str, finish: str | None) -> list[dict[str, Any]]:
        """A whole answer's content blocks: its thinking, its text and its tool calls."""
        thought = ""
        if self.made.thinking is not None:
            thought, text = reasoning.split(text, self.made.thinking)
        content, calls = tools.finished_answer(text, self.made.tool_plan, finish)
        out = [_thinking(thought)] if thought else []
        if content or not (out or calls):  # an empty answer is still one text block, as Anthropic's are
            out.append(_text_block(content or ""))
        return out + [_tool_use(c) for c in calls]

    def whole(self, text: str, last: Delta) -> dict[str, Any]:
        return self.head(self.blocks(text, last.finish), last)


def _stop_reason(delta: Delta, content: list[dict[str, Any]]) -> str:
    if any(block["type"] == "tool_use" for block in content):
        return "tool_use"
    if delta.finish == "length":
        return "max_tokens"
    return "stop_sequence" if delta.stop_sequence is not None else "end_turn"


def _thinking(text: str) -> dict[str, Any]:
    return {"type": "thinking", "thinking": text, "signature": ""}


def _text_block(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def _tool_use(call: dict[str, Any]) -> dict[str, Any]:
    try:
        arguments = json_text.loads(call["function"]["arguments"])
    except ValueError:
        arguments = None
    return {
        "type": "tool_use",
        "id": "toolu_" + call["id"].removeprefix("call_"),
        "name": call["function"]["name"],
        "input": arguments if isinstance(arguments, dict) else {},
    }


async def _events(handle: Handle, reply: _Reply, release: Callable[[], None]) -> AsyncIterator[bytes]:
    """The answer as Anthropic's server-sent events: thinking and text stream as they come; an answer
    that may call tools is read whole, then sent as its blocks."""

    def event(kind: str, **fields: Any) -> bytes:
        payload = json.dumps({"type": kind, **fields}, ensure_ascii=False, separators=(",", ":"))
        return f"event: {kind}\ndata: {payload}\n\n".encode()

    blocks = 0  # blocks started so far
    open_kind: str | None = None  # the kind of the block being streamed

    def start(block: dict[str, Any]) -> list[bytes]:
        nonlocal blocks, open_kind
        out = stop()
        out.append(event("content_block_start", index=blocks, content_block=block))
        blocks, open_kind = blocks + 1, block["type"]
        return out

    def stop() -> list[bytes]:
        nonlocal open_kind
        if open_kind is None:
            return []
        open_kind = None
        return [event("content_block_stop", index=blocks - 1)]

    def streamed(kind: str, piece: str) -> list[bytes]:
        """``piece`` as a delta of a ``kind`` block ("thinking" or "text"), opening one where needed."""
        out = [] if open_kind == kind else start(_thinking("") if kind == "thinking" else _text_block(""))
        delta = (
            {"type": "thinking_delta", "thinking": piece}
            if kind == "thinking"
            else {"type": "text_delta", "text": piece}
        )
        out.append(event("content_block_delta", index=blocks - 1, delta=delta))
        return out

    made = reply.made
    splitter = None if made.thinking is None else reasoning.ReasoningSplitter(made.thinking)
    held: list[str] = []  # an answer that may call tools is read whole before it is sent
    try:
        yield event("message_start", message=reply.head([], None))
        yield event("ping")
        async for delta in handle.deltas():
            if delta.error is not None:
                yield event("error", error=anthropic_error_body(delta.error.status, delta.error.message)["error"])
                return
            if delta.finish == CANCELLED:
                return
            thought, text = reasoning.pieces(splitter, delta.text, delta.finish is not None)
            if thought:
                for piece in streamed("thinking", thought):
                    yield piece
            if made.tool_plan is not None:
                held.append(text)
            elif text:
                for piece in streamed("text", text):
                    yield piece
            if delta.finish is None:
                continue
            content: list[dict[str, Any]] = []
            if made.tool_plan is not None:
                answer, calls = tools.finished_answer("".join(held), made.tool_plan, delta.finish)
                if answer:
                    for piece in streamed("text", answer):
                        yield piece
                for call in calls:
                    block = _tool_use(call)
                    content.append(block)
                    for piece in start({**block, "input": {}}):
                        yield piece
                    partial = json.dumps(block["input"], ensure_ascii=False)
                    yield event("content_block_delta", index=blocks - 1,
                                delta={"type": "input_json_delta", "partial_json": partial})  # fmt: skip
            if blocks == 0:  # an empty answer is still one text block, as Anthropic's are
                for piece in start(_text_block("")):
                    yield piece
            for piece in stop():
                yield piece
            whole = reply.head(content, delta)
            ending = {"stop_reason": whole["stop_reason"], "stop_sequence": whole["stop_sequence"]}
            yield event("message_delta", delta=ending, usage=whole["usage"])
            yield event("message_stop")
    finally:
        handle.cancel()
        release()
