"""Issue 2's acceptance: tickets through six steps, malformed records to the DLQ."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from agents.definition import load_definition
from streams.topics import Topics
from tests.integration.kafka_helpers import ROUTES, collect, plain_producer, publish, tickets

pytestmark = pytest.mark.integration
STEPS = ["validate", "clean", "features", "infer", "rules", "route"]


DEFAULT = load_definition(Path("agents/workflows/ticket_classify.yaml"))
CASCADE_BELOW = DEFAULT.step("infer").cascade.below
# the rule that fired -> the route it takes (agents/steps/rules.py); nothing fired: auto
ROUTE_OF = {
    "refund_intent": "after_sales",
    "refund_intent_uncertain": "manual_review",
    "refund_intent_disagree": "manual_review",
    "score_threshold": "manual_review",
    "degraded": "manual_review",
    "sample": "auto_classify",
}


def test_a_thousand_tickets_each_yield_exactly_one_result(settings, worker):
    topics = Topics(settings.topic_prefix)
    batch = tickets(1000, "k", seed=20261202)
    # paced like steady traffic: a burst beyond the worker's rate would (rightly) degrade
    # the tickets that pass their 2 s deadline; that is the fault tests' business
    publish(settings.kafka_bootstrap, topics.tickets_in, batch, rate=100)
    # other modules may share the session's prefix: judge this test's own tickets only
    own = {t["ticket_id"].encode() for t in batch}
    msgs = collect(
        settings.kafka_bootstrap,
        [topics.out(r) for r in ROUTES],
        lambda out: len({m.key() for m in out} & own) >= len(batch),
    )
    msgs = [m for m in msgs if m.key() in own]
    results = [orjson.loads(m.value()) for m in msgs]
    ids = [r["ticket_id"] for r in results]
    assert len(ids) == len(set(ids)), "a ticket produced two results"
    assert set(ids) == {t["ticket_id"] for t in batch}
    by_id = {t["ticket_id"]: t for t in batch}
    correct = refunds = missed = 0
    for m, r in zip(msgs, results, strict=True):
        assert m.topic() == topics.out(r["route"])
        path = r["decision_path"]
        assert [s["step"] for s in path] == STEPS
        # the cascade: v1 decides, v2 where v1 is unsure; the result names who decided
        assert r["model_name"] == "ticket_classifier" and r["model_version"] in ("v1", "v2")
        infer = path[STEPS.index("infer")]
        assert infer["detail"] in ("v1 decided", f"below {CASCADE_BELOW}: v2 decided")
        assert r["model_version"] == infer["detail"].split()[-2]
        # the rule step's entry says which rule routed it, and why
        fired = (path[STEPS.index("rules")]["detail"] or "").split(":")[0]
        assert r["route"] == ROUTE_OF.get(fired, "auto_classify"), (fired, r)
        if r["route"] == "auto_classify":
            assert r["confidence"] >= 0.5 and r["category"] != "after_sales" and not r["degraded"]
        label = by_id[r["ticket_id"]]["_label"]
        if label == "after_sales":  # a request for money back or a replacement
            refunds += 1
            missed += r["route"] == "auto_classify"
        correct += r["category"] == label
    # the learned refund-intent head, not the words: few requests pass without a person
    # (9 of 167 here when written; the blind set's recall is in docs/blind5.md)
    assert refunds > 50 and missed <= 0.1 * refunds, (missed, refunds)
    assert correct / len(results) > 0.8, f"only {correct} of {len(results)} categories right"


MALFORMED = {
    "bad-utf8": (b"\xff\xfe\xfa not utf-8 at all", "DESERIALIZATION"),
    "bad-json": (b'{"ticket_id": "bad-json", "text": ', "DESERIALIZATION"),
    "no-text": (
        b'{"ticket_id": "no-text", "created_at": "2026-01-01T00:00:00Z"}',
        "SCHEMA_VALIDATION",
    ),
    "bad-id": (
        b'{"ticket_id": "white space", "text": "x", "created_at": "2026-01-01T00:00:00Z"}',
        "SCHEMA_VALIDATION",
    ),
    "too-large": (
        orjson.dumps(
            {"ticket_id": "too-large", "text": "x" * 70_000, "created_at": "2026-01-01T00:00:00Z"}
        ),
        "PAYLOAD_TOO_LARGE",
    ),
}


def test_malformed_records_reach_the_dlq_unchanged_and_valid_ones_still_pass(settings, worker):
    topics = Topics(settings.topic_prefix)
    good = tickets(20, "m", seed=7)
    p = plain_producer(settings.kafka_bootstrap)
    for i, t in enumerate(good):
        p.produce(
            topics.tickets_in,
            key=t["ticket_id"],
            value=orjson.dumps({k: v for k, v in t.items() if not k.startswith("_")}),
        )
        if i % 4 == 0 and i // 4 < len(MALFORMED):
            key, (raw, _) = list(MALFORMED.items())[i // 4]
            p.produce(topics.tickets_in, key=f"mal-{key}", value=raw)
    assert p.flush(30) == 0
    own = {f"mal-{k}" for k in MALFORMED} | {t["ticket_id"] for t in good}

    def owned(out: list) -> list:  # other modules may share the session's prefix
        return [m for m in out if m.key() is not None and m.key().decode() in own]

    dlq = collect(
        settings.kafka_bootstrap, [topics.dlq], lambda out: len(owned(out)) >= len(MALFORMED), 120
    )
    by_key = {m.key().decode(): m for m in owned(dlq)}
    assert set(by_key) == {f"mal-{k}" for k in MALFORMED}
    for key, (raw, cls) in MALFORMED.items():
        m = by_key[f"mal-{key}"]
        headers = {k: v.decode() for k, v in m.headers()}
        assert m.value() == raw, f"{key}: bytes changed"
        assert headers["x-dlq-error-class"] == cls, key
        assert headers["x-dlq-step"] == "validate"
        assert headers["x-dlq-origin-topic"] == topics.tickets_in
        for h in (
            "x-dlq-reason",
            "x-dlq-attempts",
            "x-dlq-origin-partition",
            "x-dlq-origin-offset",
            "x-dlq-first-failed-at",
            "traceparent",
        ):
            assert h in headers, h
    out = collect(
        settings.kafka_bootstrap,
        [topics.out(r) for r in ROUTES],
        lambda out: len({m.key() for m in out if m.key().startswith(b"m-")}) >= 20,
        120,
    )
    assert {m.key().decode() for m in out if m.key().startswith(b"m-")} == {
        t["ticket_id"] for t in good
    }
