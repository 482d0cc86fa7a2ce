"""Tool calls (``tools`` / ``tool_choice``) in two ways, as llama-server does.

A chat template that knows tools (it reads a ``tools`` variable) is given them and the model answers
in its trained format; ``<tool_call>{...}</tool_call>`` blocks (Hermes, Qwen) or a bare
``{"name": ..., "arguments": ...}`` object (Llama 3.1) are read back as calls. Any other model, and any
request that requires a call, gets the tools described in a system message and its answer constrained
by a JSON schema to ``{"tool_calls": [{"name", "arguments"}]}`` (or ``{"response": text}`` where a
call is optional): every call then names a real tool with arguments that match its parameters."""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass
from typing import Any

from . import json_text
from .errors import bad_request

_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_MAX_TOOLS = 128
_NATIVE_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: dict[str, Any]

    def as_openai(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }


@dataclass(frozen=True)
class ToolPlan:
    """How one request calls tools: the tools offered, whether the model's own format is used, and the
    schema its answer must match (None: free text in the model's format)."""

    tools: tuple[Tool, ...]
    native: bool
    schema: dict[str, Any] | None
    required: bool  # the answer must call a tool


def parse_tools(raw: Any) -> tuple[Tool, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list) or len(raw) > _MAX_TOOLS:
        raise bad_request(f"tools must be a list of at most {_MAX_TOOLS} function tools", "tools")
    tools = []
    for i, item in enumerate(raw):
        where = f"tools[{i}]"
        if not isinstance(item, dict) or item.get("type") != "function" or not isinstance(item.get("function"), dict):
            raise bad_request(f'{where} must be {{"type": "function", "function": {{...}}}}', where)
        fn = item["function"]
        name = fn.get("name")
        if not isinstance(name, str) or not _NAME.match(name):
            raise bad_request(f"{where}.function.name must be 1-64 letters, digits, '_', '.' or '-'", where)
        description = fn.get("description", "")
        parameters = fn.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(description, str) or not isinstance(parameters, dict):
            raise bad_request(f"{where}.function needs a string description and an object of parameters", where)
        tools.append(Tool(name, description, parameters))
    if len({t.name for t in tools}) != len(tools):
        raise bad_request("tools must have distinct names", "tools")
    return tuple(tools)


def plan(tools: tuple[Tool, ...], choice: Any, template_knows_tools: bool, parallel: bool = False) -> ToolPlan | None:
    """The way this request calls tools, or None where it offers none (or ``tool_choice`` is "none").
    ``parallel`` (``parallel_tool_calls``): an answer may make several calls; by default one, as
    llama-server has it (a small model allowed a list repeats its call until ``max_tokens``)."""
    if choice is None:
        choice = "auto" if tools else "none"
    if choice == "none" or not tools:
        if isinstance(choice, dict) or choice in ("required",):
            raise bad_request("tool_choice asks for a tool call but the request offers no tools", "tool_choice")
        if choice not in ("none", "auto"):
            raise bad_request('tool_choice must be "none", "auto", "required" or a named function', "tool_choice")
        return None
    most = None if parallel else 1
    if choice == "auto":
        if template_knows_tools:
            return ToolPlan(tools, True, None, False)
        return ToolPlan(tools, False, _answer_schema(tools, required=False, most=most), False)
    if choice == "required":
        return ToolPlan(tools, False, _answer_schema(tools, required=True, most=most), True)
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("function"), dict):
        name = choice["function"].get("name")
        named = tuple(t for t in tools if t.name == name)
        if not named:
            raise bad_request(f"tool_choice names {name!r}, which is not among the tools", "tool_choice")
        return ToolPlan(named, False, _answer_schema(named, required=True, most=1), True)
    raise bad_request('tool_choice must be "none", "auto", "required" or a named function', "tool_choice")


def _answer_schema(tools: tuple[Tool, ...], required: bool, most: int | None = None) -> dict[str, Any]:
    """The JSON an answer under the generic tool format must be: ``{"tool_calls": [...]}`` (at most
    ``most`` calls; a named ``tool_choice`` asks for one call of that function), or where no call is
    required ``{"response": text}``."""
    call = {
        "anyOf": [
            {
                "type": "object",
                "properties": {"name": {"const": t.name}, "arguments": t.parameters},
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
            for t in tools
        ]
    }
    calls = {
        "type": "object",
        "properties": {
            "tool_calls": {"type": "array", "items": call, "minItems": 1, **({"maxItems": most} if most else {})}
        },
        "required": ["tool_calls"],
        "additionalProperties": False,
    }
    if required:
        return calls
    answer = {
        "type": "object",
        "properties": {"response": {"type": "string"}},
        "required": ["response"],
        "additionalProperties": False,
    }
    return {"anyOf": [calls, answer]}


def system_prompt(tools: tuple[Tool, ...], required: bool) -> str:
    """What a model without tools in its template is told about them."""
    listed = json.dumps([{"name": t.name, "description": t.description, "parameters": t.parameters} for t in tools])
    shape = '{"tool_calls": [{"name": "<tool name>", "arguments": {<arguments>}}]}'
    if required:
        return f"You call tools. Reply with one JSON object: {shape}.\nTools: {listed}"
    return (
        f"You can call tools. Reply with one JSON object: {shape} to call tools, or "
        f'{{"response": "<your answer>"}} to answer directly.\nTools: {listed}'
    )


def generic_messages(messages: list[dict[str, Any]], tool_plan: ToolPlan) -> list[dict[str, Any]]:
    """``messages`` for a template without tools: the tools described in the system message, earlier
    calls and their results as JSON text in roles every template takes."""
    intro = system_prompt(tool_plan.tools, tool_plan.required)
    out: list[dict[str, Any]] = []
    for m in messages:
        role, content = m["role"], m.get("content") or ""
        if role == "assistant" and m.get("tool_calls"):
            calls = [
                {"name": c["function"]["name"], "arguments": _arguments_object(c["function"].get("arguments"))}
                for c in m["tool_calls"]
            ]
            out.append({"role": "assistant", "content": json.dumps({"tool_calls": calls})})
        elif role == "tool":
            result = {"tool_call_id": m.get("tool_call_id"), "content": content}
            out.append({"role": "user", "content": json.dumps({"tool_response": result})})
        else:
            out.append({"role": role, "content": content})
    if out and out[0]["role"] == "system":
        out[0] = {"role": "system", "content": out[0]["content"] + "\n\n" + intro}
    else:
        out.insert(0, {"role": "system", "content": intro})
    return out


def _arguments_object(arguments: Any) -> Any:
    if isinstance(arguments, str):
        try:
            return json_text.loads(arguments)
        except ValueError:
            return arguments
    return arguments


def finished_answer(
    text: str, tool_plan: ToolPlan | None, finish: str | None
) -> tuple[str | None, list[dict[str, Any]]]:
    """A whole answer's text and tool calls, however it finished: one cut short by ``max_tokens`` (or
    offered no tools) stays text as it is."""
    if tool_plan is None or finish == "length":
        return text, []
    return read_answer(text, tool_plan)


def read_answer(text: str, tool_plan: ToolPlan) -> tuple[str | None, list[dict[str, Any]]]:
    """The answer's text and its tool calls (OpenAI's shape, each with a fresh id)."""
    if tool_plan.native:
        return _read_native(text, tool_plan.tools)
    try:
        answer = json_text.loads(text)
    except ValueError:
        return text, []  # cut short by max_tokens: what there is, as text
    if isinstance(answer, dict) and isinstance(answer.get("tool_calls"), list):
        return None, [_call(c.get("name"), c.get("arguments")) for c in answer["tool_calls"] if isinstance(c, dict)]
    if isinstance(answer, dict) and isinstance(answer.get("response"), str):
        return answer["response"], []
    return text, []


def _read_native(text: str, tools: tuple[Tool, ...]) -> tuple[str | None, list[dict[str, Any]]]:
    """Calls in the formats models are trained on: ``<tool_call>`` blocks (Hermes, Qwen); the whole answer
    one call object (Llama 3.1) or a list of them (Mistral's ``[TOOL_CALLS][...]``, whose marker is a
    special token and so not in the text); or ``name{arguments}`` runs (later Mistral models'
    ``[TOOL_CALLS]name[ARGS]{...}``, markers likewise gone)."""
    names = {t.name for t in tools}
    calls = []
    for block in _NATIVE_CALL.findall(text):
        call = _json_call(block, names)
        if call is not None:
            calls.append(call)
    if calls:
        rest = _NATIVE_CALL.sub("", text).strip()
        return rest or None, calls
    whole = _MISTRAL_MARKERS.sub("", text).strip()
    value = _json_value(whole)
    bare = _call_object(value, names)
    if bare is not None:
        return None, [bare]
    listed = _call_list(value, names)
    if listed:
        return None, listed
    named = _named_calls(whole, names)
    return (None, named) if named else (text, [])


# the markers of Mistral's call formats, where a tokenizer keeps them as text
_MISTRAL_MARKERS = re.compile(r"\[TOOL_CALLS\]|\[ARGS\]|\[CALL_ID\][A-Za-z0-9]*")


def _call_list(value: Any, names: set[str]) -> list[dict[str, Any]]:
    """A JSON list of call objects, all of offered tools; else none."""
    if not isinstance(value, list) or not value:
        return []
    calls = [_call_object(item, names) for item in value]
    return [c for c in calls if c is not None] if all(c is not None for c in calls) else []


def _named_calls(text: str, names: set[str]) -> list[dict[str, Any]]:
    """``name{...}name{...}``: each an offered tool's name and a JSON object of arguments, back to back."""
    calls, at = [], 0
    decoder = json.JSONDecoder()
    longest_first = sorted(names, key=len, reverse=True)
    while at < len(text):
        name = next((n for n in longest_first if text.startswith(n + "{", at)), None)
        if name is None:
            return []
        try:
            arguments, end = decoder.raw_decode(text, at + len(name))
        except (ValueError, RecursionError):  # the model's text: anything at all up to max_tokens
            return []
        if not isinstance(arguments, dict):
            return []
        calls.append(_call(name, arguments))
        at = end
        while at < len(text) and text[at].isspace():
            at += 1
    return calls


def _json_value(text: str) -> Any:
    """``text`` as JSON, or None where it is not JSON."""
    try:
        return json_text.loads(text)
    except ValueError:
        return None


def _json_call(text: str, names: set[str]) -> dict[str, Any] | None:
    return _call_object(_json_value(text), names)


def _call_object(value: Any, names: set[str]) -> dict[str, Any] | None:
    """A call of an offered tool from its JSON object (``arguments``, or Llama 3.1's ``parameters``)."""
    if not isinstance(value, dict) or value.get("name") not in names:
        return None
    return _call(value["name"], value.get("arguments", value.get("parameters", {})))


def _call(name: Any, arguments: Any) -> dict[str, Any]:
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments)
    return {
        "id": "call_" + secrets.token_hex(12),
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }
