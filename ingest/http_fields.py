"""Parsing and formatting of the HTTP fields ingest reads and writes; pure functions.

- `traceparent` (W3C Trace Context level 1): the caller's is continued when valid;
- `Idempotency-Key` (draft-ietf-httpapi-idempotency-key-header): a Structured Field string;
- `RateLimit` / `RateLimit-Policy` (draft-ietf-httpapi-ratelimit-headers-10): Structured
  Field lists of named items with `q`/`w` (policy) and `r`/`t` (current state) parameters;
- `Authorization: Bearer` (RFC 6750) and the client's address behind trusted proxies.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass

_TRACEPARENT = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")
# visible ASCII except `"` and `\`, which a Structured Field string would need escaped;
# what an idempotency key (a UUID, a hash) never needs. The OpenAPI document states it.
IDEMPOTENCY_KEY_CHARS = r"[!#-\[\]-~]{1,255}"
IDEMPOTENCY_KEY_PATTERN = f'^("{IDEMPOTENCY_KEY_CHARS}"|{IDEMPOTENCY_KEY_CHARS})$'
_IDEMPOTENCY_KEY = re.compile(IDEMPOTENCY_KEY_CHARS)
_BEARER = re.compile(r"^[Bb][Ee][Aa][Rr][Ee][Rr] +([A-Za-z0-9._~+/-]+=*) *$")


# ---- traceparent ------------------------------------------------------------------------------


def parse_traceparent(value: str | None) -> tuple[str, str] | None:
    """(trace id, flags) of a valid version-00 `traceparent`, else None.

    Per the spec, an all-zero trace or parent id is invalid, and version ff is forbidden;
    a higher version is read by its first four fields when the value is longer.
    """
    if not value:
        return None
    value = value.strip()
    head = value[:55]
    match = _TRACEPARENT.match(head)
    if match is None:
        return None
    version, trace_id, parent_id, flags = match.groups()
    if version == "ff" or (version == "00" and len(value) != 55):
        return None
    if version != "00" and len(value) > 55 and value[55] != "-":
        return None
    if trace_id == "0" * 32 or parent_id == "0" * 16:
        return None
    return trace_id, flags


def child_traceparent(caller: str | None) -> str:
    """Ingest's span in the caller's trace, or the first span of a new trace."""
    parsed = parse_traceparent(caller)
    if parsed is None:
        trace_id, flags = f"{random.getrandbits(128) or 1:032x}", "01"
    else:
        trace_id, flags = parsed
    return f"00-{trace_id}-{random.getrandbits(64) or 1:016x}-{flags}"


def trace_id(traceparent: str) -> str:
    return traceparent.split("-")[1]


# ---- Idempotency-Key ----------------------------------------------------------------------------


def parse_idempotency_key(value: str) -> str | None:
    """The key of an `Idempotency-Key` field, or None when it is not a valid one.

    The draft defines the field as a Structured Field string (`"..."`); a bare token is
    taken too, since many clients send one.
    """
    if len(value) >= 2 and value[0] == '"' and value[-1] == '"':
        value = value[1:-1]
    return value if _IDEMPOTENCY_KEY.fullmatch(value) else None


# ---- RateLimit ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Bucket:
    """One token bucket after a request: its policy and what is left in it."""

    name: str
    rate: float  # tokens a second
    burst: int  # the bucket's size
    tokens: float  # left after this request (negative never: a refused request takes none)

    @property
    def window_s(self) -> int:
        """The policy's window: the seconds a bucket takes to fill from empty."""
        return max(1, math.ceil(self.burst / self.rate))

    @property
    def remaining(self) -> int:
        return max(0, math.floor(self.tokens))

    @property
    def reset_s(self) -> int:
        """Seconds until the bucket is full again."""
        return max(0, math.ceil((self.burst - self.tokens) / self.rate))

    def retry_after_s(self, cost: float = 1.0) -> int:
        """Seconds until `cost` tokens are there; at least 1, as Retry-After needs."""
        return max(1, math.ceil((cost - self.tokens) / self.rate))


def ratelimit_policy(buckets: Sequence[Bucket]) -> str:
    return ", ".join(f'"{b.name}";q={b.burst};w={b.window_s}' for b in buckets)


def ratelimit(buckets: Sequence[Bucket]) -> str:
    return ", ".join(f'"{b.name}";r={b.remaining};t={b.reset_s}' for b in buckets)


def ratelimit_fields(buckets: Sequence[Bucket]) -> dict[str, str]:
    if not buckets:
        return {}
    return {"RateLimit-Policy": ratelimit_policy(buckets), "RateLimit": ratelimit(buckets)}


def retry_after(buckets: Sequence[Bucket], cost: float = 1.0) -> int:
    """Seconds until every bucket has room for `cost` again."""
    return max(b.retry_after_s(cost) for b in buckets if b.tokens < cost)


# ---- Authorization and the client ----------------------------------------------------------


def bearer_token(authorization: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` field (RFC 6750 b64token), or None."""
    if not authorization or len(authorization) > 512:
        return None
    match = _BEARER.match(authorization)
    return match.group(1) if match else None


def client_ip(peer: str | None, forwarded_for: str | None, trusted_proxies: int) -> str:
    """The client's address: the peer's, or with `trusted_proxies` proxies in front, the
    entry that many hops back in X-Forwarded-For (entries before it are the caller's word)."""
    if trusted_proxies and forwarded_for:
        hops = [h.strip() for h in forwarded_for.split(",") if h.strip()]
        if len(hops) >= trusted_proxies:
            return hops[-trusted_proxies][:64]
    return (peer or "unknown")[:64]
