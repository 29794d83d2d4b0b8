import orjson
import pytest

from agents.errors import BadRecord
from agents.steps.clean import clean_text
from agents.steps.validate import parse_ticket
from schemas.tickets import ErrorClass
from streams.headers import DeadLetterContext, trace_id_of

GOOD = orjson.dumps({"ticket_id": "a-1", "text": "hi", "created_at": "2026-01-01T00:00:00Z"})


def test_a_good_record_parses():
    assert parse_ticket(GOOD, 65536).ticket_id == "a-1"


@pytest.mark.parametrize(
    ("raw", "cls"),
    [
        (None, ErrorClass.DESERIALIZATION),
        (b"\xff\xfe\x00", ErrorClass.DESERIALIZATION),
        (b"{not json", ErrorClass.DESERIALIZATION),
        (b"[1, 2]", ErrorClass.SCHEMA_VALIDATION),
        (b'{"ticket_id": "x"}', ErrorClass.SCHEMA_VALIDATION),
        (b"x" * 70_000, ErrorClass.PAYLOAD_TOO_LARGE),
    ],
)
def test_bad_records_get_their_class(raw, cls):
    with pytest.raises(BadRecord) as err:
        parse_ticket(raw, 65536)
    assert err.value.error_class == cls


def test_schema_errors_name_the_field():
    with pytest.raises(BadRecord, match="text"):
        parse_ticket(b'{"ticket_id": "x", "created_at": "2026-01-01T00:00:00Z"}', 65536)


def test_clean_text_normalises():
    assert clean_text("  <p>Hello&nbsp;<b>World</b></p>\u200b\n\n ＡＢＣ\x07 ") == "Hello World ABC"
    assert clean_text("我的订单\t\t没有到") == "我的订单 没有到"


def test_dead_letter_headers_carry_the_context():
    from datetime import datetime, timezone

    ctx = DeadLetterContext(
        "DESERIALIZATION",
        "not JSON",
        "validate",
        1,
        "tickets.in",
        2,
        7,
        datetime(2026, 1, 1, tzinfo=timezone.utc),
        "x" * 5000,
        "00-" + "a" * 32 + "-" + "b" * 16 + "-01",
    )
    h = dict(ctx.headers())
    assert h["x-dlq-error-class"] == b"DESERIALIZATION" and h["x-dlq-origin-offset"] == b"7"
    assert len(h["x-dlq-exception"]) == 2000
    assert trace_id_of(h["traceparent"].decode()) == "a" * 32
    assert trace_id_of("garbage") is None
