"""What every request passes before any route sees it: the API key, where the server has one, and the
body's size. A pure ASGI middleware, so a body over the limit is refused as it arrives (from its
``Content-Length``, or once the bytes read pass the limit) rather than after it has been buffered."""

from __future__ import annotations

import base64
import binascii
import hmac
import json
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .errors import ANTHROPIC_PATHS, anthropic_error_body, error_body


class _TooLarge(Exception):
    pass


class Guard:
    def __init__(self, app: ASGIApp, api_key: str | None, max_body_bytes: int) -> None:
        self.app, self.api_key, self.max_body = app, api_key, max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        anthropic = str(scope.get("path", "")).startswith(ANTHROPIC_PATHS)
        if self.api_key is not None and not self._authorized(headers):
            message = "a valid API key is required: send 'Authorization: Bearer <key>' or 'x-api-key: <key>'"
            body = anthropic_error_body(401, message) if anthropic else error_body(401, message, code="invalid_api_key")
            # a browser asks for the key as a password (any user name) and then sends it with every request
            await _respond(send, 401, body, {"www-authenticate": 'Basic realm="torchburn", charset="UTF-8"'})
            return
        length = headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_body):
            await _respond(send, 413, self._too_large(anthropic))
            return
        seen = 0
        started = False

        async def counted_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_body:
                    raise _TooLarge
            return message

        async def watched_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, counted_receive, watched_send)
        except _TooLarge:
            if not started:
                await _respond(send, 413, self._too_large(anthropic))

    def _too_large(self, anthropic: bool) -> dict[str, Any]:
        message = f"the request body is larger than {self.max_body:,} bytes"
        return anthropic_error_body(413, message) if anthropic else error_body(413, message, code="request_too_large")

    def _authorized(self, headers: dict[str, str]) -> bool:
        """The key as a bearer token, a Basic password (browsers) or in ``x-api-key`` (Anthropic's clients)."""
        assert self.api_key is not None
        if "x-api-key" in headers and self._matches(headers["x-api-key"].strip()):
            return True
        scheme, _, credentials = headers.get("authorization", "").partition(" ")
        given = ""
        if scheme.lower() == "bearer":
            given = credentials.strip()
        elif scheme.lower() == "basic":
            try:
                given = base64.b64decode(credentials.strip(), validate=True).decode("utf-8").partition(":")[2]
            except (binascii.Error, UnicodeDecodeError):
                return False
        return self._matches(given)

    def _matches(self, given: str) -> bool:
        assert self.api_key is not None
        return hmac.compare_digest(given.encode("utf-8"), self.api_key.encode("utf-8"))


async def _respond(send: Send, status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> None:
    raw = json.dumps(body).encode()
    pairs = [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())]
    pairs += [(k.encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": pairs})
    await send({"type": "http.response.body", "body": raw})
