"""Issue 11: every decoder of agents/decoding.py returns or raises BadRecord, whatever it gets.

Values, keys and headers are drawn from arbitrary bytes and from valid records with one
field swapped for an arbitrary JSON value or a literal that JSON parsers disagree on.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import orjson
import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from agents.decoding import (
    MAX_ATTEMPT,
    NO_KEY,
    header,
    ledger_key,
    read_decision,
    read_envelope,
    read_ticket,
    retry_wait_s,
    trace_id,
    traceparent,
)
from agents.errors import BadRecord
from schemas.tickets import (
    Context,
    DecisionStep,
    Envelope,
    ErrorClass,
    FeatureValue,
    Prediction,
    ReviewDecision,
    RuleOutcome,
    Ticket,
)
from streams.codecs import encode
from streams.headers import REPLAY_COUNT, replay_count

MAX_BYTES = 64 * 1024
STEPS = {"clean", "features", "infer", "rules", "route"}
VERSIONS = {1}
NOW = datetime(2026, 6, 1, tzinfo=timezone.utc)
PROPERTY = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# ---- strategies ------------------------------------------------------------------------------

offsets = st.timedeltas(
    min_value=-timedelta(hours=23, minutes=59), max_value=timedelta(hours=23, minutes=59)
).map(lambda d: timezone(timedelta(minutes=d // timedelta(minutes=1))))
datetimes = st.datetimes(timezones=st.none() | offsets)
header_names = st.sampled_from(["traceparent", "x-replay-count", b"traceparent"]) | st.one_of(
    st.none(), st.text(max_size=16), st.binary(max_size=16), st.integers()
)
header_values = st.one_of(st.none(), st.binary(max_size=80), st.text(max_size=80), st.integers())
pairs = st.tuples(header_names, header_values)
headers = st.one_of(
    st.none(),
    st.lists(pairs, max_size=6),
    st.lists(st.one_of(pairs, st.tuples(header_names), st.integers(), st.binary()), max_size=6),
    st.dictionaries(header_names.filter(lambda n: n is not None), header_values, max_size=4),
    st.text(max_size=20),
    st.binary(max_size=20),
    st.integers(),
)
keys = st.one_of(st.none(), st.binary(max_size=40), st.text(max_size=40), st.integers())
json_values = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(),  # past 64 bits too: pydantic reads them, orjson cannot write them
        st.floats(allow_nan=False, allow_infinity=False),
        st.text(max_size=30),
        datetimes.map(datetime.isoformat),
    ),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=12,
)


def dumps(value: object) -> bytes:
    return json.dumps(value).encode()  # orjson cannot write integers past 64 bits


# literals some JSON parsers take and others refuse, or that overflow what reads them
odd_literals = st.sampled_from(
    [
        b"NaN",
        b"Infinity",
        b"-Infinity",
        b"1e400",
        b"123456789012345678901234567890",
        b'"\\ud800"',
        b'"2026-01-01T00:00:00"',
        b'"9999-12-31T23:59:59-23:59"',
        b'"0001-01-01T00:00:00+23:59"',
        b"[" * 300 + b"]" * 300,
        b'"' + b"x" * 70_000 + b'"',
        b"-1",
        b"0",
        b"2147483648",
    ]
)
ticket_ids = st.from_regex(r"[A-Za-z0-9._:-]{1,128}", fullmatch=True)
tickets = st.builds(
    Ticket,
    ticket_id=ticket_ids,
    text=st.text(min_size=1, max_size=300),
    user_id=st.none() | st.text(max_size=128),
    channel=st.none() | st.sampled_from(["email", "chat", "web", "phone", "api"]),
    language=st.none() | st.text(max_size=16),
    created_at=datetimes,
    metadata=st.dictionaries(st.text(max_size=10), st.text(max_size=20), max_size=3),
)


FULL_CONTEXT = Context(
    clean_text="x",
    features={"f": FeatureValue(value=1), "g": FeatureValue(value=["a"], is_fallback=True)},
    prediction=Prediction(
        category="billing",
        confidence=0.9,
        scores={"billing": 0.9},
        model_name="m",
        model_version="v1",
    ),
    rule=RuleOutcome(route="auto_classify", category="billing"),
)


def envelope_of(ticket: Ticket, **fields) -> Envelope:
    return Envelope(
        ticket=ticket,
        workflow="ticket_classify",
        workflow_version=1,
        step="infer",
        trace_id="a" * 32,
        arrival="0:1",
        input_sha256="0" * 64,
        started_at=NOW - timedelta(seconds=1),
        **fields,
    )


def full_envelope(ticket: Ticket) -> Envelope:
    path = [DecisionStep(step="clean", status="ok", latency_ms=0.1)]
    return envelope_of(ticket, context=FULL_CONTEXT, path=path)


def swapped(data: dict, path: list[str]) -> dict:
    """A copy of `data` with the field at `path` set to a marker, replaced in the bytes."""
    out = orjson.loads(orjson.dumps(data))
    node = out
    for part in path[:-1]:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    node[path[-1]] = "__swap__"
    return out


def with_literal(data: dict, path: list[str], literal: bytes) -> bytes:
    return orjson.dumps(swapped(data, path)).replace(b'"__swap__"', literal, 1)


def assert_bad(exc: BadRecord) -> None:
    assert isinstance(exc.error_class, ErrorClass)
    exc.reason.encode("utf-8")  # the dead-letter headers are built from it
    assert len(exc.reason) <= 1000


# ---- headers -----------------------------------------------------------------------------


@PROPERTY
@given(headers, st.text(max_size=16))
def test_header_never_raises_and_answers_text_or_none(hs, name):
    got = header(hs, name)
    assert got is None or isinstance(got, str)
    if got is not None:
        got.encode("utf-8")


@PROPERTY
@given(headers)
def test_replay_count_and_trace_context_never_raise(hs):
    count = replay_count(header(hs, REPLAY_COUNT))
    assert count is None or count >= 0
    parent = traceparent(hs)
    assert parent is None or (len(parent) == 55 and trace_id(hs) == parent[3:35])


def test_the_last_duplicate_wins_and_odd_shapes_are_tolerated():
    hs = [("x-replay-count", b"1"), ("traceparent", None), ("x-replay-count", b"2"), (1, 2)]
    assert header(hs, "x-replay-count") == "2" and header(hs, "traceparent") is None
    assert header({"a": b"\xff"}, "a") == "\ufffd"
    assert header([(b"a", b"v")], "a") == "v"
    assert header(iter([("a", b"v"), ("b",)]), "a") == "v"
    assert header(42, "a") is None and header("abc", "a") is None


def test_a_garbage_traceparent_is_ignored():
    good = "00-" + "ab" * 16 + "-" + "cd" * 8 + "-01"
    assert trace_id([("traceparent", good.encode())]) == "ab" * 16
    for bad in ["garbage", "00-" + "é" * 32 + "-" + "c" * 16 + "-01", good.upper(), ""]:
        assert trace_id([("traceparent", bad.encode())]) is None
    assert trace_id([("traceparent", ("00-" + "0" * 32 + "-" + "c" * 16 + "-01").encode())]) is None


# ---- tickets.in ----------------------------------------------------------------------------


@PROPERTY
@given(
    st.one_of(st.none(), st.binary(max_size=300), st.text(max_size=300), st.integers()),
    keys,
    headers,
)
def test_read_ticket_on_anything_returns_a_ticket_or_bad_record(value, key, hs):
    try:
        ticket = read_ticket(value, key, hs, MAX_BYTES)
    except BadRecord as exc:
        assert_bad(exc)
    else:
        assert isinstance(ticket, Ticket) and ticket.created_at.tzinfo is not None


@PROPERTY
@given(tickets, keys, headers)
def test_a_valid_ticket_round_trips_whatever_its_key_and_headers(ticket, key, hs):
    raw = ticket.model_dump_json().encode()
    assume(len(raw) <= MAX_BYTES)
    assert read_ticket(raw, key, hs, MAX_BYTES) == ticket


@PROPERTY
@given(
    tickets,
    st.sampled_from(["ticket_id", "text", "user_id", "channel", "created_at", "metadata"]),
    json_values.map(dumps) | odd_literals,
)
def test_a_ticket_with_any_field_swapped_is_read_or_refused(ticket, field, literal):
    raw = with_literal(ticket.model_dump(mode="json"), [field], literal)
    try:
        read_ticket(raw, None, None, MAX_BYTES)
    except BadRecord as exc:
        assert_bad(exc)


@pytest.mark.parametrize(
    ("value", "error_class"),
    [
        (None, ErrorClass.DESERIALIZATION),
        (b"\xff\xfe", ErrorClass.DESERIALIZATION),
        (b"{", ErrorClass.DESERIALIZATION),
        (b"[]", ErrorClass.SCHEMA_VALIDATION),
        (b"{}", ErrorClass.SCHEMA_VALIDATION),
        (b" " * (MAX_BYTES + 1), ErrorClass.PAYLOAD_TOO_LARGE),
        (12, ErrorClass.DESERIALIZATION),
    ],
)
def test_bad_tickets_carry_their_design_class(value, error_class):
    with pytest.raises(BadRecord) as caught:
        read_ticket(value, b"\xff", [("x-replay-count", b"abc")], MAX_BYTES)
    assert caught.value.error_class == error_class


def test_a_naive_created_at_is_read_as_utc():
    raw = b'{"ticket_id": "t", "text": "x", "created_at": "2026-01-01T00:00:00"}'
    assert read_ticket(raw, None, None, MAX_BYTES).created_at.tzinfo is not None


# ---- envelopes -----------------------------------------------------------------------------

ENVELOPE_FIELDS = [
    ["step"],
    ["workflow_version"],
    ["attempt"],
    ["started_at"],
    ["not_before"],
    ["trace_id"],
    ["ticket"],
    ["context"],
    ["path"],
    ["context", "features"],
    ["context", "clean_text"],
    ["context", "prediction"],
    ["context", "rule"],
    ["ticket", "text"],
    ["ticket", "created_at"],
    ["context", "features", "f", "value"],
    ["context", "features", "f"],
    ["context", "prediction", "confidence"],
    ["context", "prediction", "scores", "billing"],
    ["context", "prediction", "category"],
    ["context", "rule", "route"],
]


def assert_usable(env: Envelope) -> None:
    """What the steps do with an envelope cannot fail on it."""
    assert env.step in STEPS and env.workflow_version in VERSIONS
    assert 1 <= env.attempt <= MAX_ATTEMPT
    assert env.started_at <= datetime.now(timezone.utc)
    assert env.started_at.tzinfo is not None
    assert env.not_before is None or env.not_before.tzinfo is not None
    encode(env)
    orjson.dumps({k: v.value for k, v in env.context.features.items()})
    assert 0 <= retry_wait_s(env, 3200, NOW) <= 3.2


T = Ticket(ticket_id="t", text="x", created_at=NOW)


@PROPERTY
@given(tickets, st.sampled_from(ENVELOPE_FIELDS), json_values.map(dumps) | odd_literals)
@example(T, ["context", "features", "f", "value"], b"123456789012345678901234567890")
@example(T, ["started_at"], b'"9999-12-31T23:59:59-23:59"')
@example(T, ["not_before"], b'"2026-01-01T00:00:00"')
@example(T, ["not_before"], b'"9999-12-31T23:59:59+00:00"')
@example(T, ["attempt"], b"2147483648")
@example(T, ["workflow_version"], b"2")
@example(T, ["step"], b'"../../etc"')
@example(T, ["context", "prediction", "confidence"], b"NaN")
@example(T, ["context", "prediction", "scores", "billing"], b"Infinity")
@example(T, ["context", "clean_text"], b'"' + "\ufdfa".encode() * 20_001 + b'"')
def test_an_envelope_with_any_field_swapped_is_read_or_refused(ticket, path, literal):
    raw = with_literal(full_envelope(ticket).model_dump(mode="json"), path, literal)
    try:
        env = read_envelope(raw, STEPS, VERSIONS)
    except BadRecord as exc:
        assert_bad(exc)
        assert exc.error_class == ErrorClass.INTERNAL
    else:
        assert_usable(env)


@PROPERTY
@given(st.one_of(st.none(), st.binary(max_size=300), st.text(max_size=100)), keys)
def test_read_envelope_on_anything_returns_an_envelope_or_bad_record(value, key):
    try:
        assert_usable(read_envelope(value, STEPS, VERSIONS, key=key))
    except BadRecord as exc:
        assert exc.error_class == ErrorClass.INTERNAL


@PROPERTY
@given(tickets)
def test_a_valid_envelope_round_trips(ticket):
    env = full_envelope(ticket)
    key = ticket.ticket_id.encode()
    assert read_envelope(encode(env), STEPS, VERSIONS, key=key, step="infer") == env


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"step": "nowhere"}, "no workflow version here has"),
        ({"workflow_version": 7}, "not one of"),
        ({"attempt": MAX_ATTEMPT + 1}, "no retry policy"),
        ({"context": Context(features={"f": FeatureValue(value=2**70)})}, "cannot be sent"),
    ],
)
def test_envelopes_no_step_could_run_are_refused_at_once(change, why):
    env = envelope_of(T).model_copy(update=change)
    with pytest.raises(BadRecord, match=why) as caught:
        read_envelope(encode(env), STEPS, VERSIONS)
    assert caught.value.error_class == ErrorClass.INTERNAL


def test_an_envelope_under_another_key_or_on_another_steps_topic_is_refused():
    raw = encode(envelope_of(Ticket(ticket_id="t", text="x", created_at=NOW)))
    for key in (b"other", None, b"\xff"):
        with pytest.raises(BadRecord, match="key"):
            read_envelope(raw, STEPS, VERSIONS, key=key)
    with pytest.raises(BadRecord, match="on the topic of step"):
        read_envelope(raw, STEPS, VERSIONS, step="rules")
    assert read_envelope(raw, STEPS, VERSIONS, key=NO_KEY).ticket.ticket_id == "t"


def test_a_future_start_is_clamped_so_latencies_stay_positive():
    future = envelope_of(Ticket(ticket_id="t", text="x", created_at=NOW)).model_copy(
        update={"started_at": datetime(9999, 1, 1, tzinfo=timezone.utc)}
    )
    env = read_envelope(encode(future), STEPS, VERSIONS, now=NOW)
    assert env.started_at == NOW


# ---- retry tiers ---------------------------------------------------------------------------


@PROPERTY
@given(st.none() | datetimes, datetimes, st.sampled_from([200, 400, 800, 1600, 3200]))
def test_a_retry_never_waits_longer_than_its_tier(not_before, now, tier_ms):
    env = envelope_of(Ticket(ticket_id="t", text="x", created_at=NOW))
    env.not_before = not_before  # as a forged record could carry (naive too)
    assert 0 <= retry_wait_s(env, tier_ms, now) <= tier_ms / 1000


def test_a_due_retry_waits_what_is_left():
    env = envelope_of(Ticket(ticket_id="t", text="x", created_at=NOW))
    env.not_before = NOW + timedelta(milliseconds=150)
    assert retry_wait_s(env, 200, NOW) == pytest.approx(0.15)
    env.not_before = NOW + timedelta(days=3650)
    assert retry_wait_s(env, 200, NOW) == 0.2


# ---- review decisions and the ledger -------------------------------------------------------


@PROPERTY
@given(st.one_of(st.none(), st.binary(max_size=300), st.integers()), keys)
def test_read_decision_on_anything_returns_a_decision_or_bad_record(value, key):
    try:
        decision = read_decision(value, key)
    except BadRecord as exc:
        assert_bad(exc)
        assert exc.error_class in (ErrorClass.DESERIALIZATION, ErrorClass.SCHEMA_VALIDATION)
    else:
        assert decision.decided_at.tzinfo is not None


@PROPERTY
@given(
    ticket_ids,
    st.sampled_from(["ticket_id", "category", "reviewer", "note", "decided_at"]),
    json_values.map(dumps) | odd_literals,
)
def test_a_decision_with_any_field_swapped_is_read_or_refused(tid, field, literal):
    good = ReviewDecision(ticket_id=tid, category="billing", decided_at=NOW)
    raw = with_literal(good.model_dump(mode="json"), [field], literal)
    try:
        decision = read_decision(raw, tid.encode())
    except BadRecord as exc:
        assert_bad(exc)
    else:
        assert decision.decided_at.tzinfo is not None and decision.ticket_id == tid


def test_a_decision_keyed_by_another_ticket_is_refused():
    raw = ReviewDecision(ticket_id="t-1", category="billing").model_dump_json().encode()
    assert read_decision(raw, b"t-1").ticket_id == "t-1"
    for key in (b"t-2", None, b"\xff"):
        with pytest.raises(BadRecord) as caught:
            read_decision(raw, key)
        assert caught.value.error_class == ErrorClass.SCHEMA_VALIDATION


@PROPERTY
@given(keys)
def test_ledger_key_names_a_ticket_or_none(key):
    got = ledger_key(key)
    assert got is None or (isinstance(got, str) and got)
    if isinstance(key, bytes) and key:
        try:
            assert got == key.decode("utf-8")
        except UnicodeDecodeError:
            assert got is None
