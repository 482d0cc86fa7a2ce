"""The OpenAI response objects: whole answers, stream chunks, usage, logprobs."""

from __future__ import annotations

import json
import secrets
import time
from typing import Any

from .engine import TokenLogprob


class Answer:
    """One request's response identity (id, time, model) and what it has generated so far."""

    def __init__(self, prefix: str, model: str) -> None:
        self.id = f"{prefix}-{secrets.token_hex(12)}"
        self.created = int(time.time())
        self.model = model
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.cached_tokens = 0

    def usage(self) -> dict[str, Any]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
        }

    def head(self, kind: str) -> dict[str, Any]:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}


def sse(payload: dict[str, Any] | str) -> bytes:
    """One server-sent event."""
    data = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    return f"data: {data}\n\n".encode()


def chat_logprobs(items: list[TokenLogprob]) -> dict[str, Any]:
    def entry(text: str, logprob: float) -> dict[str, Any]:
        return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}

    return {
        "content": [{**entry(t.text, t.logprob), "top_logprobs": [entry(s, v) for _, s, v in t.top]} for t in items]
    }


def completion_logprobs(items: list[TokenLogprob], offset: int) -> dict[str, Any]:
    """The legacy completions shape; ``offset``: characters of text before the first token."""
    offsets = []
    for t in items:
        offsets.append(offset)
        offset += len(t.text)
    return {
        "tokens": [t.text for t in items],
        "token_logprobs": [t.logprob for t in items],
        "top_logprobs": [{s: v for _, s, v in t.top} for t in items],
        "text_offset": offsets,
    }
