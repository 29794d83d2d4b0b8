"""Total decoders for every record the workflow reads (issue 11, "poison isolation").

Each decoder returns the parsed value or raises `BadRecord(error_class, reason)`, whatever
the bytes, key or headers: a record that cannot be read is dead-lettered alone, with its
class, and never stops its partition, fails another ticket or kills the worker. Header
helpers never raise at all: a header that cannot be read is treated as absent.

Classes: a ticket on `tickets.in` is the user's input (DESERIALIZATION, SCHEMA_VALIDATION,
PAYLOAD_TOO_LARGE, as docs/architecture.md says); an envelope on a step or retry topic only
ever comes from a worker, so one that cannot be read is the workflow's fault (INTERNAL); a review
decision is a person's input (DESERIALIZATION or SCHEMA_VALIDATION). Reasons are bounded
and always encodable, so the dead-letter headers built from them cannot fail either.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from collections.abc import Set as AbstractSet
from datetime import datetime, timezone
from typing import Any, Final, TypeVar, cast

import orjson
from pydantic import BaseModel, ValidationError

from agents.errors import BadRecord
from agents.steps.validate import parse_ticket
from schemas.tickets import Envelope, ErrorClass, ReviewDecision, Ticket
from schemas.workflow import RetryPolicy

REASON_LIMIT = 1000
# a worker never writes a larger attempt number: it retries only below a policy's maximum
MAX_ATTEMPT: int = next(
    m.le for m in RetryPolicy.model_fields["max_attempts"].metadata if hasattr(m, "le")
)
# W3C trace context, version 00 layout: version-traceid-parentid-flags, lower-case hex
_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")


class _Unchecked:
    def __repr__(self) -> str:
        return "NO_KEY"


# pass as `key` to skip the check that a record's key is its ticket_id
NO_KEY: Final = _Unchecked()


# ---- headers ------------------------------------------------------------------------------


def header(headers: object, name: str) -> str | None:
    """The last value of header `name` as text (invalid UTF-8 replaced), or None.

    Takes whatever a client hands over: a list of (name, value) pairs with str or bytes
    names and bytes or None values, duplicates, a dict, None, or garbage (skipped). The
    last occurrence wins, as it does for a dict built from the list.
    """
    try:
        items = headers.items() if isinstance(headers, Mapping) else headers
        found: object = None
        # garbage that does not iterate raises TypeError, caught below
        for item in cast(Iterable[object], items or ()):
            if isinstance(item, (tuple, list)) and len(item) == 2 and _name(item[0]) == name:
                found = item[1]
        return _text(found)
    except Exception:  # an object whose iteration itself fails: no headers to speak of
        return None


def traceparent(headers: object) -> str | None:
    """The record's `traceparent` when it is a valid W3C one, else None (garbage ignored)."""
    value = header(headers, "traceparent")
    if value is None:
        return None
    match = _TRACEPARENT.fullmatch(value.strip())
    if match is None:
        return None
    version, trace, parent, _ = match.groups()
    if version == "ff" or trace == "0" * 32 or parent == "0" * 16:
        return None
    return match.group(0)


def trace_id(headers: object) -> str | None:
    """The trace id of a valid `traceparent` header, else None (start a new trace)."""
    parent = traceparent(headers)
    return parent.split("-")[1] if parent else None


# ---- records ------------------------------------------------------------------------------


def read_ticket(value: object, key: object, headers: object, max_bytes: int) -> Ticket:
    """A `Ticket` from a `tickets.in` record, or BadRecord with its class (docs/architecture.md).

    The key and headers never fail a ticket: the ticket_id in the value is what counts
    (the step re-keys by it), and a garbage `traceparent` only means a new trace.
    """
    del key, headers  # accepted for the caller's symmetry; read with header() if needed
    raw = _bytes(value, ErrorClass.DESERIALIZATION)
    try:
        return parse_ticket(raw, max_bytes)
    except BadRecord as exc:
        raise BadRecord(exc.error_class, _safe(exc.reason)) from None
    except Exception as exc:  # a parser bug must not escape as something else
        raise BadRecord(ErrorClass.SCHEMA_VALIDATION, _unexpected(exc)) from None


def read_envelope(
    value: object,
    known_steps: AbstractSet[str],
    versions: AbstractSet[int],
    *,
    key: object = NO_KEY,
    step: str | None = None,
    now: datetime | None = None,
    written: Envelope | None = None,
) -> Envelope:
    """An `Envelope` from a step or retry topic, or BadRecord(INTERNAL, why).

    Refused as well as unreadable ones: a step or workflow version this worker does not
    run (it would fail later, outside any per-ticket handling), an attempt number no
    worker writes, features the gateway's JSON cannot carry (integers past 64 bits), and,
    when given, a `key` that is not the ticket_id (its state would go to the wrong
    partition) or a `step` other than the topic's. A `started_at` in the future (a forged
    record, or another worker's clock ahead of ours) is clamped to `now`: a result's
    latency must not be negative.

    `written`: the envelope this worker encoded into exactly these bytes
    (agents/handoff.py), which stands for their parse; every check above still applies, the
    features' one by `handoff.plain`, which kept it only with JSON's own values.
    """
    if written is not None:
        env = written
    else:
        raw = _bytes(value, ErrorClass.INTERNAL)
        env = _validated(Envelope, raw, ErrorClass.INTERNAL, "not an envelope")
    problem = _envelope_problem(env, known_steps, versions, key, step, written is None)
    if problem is not None:
        raise BadRecord(ErrorClass.INTERNAL, _safe(problem))
    now = now or datetime.now(timezone.utc)
    if env.started_at > now:
        env.started_at = now
    return env


def read_decision(value: object, key: object = NO_KEY) -> ReviewDecision:
    """A `ReviewDecision`, or BadRecord (DESERIALIZATION or SCHEMA_VALIDATION).

    When `key` is given it must be the decision's ticket_id: the review step writes the
    ticket's state from this record's partition, which is only the ticket's own when the
    record is keyed by it.
    """
    raw = _bytes(value, ErrorClass.DESERIALIZATION)
    data = _json_object(raw)
    decision = _validated(ReviewDecision, data, ErrorClass.SCHEMA_VALIDATION, "not a decision")
    if key is not NO_KEY and _key_text(key) != decision.ticket_id:
        raise BadRecord(
            ErrorClass.SCHEMA_VALIDATION,
            f"record key {_safe(repr(key), 140)} is not the decision's ticket_id",
        )
    return decision


def ledger_key(key: object) -> str | None:
    """The ticket_id of a `tickets.completed` entry, or None for a key that names none."""
    text = _key_text(key)
    return text or None


def retry_wait_s(env: Envelope, tier_ms: int, now: datetime) -> float:
    """Seconds the retry tier of `tier_ms` still holds `env`: never more than the tier's
    delay, so a `not_before` years ahead cannot park the tier's partition behind it."""
    bound = max(0.0, tier_ms / 1000)
    if env.not_before is None:
        return 0.0
    try:
        wait = (_aware(env.not_before) - _aware(now)).total_seconds()
    except (OverflowError, TypeError, ValueError):
        return 0.0
    return min(max(wait, 0.0), bound)


# ---- helpers ------------------------------------------------------------------------------


def _name(value: object) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "replace")
    return None


def _text(value: object) -> str | None:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode("utf-8", "replace")
    if isinstance(value, str):
        return _safe(value, len(value))
    return None


def _key_text(key: object) -> str | None:
    if isinstance(key, str):
        return _safe(key, len(key))
    if not isinstance(key, (bytes, bytearray, memoryview)):
        return None
    try:
        return bytes(key).decode("utf-8")
    except UnicodeDecodeError:
        return None


def _bytes(value: object, error_class: ErrorClass) -> bytes | None:
    """The record value as bytes (None stays None: the parsers name it)."""
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, str):
        try:
            return value.encode("utf-8")
        except UnicodeEncodeError:
            raise BadRecord(error_class, "not UTF-8: a lone surrogate") from None
    raise BadRecord(error_class, f"a record value of type {type(value).__name__}")


def _json_object(raw: bytes | None) -> dict[str, Any]:
    if raw is None:
        raise BadRecord(ErrorClass.DESERIALIZATION, "empty record (null value)")
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:  # not UTF-8 comes as a JSONDecodeError too
        raise BadRecord(ErrorClass.DESERIALIZATION, _safe(f"not JSON: {exc}")) from None
    if not isinstance(data, dict):
        raise BadRecord(ErrorClass.SCHEMA_VALIDATION, "a JSON object is needed")
    return data


M = TypeVar("M", bound=BaseModel)


def _validated(model: type[M], data: Any, error_class: ErrorClass, what: str) -> M:
    if data is None:
        raise BadRecord(error_class, f"{what}: empty record (null value)")
    try:
        if isinstance(data, bytes):
            return model.model_validate_json(data)
        return model.model_validate(data)
    except ValidationError as exc:
        raise BadRecord(error_class, _safe(f"{what}: {_summary(exc)}")) from None
    except Exception as exc:  # whatever else a validator raised: still this record's fault
        raise BadRecord(error_class, _safe(f"{what}: {_unexpected(exc)}")) from None


def _envelope_problem(
    env: Envelope,
    known_steps: AbstractSet[str],
    versions: AbstractSet[int],
    key: object,
    step: str | None,
    check_features: bool = True,
) -> str | None:
    """Why the envelope is refused, or None. `check_features` False: its features are known
    to be JSON's own values already (a handed-over envelope passed `handoff.plain`)."""
    if env.step not in known_steps:
        return f"envelope for step {env.step!r}, which no workflow version here has"
    if step is not None and env.step != step:
        return f"envelope for step {env.step!r} on the topic of step {step!r}"
    if env.workflow_version not in versions:
        return f"envelope of workflow version {env.workflow_version}, not one of {sorted(versions)}"
    if env.attempt > MAX_ATTEMPT:
        return f"attempt {env.attempt}: no retry policy allows more than {MAX_ATTEMPT}"
    if key is not NO_KEY and _key_text(key) != env.ticket.ticket_id:
        return f"record key {repr(key)[:140]} is not the envelope's ticket_id"
    if check_features:
        try:
            orjson.dumps({name: f.value for name, f in env.context.features.items()})
        except TypeError as exc:
            return f"features the gateway cannot be sent: {exc}"
    return None


def _summary(exc: ValidationError) -> str:
    parts = [
        f"{'.'.join(map(str, e['loc'])) or '<root>'}: {e['msg']}"
        for e in exc.errors(include_url=False, include_input=False)
    ]
    return "; ".join(parts[:5])


def _unexpected(exc: Exception) -> str:
    return f"unreadable record ({type(exc).__name__}: {exc})"


def _safe(text: str, limit: int = REASON_LIMIT) -> str:
    """`text` cut to `limit` and encodable as UTF-8 (a lone surrogate becomes '?')."""
    return text[:limit].encode("utf-8", "replace").decode("utf-8")


def _aware(value: datetime) -> datetime:
    return value if value.tzinfo is not None else value.replace(tzinfo=timezone.utc)
