"""RFC 9457 problems: the field named by JSON pointer, the caller's values never repeated."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from ingest.problems import (
    MAX_FIELD_ERRORS,
    PROBLEM_JSON,
    TITLES,
    Problem,
    field_errors,
    invalid_ticket,
    pointer,
)
from ingest.tickets import Rejected, check_ticket
from schemas.tickets import Ticket


def _error(data: dict) -> ValidationError:
    with pytest.raises(ValidationError) as info:
        Ticket.model_validate(data)
    return info.value


def test_pointer_escapes_per_rfc_6901() -> None:
    assert pointer("", ["a/b", "c~d", 3]) == "/a~1b/c~0d/3"
    assert pointer("/tickets/2", ["text"]) == "/tickets/2/text"


def test_pointer_stops_at_a_map_the_caller_names() -> None:
    assert pointer("", ["metadata", "my secret key"]) == "/metadata"


def test_a_problem_body_and_response() -> None:
    p = Problem(429, "rate-limited", "over quota", headers={"Retry-After": "3"})
    body = p.body()
    assert body == {
        "type": "urn:ticketflow:problem:rate-limited",
        "title": TITLES["rate-limited"],
        "status": 429,
        "detail": "over quota",
    }
    response = p.response({"X-Other": "1"})
    assert response.status == 429
    assert response.content_type == PROBLEM_JSON
    assert response.headers["Retry-After"] == "3" and response.headers["X-Other"] == "1"
    assert orjson.loads(response.body) == body


def test_every_invalid_field_is_named() -> None:
    error = _error({"ticket_id": "bad id!", "text": "", "channel": "fax"})
    problem = invalid_ticket(error, "/tickets/4")
    pointers = {e["pointer"] for e in problem.errors}
    assert pointers == {
        "/tickets/4/ticket_id",
        "/tickets/4/text",
        "/tickets/4/channel",
        "/tickets/4/created_at",
    }
    assert problem.status == 400


def test_errors_are_bounded_and_deduplicated() -> None:
    metadata = {f"k{i}": i for i in range(50)}  # 50 errors, all under one pointer
    errors = field_errors(_error({"metadata": metadata}), "")
    assert len(errors) <= MAX_FIELD_ERRORS
    assert [e["pointer"] for e in errors].count("/metadata") == 1


CANARY = "ZQXJ"
canaries = st.text(min_size=1, max_size=20).map(lambda s: f"{CANARY}{s}{CANARY}")


@settings(max_examples=200, deadline=None)
@given(
    value=canaries,
    field=st.sampled_from(
        ["ticket_id", "text", "user_id", "channel", "language", "created_at", "metadata"]
    ),
    as_key=st.booleans(),
)
def test_no_problem_repeats_what_the_caller_sent(value: str, field: str, as_key: bool) -> None:
    ticket: dict = {"ticket_id": "t-1", "text": "x", "created_at": "2026-01-01T00:00:00Z"}
    if field == "metadata":
        ticket["metadata"] = {value: 1} if as_key else {"k": {value: value}}
    elif field in {"text", "user_id", "language"}:
        ticket[field] = value * 3000  # over each field's length limit
    elif field == "ticket_id":
        ticket[field] = value + " !"  # outside the id's alphabet
    else:
        ticket[field] = value
    item = check_ticket(ticket, 0, "", 64 * 1024)
    assert isinstance(item, Rejected)
    assert CANARY not in orjson.dumps(item.problem.body()).decode()
