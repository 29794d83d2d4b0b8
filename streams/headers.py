"""Record headers: W3C trace context and the dead-letter context of docs/architecture.md."""

from __future__ import annotations

import random
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime

Headers = list[tuple[str, bytes]]

DLQ_PREFIX = "x-dlq-"
REPLAY_COUNT = "x-replay-count"
EXCEPTION_LIMIT = 2000
# far above any sane max_replays: a longer count is forged, and int() of it costs nothing
REPLAY_COUNT_DIGITS = 6


def new_trace_id() -> str:
    return secrets.token_hex(16)


def new_traceparent() -> str:
    return child_traceparent(new_trace_id())


def trace_id_of(traceparent: str | None) -> str | None:
    """The trace id of a valid `traceparent`, else None."""
    if not traceparent:
        return None
    parts = traceparent.split("-")
    if len(parts) != 4 or len(parts[1]) != 32:
        return None
    return parts[1]


def child_traceparent(trace_id: str) -> str:
    # a span id needs to be unique, not secret: the Mersenne Twister costs a tenth of
    # `secrets` (one is made per record the workflow writes); zero is not a valid id
    return f"00-{trace_id}-{random.getrandbits(64) or 1:016x}-01"


def to_dict(headers: Iterable[tuple[str, bytes]] | Mapping[str, bytes] | None) -> dict[str, str]:
    if not headers:
        return {}
    items = headers.items() if isinstance(headers, Mapping) else headers
    return {k: (v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)) for k, v in items}


def replay_count(value: str | bytes | None) -> int | None:
    """The replays a record has had: 0 when the header is missing, None when it is forged.

    Only ASCII digits of bounded length count: a negative, empty, huge, non-integer or
    non-UTF-8 value could otherwise reset or overflow the count and replay a record for ever,
    so callers treat None as "no replays left".
    """
    if value is None:
        return 0
    if isinstance(value, bytes):
        try:
            value = value.decode("ascii")
        except UnicodeDecodeError:
            return None
    if not 0 < len(value) <= REPLAY_COUNT_DIGITS or not (value.isascii() and value.isdigit()):
        return None
    return int(value)


@dataclass(frozen=True)
class DeadLetterContext:
    error_class: str
    reason: str
    step: str
    attempts: int
    origin_topic: str
    origin_partition: int
    origin_offset: int
    first_failed_at: datetime
    exception: str
    traceparent: str

    def headers(self, replay_count: int = 0) -> Headers:
        fields = {
            "error-class": self.error_class,
            "reason": self.reason,
            "step": self.step,
            "attempts": str(self.attempts),
            "origin-topic": self.origin_topic,
            "origin-partition": str(self.origin_partition),
            "origin-offset": str(self.origin_offset),
            "first-failed-at": self.first_failed_at.isoformat(),
            "exception": self.exception[:EXCEPTION_LIMIT],
        }
        out: Headers = [(DLQ_PREFIX + k, v.encode()) for k, v in fields.items()]
        out.append(("traceparent", self.traceparent.encode()))
        if replay_count:
            out.append((REPLAY_COUNT, str(replay_count).encode()))
        return out
