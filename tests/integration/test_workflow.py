"""Issue 3: idempotency, status, review, poison records and DLQ replay on the real stack."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request

import orjson
import pytest

from streams.headers import REPLAY_COUNT
from streams.topics import Topics
from tests.integration.kafka_helpers import (
    ROUTES,
    UNSURE_TEXT,
    Collector,
    body,
    collect,
    keys_with,
    plain_producer,
    tickets,
)

pytestmark = pytest.mark.integration


def state_of(settings, ticket_id: str) -> dict | None:
    url = f"http://127.0.0.1:{settings.worker_web_port}/ticket/{ticket_id}"
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return orjson.loads(resp.read())
    except urllib.error.HTTPError as exc:
        assert exc.code == 404
        return None


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ticketflow.cli", *args],
        capture_output=True,
        text=True,
        env=os.environ.copy(),
        timeout=120,
    )


def wait_state(settings, ticket_id: str, statuses: set[str], timeout_s: float = 60) -> dict:
    deadline = time.monotonic() + timeout_s
    state = None
    while time.monotonic() < deadline:
        state = state_of(settings, ticket_id)
        if state and state["status"] in statuses:
            return state
        time.sleep(0.3)
    raise AssertionError(f"{ticket_id}: state {state} never reached {statuses}")


def test_a_ticket_published_twice_is_processed_once(settings, worker):
    topics = Topics(settings.topic_prefix)
    first, second = tickets(2, "dup", seed=3)
    second["ticket_id"] = first["ticket_id"]
    p = plain_producer(settings.kafka_bootstrap)
    p.produce(topics.tickets_in, key=first["ticket_id"], value=body(first))
    p.flush(10)
    wait_state(settings, first["ticket_id"], {"completed", "awaiting_review", "degraded"})
    p.produce(topics.tickets_in, key=second["ticket_id"], value=body(second))
    p.flush(10)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and state_of(settings, first["ticket_id"])["duplicates"] < 1:
        time.sleep(0.3)
    out = collect(
        settings.kafka_bootstrap, [topics.out(r) for r in ROUTES], lambda rs: False, timeout_s=3
    )
    assert keys_with(first["ticket_id"], out) == [first["ticket_id"]]
    state = state_of(settings, first["ticket_id"])
    assert state["duplicates"] == 1 and state["last_duplicate"]["arrival"] != state["arrival"]
    status = cli("status", first["ticket_id"])
    assert status.returncode == 0 and '"duplicates": 1' in status.stdout


def test_status_of_an_unknown_ticket_says_so(settings, worker):
    result = cli("status", "never-published")
    assert result.returncode == 1 and "unknown ticket" in result.stdout


def test_review_completes_a_manual_review_ticket_once(settings, worker):
    topics = Topics(settings.topic_prefix)
    t = {"ticket_id": "rev-1", "text": UNSURE_TEXT, "created_at": "2026-12-01T00:00:00Z"}
    p = plain_producer(settings.kafka_bootstrap)
    p.produce(topics.tickets_in, key=t["ticket_id"], value=orjson.dumps(t))
    p.flush(10)
    state = wait_state(settings, "rev-1", {"awaiting_review", "completed", "degraded"})
    assert state["status"] == "awaiting_review", state
    decided = cli("review", "decide", "rev-1", "--category", "billing", "--note", "invoice")
    assert decided.returncode == 0, decided.stdout + decided.stderr
    done = wait_state(settings, "rev-1", {"completed"})
    assert done["route"] == "reviewed"
    out = collect(
        settings.kafka_bootstrap,
        [topics.out("reviewed")],
        lambda rs: "rev-1" in keys_with("rev-1", rs),
        timeout_s=30,
    )
    results = [orjson.loads(m.value()) for m in out if m.key() == b"rev-1"]
    assert len(results) == 1
    assert results[0]["category"] == "billing"
    assert results[0]["decision_path"][-1]["step"] == "review"
    again = cli("review", "decide", "rev-1", "--category", "general")
    assert again.returncode == 1 and "not awaiting review" in again.stdout
    unknown = cli("review", "decide", "nobody", "--category", "general")
    assert unknown.returncode == 1 and "unknown ticket" in unknown.stdout


def test_a_poison_envelope_between_valid_tickets_stalls_nothing(settings, worker):
    topics = Topics(settings.topic_prefix)
    good = tickets(30, "poison", seed=11)
    p = plain_producer(settings.kafka_bootstrap)
    for i, t in enumerate(good):
        p.produce(topics.tickets_in, key=t["ticket_id"], value=body(t))
        if i == 15:  # garbage straight onto an internal step topic
            p.produce(topics.step("infer"), key=b"poison-x", value=b'{"not": "an envelope"}')
    assert p.flush(10) == 0
    out = collect(
        settings.kafka_bootstrap,
        [topics.out(r) for r in ROUTES],
        lambda rs: len(keys_with("poison-", rs)) >= 30,
        timeout_s=120,
    )
    assert sorted(keys_with("poison-", out)) == sorted(t["ticket_id"] for t in good)
    dlq = collect(
        settings.kafka_bootstrap,
        [topics.dlq],
        lambda rs: b"poison-x" in [m.key() for m in rs],
        timeout_s=30,
    )
    [dead] = [m for m in dlq if m.key() == b"poison-x"]
    headers = {k: v.decode() for k, v in dead.headers()}
    assert headers["x-dlq-error-class"] == "INTERNAL" and headers["x-dlq-step"] == "infer"
    assert dead.value() == b'{"not": "an envelope"}'


def test_dlq_replay_resumes_once_and_parks_what_keeps_failing(settings, worker):
    topics = Topics(settings.topic_prefix)
    # dead letters as a failing `validate` would have left them: one good ticket whose
    # fault is gone, one that can never parse
    good = tickets(1, "replay", seed=5)[0]
    dlq_headers = [
        ("x-dlq-error-class", b"INTERNAL"),
        ("x-dlq-step", b"validate"),
        ("x-dlq-reason", b"simulated outage"),
    ]
    p = plain_producer(settings.kafka_bootstrap)
    p.produce(topics.dlq, key=good["ticket_id"], value=body(good), headers=dlq_headers)
    p.produce(
        topics.dlq,
        key=b"replay-bad",
        value=b"\xff never json",
        headers=[("x-dlq-error-class", b"DESERIALIZATION"), ("x-dlq-step", b"validate")],
    )
    assert p.flush(10) == 0
    watch = Collector(settings.kafka_bootstrap, [topics.out(r) for r in ROUTES])
    parked = Collector(settings.kafka_bootstrap, [topics.dlq_parked])
    try:
        dry = cli("dlq", "replay", "--dry-run")
        assert dry.returncode == 0 and "would replay" in dry.stdout, dry.stdout + dry.stderr
        for _ in range(settings.max_replays + 1):  # each round replays what failed again
            run = cli("dlq", "replay", "--rate", "100")
            assert run.returncode == 0, run.stdout + run.stderr
            time.sleep(3)
        out = watch.until(lambda rs: good["ticket_id"] in keys_with("replay", rs), 60)
        assert keys_with("replay", out) == [good["ticket_id"]], "replayed ticket not once"
        parked_out = parked.until(lambda rs: any(m.key() == b"replay-bad" for m in rs), 60)
        [bad] = [m for m in parked_out if m.key() == b"replay-bad"]
        assert bad.value() == b"\xff never json"
        headers = {k: v.decode() for k, v in bad.headers()}
        assert int(headers[REPLAY_COUNT]) == settings.max_replays
    finally:
        watch.close()
        parked.close()
