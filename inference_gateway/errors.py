"""The one exception the gateway raises, carrying a contract error code (DESIGN.md).

Every layer (Triton client, batcher, HTTP server, HTTP client) speaks `GatewayError`, so a
caller decides what to do from `code` and `retryable` alone, never from exception types.
"""

from __future__ import annotations

from typing import Any

from schemas.gateway import HTTP_STATUS, RETRYABLE, ErrorCode, ErrorResponse

__all__ = ["ErrorCode", "GatewayError"]


class GatewayError(Exception):
    """A failure with a contract `ErrorCode`; `retryable` defaults to the code's contract value."""

    def __init__(self, code: ErrorCode, message: str, retryable: bool | None = None) -> None:
        super().__init__(f"{code.value}: {message}")
        self.code = code
        self.message = message
        self.retryable = RETRYABLE[code] if retryable is None else retryable

    @property
    def http_status(self) -> int:
        return HTTP_STATUS[self.code]

    def to_body(self) -> dict[str, Any]:
        """The `{"error": {"code", "message", "retryable"}}` body of the HTTP API."""
        body = ErrorResponse.of(self.code, self.message).model_dump(mode="json")
        body["error"]["retryable"] = self.retryable
        return body

    def __repr__(self) -> str:
        return f"GatewayError({self.code.value}, {self.message!r}, retryable={self.retryable})"
