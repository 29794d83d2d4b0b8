"""RFC 9457 problem details: every error ingest answers, as `application/problem+json`.

A problem names what was wrong (a JSON pointer into the request body, RFC 6901) and never
repeats what the caller sent: a body may hold personal data, and an error page that
reflects input is a way to smuggle content into logs and browsers.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web
from pydantic import ValidationError

PROBLEM_JSON = "application/problem+json"
TYPE_PREFIX = "urn:ticketflow:problem:"
# the most field errors listed for one ticket: enough to fix it, bounded for a hostile body
MAX_FIELD_ERRORS = 10
# fields whose members are named by the caller: a pointer stops at the field, since the
# member's name is input too
OPAQUE_MAPS = frozenset({"metadata"})

TITLES: dict[str, str] = {
    "invalid-ticket": "The ticket does not match the schema",
    "invalid-request": "The request is malformed",
    "not-json": "The body is not JSON",
    "unsupported-media-type": "Unsupported media type",
    "body-too-large": "The request body is too large",
    "body-timeout": "The request body did not arrive in time",
    "record-too-large": "The ticket is too large for tickets.in",
    "unauthorized": "Missing or invalid API key",
    "forbidden": "The API key lacks the scope this needs",
    "not-found": "Not found",
    "method-not-allowed": "Method not allowed",
    "idempotency-key-reused": "Idempotency-Key reused with another payload",
    "idempotency-key-in-flight": "A request with this Idempotency-Key is still in flight",
    "ticket-id-taken": "The ticket_id belongs to another client",
    "rate-limited": "Too many requests",
    "kafka-unavailable": "Kafka did not acknowledge the record",
    "redis-unavailable": "The key, quota and idempotency store is unavailable",
    "internal": "Internal error",
}


@dataclass(frozen=True)
class Problem:
    status: int
    kind: str
    detail: str | None = None
    errors: Sequence[Mapping[str, str]] = ()
    headers: Mapping[str, str] = field(default_factory=dict)
    extra: Mapping[str, Any] = field(default_factory=dict)

    def body(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "type": TYPE_PREFIX + self.kind,
            "title": TITLES[self.kind],
            "status": self.status,
        }
        if self.detail:
            out["detail"] = self.detail
        if self.errors:
            out["errors"] = [dict(e) for e in self.errors]
        out.update(self.extra)
        return out

    def response(self, headers: Mapping[str, str] | None = None) -> web.Response:
        return web.Response(
            body=orjson.dumps(self.body()),
            status=self.status,
            content_type=PROBLEM_JSON,
            headers={**self.headers, **(headers or {})},
        )


class ProblemError(Exception):
    """Raised anywhere below a handler; the middleware answers with its problem."""

    def __init__(self, problem: Problem) -> None:
        super().__init__(problem.kind)
        self.problem = problem


def escape_token(token: str) -> str:
    return token.replace("~", "~0").replace("/", "~1")


def pointer(base: str, loc: Iterable[str | int]) -> str:
    """The JSON pointer of a pydantic error location under `base` ("" or "/tickets/3").

    Stops at a field whose members the caller names (`metadata`): the pointer must not
    carry a key from the input.
    """
    parts = [base]
    for depth, token in enumerate(loc):
        parts.append("/" + escape_token(str(token)))
        if depth == 0 and token in OPAQUE_MAPS:
            break
    return "".join(parts)


def field_errors(error: ValidationError, base: str) -> list[dict[str, str]]:
    """One `{pointer, detail}` a problem, without the input that caused it."""
    out: list[dict[str, str]] = []
    seen: set[tuple[str, str]] = set()
    for e in error.errors(include_url=False, include_input=False, include_context=False):
        entry = (pointer(base, e["loc"]), e["msg"])
        if entry not in seen:  # two members of `metadata` collapse into one pointer
            seen.add(entry)
            out.append({"pointer": entry[0], "detail": entry[1]})
        if len(out) == MAX_FIELD_ERRORS:
            break
    return out


def invalid_ticket(error: ValidationError, base: str) -> Problem:
    errors = field_errors(error, base)
    return Problem(400, "invalid-ticket", f"{len(errors)} field(s) are invalid", errors)


def not_an_object(base: str) -> Problem:
    return Problem(
        400,
        "invalid-ticket",
        "a ticket must be a JSON object",
        [{"pointer": base, "detail": "expected an object"}],
    )
