"""Issue 14, parts 2 and 3, through the real worker: a workflow per ticket (VIP, chat,
default) chosen by the selector, and a spot check that keeps its one result and shows up
in `ticketflow review stats` once a reviewer decided it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import datetime, timezone

import orjson
import pytest

from agents.steps.rules import sampled
from streams.topics import Topics
from tests.integration.conftest import RUN
from tests.integration.kafka_helpers import ROUTES, body, collect, plain_producer
from tests.integration.test_workflow import state_of
from training.corpus import generate

pytestmark = pytest.mark.integration
SETTLED = {"completed", "awaiting_review", "degraded", "dead_lettered"}
SHARE = 0.05  # ticket_classify_chat's sample_share


def cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "80"}
    return subprocess.run(
        [sys.executable, "-m", "ticketflow.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def ticket(tid: str, text: str, **fields) -> dict:
    now = datetime.now(timezone.utc).isoformat()
    return {"ticket_id": tid, "text": text, "user_id": "u1", "created_at": now, **fields}


def clear_texts(n: int) -> list[str]:
    # categories the model tells apart with confidence and no rule sends elsewhere
    wanted = {"shipping", "technical", "account", "billing"}
    return [t["text"] for t in generate(400, seed=14) if t["category"] in wanted][:n]


def sampled_ids(n: int) -> list[str]:
    ids = (f"sel{RUN}-chat-{i}" for i in range(10_000))
    return [tid for tid in ids if sampled(tid, SHARE)][:n]


def wait_all(settings, ids: list[str], timeout_s: float = 60) -> dict[str, dict]:
    deadline = time.monotonic() + timeout_s
    states: dict[str, dict] = {}
    while time.monotonic() < deadline and len(states) < len(ids):
        for tid in ids:
            state = state_of(settings, tid)
            if state and state["status"] in SETTLED:
                states[tid] = state
        time.sleep(0.3)
    assert len(states) == len(ids), f"never settled: {sorted(set(ids) - set(states))}"
    return states


def test_each_ticket_takes_its_workflow_and_a_spot_check_keeps_one_result(settings, worker):
    topics = Topics(settings.topic_prefix)
    texts = clear_texts(13)
    vip = ticket(f"sel{RUN}-vip", texts[0], channel="email", metadata={"tier": "vip"})
    plain = ticket(f"sel{RUN}-plain", texts[0], channel="email")
    # chat tickets whose ticket_id falls in the 5 % sample: the ones auto-classified are
    # spot-checked (a slow one may degrade under the chat deadline, hence several)
    chats = [
        ticket(tid, text, channel="chat")
        for tid, text in zip(sampled_ids(12), texts[1:], strict=True)
    ]
    p = plain_producer(settings.kafka_bootstrap)
    for t in [vip, plain, *chats]:
        p.produce(topics.tickets_in, key=t["ticket_id"], value=body(t))
    assert p.flush(10) == 0
    states = wait_all(
        settings, [vip["ticket_id"], plain["ticket_id"]] + [c["ticket_id"] for c in chats]
    )

    # each took its workflow, and says so in its state and in `ticketflow status`
    assert states[vip["ticket_id"]]["workflow"] == "ticket_classify_vip"
    assert states[vip["ticket_id"]]["status"] == "awaiting_review"  # VIP: always a person
    assert states[plain["ticket_id"]]["workflow"] == "ticket_classify"
    assert {states[c["ticket_id"]]["workflow"] for c in chats} == {"ticket_classify_chat"}
    shown = cli("status", vip["ticket_id"])
    assert shown.returncode == 0 and "workflow ticket_classify_vip v1" in shown.stdout

    # a spot check: completed on auto_classify, its copy waiting for a reviewer
    checked = [
        tid
        for tid, s in states.items()
        if s["workflow"] == "ticket_classify_chat" and s["route"] == "auto_classify"
    ]
    assert checked, f"no chat ticket was auto-classified: {states}"
    assert all(states[tid].get("spot_check") == "pending" for tid in checked)
    target = checked[0]
    routed = states[target]["result"]

    decided = cli("review", "decide", target, "--category", routed["category"])
    assert decided.returncode == 0 and "spot check" in decided.stdout, decided.stdout
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and state_of(settings, target).get("spot_check") != "decided":
        time.sleep(0.3)
    assert state_of(settings, target)["spot_check"] == "decided"
    again = cli("review", "decide", target, "--category", "general")
    assert again.returncode == 1 and "already decided" in again.stdout

    # exactly one result per ticket, each naming its workflow; the copy is no result
    out_topics = [topics.out(r) for r in (*ROUTES, "reviewed")]
    want = {vip["ticket_id"], plain["ticket_id"], target}
    records = collect(
        settings.kafka_bootstrap,
        [*out_topics, topics.review_spot_checks],
        lambda rs: want <= {m.key().decode() for m in rs if m.topic() in out_topics},
        timeout_s=30,
    )
    results = [(m.topic(), orjson.loads(m.value())) for m in records if m.topic() in out_topics]
    mine = [(topic, r) for topic, r in results if r["ticket_id"] == target]
    assert [topic for topic, _ in mine] == [topics.out("auto_classify")]
    assert mine[0][1]["workflow"] == "ticket_classify_chat"
    assert [r["workflow"] for _, r in results if r["ticket_id"] == vip["ticket_id"]] == [
        "ticket_classify_vip"
    ]
    copies = [m for m in records if m.topic() == topics.review_spot_checks]
    assert target in {m.key().decode() for m in copies}

    # and it is measured: agreement per model version, from tickets.review.outcomes
    stats = cli("review", "stats", "--json")
    assert stats.returncode == 0, stats.stdout + stats.stderr
    rows = [json.loads(line) for line in stats.stdout.splitlines() if line.startswith("{")]
    spot = [
        r
        for r in rows
        if r["kind"] == "spot_check" and r["model_version"] == routed["model_version"]
    ]
    assert spot and spot[0]["decisions"] >= 1 and spot[0]["agreed"] >= 1
    table = cli("review", "stats")
    assert table.returncode == 0 and "spot check" in table.stdout
    assert max(len(line) for line in table.stdout.splitlines()) <= 80
