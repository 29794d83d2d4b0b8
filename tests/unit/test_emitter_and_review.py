"""The emitter's dead letters and the review agent, with a fake producer."""

from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

import orjson

from agents.definition import load_definition
from agents.emitter import Emitter
from agents.review_agent import ReviewAgent
from agents.state import TicketStates, new_state, transition
from schemas.tickets import (
    AuditTrail,
    Category,
    Envelope,
    ErrorClass,
    Prediction,
    StepStatus,
    Ticket,
    TicketResult,
)
from streams.settings import Settings
from streams.topics import Topics

TOPICS = Topics("p.")
DEFINITION = load_definition(Settings().workflow_file)


class FakeProducer:
    def __init__(self) -> None:
        self.sent: list[tuple] = []

    def produce(self, topic, key, value, headers=None, partition=None):
        self.sent.append((topic, key, value, dict(headers or [])))

    def produce_many(self, records):
        for topic, key, value, headers, partition in records:
            self.produce(topic, key, value, headers, partition)


def event(value: bytes, headers=None, key: bytes | None = b"t-1"):
    message = SimpleNamespace(
        topic="p.tickets.in", partition=2, offset=41, key=key, value=value, headers=headers
    )
    return SimpleNamespace(message=message)


def test_a_dead_letter_keeps_the_original_bytes_and_says_why():
    producer = FakeProducer()
    Emitter(producer, TOPICS, max_replays=3).dead_letter(
        event(b"\xff not json"), "validate", ErrorClass.DESERIALIZATION, "not UTF-8", 1
    )
    topic, key, value, headers = producer.sent[0]
    assert (topic, key, value) == ("p.tickets.dlq", b"t-1", b"\xff not json")
    assert headers["x-dlq-error-class"] == b"DESERIALIZATION"
    assert headers["x-dlq-origin-offset"] == b"41"


def test_forged_or_spent_replay_counts_are_parked():
    for count in (b"abc", b"-5", b"9" * 40, b"\xff", b"3"):
        producer = FakeProducer()
        Emitter(producer, TOPICS, max_replays=3).dead_letter(
            event(b"{}", [("x-replay-count", count)]), "validate", ErrorClass.INTERNAL, "x", 1
        )
        assert producer.sent[0][0] == "p.tickets.dlq.parked", count
    producer = FakeProducer()
    Emitter(producer, TOPICS, max_replays=3).dead_letter(
        event(b"{}", [("x-replay-count", b"1")]), "validate", ErrorClass.INTERNAL, "x", 1
    )
    assert producer.sent[0][0] == "p.tickets.dlq"


class Table(dict):
    pass


def awaiting(tid: str) -> dict:
    now = datetime.now(timezone.utc)
    result = TicketResult(
        ticket_id=tid,
        route="manual_review",
        category=Category.general,
        confidence=0.3,
        model_name=None,
        model_version=None,
        degraded=False,
        degraded_reason=None,
        features={},
        decision_path=[],
        latency_ms=10.0,
        completed_at=now - timedelta(seconds=5),
    )
    state = transition(new_state(tid, "0:1", "a" * 32, "w", 1), "awaiting_review", "route")
    state["result"] = result.model_dump(mode="json")
    return state


def agent():
    producer = FakeProducer()
    table = Table()
    states = TicketStates(table, lambda event: None)
    return ReviewAgent(states, Emitter(producer, TOPICS, 3), TOPICS), table, producer


def decision(tid: str) -> bytes:
    return orjson.dumps(
        {
            "ticket_id": tid,
            "category": "billing",
            "reviewer": "ana",
            "decided_at": datetime.now(timezone.utc).isoformat(),
        }
    )


def test_a_decision_completes_a_waiting_ticket_once():
    review, table, producer = agent()
    table["t-1"] = awaiting("t-1")
    review.handle(event(decision("t-1")))
    review.handle(event(decision("t-1")))  # already decided: refused
    outs = [s for s in producer.sent if s[0] == "p.tickets.out.reviewed"]
    assert len(outs) == 1 and orjson.loads(outs[0][2])["category"] == "billing"
    assert table["t-1"]["status"] == "completed"


def test_an_unreadable_decision_is_dead_lettered_alone():
    review, table, producer = agent()
    for raw, key in ((b"\x00\xff", b"t-1"), (b"[]", b"t-1"), (decision("t-2"), b"t-9")):
        review.handle(event(raw, key=key))
    assert [s[0] for s in producer.sent] == ["p.tickets.dlq"] * 3
    assert table == {}


def test_a_tickets_audit_trail_is_its_decision_path_with_times_and_versions():
    sent = []

    class Sink:
        def produce(self, topic, key, value, headers=None, partition=None):
            sent.append((topic, key, value))

    emitter = Emitter.__new__(Emitter)  # no producer thread: the sink records
    emitter.producer, emitter.topics = Sink(), Topics("p.")
    env = _trail_envelope()
    clean = DEFINITION.step("clean")
    emitter.record(env, clean, StepStatus.ok, 0.0)
    env.context.prediction = Prediction(
        category="billing", confidence=0.9, model_name="m", model_version="v1"
    )
    emitter.record(env, DEFINITION.step("infer"), StepStatus.ok, 0.0)
    emitter.audit_dead_letter(env)
    [(topic, key, value)] = sent
    assert (topic, key) == ("p.tickets.audit", b"t-9")
    trail = AuditTrail.model_validate_json(value)  # strictly valid, though constructed
    assert trail.outcome == "dead_lettered" and trail.model_version == "v1"
    records = trail.records()
    assert [(r.step, r.model_version) for r in records] == [("clean", None), ("infer", "v1")]
    assert all(r.at is not None and r.input_sha256 == "0" * 64 for r in records)
    assert records[0].at <= records[1].at <= trail.at


def _trail_envelope() -> Envelope:
    now = datetime.now(timezone.utc)
    return Envelope(
        ticket=Ticket(ticket_id="t-9", text="x", created_at=now),
        workflow=DEFINITION.name,
        workflow_version=DEFINITION.version,
        step="clean",
        trace_id="a" * 32,
        arrival="0:1",
        input_sha256="0" * 64,
        started_at=now,
    )
