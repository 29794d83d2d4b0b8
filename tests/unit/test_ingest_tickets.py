"""Request bodies as tickets: the workflow's own schema, its size limit, and the batch form."""

from __future__ import annotations

import json

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agents.errors import BadRecord
from agents.steps.validate import parse_ticket
from ingest.problems import ProblemError
from ingest.tickets import Accepted, Rejected, parse_submission

LIMIT = 64 * 1024


def ticket(i: int = 0, **extra: object) -> dict:
    return {
        "ticket_id": f"t-{i}",
        "text": "my parcel is late",
        "created_at": "2026-12-01T00:00:00Z",
        **extra,
    }


def parse(body: object, batch_max: int = 500) -> object:
    return parse_submission(orjson.dumps(body), batch_max, LIMIT)


def problem_of(body: bytes | object) -> tuple[int, str]:
    raw = body if isinstance(body, bytes) else orjson.dumps(body)
    with pytest.raises(ProblemError) as info:
        parse_submission(raw, 500, LIMIT)
    return info.value.problem.status, info.value.problem.kind


def test_one_ticket() -> None:
    sub = parse(ticket())
    assert not sub.batch
    [item] = sub.items
    assert isinstance(item, Accepted) and item.ticket_id == "t-0"


def test_the_record_keeps_fields_the_schema_does_not_know_yet() -> None:
    [item] = parse(ticket(priority="high")).items
    assert orjson.loads(item.value)["priority"] == "high"


def test_a_batch_checks_each_ticket_on_its_own() -> None:
    sub = parse({"tickets": [ticket(0), {"text": "no id"}, "not an object", ticket(3)]})
    assert sub.batch
    assert [type(i).__name__ for i in sub.items] == ["Accepted", "Rejected", "Rejected", "Accepted"]
    assert [a.index for a in sub.valid] == [0, 3]
    bad = sub.items[1]
    assert isinstance(bad, Rejected)
    assert {e["pointer"] for e in bad.problem.errors} == {
        "/tickets/1/ticket_id",
        "/tickets/1/created_at",
    }


@pytest.mark.parametrize(
    ("body", "status", "kind"),
    [
        (b"not json", 415, "not-json"),
        (b"\xff\xfe", 415, "not-json"),
        (b'{"a": 1e400}', 415, "not-json"),
        ([ticket()], 400, "invalid-request"),  # a bare array is not the batch form
        ("a string", 400, "invalid-request"),
        ({"tickets": []}, 400, "invalid-request"),
        ({"tickets": {"a": 1}}, 400, "invalid-request"),
        ({"tickets": [ticket(i) for i in range(501)]}, 400, "invalid-request"),
    ],
)
def test_malformed_bodies(body: object, status: int, kind: str) -> None:
    assert problem_of(body) == (status, kind)


def test_batch_max_is_a_setting() -> None:
    with pytest.raises(ProblemError):
        parse({"tickets": [ticket(0), ticket(1)]}, batch_max=1)


def test_a_ticket_over_the_record_limit_is_refused_with_413() -> None:
    big = ticket(text="é" * 19_000)  # valid text, 38 KB of UTF-8 ...
    [item] = parse_submission(orjson.dumps(big), 500, 32 * 1024).items  # ... over 32 KiB
    assert isinstance(item, Rejected) and item.problem.status == 413


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=30),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)
fields = st.sampled_from(
    ["ticket_id", "text", "user_id", "channel", "language", "created_at", "metadata", "other"]
)


@settings(max_examples=300, deadline=None)
@given(field=fields, value=json_values, drop=st.booleans())
def test_what_ingest_accepts_the_workflow_accepts(field: str, value: object, drop: bool) -> None:
    """The same decision as the validate step, for valid tickets with one field changed."""
    data = ticket(user_id="u1", channel="email", language="en", metadata={"a": "b"})
    if drop:
        data.pop(field, None)
    else:
        data[field] = value
    body = json.dumps(data).encode()  # integers past 64 bits too
    [item] = parse_submission(body, 500, LIMIT).items
    try:
        parse_ticket(body, LIMIT)
        worker_accepts = True
    except BadRecord:
        worker_accepts = False
    assert isinstance(item, Accepted) == worker_accepts
    if isinstance(item, Accepted):
        assert parse_ticket(item.value, LIMIT).ticket_id == item.ticket_id
