"""The OpenAI request bodies the server takes, validated: a wrong type or a value out of range is a
400 naming the field. Fields clients send that change nothing here (``user``, ``store``,
``metadata``) are accepted and ignored, as llama-server does."""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any, Literal, cast

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from . import json_text
from .errors import APIError, bad_request

MAX_STOP_LENGTH = 256
# what the server itself gives a chat template
TEMPLATE_VARIABLES = frozenset({"messages", "tools", "add_generation_prompt", "bos_token", "eos_token"})
MAX_TEMPLATE_KWARGS_BYTES = 16 << 10


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=False)


class StreamOptions(_Body):
    include_usage: bool = False


class Sampling(_Body):
    """The sampling fields chat and text completions share."""

    model: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, ge=0.0, le=1.0)  # 0: only the most likely token, as llama-server
    top_k: int | None = Field(None, ge=0)  # llama-server's extensions, as its clients send them
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    repetition_penalty: float | None = Field(None, gt=0.0, le=10.0)
    repeat_penalty: float | None = Field(None, gt=0.0, le=10.0)
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = None  # token id (as a string) -> bias in [-100, 100]
    seed: int | None = None
    n: int = Field(1, ge=1)
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None

    @field_validator("n")
    @classmethod
    def _one_choice(cls, n: int) -> int:
        if n != 1:
            raise ValueError("only n=1 is supported (one choice per request)")
        return n

    @field_validator("logit_bias")
    @classmethod
    def _biases(cls, bias: dict[str, float] | None) -> dict[str, float] | None:
        for key, value in (bias or {}).items():
            if not key.isdigit() or len(key) > 9:
                raise ValueError(f"keys are token ids; {key[:20]!r} is not one")
            if not -100 <= value <= 100:
                raise ValueError(f"token {key}'s bias {value} is outside [-100, 100]")
        return bias

    def token_biases(self) -> tuple[tuple[int, float], ...]:
        return tuple((int(k), float(v)) for k, v in (self.logit_bias or {}).items())

    @field_validator("stop")
    @classmethod
    def _stops(cls, stop: str | list[str] | None) -> str | list[str] | None:
        for s in [stop] if isinstance(stop, str) else stop or []:
            if len(s) > MAX_STOP_LENGTH:
                raise ValueError(f"a stop string may be at most {MAX_STOP_LENGTH} characters")
        return stop

    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class ContentPart(_Body):
    type: str
    text: str | None = None


class FunctionCall(_Body):
    name: str
    arguments: str | dict[str, Any] = "{}"


class ToolCall(_Body):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(_Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None

    def text(self, index: int) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        pieces = []
        for part in self.content:
            if part.type != "text" or part.text is None:
                raise bad_request(
                    f"messages[{index}] has a content part of type {part.type!r}; this model takes text only",
                    f"messages[{index}].content",
                )
            pieces.append(part.text)
        return "".join(pieces)


class JsonSchemaFormat(_Body):
    name: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Body):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class ChatRequest(Sampling):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    response_format: ResponseFormat | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool = False  # llama-server's default: one call per answer
    # llama-server's: where thinking goes (see reasoning.py), and further variables for the chat template
    # ({"enable_thinking": false} for Qwen3)
    reasoning_format: Literal["auto", "deepseek", "deepseek-legacy", "none"] = "auto"
    chat_template_kwargs: dict[str, Any] | None = None

    @field_validator("chat_template_kwargs")
    @classmethod
    def _template_variables(cls, kwargs: dict[str, Any] | None) -> dict[str, Any] | None:
        if not kwargs:
            return kwargs
        taken = sorted(set(kwargs) & TEMPLATE_VARIABLES)
        if taken:
            raise ValueError(f"{', '.join(taken)} are set by the server, not by chat_template_kwargs")
        if len(json.dumps(kwargs)) > MAX_TEMPLATE_KWARGS_BYTES:
            raise ValueError(f"chat_template_kwargs may hold at most {MAX_TEMPLATE_KWARGS_BYTES:,} bytes of JSON")
        return kwargs

    def requested_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def plain_messages(self, native_tools: bool) -> list[dict[str, Any]]:
        """The messages as chat templates take them: string contents, ``developer`` as ``system``,
        tool calls with their arguments as objects where the template formats them itself."""
        out: list[dict[str, Any]] = []
        for i, m in enumerate(self.messages):
            message: dict[str, Any] = {"role": "system" if m.role == "developer" else m.role, "content": m.text(i)}
            if m.name is not None:
                message["name"] = m.name
            if m.tool_call_id is not None:
                message["tool_call_id"] = template_call_id(m.tool_call_id)
            if m.tool_calls:
                message["tool_calls"] = [
                    {
                        "id": template_call_id(c.id),
                        "type": "function",
                        "function": {
                            "name": c.function.name,
                            "arguments": _arguments(c.function.arguments, native_tools),
                        },
                    }
                    for c in m.tool_calls
                ]
            out.append(message)
        return out


_TEMPLATE_CALL_ID = re.compile(r"[A-Za-z0-9]{9}")


def template_call_id(call_id: str | None) -> str:
    """A tool call's id as chat templates are given it: nine letters and digits, which Mistral's templates
    insist on ("Tool call IDs should be alphanumeric strings with length 9!") and the others print as
    they are. Any other id (``call_...`` from this server or another) maps to nine hex digits of its
    hash, the same in the call and in its result."""
    if call_id is not None and _TEMPLATE_CALL_ID.fullmatch(call_id):
        return call_id
    return hashlib.sha256((call_id or "").encode()).hexdigest()[:9]


def _arguments(arguments: str | dict[str, Any], as_object: bool) -> Any:
    if as_object and isinstance(arguments, str):
        try:
            return json_text.loads(arguments)
        except ValueError:
            return arguments
    return arguments


class CompletionRequest(Sampling):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = Field(16, ge=1)  # the OpenAI default for text completions
    logprobs: int | None = Field(None, ge=0, le=20)
    echo: bool = False
    suffix: str | None = None

    @field_validator("suffix")
    @classmethod
    def _no_suffix(cls, suffix: str | None) -> str | None:
        if suffix:
            raise ValueError("suffix (fill in the middle) is not supported")
        return suffix

    def prompts(self) -> list[str | list[int]]:
        """Each prompt of the request: ``prompt`` is one text or token list, or a list of them."""
        p = self.prompt
        if isinstance(p, list) and p and isinstance(p[0], (str, list)):
            return cast("list[str | list[int]]", list(p))
        return [cast("str | list[int]", p)]


class EmbeddingRequest(_Body):
    model: str | None = None
    input: str | list[str] | list[int] | list[list[int]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, ge=1)


class TokenizeRequest(_Body):
    """llama-server's ``/tokenize``."""

    content: str
    add_special: bool = False  # the BOS the model expects, before the text's tokens
    with_pieces: bool = False  # each token with its text


class DetokenizeRequest(_Body):
    """llama-server's ``/detokenize``."""

    tokens: list[int]


def parse(body: bytes, kind: type[_Body]) -> Any:
    """``body`` as a ``kind`` request, or the 400 that says what is wrong with it."""
    try:
        raw = json_text.loads(body)
    except ValueError as exc:
        raise bad_request(f"the request body is not valid JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise bad_request("the request body must be a JSON object")
    return validated(raw, kind)


def validated(raw: dict[str, Any], kind: type[_Body]) -> Any:
    """``raw`` as a ``kind`` request, or the 400 that names the field at fault."""
    try:
        return kind.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        message = first["msg"].removeprefix("Value error, ")
        raise APIError(
            400, f"{where}: {message}" if where else message, param=where or None, code="invalid_request"
        ) from None
