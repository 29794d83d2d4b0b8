"""Issue 11 on the real stack: hostile records next to valid tickets, a private worker.

A stock confluent-kafka producer publishes 400 valid tickets (some with garbage headers)
mixed with records no parser should trust: bad bytes, null and non-UTF-8 keys, forged
`x-replay-count` headers, NFKC bombs, oversize values, a value near the broker's limit. Then
hostile review decisions, and forged envelopes on a step topic and a retry tier. Every valid
ticket must get exactly one non-degraded result (read_committed) and no dead letter; every
hostile record on tickets.in must be dead-lettered alone with its class and original bytes;
the worker must still be alive and still deciding reviews.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timezone

import orjson
import pytest
from confluent_kafka import Message

from devstack import app_processes
from streams.codecs import encode
from tests.integration.kafka_helpers import UNSURE_TEXT, Collector, body, plain_producer, tickets
from tests.integration.test_faults import PrivatePipeline, count_results

pytestmark = pytest.mark.integration

NOW = datetime.now(timezone.utc).isoformat()
BIG_METADATA = {f"k{i}": "v" * 40 for i in range(1000)}  # 50 KB of it
GARBAGE_HEADERS = [
    ("traceparent", b"garbage"),
    ("x-replay-count", b"abc"),
    ("traceparent", b"\xff\xfe"),
    ("x-replay-count", None),
]


@dataclass(frozen=True)
class Record:
    key: bytes | None
    value: bytes | None
    headers: tuple = ()
    error_class: str | None = None  # None: a valid ticket, to be completed


def ticket_body(tid: str, **fields) -> bytes:
    return orjson.dumps(
        {"ticket_id": tid, "text": "my invoice is wrong", "created_at": NOW, **fields}
    )


def hostile_tickets() -> list[Record]:
    """Records on tickets.in no step may trust; (key, value) pairs are all distinct."""
    h = [
        Record(b"h-null", None, (), "DESERIALIZATION"),
        Record(b"h-bin", b"\xff\xfe\x00garbage", (), "DESERIALIZATION"),
        Record(None, b"not json {", (), "DESERIALIZATION"),
        Record(b"\xff\xfe", b"[]", (), "SCHEMA_VALIDATION"),
        Record(b"h-empty", b"{}", (), "SCHEMA_VALIDATION"),
        Record(
            b"h-notext",
            orjson.dumps({"ticket_id": "h-notext", "created_at": NOW}),
            (),
            "SCHEMA_VALIDATION",
        ),
        Record(b"h-space", ticket_body("has space"), (), "SCHEMA_VALIDATION"),
        Record(b"h-long", ticket_body("h-long", text="x" * 20_001), (), "SCHEMA_VALIDATION"),
        Record(b"h-when", ticket_body("h-when", created_at="yesterday"), (), "SCHEMA_VALIDATION"),
        Record(b"h-year", ticket_body("h-year", created_at=10**18), (), "SCHEMA_VALIDATION"),
        Record(b"h-meta", ticket_body("h-meta", metadata={"a": 1}), (), "SCHEMA_VALIDATION"),
        Record(
            b"h-nan",
            b'{"ticket_id": "h-nan", "text": NaN, "created_at": "' + NOW.encode() + b'"}',
            (),
            "DESERIALIZATION",
        ),
        Record(
            b"h-surrogate",
            b'{"ticket_id": "h-surrogate", "text": "\\ud800", "created_at": "'
            + NOW.encode()
            + b'"}',
            (),
            "DESERIALIZATION",
        ),
        Record(b"h-deep", b"[" * 5000 + b"]" * 5000, (), "DESERIALIZATION"),
        Record(b"h-big", b" " * 70_000, (), "PAYLOAD_TOO_LARGE"),
        # near the broker's limit: its dead letter (the same bytes plus x-dlq-* headers)
        # must still fit on tickets.dlq
        Record(b"h-huge", b"x" * 999_000, (), "PAYLOAD_TOO_LARGE"),
    ]
    forged = [
        [("x-replay-count", b"abc")],
        [("x-replay-count", b"-5")],
        [("x-replay-count", b"x" * 1000)],
        [("x-replay-count", b"1"), ("x-replay-count", b"zz"), ("x-replay-count", b"2")],
        [("x-replay-count", b"\xff\xfe"), ("traceparent", b"\xff")],
        [("x-replay-count", None), ("traceparent", None)],
        [("x-replay-count", b"99999999999999999999999")],
        [("traceparent", b"00-" + b"z" * 32 + b"-" + b"0" * 16 + b"-01")],
    ]
    h += [
        Record(f"h-hdr-{i}".encode(), f"bad {i}".encode(), tuple(hs), "DESERIALIZATION")
        for i, hs in enumerate(forged)
    ]
    return h


def accepted_odd() -> list[Record]:
    """Tickets the contract accepts, however odd: each must complete like any other."""
    return [
        Record(b"ok-bomb-max", ticket_body("ok-bomb-max", text="\ufdfa" * 20_000)),
        Record(b"ok-bomb", ticket_body("ok-bomb", text="\ufdfa" * 1112 + " where is my parcel")),
        Record(b"ok-mix", ticket_body("ok-mix", text="\ufb03 \u3300 \u2474 " * 2000)),
        Record(b"ok-markup", ticket_body("ok-markup", text="<b></b>")),
        Record(b"ok-naive", ticket_body("ok-naive", created_at="2026-01-01T00:00:00")),
        Record(None, ticket_body("ok-nullkey")),
        Record(b"\xff\xfe\xfd", ticket_body("ok-binkey")),
        Record(b"someone-else", ticket_body("ok-otherkey")),
        Record(b"ok-meta", ticket_body("ok-meta", metadata=BIG_METADATA)),
        Record(b"ok-user", ticket_body("ok-user", user_id="}{\u0000\ufdfa" * 30)),
        Record(b"ok-ctrl", ticket_body("ok-ctrl", text="\x00\x07 refund \u200b\u202e please")),
        Record(b"ok-hdr", ticket_body("ok-hdr"), tuple(GARBAGE_HEADERS)),
    ]  # fmt: skip


def review_ticket(tid: str) -> Record:
    return Record(tid.encode(), ticket_body(tid, text=UNSURE_TEXT))


def produce(
    pipeline: PrivatePipeline, topic: str, records: list[Record], rate: float | None = None
) -> None:
    """Publish `records` in order, at most `rate` a second when given."""
    p = plain_producer(pipeline.settings.kafka_bootstrap)
    failed: list[str] = []

    def on_delivery(err, msg) -> None:
        if err is not None:
            failed.append(f"{msg.key()!r}: {err}")

    start = time.monotonic()
    for n, r in enumerate(records, 1):
        p.produce(topic, key=r.key, value=r.value, headers=list(r.headers), on_delivery=on_delivery)
        p.poll(0)
        ahead = n / rate - (time.monotonic() - start) if rate else 0
        if ahead > 0:
            time.sleep(ahead)
    assert p.flush(60) == 0
    assert not failed, failed


def header_of(msg: Message, name: str) -> str | None:
    for k, v in msg.headers() or []:
        if k == name:
            return v.decode() if v is not None else None
    return None


def dead_letters(pipeline: PrivatePipeline, want: int, timeout_s: float = 120) -> list[Message]:
    topics = [pipeline.topics.dlq, pipeline.topics.dlq_parked]
    c = Collector(pipeline.settings.kafka_bootstrap, topics)
    try:
        return c.until(lambda rs: len(rs) >= want, timeout_s)
    finally:
        c.close()


def assert_each_dead_lettered(hostile: list[Record], letters: list[Message], step: str) -> None:
    by_record = {(m.key(), m.value()): m for m in letters}
    missing, wrong = [], []
    for r in hostile:
        letter = by_record.get((r.key, r.value))
        if letter is None:
            missing.append(r.key)
        elif header_of(letter, "x-dlq-error-class") != r.error_class:
            wrong.append((r.key, header_of(letter, "x-dlq-error-class"), r.error_class))
        elif header_of(letter, "x-dlq-step") != step:
            wrong.append((r.key, header_of(letter, "x-dlq-step"), step))
    assert not missing, f"not dead-lettered: {missing}"
    assert not wrong, f"dead-lettered with the wrong class or step: {wrong}"


def forged_envelope(tid: str, step: str, **changes) -> bytes:
    """A well-formed envelope for a ticket no one published, as a forger would write it."""
    from schemas.tickets import Envelope, Ticket

    env = Envelope(
        ticket=Ticket(ticket_id=tid, text="where is my parcel", created_at=NOW),
        workflow="ticket_classify",
        workflow_version=1,
        step=step,
        trace_id="c" * 32,
        arrival="forged:0",
        input_sha256="0" * 64,
        started_at=datetime.now(timezone.utc),
    )
    return encode(env.model_copy(update=changes))


def warm_up(pipeline: PrivatePipeline) -> None:
    """A few tickets through every step first: the first calls pay for connections."""
    batch = tickets(10, "psn-warm", seed=48)
    produce(pipeline, pipeline.topics.tickets_in, [Record(None, body(t)) for t in batch])
    want = {t["ticket_id"] for t in batch}
    pipeline.watch.until(lambda rs: want <= set(count_results(rs)), timeout_s=120, settle_s=0)


@pytest.fixture
def pipeline(live_stack, gateway):
    p = PrivatePipeline()
    p.start_worker()
    yield p
    p.close()


def test_hostile_records_are_dead_lettered_alone_and_valid_tickets_complete(pipeline):
    valid = tickets(400, "psn", seed=47)
    plain = [
        Record(t["ticket_id"].encode(), body(t), tuple(GARBAGE_HEADERS) if i % 10 == 0 else ())
        for i, t in enumerate(valid)
    ]
    hostile = hostile_tickets()
    odd = accepted_odd()
    reviews = [review_ticket("psn-rev-a"), review_ticket("psn-rev-b")]
    stream = plain + hostile + odd + reviews
    random.Random(47).shuffle(stream)
    warm_up(pipeline)
    # a steady rate, not one burst: "non-degraded" must not hinge on a cold, shared machine
    produce(pipeline, pipeline.topics.tickets_in, stream, rate=40)

    completed_ids = {t["ticket_id"] for t in valid} | {
        orjson.loads(r.value)["ticket_id"] for r in odd + reviews
    }
    records = pipeline.watch.until(
        lambda rs: completed_ids <= set(count_results(rs)), timeout_s=300, settle_s=5
    )
    results = {}
    for m in records:
        results.setdefault(m.key().decode(), []).append(orjson.loads(m.value()))
    missing = completed_ids - set(results)
    assert not missing, f"{len(missing)} ticket(s) without a result: {pipeline.explain(missing)}"
    doubled = [k for k in completed_ids if len(results[k]) > 1]
    assert not doubled, f"tickets with two results: {doubled[:5]}"
    degraded = {
        k: results[k][0]["degraded_reason"] for k in completed_ids if results[k][0]["degraded"]
    }
    assert not degraded, f"{len(degraded)} degraded: {list(degraded.items())[:5]}"

    letters = dead_letters(pipeline, len(hostile))
    assert_each_dead_lettered(hostile, letters, step="validate")
    lettered_ids = {m.key() for m in letters}
    assert not {k.encode() for k in completed_ids} & lettered_ids, (
        "a valid ticket was dead-lettered"
    )
    assert pipeline.worker.process.poll() is None, "the worker died"

    # reviews: hostile decisions first, on the same partitions as the real ones
    decisions = pipeline.topics.review_decisions
    a, b = b"psn-rev-a", b"psn-rev-b"
    assert results["psn-rev-a"][0]["route"] == "manual_review"
    bad_decisions = [
        Record(a, None, (), "DESERIALIZATION"),
        Record(a, b"\xff", (), "DESERIALIZATION"),
        Record(a, b'{"ticket_id": "psn-rev-a"}', (), "SCHEMA_VALIDATION"),
        Record(a, b'{"ticket_id": "psn-rev-a", "category": "nope"}', (), "SCHEMA_VALIDATION"),
        # keyed by another ticket: its state would be written to the wrong partition
        Record(b"zzz", b'{"ticket_id": "psn-rev-b", "category": "account"}', (),
               "SCHEMA_VALIDATION"),
        Record(None, b"garbage", tuple(GARBAGE_HEADERS), "DESERIALIZATION"),
    ]  # fmt: skip
    good_decisions = [
        # no offset on decided_at: read as UTC (it crashed the review agent before)
        Record(a, orjson.dumps({"ticket_id": "psn-rev-a", "category": "billing",
               "reviewer": "r" * 5000, "decided_at": "2026-01-01T00:00:00"}),
               tuple(GARBAGE_HEADERS)),
        Record(b, orjson.dumps({"ticket_id": "psn-rev-b", "category": "shipping"})),
    ]  # fmt: skip
    reviewed = Collector(pipeline.settings.kafka_bootstrap, [pipeline.topics.out("reviewed")])
    try:
        produce(pipeline, decisions, bad_decisions + good_decisions)
        done = reviewed.until(lambda rs: len(rs) >= 2, timeout_s=60, settle_s=3)
    finally:
        reviewed.close()
    categories = Counter((m.key(), orjson.loads(m.value())["category"]) for m in done)
    assert categories == {(a, "billing"): 1, (b, "shipping"): 1}, categories
    letters = dead_letters(pipeline, len(hostile) + len(bad_decisions))
    assert_each_dead_lettered(bad_decisions, letters, step="review")

    # forged envelopes: a retry due in the year 9999 must not park its tier's partition, and
    # envelopes no step could run are dead-lettered as INTERNAL
    far = datetime(9999, 1, 1, tzinfo=timezone.utc)
    fwd = forged_envelope("psn-fwd", "rules", not_before=far)
    produce(pipeline, pipeline.topics.retry(3200), [Record(b"psn-fwd", fwd)])
    forged = [
        Record(b"psn-f1", b"\xff garbage", (), "INTERNAL"),
        Record(b"psn-f2", forged_envelope("psn-f2", "nowhere"), (), "INTERNAL"),
        Record(b"other", forged_envelope("psn-f3", "infer"), (), "INTERNAL"),
        Record(b"psn-f4", forged_envelope("psn-f4", "infer", attempt=10**6), (), "INTERNAL"),
    ]
    produce(pipeline, pipeline.topics.step("infer"), forged)
    late = pipeline.watch.until(lambda rs: "psn-fwd" in count_results(rs), timeout_s=60, settle_s=0)
    assert "psn-fwd" in count_results(late), "a forged not_before parked the retry tier"
    letters = dead_letters(pipeline, len(hostile) + len(bad_decisions) + len(forged))
    assert_each_dead_lettered(forged, letters, step="infer")
    assert pipeline.worker.process.poll() is None, "the worker died"
    assert app_processes.worker_ready(pipeline.settings), "the worker stopped serving"


def test_a_record_at_the_producers_limit_is_dead_lettered_and_its_partition_goes_on(pipeline):
    warm_up(pipeline)
    limit = Record(b"h-limit", b"x" * 999_900, (), "PAYLOAD_TOO_LARGE")
    behind = tickets(20, "psn-behind", seed=49)
    p = plain_producer(pipeline.settings.kafka_bootstrap)
    for key, value in [(limit.key, limit.value), *((t["ticket_id"], body(t)) for t in behind)]:
        p.produce(pipeline.topics.tickets_in, key=key, value=value, partition=0)
    assert p.flush(60) == 0
    want = {t["ticket_id"] for t in behind}
    got = pipeline.watch.until(lambda rs: want <= set(count_results(rs)), 120, settle_s=0)
    assert want <= set(count_results(got)), "the partition stopped behind the record"
    assert_each_dead_lettered([limit], dead_letters(pipeline, 1), step="validate")
