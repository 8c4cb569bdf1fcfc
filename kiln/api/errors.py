"""Typed API errors and the one place that renders the error envelope.

Every error leaves the server as JSON `{"error": {"message", "type", "param", "code"}}`
(the OpenAI shape, which OpenAI SDKs parse), with Kiln's codes in `code`; on Anthropic's routes
(`/v1/messages...`) as Anthropic's `{"type": "error", "error": {"type", "message"}}`, which
Anthropic's SDKs parse. `body_for(path)` picks the shape: the one place that decides it.
"""

from __future__ import annotations

from typing import Any

import msgspec

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "timeout_error",
    409: "conflict_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
    501: "not_implemented_error",
    503: "service_unavailable_error",
}


class ApiError(Exception):
    """An error that becomes an HTTP response with the error envelope."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.param = param
        self.headers = headers or {}

    @property
    def type(self) -> str:
        return _TYPES.get(self.status, "server_error" if self.status >= 500 else "invalid_request_error")

    def envelope(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }

    def body(self) -> bytes:
        return msgspec.json.encode(self.envelope())

    def anthropic_envelope(self) -> dict[str, Any]:
        kind = _ANTHROPIC_TYPES.get(self.status, "api_error" if self.status >= 500
                                    else "invalid_request_error")
        message = self.message if self.param is None or self.param in self.message \
            else f"{self.param}: {self.message}"
        return {"type": "error", "error": {"type": kind, "message": message}}

    def body_for(self, path: str) -> bytes:
        """The error in the shape of the API that ``path`` belongs to."""
        if is_anthropic(path):
            return msgspec.json.encode(self.anthropic_envelope())
        return self.body()


ANTHROPIC_PREFIX = "/v1/messages"


def is_anthropic(path: str) -> bool:
    return path == ANTHROPIC_PREFIX or path.startswith(ANTHROPIC_PREFIX + "/")


# Anthropic's error types by status (its API reference's table)
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


def bad_request(code: str, message: str, param: str | None = None) -> ApiError:
    return ApiError(400, code, message, param=param)


def not_found(code: str, message: str, param: str | None = None) -> ApiError:
    return ApiError(404, code, message, param=param)
