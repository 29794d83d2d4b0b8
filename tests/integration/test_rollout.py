"""Issue 14 part 6: a model version rolled out while tickets flow, with nothing lost or degraded.

A Triton of its own (explicit model control, a temporary repository holding version 1), a
gateway and a worker on a topic prefix of their own, and a client publishing tickets at a
steady rate throughout: build a new version (corpus plus a reviewer's decisions read from
`tickets.out.reviewed`), deploy it with a canary, promote it, roll back twice (to the canary,
then to v1 alone), retire it. Every ticket gets exactly one result, none degraded or
dead-lettered, and each names the version that produced it: the new one during the canary and
after the promotion, v1 alone once rolled back.
"""

from __future__ import annotations

import shutil
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import orjson
import pytest

from devstack import app_processes
from inference_gateway import triton_server
from inference_gateway.model import rollout
from schemas.tickets import DecisionStep, StepStatus, TicketResult
from streams.settings import Settings
from streams.topics import Topics
from tests.integration.kafka_helpers import ROUTES, Collector, plain_producer, publish
from training import builds
from training.corpus import generate

pytestmark = pytest.mark.integration

RATE = 20  # tickets a second: steady traffic a worker on a shared CPU keeps up with
PHASE_S = 4.0  # traffic under each routing config
SETTLE_S = 1.0  # a gateway applies a config within ~0.5 s; a call in flight finishes
CANARY = 30


@dataclass
class Traffic:
    """Tickets published at RATE from a thread until stopped, with their publish times."""

    bootstrap: str
    topic: str
    sent: dict[str, float] = field(default_factory=dict)
    stop: threading.Event = field(default_factory=threading.Event)

    def tickets(self) -> Iterator[dict]:
        rows = generate(5000, seed=1414)
        i = 0
        while not self.stop.is_set():
            row = rows[i % len(rows)]
            ticket_id = f"ro-{i}"
            self.sent[ticket_id] = time.monotonic()
            yield {
                "ticket_id": ticket_id,
                "text": row["text"],
                "user_id": f"u{i % 40}",
                "channel": "email",
                "created_at": datetime.now(timezone.utc).isoformat(),
            }
            i += 1

    def start(self) -> threading.Thread:
        thread = threading.Thread(
            target=publish, args=(self.bootstrap, self.topic, self.tickets(), RATE), daemon=True
        )
        thread.start()
        return thread


@dataclass
class Private:
    settings: Settings
    target: rollout.Target
    triton: object


def _repository(root: Path) -> Path:
    """A repository of version 1 only (cheap to load twice); built versions land beside it."""
    src = builds.MODEL_DIR
    dst = root / "repo" / src.name
    dst.mkdir(parents=True)
    for name in ("config.pbtxt", "labels.txt"):
        shutil.copyfile(src / name, dst / name)
    shutil.copytree(src / "1", dst / "1", ignore=shutil.ignore_patterns("__pycache__"))
    return dst.parent


@pytest.fixture(scope="module")
def private(live_stack: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Private]:
    root = tmp_path_factory.mktemp("rollout")
    repo = _repository(root)
    grpc, http, metrics = (app_processes.free_port() for _ in range(3))
    command = triton_server.tritonserver_command(repo, grpc, http, metrics)
    logs = live_stack.state_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    triton = triton_server.start(command, logs / f"triton-rollout-{grpc}.log")
    env = {
        "TICKETFLOW_TOPIC_PREFIX": f"{live_stack.topic_prefix}rollout{uuid.uuid4().hex[:6]}.",
        "TICKETFLOW_WORKER_WEB_PORT": str(app_processes.free_port()),
        "TICKETFLOW_GATEWAY_URL": f"http://127.0.0.1:{app_processes.free_port()}",
        "TICKETFLOW_TRITON_GRPC": f"127.0.0.1:{grpc}",
        "TICKETFLOW_TRITON_HTTP_PORT": str(http),
        "TICKETFLOW_TRITON_METRICS_PORT": str(metrics),
    }
    update: dict[str, str | int] = {
        k.removeprefix("TICKETFLOW_").lower(): v for k, v in env.items()
    }
    update.update(worker_web_port=int(env["TICKETFLOW_WORKER_WEB_PORT"]),
                  triton_http_port=http, triton_metrics_port=metrics)  # fmt: skip
    settings = live_stack.model_copy(update=update)
    started: list[app_processes.Service] = []
    try:
        triton_server.wait_ready(env["TICKETFLOW_TRITON_GRPC"], "ticket_classifier", 60,
                                 process=triton)  # fmt: skip
        started.append(app_processes.start_gateway(settings, env))
        started.append(app_processes.start_worker(settings, env, log_name=f"worker-{grpc}"))
        target = rollout.Target(
            repo, env["TICKETFLOW_TRITON_GRPC"], settings.kafka_bootstrap, settings.topic_prefix
        )
        yield Private(settings, target, triton)
    finally:
        for service in reversed(started):
            service.stop()
        triton_server.stop(triton)
        shutil.rmtree(root, ignore_errors=True)


def _review(settings: Settings, ticket_id: str, category: str) -> None:
    """A reviewer's final result on tickets.out.reviewed, as agents/review.py writes it."""
    result = TicketResult(
        ticket_id=ticket_id,
        route="reviewed",
        category=category,
        confidence=1.0,
        model_name="ticket_classifier",
        model_version="v1",
        decision_path=[DecisionStep(step="review", status=StepStatus.ok, latency_ms=1.0)],
        latency_ms=1.0,
        completed_at=datetime.now(timezone.utc),
    )
    producer = plain_producer(settings.kafka_bootstrap)
    producer.produce(
        Topics(settings.topic_prefix).out("reviewed"), key=ticket_id, value=result.model_dump_json()
    )
    assert producer.flush(10) == 0


def _phase(marks: dict[str, tuple[float, float]], name: str) -> None:
    """Traffic under one routing config for PHASE_S; its (start, end) in wall-clock time,
    as the audit entries' `at`, taken before the next change begins."""
    start = time.time()
    time.sleep(PHASE_S)
    marks[name] = (start, time.time())


def test_a_rollout_under_steady_traffic_loses_and_degrades_nothing(private: Private) -> None:
    settings, target = private.settings, private.target
    topics = Topics(settings.topic_prefix)
    outs = [topics.out(r) for r in ROUTES]
    watch = Collector(settings.kafka_bootstrap, [*outs, topics.dlq, topics.audit])
    traffic = Traffic(settings.kafka_bootstrap, topics.tickets_in)
    publisher = traffic.start()
    marks: dict[str, tuple[float, float]] = {}
    try:
        _phase(marks, "v1")
        _review(settings, "ro-3", "billing")
        staging = target.repository.parent / "staging"
        from training.feedback import read_reviewed

        examples = read_reviewed(settings.kafka_bootstrap, topics.out("reviewed"),
                                 topics.tickets_in)  # fmt: skip
        assert [(e.ticket_id, e.category) for e in examples] == [("ro-3", "billing")]
        built = builds.build("v1", staging, examples)
        assert built["feedback_examples"] == 1 and built["accuracy"] > 0.9

        deployed = rollout.deploy(target, staging, canary=CANARY)
        assert deployed.version == 3 and deployed.loaded == [1, 3]
        assert deployed.routing.versions == {"v1": 100 - CANARY, "v3": CANARY}
        _phase(marks, "canary")
        rollout.promote(target)
        _phase(marks, "promote")
        assert [r.share for r in rollout.listing(target)] == [0, 100]
        assert rollout.rollback(target).versions == {"v1": 100 - CANARY, "v3": CANARY}
        _phase(marks, "back-to-canary")
        assert rollout.rollback(target).versions == {"v1": 100}
        _phase(marks, "rolled-back")
    finally:
        traffic.stop.set()
        publisher.join(30)

    def done(records: list) -> bool:
        return len({m.key() for m in records if m.topic() in outs}) >= len(traffic.sent)

    records = watch.until(done, 90)
    watch.close()
    dead = [m.key() for m in records if m.topic() == topics.dlq]
    assert not dead, f"dead-lettered during the rollout: {dead[:5]}"
    results = [orjson.loads(m.value()) for m in records if m.topic() in outs]
    ids = [r["ticket_id"] for r in results]
    assert len(ids) == len(set(ids)), "a ticket produced two results"
    assert set(ids) == set(traffic.sent), f"{len(set(traffic.sent) - set(ids))} tickets lost"
    degraded = [(r["ticket_id"], r["degraded_reason"]) for r in results if r["degraded"]]
    assert not degraded, f"{len(degraded)} degraded, e.g. {degraded[:3]}"
    assert {r["model_version"] for r in results} <= {"v1", "v3"}

    # when each ticket's infer step ran, and on which version (its audit entry)
    inferred = {
        a["ticket_id"]: (e["at_ms"] / 1000, e["model_version"])
        for a in (orjson.loads(m.value()) for m in records if m.topic() == topics.audit)
        for e in a["steps"]
        if e["step"] == "infer"
    }
    assert set(inferred) == set(ids), "a ticket's infer step left no audit entry"
    wrong = [r["ticket_id"] for r in results if inferred[r["ticket_id"]][1] != r["model_version"]]
    assert not wrong, f"results naming another version than their infer step: {wrong[:5]}"

    def versions(phase: str) -> set[str]:
        # by when the infer step ran, not when the ticket was sent or completed: a ticket
        # waits in step topics between steps and may cross a config change on the way
        lo, hi = marks[phase][0] + SETTLE_S, marks[phase][1]
        return {v for at, v in inferred.values() if lo <= at < hi}

    assert versions("v1") == {"v1"}
    assert versions("canary") == {"v1", "v3"}
    assert versions("promote") == {"v3"}
    assert versions("back-to-canary") == {"v1", "v3"}
    assert versions("rolled-back") == {"v1"}

    remaining = rollout.retire(target, 3)  # the clean-up other tests rely on, checked
    assert remaining == [1] and not (target.model_dir / "3").exists()
    assert rollout.loaded(target) == [1]
