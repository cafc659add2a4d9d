"""The gateway's error answers, in the two shapes its clients parse.

Ollama routes answer ``{"error": "…"}``; OpenAI routes answer
``{"error": {"message", "type", "code"}}``. One :class:`GatewayError` carries the
status, the message, the OpenAI code and any headers (``Retry-After``); the route
family decides the shape when the answer is written.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from starlette.responses import JSONResponse

__all__ = ["GatewayError", "error_response"]

_OPENAI_TYPES = {400: "invalid_request_error", 401: "authentication_error",
                 404: "invalid_request_error", 413: "invalid_request_error",
                 501: "invalid_request_error", 503: "server_error"}


@dataclass(slots=True)
class GatewayError(Exception):
    """An answer that is not a reply: status, message for people, OpenAI code."""

    status: int
    message: str
    code: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)

    def __str__(self) -> str:
        return self.message


def error_response(error: GatewayError, *, openai: bool,
                   extra_headers: Mapping[str, str] | None = None) -> JSONResponse:
    """``error`` as a JSON answer in the route family's shape."""
    headers = {**error.headers, **(extra_headers or {})}
    if openai:
        body: object = {"error": {
            "message": error.message,
            "type": _OPENAI_TYPES.get(error.status, "api_error"),
            "code": error.code,
        }}
    else:
        body = {"error": error.message}
    return JSONResponse(body, status_code=error.status, headers=headers)
