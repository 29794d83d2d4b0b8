"""Issue 3's fault scenarios: exactly one result per ticket through kills and outages.

Each test runs its own worker on a topic prefix of its own, so killing it touches no other
test. Results are counted by a stock read_committed consumer.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid
from collections import Counter

import orjson
import pytest

from streams.settings import Settings
from streams.topics import Topics
from tests.integration.kafka_helpers import ROUTES, Collector, publish, tickets
from ticketflow import services, stack

pytestmark = pytest.mark.integration


@pytest.fixture
def fault_env(live_stack, gateway, worker):
    """Settings and environment of a private pipeline (prefix, web port)."""
    env = {
        "TICKETFLOW_TOPIC_PREFIX": f"f{uuid.uuid4().hex[:8]}.",
        "TICKETFLOW_WORKER_WEB_PORT": "6266",
    }
    return Settings(**{k.removeprefix("TICKETFLOW_").lower(): v for k, v in env.items()}), env


def count_results(records) -> Counter:
    return Counter(m.key().decode() for m in records)


def wait_for(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def test_sigkill_mid_stream_loses_nothing_and_doubles_nothing(fault_env):
    settings, env = fault_env
    topics = Topics(settings.topic_prefix)
    batch = tickets(5000, "kill", seed=42)
    watch = Collector(settings.kafka_bootstrap, [topics.out(r) for r in ROUTES])
    w = services.start_worker(settings, env, log_name=f"worker-{settings.topic_prefix}1")
    try:
        publish(settings.kafka_bootstrap, topics.tickets_in, batch)
        watch.until(lambda rs: len(rs) >= 1000, 120, settle_s=0)  # well in flight
        os.kill(w.process.pid, signal.SIGKILL)
        w.process.wait(10)
        w = services.start_worker(settings, env, log_name=f"worker-{settings.topic_prefix}2")
        records = watch.until(lambda rs: len(count_results(rs)) >= len(batch), 300, settle_s=5)
    finally:
        w.stop()
        watch.close()
    counts = count_results(records)
    assert set(counts) == {t["ticket_id"] for t in batch}, "tickets lost"
    doubled = [k for k, n in counts.items() if n > 1]
    assert not doubled, f"{len(doubled)} tickets with two results, e.g. {doubled[:3]}"


def test_broker_restart_mid_stream_loses_nothing_and_doubles_nothing(fault_env):
    settings, env = fault_env
    topics = Topics(settings.topic_prefix)
    batch = tickets(1500, "brk", seed=43)
    watch = Collector(settings.kafka_bootstrap, [topics.out(r) for r in ROUTES])
    w = services.start_worker(settings, env, log_name=f"worker-{settings.topic_prefix}b")
    try:
        publish(settings.kafka_bootstrap, topics.tickets_in, batch[:750], rate=150)
        watch.until(lambda rs: len(rs) >= 200, 120, settle_s=0)
        stack.stop_part(settings, "kafka")
        time.sleep(2)
        stack.start_part(settings, "kafka")
        publish(settings.kafka_bootstrap, topics.tickets_in, batch[750:], rate=150)
        if w.process.poll() is not None:  # Faust gave up on the broker: a supervisor restarts
            w = services.start_worker(settings, env, log_name=f"worker-{settings.topic_prefix}c")
        records = watch.until(lambda rs: len(count_results(rs)) >= len(batch), 300, settle_s=5)
    finally:
        w.stop()
        watch.close()
    counts = count_results(records)
    assert set(counts) == {t["ticket_id"] for t in batch}, "tickets lost"
    assert max(counts.values()) == 1, "a ticket has two results"


def test_triton_outage_opens_the_breaker_degrades_and_recovers(fault_env):
    settings, env = fault_env
    topics = Topics(settings.topic_prefix)
    batch = tickets(1200, "tri", seed=44)
    watch = Collector(settings.kafka_bootstrap, [topics.out(r) for r in ROUTES])
    w = services.start_worker(settings, env, log_name=f"worker-{settings.topic_prefix}t")
    feeder = threading.Thread(
        target=publish, daemon=True, args=(settings.kafka_bootstrap, topics.tickets_in, batch, 20)
    )
    try:
        feeder.start()  # 60 s of steady traffic
        watch.until(lambda rs: len(rs) >= 100, 60, settle_s=0)
        stopped_at = time.monotonic()
        stack.stop_part(settings, "triton")

        def breaker_open() -> bool:
            return 'circuit_breaker_state{target="inference_gateway"} 2.0' in _metrics(env)

        wait_for(breaker_open, 10, "the breaker to open")
        assert time.monotonic() - stopped_at <= 12
        time.sleep(max(0.0, 30 - (time.monotonic() - stopped_at)))
        stack.start_part(settings, "triton")
        feeder.join(120)
        records = watch.until(lambda rs: len(count_results(rs)) >= len(batch), 180, settle_s=5)
    finally:
        w.stop()
        watch.close()
    counts = count_results(records)
    assert set(counts) == {t["ticket_id"] for t in batch} and max(counts.values()) == 1
    results = [orjson.loads(m.value()) for m in records]
    reasons = Counter((r["degraded_reason"] or "").split(":")[0] for r in results)
    assert reasons["CIRCUIT_OPEN"] > 0, reasons
    degraded = [r for r in results if r["degraded"]]
    assert all(r["route"] in {"manual_review", "after_sales"} for r in degraded)
    tail = sorted(results, key=lambda r: r["completed_at"])[-50:]
    assert sum(r["model_version"] is not None and not r["degraded"] for r in tail) >= 40, (
        "tickets did not classify again after Triton came back"
    )


def _metrics(env: dict[str, str]) -> str:
    import urllib.request

    url = f"http://127.0.0.1:{env['TICKETFLOW_WORKER_WEB_PORT']}/metrics"
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.read().decode()
    except OSError:
        return ""
