"""A request body as tickets: one `Ticket` object, or `{"tickets": [Ticket, ...]}`.

Each ticket is checked as the workflow's `validate` step will check it (the same `Ticket`
model from `schemas.tickets`, after the same orjson decoding, and the same record size
limit), so what ingest accepts is never dead-lettered for its shape. The record's value
is the caller's object re-encoded as it was parsed: fields the schema does not know yet
travel on (the schema ignores them, for forward compatibility).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson
from pydantic import ValidationError

from ingest.problems import Problem, ProblemError, invalid_ticket, not_an_object
from schemas.tickets import Ticket

BATCH_FIELD = "tickets"


@dataclass(frozen=True)
class Accepted:
    """A valid ticket and the record value that goes to tickets.in."""

    index: int
    ticket_id: str
    value: bytes


@dataclass(frozen=True)
class Rejected:
    index: int
    problem: Problem


Item = Accepted | Rejected


@dataclass(frozen=True)
class Submission:
    batch: bool
    items: list[Item]

    @property
    def valid(self) -> list[Accepted]:
        return [i for i in self.items if isinstance(i, Accepted)]


def decode(body: bytes) -> Any:
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        # the parser's message quotes the body; say only that it is not JSON
        raise ProblemError(Problem(415, "not-json", "the body is not valid UTF-8 JSON")) from None


def parse_submission(body: bytes, batch_max: int, max_record_bytes: int) -> Submission:
    data = decode(body)
    if isinstance(data, dict) and BATCH_FIELD in data:
        entries = _batch_entries(data[BATCH_FIELD], batch_max)
        items = [
            check_ticket(e, i, f"/{BATCH_FIELD}/{i}", max_record_bytes)
            for i, e in enumerate(entries)
        ]
        return Submission(True, items)
    if isinstance(data, dict):
        return Submission(False, [check_ticket(data, 0, "", max_record_bytes)])
    raise ProblemError(
        Problem(
            400,
            "invalid-request",
            f'the body must be a ticket object or {{"{BATCH_FIELD}": [ticket, ...]}}',
            [{"pointer": "", "detail": "expected an object"}],
        )
    )


def _batch_entries(entries: Any, batch_max: int) -> list[Any]:
    pointer = f"/{BATCH_FIELD}"
    if not isinstance(entries, list):
        detail = "expected an array of tickets"
    elif not entries:
        detail = "expected at least one ticket"
    elif len(entries) > batch_max:
        detail = f"at most {batch_max} tickets in one request"
    else:
        return entries
    raise ProblemError(
        Problem(400, "invalid-request", detail, [{"pointer": pointer, "detail": detail}])
    )


def check_ticket(entry: Any, index: int, base: str, max_record_bytes: int) -> Item:
    if not isinstance(entry, dict):
        return Rejected(index, not_an_object(base))
    try:
        ticket = Ticket.model_validate(entry)
    except ValidationError as error:
        return Rejected(index, invalid_ticket(error, base))
    value = orjson.dumps(entry)
    if len(value) > max_record_bytes:
        return Rejected(
            index,
            Problem(
                413,
                "record-too-large",
                f"the ticket takes {len(value)} bytes as a record; at most {max_record_bytes}",
                [{"pointer": base, "detail": "record too large"}],
            ),
        )
    return Accepted(index, ticket.ticket_id, value)
