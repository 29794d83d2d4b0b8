"""A fault fires its alert in the stack's Prometheus, live: Redis stopped, then a worker killed.

Others' tests share the stack's Redis, so the Redis stopped here is a second one, of this
module, on a free port; a worker of this module (its own topic prefix, so it takes no
partitions from the session's) probes it (agents/probes.py) and is registered with
Prometheus as a file_sd target. Stopping that Redis must fire RedisDown for this worker, and
killing the worker must fire WorkerDown for it, each well within the two minutes an operator
is promised (5 s scrapes and evaluations; `for:` 15 s and 30 s).
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import devstack as stack
from devstack import app_processes, prometheus, redis_server
from streams.admin import delete_prefixed
from streams.settings import Settings

pytestmark = pytest.mark.integration

RUN = uuid.uuid4().hex[:8]
PREFIX = f"itlive{RUN}."
PROMISED_S = 120  # issue 15: the right alert fires within two minutes of the fault


class SecondRedis:
    """A redis-server of this module alone, in a temporary folder."""

    def __init__(self, tmp: Path) -> None:
        self.port = app_processes.free_port()
        self.settings = Settings(state_dir=tmp, redis_url=f"redis://127.0.0.1:{self.port}/0")
        binary = redis_server.find_redis_server()
        if binary is None:
            pytest.skip("redis-server is not installed")
        redis_server.prepare(self.settings)
        self.log = (tmp / "redis.log").open("ab")
        argv = redis_server.server_args(self.settings, binary)
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 20
        while not redis_server.healthy(self.settings):
            assert time.monotonic() < deadline and self.proc.poll() is None, "no second Redis"
            time.sleep(0.2)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(15)
        self.log.close()


def firing(settings: Settings, alert: str, instance: str) -> dict | None:
    with urllib.request.urlopen(prometheus.base_url(settings) + "/api/v1/alerts", timeout=10) as r:
        alerts = json.load(r)["data"]["alerts"]
    for a in alerts:
        labels = a["labels"]
        ours = labels["alertname"] == alert and labels.get("instance") == instance
        if ours and a["state"] == "firing":
            return a
    return None


def wait_firing(settings: Settings, alert: str, instance: str, since: float) -> tuple[dict, float]:
    while time.monotonic() - since < PROMISED_S:
        found = firing(settings, alert, instance)
        if found is not None:
            return found, time.monotonic() - since
        time.sleep(1)
    raise AssertionError(f"{alert} for {instance} did not fire within {PROMISED_S} s")


def sample(settings: Settings, promql: str) -> float | None:
    url = (
        f"{prometheus.base_url(settings)}/api/v1/query?{urllib.parse.urlencode({'query': promql})}"
    )
    with urllib.request.urlopen(url, timeout=10) as r:
        result = json.load(r)["data"]["result"]
    return float(result[0]["value"][1]) if result else None


@pytest.fixture(scope="module")
def prom(live_stack: Settings) -> Settings:
    stack.start_part(live_stack, "prometheus")
    return live_stack


@pytest.fixture(scope="module")
def second_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecondRedis]:
    redis = SecondRedis(tmp_path_factory.mktemp("redis2"))
    yield redis
    redis.stop()


@pytest.fixture(scope="module")
def probing_worker(
    prom: Settings, second_redis: SecondRedis
) -> Iterator[tuple[app_processes.Service, str]]:
    port = app_processes.free_port()
    env = {
        "TICKETFLOW_TOPIC_PREFIX": PREFIX,
        "TICKETFLOW_WORKER_WEB_PORT": str(port),
        "TICKETFLOW_REDIS_URL": second_redis.settings.redis_url.get_secret_value(),
    }
    args = ["worker", "--loglevel", "warning", "--processes", "1"]
    service = app_processes.start("worker", args, prom, env, log_name=f"worker-live-{RUN}")
    address = f"127.0.0.1:{port}"
    path = prometheus.register_target(prom, "worker", address, f"itlive-{RUN}")
    try:
        yield service, address
    finally:
        prometheus.unregister_target(path)
        service.stop()
        delete_prefixed(prom, PREFIX, PREFIX)


def test_redis_stopped_fires_redis_down_then_a_killed_worker_fires_worker_down(
    prom: Settings, second_redis: SecondRedis, probing_worker: tuple[app_processes.Service, str]
) -> None:
    worker, address = probing_worker
    up = f'workflow_dependency_up{{dependency="redis", instance="{address}"}}'
    deadline = time.monotonic() + 90
    while sample(prom, up) != 1.0:  # the worker runs, probes, and is scraped
        assert worker.process.poll() is None, f"the worker exited; see {worker.log_path}"
        assert time.monotonic() < deadline, f"{address} never reported Redis up"
        time.sleep(1)
    assert firing(prom, "RedisDown", address) is None

    stopped = time.monotonic()
    second_redis.stop()
    alert, took = wait_firing(prom, "RedisDown", address, stopped)
    assert alert["labels"]["severity"] == "critical" and alert["labels"]["layer"] == "data"
    assert "Redis" in alert["annotations"]["action"]
    print(f"RedisDown fired {took:.0f} s after Redis stopped")
    assert firing(prom, "KafkaDown", address) is None  # the right alert, not every alert

    killed = time.monotonic()
    worker.kill()
    alert, took = wait_firing(prom, "WorkerDown", address, killed)
    assert alert["labels"]["layer"] == "workflow" and alert["labels"]["job"] == "worker"
    print(f"WorkerDown fired {took:.0f} s after the worker was killed")
