"""The one exception the gateway raises, carrying a contract error code (docs/architecture.md).

Every layer (Triton client, batcher, HTTP server, HTTP client) speaks `GatewayError`, so a
caller decides what to do from `code` and `retryable` alone, never from exception types.
"""

from __future__ import annotations

import re
from typing import Any

from schemas.gateway import HTTP_STATUS, RETRYABLE, ErrorCode, ErrorResponse

__all__ = ["ErrorCode", "GatewayError", "redact", "register_secret"]

_SECRETS: set[str] = set()
_CREDENTIALS = re.compile(
    r"(?i)(\b(?:bearer|basic)\s+)[^\s,;'\"]+"  # an Authorization value
    r"|(\b[a-z][a-z0-9+.-]*://)[^/\s:@]*:[^/\s@]*@"  # user:password@ in a URL
    r"|(\b(?:password|passwd|token|secret)\s*[=:]\s*)[^\s,;'\"]+"
)


def register_secret(value: str) -> None:
    """A value `redact` masks wherever it appears (the gateway's token)."""
    if value:
        _SECRETS.add(value)


def redact(text: str) -> str:
    """`text` for a log line: registered secrets and credential-looking values masked."""
    for secret in _SECRETS:
        text = text.replace(secret, "***")
    return _CREDENTIALS.sub(_mask, text)


def _mask(match: re.Match[str]) -> str:
    if match.group(2):
        return f"{match.group(2)}***@"
    return f"{match.group(1) or match.group(3)}***"


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
