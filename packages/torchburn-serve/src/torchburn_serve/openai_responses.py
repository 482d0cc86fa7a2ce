"""OpenAI's Responses API (``POST /v1/responses``), which newer OpenAI clients and agent frameworks
call instead of chat completions.

A request becomes the chat request the server already runs: ``instructions`` as the system message,
``input`` (a string, or messages, function calls and their outputs) as the conversation,
``max_output_tokens``, ``temperature``, ``top_p``, ``text.format`` (JSON object or JSON schema,
enforced token by token), function ``tools`` and ``tool_choice``; ``reasoning.effort`` "none" asks the
chat template not to think (Qwen3's ``enable_thinking``). The answer is a ``response`` object whose
``output`` holds a reasoning model's thinking (a ``reasoning`` item), the assistant's message and any
function calls; streamed, the standard events (``response.created`` ... ``response.reasoning_text.delta``
... ``response.output_text.delta`` ... ``response.completed``). Responses are not stored:
``previous_response_id`` is refused, and a conversation sends its history as ``input`` (reasoning items
sent back are left out, as the chat routes leave earlier thinking out).
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import Field

from . import reasoning, tools
from .engine import CANCELLED, Delta, Handle
from .errors import bad_request
from .jobs import ChatJob
from .protocol import ChatRequest, _Body, parse, validated


class _Part(_Body):
    type: str
    text: str | None = None


class _Item(_Body):
    type: str | None = None  # "message" where a role is given, "function_call", "function_call_output"
    role: Literal["system", "developer", "user", "assistant"] | None = None
    content: str | list[_Part] | None = None
    call_id: str | None = None
    name: str | None = None
    arguments: str | None = None
    output: str | list[_Part] | None = None


class _Format(_Body):
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class _Text(_Body):
    format: _Format | None = None


class _Reasoning(_Body):
    effort: str | None = None  # "none": the chat template is asked not to think


class ResponsesRequest(_Body):
    model: str | None = None
    input: str | list[_Item]
    instructions: str | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, ge=0.0, le=1.0)
    stream: bool = False
    text: _Text | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool = False
    previous_response_id: str | None = None
    reasoning: _Reasoning | None = None


def add_routes(app: FastAPI, server: Any) -> None:
    """``/v1/responses`` (and ``/responses``) on ``app`` for ``server``."""
    from .app import _SSE_HEADERS, CLIENT_CLOSED, _collect, _submitted

    @app.post("/v1/responses")
    @app.post("/responses")
    async def create(request: Request) -> Response:
        req: ResponsesRequest = parse(await request.body(), ResponsesRequest)
        chat: ChatRequest = validated(chat_request(req), ChatRequest)
        made, handle, release = await _submitted(server, lambda: server.jobs.chat(chat), lambda m: m.job)
        answer = _Answer(server.model_id, req, made)
        if req.stream:
            return StreamingResponse(
                _events(handle, answer, release), media_type="text/event-stream", headers=_SSE_HEADERS
            )
        deltas = await _collect(handle, request, release)
        if deltas is None:
            return Response(status_code=CLIENT_CLOSED)
        answer.take(deltas[-1])
        return JSONResponse(answer.response("".join(d.text for d in deltas), deltas[-1].finish))


def chat_request(req: ResponsesRequest) -> dict[str, Any]:
    """``req`` as the chat completions request the server runs."""
    if req.previous_response_id is not None:
        raise bad_request(
            "responses are not stored here: send the conversation so far as input instead of previous_response_id",
            "previous_response_id",
        )
    messages: list[dict[str, Any]] = []
    if req.instructions:
        messages.append({"role": "system", "content": req.instructions})
    items = [_Item(role="user", content=req.input)] if isinstance(req.input, str) else req.input
    for i, item in enumerate(items):
        kind = item.type or ("message" if item.role is not None else None)
        where = f"input[{i}]"
        if kind == "message" and item.role is not None:
            messages.append({"role": item.role, "content": _text(item.content, where)})
        elif kind == "function_call" and item.name is not None and item.call_id is not None:
            call = {"id": item.call_id, "type": "function",
                    "function": {"name": item.name, "arguments": item.arguments or "{}"}}  # fmt: skip
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant" and "tool_calls" in last:
                last["tool_calls"].append(call)  # calls made together go back in one assistant turn
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output" and item.call_id is not None:
            messages.append({"role": "tool", "tool_call_id": item.call_id, "content": _text(item.output, where)})
        elif kind == "reasoning":
            continue  # earlier thinking stays out of the prompt
        else:
            raise bad_request(
                f"{where} must be a message (role and content), a function_call (call_id, name, arguments) or a "
                "function_call_output (call_id, output)",
                where,
            )
    out: dict[str, Any] = {"messages": messages}
    for name, value in (("max_tokens", req.max_output_tokens), ("temperature", req.temperature), ("top_p", req.top_p)):
        if value is not None:
            out[name] = value
    fmt = req.text.format if req.text is not None else None
    if fmt is not None and fmt.type == "json_object":
        out["response_format"] = {"type": "json_object"}
    elif fmt is not None and fmt.type == "json_schema":
        if fmt.schema_ is None:
            raise bad_request("text.format json_schema needs a schema", "text.format")
        out["response_format"] = {"type": "json_schema", "json_schema": {"name": fmt.name, "schema": fmt.schema_}}
    if req.tools:
        out["tools"] = [_chat_tool(t, i) for i, t in enumerate(req.tools)]
    if req.tool_choice is not None:
        choice = req.tool_choice
        if isinstance(choice, dict) and choice.get("type") == "function" and "name" in choice:
            choice = {"type": "function", "function": {"name": choice["name"]}}
        out["tool_choice"] = choice
    out["parallel_tool_calls"] = req.parallel_tool_calls
    if req.reasoning is not None and req.reasoning.effort == "none":
        out["chat_template_kwargs"] = {"enable_thinking": False}
    return out


def _text(content: str | list[_Part] | None, where: str) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    pieces = []
    for part in content:
        if part.type not in ("input_text", "output_text", "text", "reasoning_text") or part.text is None:
            raise bad_request(f"{where} has a content part of type {part.type!r}; this model takes text only", where)
        pieces.append(part.text)
    return "".join(pieces)


def _chat_tool(tool: dict[str, Any], i: int) -> dict[str, Any]:
    """A Responses function tool (name and parameters at the top) as chat completions write it."""
    if tool.get("type") != "function" or not isinstance(tool.get("name"), str):
        raise bad_request(f'tools[{i}] must be {{"type": "function", "name": ..., "parameters": ...}}', f"tools[{i}]")
    function = {k: tool[k] for k in ("name", "description", "parameters") if k in tool}
    return {"type": "function", "function": function}


class _Answer:
    """One response's identity, settings and counts, and the objects that describe it."""

    def __init__(self, model: str, req: ResponsesRequest, made: ChatJob) -> None:
        self.id = f"resp_{secrets.token_hex(12)}"
        self.message_id = f"msg_{secrets.token_hex(12)}"
        self.reasoning_id = f"rs_{secrets.token_hex(12)}"
        self.created = int(time.time())
        self.model, self.req = model, req
        self.plan, self.thinking = made.tool_plan, made.thinking
        self.input_tokens = self.output_tokens = self.cached_tokens = 0

    def take(self, delta: Delta) -> None:
        self.input_tokens, self.output_tokens = delta.prompt_tokens, delta.completion_tokens
        self.cached_tokens = delta.cached_tokens

    def message(self, text: str, status: str = "completed") -> dict[str, Any]:
        content = [_output_text(text)] if status == "completed" else []
        return {"type": "message", "id": self.message_id, "status": status, "role": "assistant", "content": content}

    def reasoning(self, text: str, status: str = "completed") -> dict[str, Any]:
        content = [_reasoning_text(text)] if status == "completed" else []
        return {"type": "reasoning", "id": self.reasoning_id, "status": status, "summary": [], "content": content}

    def response(self, text: str | None, finish: str | None) -> dict[str, Any]:
        """The whole response object; ``text`` None while it is being generated."""
        output: list[dict[str, Any]] = []
        if text is not None:
            if self.thinking is not None:
                thought, text = reasoning.split(text, self.thinking)
                if thought:
                    output.append(self.reasoning(thought))
            content, calls = tools.finished_answer(text, self.plan, finish)
            if content or not calls:
                output.append(self.message(content or ""))
            output += [_function_call(c) for c in calls]
        done = text is not None
        status = "in_progress" if not done else "incomplete" if finish == "length" else "completed"
        req = self.req
        body: dict[str, Any] = {
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "status": status,
            "model": self.model,
            "output": output,
            "instructions": req.instructions,
            "max_output_tokens": req.max_output_tokens,
            "temperature": req.temperature,
            "top_p": req.top_p,
            "tools": req.tools or [],
            "tool_choice": req.tool_choice if req.tool_choice is not None else "auto",
            "parallel_tool_calls": req.parallel_tool_calls,
            "text": {"format": {"type": "text"}} if req.text is None else req.text.model_dump(by_alias=True),
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "error": None,
            "usage": None,
        }
        if done:
            body["usage"] = {
                "input_tokens": self.input_tokens,
                "input_tokens_details": {"cached_tokens": self.cached_tokens},
                "output_tokens": self.output_tokens,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": self.input_tokens + self.output_tokens,
            }
        return body


def _reasoning_text(text: str) -> dict[str, Any]:
    return {"type": "reasoning_text", "text": text}


def _output_text(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _function_call(call: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": f"fc_{secrets.token_hex(12)}",
        "call_id": call["id"],
        "name": call["function"]["name"],
        "arguments": call["function"]["arguments"],
        "status": "completed",
    }


async def _events(handle: Handle, answer: _Answer, release: Callable[[], None]) -> AsyncIterator[bytes]:
    """The response as server-sent events, each named by its type and numbered. Thinking and text stream
    as they come, each in its output item (opened when its first piece arrives); an answer that may call
    tools is read whole, then sent as its items."""
    number = 0

    def event(kind: str, **fields: Any) -> bytes:
        nonlocal number
        payload = json.dumps({"type": kind, "sequence_number": number, **fields}, ensure_ascii=False)
        number += 1
        return f"event: {kind}\ndata: {payload}\n\n".encode()

    opened: list[str] = []  # the kinds of the output items started so far, in order
    ended: set[str] = set()
    thought: list[str] = []
    shown: list[str] = []  # the message's text sent so far
    raw: list[str] = []  # the answer as generated

    def at(kind: str) -> dict[str, Any]:
        item_id = answer.message_id if kind == "message" else answer.reasoning_id
        return {"item_id": item_id, "output_index": opened.index(kind), "content_index": 0}

    def start(kind: str) -> list[bytes]:
        opened.append(kind)
        item, part = (
            (answer.message("", "in_progress"), _output_text(""))
            if kind == "message"
            else (answer.reasoning("", "in_progress"), _reasoning_text(""))
        )
        return [
            event("response.output_item.added", output_index=len(opened) - 1, item=item),
            event("response.content_part.added", **at(kind), part=part),
        ]

    def end_reasoning() -> list[bytes]:
        if "reasoning" not in opened or "reasoning" in ended:
            return []
        text = "".join(thought)
        ended.add("reasoning")
        return [
            event("response.reasoning_text.done", **at("reasoning"), text=text),
            event("response.content_part.done", **at("reasoning"), part=_reasoning_text(text)),
            event(
                "response.output_item.done", output_index=at("reasoning")["output_index"], item=answer.reasoning(text)
            ),
        ]

    plan = answer.plan
    splitter = None if answer.thinking is None else reasoning.ReasoningSplitter(answer.thinking)
    try:
        yield event("response.created", response=answer.response(None, None))
        yield event("response.in_progress", response=answer.response(None, None))
        if plan is None and splitter is None:
            for piece in start("message"):
                yield piece
        async for delta in handle.deltas():
            if delta.error is not None:
                yield event("error", code=delta.error.code, message=delta.error.message, param=delta.error.param)
                return
            if delta.finish == CANCELLED:
                return
            raw.append(delta.text)
            thinking, text = reasoning.pieces(splitter, delta.text, delta.finish is not None)
            out: list[bytes] = []
            if thinking:
                if "reasoning" not in opened:
                    out += start("reasoning")
                thought.append(thinking)
                out.append(event("response.reasoning_text.delta", **at("reasoning"), delta=thinking))
            if plan is None and text:
                out += end_reasoning()
                if "message" not in opened:
                    out += start("message")
                shown.append(text)
                out.append(event("response.output_text.delta", **at("message"), delta=text, logprobs=[]))
            for piece in out:
                yield piece
            if delta.finish is None:
                continue
            for piece in end_reasoning():
                yield piece
            answer.take(delta)
            whole = answer.response("".join(raw), delta.finish)
            if plan is None:
                if "message" not in opened:  # an answer of thinking alone still has its (empty) message
                    for piece in start("message"):
                        yield piece
                text = "".join(shown)
                index = at("message")["output_index"]
                yield event("response.output_text.done", **at("message"), text=text, logprobs=[])
                yield event("response.content_part.done", **at("message"), part=_output_text(text))
                yield event("response.output_item.done", output_index=index, item=whole["output"][index])
            else:
                for index, item in enumerate(whole["output"]):
                    if item["type"] == "reasoning":
                        continue  # streamed above
                    yield event("response.output_item.added", output_index=index, item=item)
                    if item["type"] == "function_call":
                        yield event("response.function_call_arguments.done", item_id=item["id"],
                                    output_index=index, arguments=item["arguments"])  # fmt: skip
                    yield event("response.output_item.done", output_index=index, item=item)
            kind = "response.incomplete" if whole["status"] == "incomplete" else "response.completed"
            yield event(kind, response=whole)
    finally:
        handle.cancel()
        release()
