"""Issue 3's fault scenarios: exactly one result per ticket through kills and outages.

Each test runs its own worker on a topic prefix of its own, so killing it touches no other
test. Results are counted by a stock read_committed consumer.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from pathlib import Path

import orjson
import pytest

import devstack as stack
from benchmarks.pipeline import fused_definition
from devstack import app_processes
from streams.admin import topic_size
from streams.bundles import is_bundle, unpack
from streams.settings import Settings
from streams.topics import Topics
from tests.integration.kafka_helpers import ROUTES, Collector, publish, tickets, trace_keys

pytestmark = pytest.mark.integration


class PrivatePipeline:
    """A worker of its own on a topic prefix of its own, and a read_committed watcher."""

    def __init__(self, **env: str) -> None:
        self.env = {
            "TICKETFLOW_TOPIC_PREFIX": f"f{uuid.uuid4().hex[:8]}.",
            "TICKETFLOW_WORKER_WEB_PORT": str(app_processes.free_port()),
            **env,
        }
        self.settings = Settings(
            **{k.removeprefix("TICKETFLOW_").lower(): v for k, v in self.env.items()}
        )
        self.topics = Topics(self.settings.topic_prefix)
        self.watch = Collector(self.settings.kafka_bootstrap, [self.topics.out(r) for r in ROUTES])
        self.worker: app_processes.Service | None = None
        self._starts = 0

    def start_worker(self) -> None:
        self._starts += 1
        name = f"worker-{self.settings.topic_prefix}{self._starts}"
        # at info, so that a lost ticket's failure message can quote what the workers did
        self.worker = app_processes.start_worker(self.settings, self.env, name, loglevel="info")

    def publish(self, batch: list[dict], rate: float | None = None) -> None:
        publish(self.settings.kafka_bootstrap, self.topics.tickets_in, batch, rate)

    def results_for(self, batch: list[dict], timeout_s: float = 300) -> list:
        want = len(batch)
        return self.watch.until(lambda rs: len(count_results(rs)) >= want, timeout_s, 5)

    def explain(self, missing: set[str]) -> str:
        """Where a few lost tickets got to, and what the workers warned of."""
        some = sorted(missing)[:5]
        # one ticket's whole path: the step, state and result topics that hold it
        where = trace_keys(self.settings.kafka_bootstrap, self.settings.topic_prefix, {some[0]})
        logs = sorted(
            (self.settings.state_dir / "logs").glob(f"worker-{self.settings.topic_prefix}*")
        )
        lines = [
            (log.name, line[:300])
            for log in logs
            for line in log.read_text(errors="replace").splitlines()
        ]
        warned = [f"{n}: {line}" for n, line in lines if "WARNING" in line or "ERROR" in line]
        told = [f"{n}: {line}" for n, line in lines if f"{some[0]} " in line]
        return (
            f"{some}; {some[0]} found at {where}; the workers on {some[0]}: {told[-10:]}; "
            f"worker warnings (last 30): {warned[-30:]}"
        )

    def close(self) -> None:
        if self.worker is not None:
            self.worker.stop()
        self.watch.close()


@pytest.fixture
def pipeline(live_stack, gateway, worker):
    p = PrivatePipeline()
    p.start_worker()
    yield p
    p.close()


def fused_workflow(directory: Path) -> Path:
    """The default workflow with [validate, clean] and [features ... route] fused."""
    return fused_definition(Settings().workflow_file, directory)


@pytest.fixture(params=["topic-per-step", "static-member", "fused"])
def any_pipeline(request, tmp_path, live_stack, gateway, worker):
    env = {}
    if request.param == "fused":
        env["TICKETFLOW_WORKFLOW_FILE"] = str(fused_workflow(tmp_path))
    if request.param == "static-member":  # its successor takes the partitions straight back
        env["TICKETFLOW_WORKER_ID"] = "w1"
    p = PrivatePipeline(**env)
    p.start_worker()
    yield p
    p.close()


def envelope_keys(value: bytes) -> list[str]:
    """The ticket_ids of the envelopes a step record carries, one or a bundle of them."""
    if is_bundle(value):
        return [orjson.loads(v)["ticket"]["ticket_id"] for _, v in unpack(value)]
    return [orjson.loads(value)["ticket"]["ticket_id"]]


def count_results(records) -> Counter:
    return Counter(m.key().decode() for m in records)


def assert_exactly_once(batch: list[dict], records, pipeline: PrivatePipeline) -> None:
    counts = count_results(records)
    missing = {t["ticket_id"] for t in batch} - set(counts)
    assert not missing, f"{len(missing)} ticket(s) lost: {pipeline.explain(missing)}"
    doubled = [k for k, n in counts.items() if n > 1]
    assert not doubled, f"{len(doubled)} tickets with two results, e.g. {doubled[:3]}"


def wait_for(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def test_sigkill_mid_stream_loses_nothing_and_doubles_nothing(any_pipeline):
    pipeline = any_pipeline
    batch = tickets(5000, "kill", seed=42)
    pipeline.publish(batch)
    pipeline.watch.until(lambda rs: len(rs) >= 1000, 120, settle_s=0)  # well in flight
    pipeline.worker.kill()
    pipeline.start_worker()
    assert_exactly_once(batch, pipeline.results_for(batch), pipeline)


def test_fused_steps_keep_every_audit_entry_and_decision_step(tmp_path, live_stack, gateway):
    p = PrivatePipeline(TICKETFLOW_WORKFLOW_FILE=str(fused_workflow(tmp_path)))
    audit = Collector(p.settings.kafka_bootstrap, [p.topics.audit])
    try:
        p.start_worker()
        batch = tickets(300, "fus", seed=45)
        p.publish(batch)
        results = p.results_for(batch, timeout_s=120)
        assert_exactly_once(batch, results, p)
        steps = ["validate", "clean", "features", "infer", "rules", "route"]
        paths = {}
        for m in results:
            path = [e["step"] for e in orjson.loads(m.value())["decision_path"]]
            # a retry of a step (the gateway overloaded on a busy machine) adds an entry
            assert [s for i, s in enumerate(path) if i == 0 or path[i - 1] != s] == steps
            paths[m.key().decode()] = len(path)
        trails = audit.until(lambda rs: len(rs) >= len(paths), 60, 2)
        assert len(trails) == len(paths), "one audit trail per ticket"
        per_ticket = {m.key().decode(): len(orjson.loads(m.value())["steps"]) for m in trails}
        assert per_ticket == paths, "an audit entry per decision step"
        # two hops, not six: the middle steps' topics carried nothing
        assert topic_size(p.settings, p.topics.step("infer")) == 0
        # and the one hop carried each ticket once, in bundles (streams/bundles.py)
        hop = Collector(p.settings.kafka_bootstrap, [p.topics.step("features")])
        try:
            size = topic_size(p.settings, p.topics.step("features"))
            records = hop.until(lambda rs: len(rs) >= size, 60, 1)
        finally:
            hop.close()
        keys = [k for m in records for k in envelope_keys(m.value())]
        assert sorted(keys) == sorted(t["ticket_id"] for t in batch)
    finally:
        audit.close()
        p.close()


def test_broker_restart_mid_stream_loses_nothing_and_doubles_nothing(pipeline):
    batch = tickets(1500, "brk", seed=43)
    pipeline.publish(batch[:750], rate=150)
    pipeline.watch.until(lambda rs: len(rs) >= 200, 120, settle_s=0)
    stack.stop_part(pipeline.settings, "kafka")
    time.sleep(2)
    stack.start_part(pipeline.settings, "kafka")
    pipeline.publish(batch[750:], rate=150)
    if pipeline.worker.process.poll() is not None:  # Faust gave up: a supervisor restarts it
        pipeline.start_worker()
    assert_exactly_once(batch, pipeline.results_for(batch), pipeline)


def test_triton_outage_opens_the_breaker_degrades_and_recovers(pipeline):
    during = tickets(800, "tri", seed=44)
    feeder = threading.Thread(target=pipeline.publish, args=(during, 20), daemon=True)
    feeder.start()  # 40 s of steady traffic, across the outage
    pipeline.watch.until(lambda rs: len(rs) >= 100, 60, settle_s=0)
    stopped_at = time.monotonic()
    stack.stop_part(pipeline.settings, "triton")
    wait_for(lambda: _breaker(pipeline.env) == 2.0, 10, "the breaker to open")
    assert time.monotonic() - stopped_at <= 12
    time.sleep(max(0.0, 30 - (time.monotonic() - stopped_at)))
    stack.start_part(pipeline.settings, "triton")
    feeder.join(120)
    records = pipeline.results_for(during, 180)
    assert_exactly_once(during, records, pipeline)
    results = [orjson.loads(m.value()) for m in records]
    reasons = Counter((r["degraded_reason"] or "").split(":")[0] for r in results)
    assert reasons["CIRCUIT_OPEN"] > 0, reasons
    degraded = [r for r in results if r["degraded"]]
    assert all(r["route"] in {"manual_review", "after_sales"} for r in degraded)
    # Triton is back (and the gateway's channel to it reconnected): the breaker's probe
    # succeeds and tickets classify again
    wait_for(lambda: app_processes.gateway_ready(pipeline.settings), 90, "the gateway to be ready")
    wait_for(lambda: _breaker(pipeline.env) != 2.0, 30, "the breaker to half-open")
    after = tickets(200, "tri-after", seed=46)
    pipeline.publish(after, rate=20)
    later = {
        orjson.loads(m.value())["ticket_id"]: orjson.loads(m.value())
        for m in pipeline.results_for(after, 120)
        if m.key().decode().startswith("tri-after-")
    }
    assert len(later) == len(after)
    assert _breaker(pipeline.env) == 0.0, "the breaker did not close"
    last = [later[t["ticket_id"]] for t in after[100:]]
    classified = [r for r in last if r["model_version"] and not r["degraded"]]
    assert len(classified) >= 95, Counter(r["degraded_reason"] for r in last)


def _breaker(env: dict[str, str]) -> float | None:
    for line in _metrics(env).splitlines():
        if line.startswith('circuit_breaker_state{target="inference_gateway"}'):
            return float(line.rsplit(" ", 1)[1])
    return None


def test_redis_outage_serves_fallbacks_and_tickets_still_complete(pipeline):
    batch = tickets(300, "red", seed=45)
    stack.stop_part(pipeline.settings, "redis")
    try:
        pipeline.publish(batch, rate=50)
        records = pipeline.results_for(batch, 120)
    finally:
        stack.start_part(pipeline.settings, "redis")
    assert_exactly_once(batch, records, pipeline)
    results = [orjson.loads(m.value()) for m in records]
    assert all(f["is_fallback"] for r in results for f in r["features"].values())
    assert all(r["model_version"] is not None for r in results), "features down stopped inference"
    coverage = [
        line
        for line in _metrics(pipeline.env).splitlines()
        if line.startswith("feature_coverage_ratio{")
    ]
    assert coverage and all(float(line.rsplit(" ", 1)[1]) < 1.0 for line in coverage)


def _metrics(env: dict[str, str]) -> str:
    """The private worker's Prometheus metrics ('' while it does not answer)."""
    import urllib.request

    url = f"http://127.0.0.1:{env['TICKETFLOW_WORKER_WEB_PORT']}/metrics"
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.read().decode()
    except OSError:
        return ""


def _completed(env: dict[str, str]) -> float:
    """Tickets this worker completed, from its own /metrics."""
    return sum(
        float(line.split()[-1])
        for line in _metrics(env).splitlines()
        if line.startswith("workflow_tickets_total{")
    )


def test_two_workers_split_the_partitions_and_a_kill_of_one_doubles_nothing(pipeline):
    second_env = {**pipeline.env, "TICKETFLOW_WORKER_WEB_PORT": str(app_processes.free_port())}
    second_settings = pipeline.settings.model_copy(
        update={"worker_web_port": int(second_env["TICKETFLOW_WORKER_WEB_PORT"])}
    )
    name = f"worker-{pipeline.settings.topic_prefix}second"
    second = app_processes.start_worker(second_settings, second_env, log_name=name)
    try:
        batch = tickets(3000, "two", seed=46)
        pipeline.publish(batch[:1500], rate=300)
        pipeline.watch.until(lambda rs: len(rs) >= 1200, 120, settle_s=0)
        # both own partitions of the group: each completed some of the tickets
        assert _completed(pipeline.env) > 0 and _completed(second_env) > 0
        second.kill()  # the first worker takes its partitions over
        pipeline.publish(batch[1500:], rate=300)
        assert_exactly_once(batch, pipeline.results_for(batch), pipeline)
    finally:
        second.stop()


# Loaded by the restarted worker only (PYTHONPATH): its first table restore loses every
# changelog record it fetches, as if Faust's read offset had been left past them.
LOSE_RESTORE = """
import faust.tables.recovery as recovery

seek = recovery.Recovery._seek_offsets
done = []


async def _seek_offsets(self, consumer, tps, offsets, title):
    await seek(self, consumer, tps, offsets, title)
    if title == "active" and not done and any(h > 0 for h in self.active_highwaters.values()):
        done.append(True)
        for tp in tps:
            consumer._read_offset[tp] = 1 << 40

recovery.Recovery._seek_offsets = _seek_offsets
"""


def test_a_table_restore_that_stops_receiving_records_is_read_again(pipeline, tmp_path):
    first = tickets(200, "restore", seed=49)
    pipeline.publish(first)
    pipeline.results_for(first)
    pipeline.worker.stop()
    (tmp_path / "sitecustomize.py").write_text(LOSE_RESTORE)
    pipeline.env["PYTHONPATH"] = str(tmp_path)
    pipeline.start_worker()  # restores the 200 tickets' state from the changelog, or stalls
    second = tickets(200, "restore2", seed=50)
    pipeline.publish(second)
    assert_exactly_once(first + second, pipeline.results_for(first + second), pipeline)
    log = pipeline.worker.log_path.read_text(errors="replace")
    assert "table restore stalled" in log  # the sabotage did hold the restore up
