"""The `validator` step: size limit, UTF-8, JSON, schema; every failure has its error class."""

from __future__ import annotations

import orjson
from pydantic import ValidationError

from agents.errors import BadRecord
from schemas.tickets import ErrorClass, Ticket


def parse_ticket(raw: bytes | None, max_bytes: int) -> Ticket:
    if raw is None:
        raise BadRecord(ErrorClass.DESERIALIZATION, "empty record (null value)")
    if len(raw) > max_bytes:
        raise BadRecord(
            ErrorClass.PAYLOAD_TOO_LARGE, f"record of {len(raw)} bytes exceeds {max_bytes}"
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadRecord(ErrorClass.DESERIALIZATION, f"not UTF-8: {exc}") from exc
    try:
        data = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise BadRecord(ErrorClass.DESERIALIZATION, f"not JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise BadRecord(ErrorClass.SCHEMA_VALIDATION, "a ticket must be a JSON object")
    try:
        return Ticket.model_validate(data)
    except ValidationError as exc:
        raise BadRecord(ErrorClass.SCHEMA_VALIDATION, _summary(exc)) from exc


def _summary(exc: ValidationError) -> str:
    parts = [f"{'.'.join(map(str, e['loc'])) or '<root>'}: {e['msg']}" for e in exc.errors()]
    return "; ".join(parts[:5])
