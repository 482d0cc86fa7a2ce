"""Errors as the OpenAI API reports them: an HTTP status and ``{"error": {"message", "type", "param",
"code"}}``, so that clients raise their usual exceptions (``openai.BadRequestError`` for a 400, ...);
on Anthropic's routes as Anthropic reports them (``{"type": "error", "error": {"type", "message"}}``).
Nothing the server answers carries a traceback."""

from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse

# the OpenAI API's error types by status
_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "server_error",
}


# Anthropic's error types by status
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
}
ANTHROPIC_PATHS = ("/v1/messages",)  # the routes whose errors are Anthropic's


class APIError(Exception):
    """A request the server refuses or cannot serve; ``param`` names the request field at fault."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def body(self) -> dict[str, Any]:
        return error_body(self.status, self.message, param=self.param, code=self.code)

    def response(self, headers: dict[str, str] | None = None) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=headers)


def error_body(status: int, message: str, *, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    kind = _TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def anthropic_error_body(status: int, message: str) -> dict[str, Any]:
    kind = _ANTHROPIC_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def bad_request(message: str, param: str | None = None) -> APIError:
    return APIError(400, message, param=param, code="invalid_request")
