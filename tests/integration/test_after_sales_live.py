"""Issue 14 part 5, live: the blind2 hand-written set through the real pipeline.

A stock Kafka client publishes each ticket of tests/fixtures/after_sales_blind2.jsonl; the
session worker (default workflow) classifies it through the gateway and Triton. At most
5 % of its refund, return or exchange requests may be auto-classified, the bar of the
offline `test_after_sales_targets` (the others reach after_sales, or manual_review in the
intent head's uncertain band; at most 10 % to people); of what reaches after_sales, at
least 90 % must be such requests; and every
ticket must take the route the in-process evaluation (`ticketflow eval after-sales`, the
weights on disk) gives it. A difference there means Triton serves other weights than the
files: restart it after a retrain.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timezone

import orjson
import pytest

from evaluation import after_sales as ev
from streams.topics import Topics
from tests.integration.kafka_helpers import ROUTES, collect, publish, tickets

pytestmark = pytest.mark.integration
FIXTURE = ev.FIXTURE.parent / "after_sales_blind2.jsonl"


def _tickets(cases: list[ev.Case], tag: str) -> list[dict]:
    now = datetime.now(timezone.utc).isoformat()
    return [
        # email: the selector's default workflow (chat and VIP tickets have their own)
        {"ticket_id": f"{tag}-{c.id}", "text": c.text, "user_id": f"u{i % 20}",
         "channel": "email", "created_at": now}
        for i, c in enumerate(cases)
    ]  # fmt: skip


def _offline_routes(cases: list[ev.Case]) -> dict[str, str]:
    infer = next(s for s in ev.load_definition_steps() if s.type == "inference_call")
    score = ev.cascade_scorer(infer.cascade.below) if infer.cascade else ev.scorer("v1")
    outcomes = ev.decide([c.text for c in cases], score, ev.rules_step(), "v1")
    return {c.id: o.route for c, o in zip(cases, outcomes, strict=True)}


def test_every_request_of_blind2_reaches_after_sales(settings, worker):
    topics = Topics(settings.topic_prefix)
    cases = ev.load_cases(FIXTURE)
    batch = _tickets(cases, "as2")
    # one ticket first: a worker that just started spends a deadline joining its group, and
    # a ticket degraded by that is not what this test measures
    warm = tickets(1, f"warm{uuid.uuid4().hex[:6]}", seed=15)
    publish(settings.kafka_bootstrap, topics.tickets_in, warm)
    results_topics = [topics.out(r) for r in ROUTES]
    warm_key = warm[0]["ticket_id"].encode()
    answered = collect(
        settings.kafka_bootstrap,
        results_topics,
        lambda out: any(m.key() == warm_key for m in out),
        90,
    )
    assert any(m.key() == warm_key for m in answered), "the worker answers"
    publish(settings.kafka_bootstrap, topics.tickets_in, batch, rate=50)
    msgs = collect(
        settings.kafka_bootstrap,
        results_topics,
        lambda out: len({m.key() for m in out if m.key().startswith(b"as2-")}) >= len(batch),
        timeout_s=45,
    )
    results = {}
    for m in msgs:
        r = orjson.loads(m.value())
        if r["ticket_id"].startswith("as2-"):
            assert r["ticket_id"] not in results, f"{r['ticket_id']}: two results"
            assert m.topic() == topics.out(r["route"])
            results[r["ticket_id"].removeprefix("as2-")] = r
    assert set(results) == {c.id for c in cases}, "some tickets have no result"
    offline = _offline_routes(cases)

    def why(c: ev.Case) -> str:
        r = results[c.id]
        got = f"{r['route']}/{r['category']} {r['confidence']:.2f}"
        return f"{c.id}: {got} (offline {offline[c.id]}; {r['degraded_reason'] or ''})"

    assert not [why(c) for c in cases if results[c.id]["degraded"]], "degraded tickets"
    requests = [c for c in cases if c.route == "after_sales"]
    # the route is the intent head's; the category stays the model's (issue 24). A request
    # in the head's uncertain band goes to people, not lost
    missed = [why(c) for c in requests if results[c.id]["route"] == "auto_classify"]
    assert len(missed) <= 0.05 * len(requests), missed
    to_people = [why(c) for c in cases if results[c.id]["route"] == "manual_review"]
    assert len(to_people) <= 0.1 * len(cases), to_people
    others = [c for c in cases if c.route != "after_sales"]
    wrongly = [why(c) for c in others if results[c.id]["route"] == "after_sales"]
    precision = len(requests) / (len(requests) + len(wrongly))
    assert precision >= ev.TARGET_PRECISION, wrongly
    # every ticket, request or not, routed as the offline evaluation routes it
    differ = [why(c) for c in cases if results[c.id]["route"] != offline[c.id]]
    assert not differ, f"live routes differ from the weights on disk (restart Triton?): {differ}"
