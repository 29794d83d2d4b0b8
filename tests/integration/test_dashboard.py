"""Every panel of the Grafana dashboard, asked of the local stack's Prometheus after a short load.


The session's gateway (conftest), plus a worker, an ingest and a feature job of this module on
a topic prefix of its own (so its tickets and dead letter never reach another module's
collectors), serve the load: tickets POSTed to ingest go through the worker, the gateway and
Triton, the feature job counts them into Redis, and one unparseable record is dead-lettered.
The worker, ingest and feature job run on free ports, so they are registered with Prometheus
as file_sd targets (devstack/prometheus.py) for the length of the module.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis as redis_sync
import redis.asyncio as aioredis

import devstack as stack
from devstack import app_processes, prometheus
from ingest.keys import KeyStore
from streams.settings import REPO_ROOT, Settings
from streams.topics import Topics
from tests.integration.kafka_helpers import ROUTES, collect, keys_with, plain_producer, tickets

pytestmark = pytest.mark.integration

RUN = uuid.uuid4().hex[:8]
DASHBOARD = REPO_ROOT / "deploy" / "grafana" / "dashboards" / "ticketflow.json"
INGEST_PREFIX = f"itdash{RUN}:ingest:"
FEATURE_PREFIX = f"itdash{RUN}:fv"
N_TICKETS = 24
# host:port of this module's ingest and feature job, by Prometheus job name
ADDRESS: dict[str, str] = {}


def panel_queries() -> list[tuple[str, str]]:
    """(panel title, PromQL) of every target of every panel, rows included."""
    spec = json.loads(DASHBOARD.read_text())
    panels = [p for top in spec["panels"] for p in [top, *top.get("panels", [])]]
    return [(p["title"], t["expr"]) for p in panels for t in p.get("targets", [])]


def query(settings: Settings, promql: str) -> dict:
    url = (
        prometheus.base_url(settings) + "/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    )
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return json.load(resp)
    except urllib.error.HTTPError as exc:  # 400: the query does not parse
        return json.load(exc)


def scraped(settings: Settings, job: str, address: str) -> bool:
    with urllib.request.urlopen(prometheus.base_url(settings) + "/api/v1/targets", timeout=10) as r:
        targets = json.load(r)["data"]["activeTargets"]
    return any(
        t["labels"]["job"] == job and t["labels"]["instance"] == address and t["health"] == "up"
        for t in targets
    )


@pytest.fixture(scope="module")
def dash_stack(live_stack: Settings, gateway) -> Iterator[Settings]:
    """The session's stack and gateway, with this module's topic prefix and worker."""
    settings = live_stack.model_copy(
        update={
            "topic_prefix": f"{live_stack.topic_prefix}dash{RUN}.",
            "worker_web_port": app_processes.free_port(),
        }
    )
    env = {
        "TICKETFLOW_TOPIC_PREFIX": settings.topic_prefix,
        "TICKETFLOW_WORKER_WEB_PORT": str(settings.worker_web_port),
    }
    worker = app_processes.start_worker(settings, env, log_name=f"worker-dash-{RUN}")
    try:
        yield settings
    finally:
        worker.stop()


@pytest.fixture(scope="module")
def prom(dash_stack: Settings) -> Iterator[Settings]:
    stack.start_part(dash_stack, "prometheus")
    address = f"127.0.0.1:{dash_stack.worker_web_port}"
    path = prometheus.register_target(dash_stack, "worker", address, f"itdash-{RUN}")
    yield dash_stack
    prometheus.unregister_target(path)


@pytest.fixture(scope="module")
def ingest_url(prom: Settings) -> Iterator[str]:
    port = app_processes.free_port()
    env = {
        "TICKETFLOW_TOPIC_PREFIX": prom.topic_prefix,
        "TICKETFLOW_INGEST_PORT": str(port),
        "TICKETFLOW_INGEST_REDIS_PREFIX": INGEST_PREFIX,
    }
    service = app_processes.start("ingest", ["ingest"], prom, env, log_name=f"ingest-dash-{RUN}")
    url = f"http://127.0.0.1:{port}"
    ADDRESS["ingest"] = f"127.0.0.1:{port}"
    path = prometheus.register_target(prom, "ingest", ADDRESS["ingest"], f"itdash-{RUN}")
    try:
        app_processes.wait_until(
            lambda: app_processes.http_ok(url + "/readyz"), service, 60, "ready"
        )
        yield url
    finally:
        prometheus.unregister_target(path)
        service.stop()
        _delete_keys(prom, INGEST_PREFIX + "*")


@pytest.fixture(scope="module")
def feature_job(prom: Settings) -> Iterator[app_processes.Service]:
    port = app_processes.free_port()
    env = {
        "TICKETFLOW_TOPIC_PREFIX": prom.topic_prefix,
        "TICKETFLOW_FEATURES_WEB_PORT": str(port),
        "TICKETFLOW_FEATURES_KEY_PREFIX": FEATURE_PREFIX,
        "TICKETFLOW_FEATURES_DRIFT_ENABLED": "false",
    }
    args = ["features", "run"]
    service = app_processes.start("features", args, prom, env, log_name=f"features-dash-{RUN}")
    ADDRESS["features"] = f"127.0.0.1:{port}"
    path = prometheus.register_target(prom, "features", ADDRESS["features"], f"itdash-{RUN}")
    try:
        ready = f"http://127.0.0.1:{port}/ready"
        app_processes.wait_until(lambda: app_processes.http_ok(ready), service, 90, "ready")
        yield service
    finally:
        prometheus.unregister_target(path)
        service.stop()
        _delete_keys(prom, FEATURE_PREFIX + ":*")


def _delete_keys(settings: Settings, pattern: str) -> None:
    client = redis_sync.Redis.from_url(settings.redis_url.get_secret_value())
    try:
        for name in client.scan_iter(match=pattern, count=1000):
            client.delete(name)
    finally:
        client.close()


async def _new_key(settings: Settings) -> str:
    client = aioredis.Redis.from_url(settings.redis_url.get_secret_value())
    try:
        token, _ = await KeyStore(client, INGEST_PREFIX).create(f"dash{RUN}", "submit")
        return token
    finally:
        await client.aclose()


def post(url: str, token: str, payload: dict) -> int:
    request = urllib.request.Request(
        url + "/v1/tickets",
        data=json.dumps(payload).encode(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


@pytest.fixture(scope="module")
def load(prom: Settings, ingest_url: str, feature_job: app_processes.Service) -> Settings:
    """Tickets through ingest to a result, one record dead-lettered at validate."""
    topics = Topics(prom.topic_prefix)
    batch = [
        {k: v for k, v in t.items() if not k.startswith("_")}
        for t in tickets(N_TICKETS, f"dash{RUN}", seed=15)
    ]
    token = asyncio.run(_new_key(prom))
    assert post(ingest_url, token, {"tickets": batch[:-1]}) == 202
    assert post(ingest_url, token, batch[-1]) == 202
    producer = plain_producer(prom.kafka_bootstrap)
    producer.produce(topics.tickets_in, key=f"dash{RUN}-bad", value=b"{not json")
    assert producer.flush(10) == 0
    out = collect(
        prom.kafka_bootstrap,
        [topics.out(r) for r in ROUTES],
        lambda rs: len(keys_with(f"dash{RUN}-", rs)) >= N_TICKETS,
        timeout_s=120,
    )
    assert len(set(keys_with(f"dash{RUN}-", out))) == N_TICKETS
    return prom


def wait_value(settings: Settings, promql: str, want: float, timeout_s: float = 60) -> float:
    """The query's single value, once it is at least `want` (or whatever it is at the end)."""
    deadline = time.monotonic() + timeout_s
    value = float("nan")
    while time.monotonic() < deadline:
        result = query(settings, promql)["data"]["result"]
        value = float(result[0]["value"][1]) if result else float("nan")
        if value >= want:
            break
        time.sleep(1)
    return value


def test_this_runs_services_are_scraped_and_their_load_counted(load: Settings) -> None:
    # the panels sum over instances: make sure this module's ones are among them
    settings = load
    worker = f'instance="127.0.0.1:{settings.worker_web_port}"'
    ingest, features = ADDRESS["ingest"], ADDRESS["features"]
    accepted = f'sum(ingest_records_total{{outcome="accepted", instance="{ingest}"}})'
    done = f"sum(workflow_tickets_total{{{worker}}})"
    applied = f'sum(feature_job_events_total{{instance="{features}"}})'
    assert wait_value(settings, accepted, N_TICKETS) == N_TICKETS
    assert wait_value(settings, done, N_TICKETS) >= N_TICKETS
    assert wait_value(settings, applied, N_TICKETS) >= N_TICKETS
    dead = f'sum(dlq_records_total{{step="validate", {worker}}})'
    assert wait_value(settings, dead, 1) >= 1


def test_every_panel_query_is_valid_and_returns_data(load: Settings) -> None:
    settings = load
    assert scraped(settings, "worker", f"127.0.0.1:{settings.worker_web_port}")
    queries = panel_queries()
    assert len(queries) >= 25
    # rates need two scrapes (5 s apart) after the load's counters first appear
    deadline = time.monotonic() + 60
    empty: list[str] = []
    while True:
        empty = []
        for title, promql in queries:
            answer = query(settings, promql)
            assert answer["status"] == "success", f"{title}: {answer.get('error')}"
            if not answer["data"]["result"]:
                empty.append(title)
        if not empty or time.monotonic() > deadline:
            break
        time.sleep(2)
    assert empty == [], f"panels without data: {empty}"


def test_a_query_that_does_not_parse_is_told_apart() -> None:
    # the check above would not pass a broken panel as "valid"
    answer = query(Settings(), "sum by (le (rate(x[5m]))")
    assert answer["status"] == "error" and answer["errorType"] == "bad_data"


def test_the_alert_rules_are_loaded(prom: Settings) -> None:
    with urllib.request.urlopen(prometheus.base_url(prom) + "/api/v1/rules", timeout=10) as r:
        groups = json.load(r)["data"]["groups"]
    loaded = {rule["name"] for g in groups for rule in g["rules"]}
    rules_file = Path(prometheus.RULES_DIR / "ticketflow.rules.yml").read_text()
    assert {"TritonDown", "RedisDown", "FeatureCoverageLow", "ConsumerLagGrowing"} <= loaded
    assert all(f"alert: {name}" in rules_file for name in loaded if name[0].isupper())
