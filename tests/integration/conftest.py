"""Integration fixtures: the real Kafka, Redis and Triton of `ticketflow stack up`.

The stack is started once per run (by `make test`, or here if it is not up). The gateway
and one worker are started once per session on a topic prefix of their own, so a run
never sees another run's records.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator

import pytest

import devstack as stack
from devstack import app_processes
from devstack.process import log_tail
from streams.settings import Settings

RUN = uuid.uuid4().hex[:8]


@pytest.fixture(scope="session")
def settings() -> Settings:
    prefix = f"it{RUN}."
    env = {
        "TICKETFLOW_TOPIC_PREFIX": prefix,
        "TICKETFLOW_WORKER_WEB_PORT": str(app_processes.free_port()),
    }
    os.environ.update(env)
    return Settings()


@pytest.fixture(scope="session")
def live_stack(settings: Settings) -> Settings:
    stack.up(settings)
    return settings


@pytest.fixture(scope="session")
def gateway(live_stack: Settings) -> Iterator[app_processes.Service | None]:
    if app_processes.http_ok(live_stack.gateway_url.rstrip("/") + "/healthz"):
        # someone's gateway is already serving: use it, once Triton answers through it
        deadline = time.monotonic() + 90
        while not app_processes.gateway_ready(live_stack) and time.monotonic() < deadline:
            time.sleep(0.5)
        yield None
        return
    service = app_processes.start_gateway(live_stack)
    yield service
    service.stop()


@pytest.fixture(scope="session")
def worker(live_stack: Settings, gateway) -> Iterator[app_processes.Service]:
    service = app_processes.start_worker(live_stack, log_name=f"worker-{RUN}")
    yield service
    service.stop()


# librdkafka's and aiokafka's reconnect chatter while a test stops the broker: it would
# crowd out the lines that tell why a worker stalled
LOG_NOISE = ("Connect to ipv4", "Unable connect to node", "Unable to update metadata",
             "NodeNotReadyError", "Heartbeat", "Marking the coordinator dead")  # fmt: skip


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed test that ran on the session's worker shows the end of that worker's log:
    CI keeps the test output, not the stack's log folder."""
    outcome = yield
    report = outcome.get_result()
    service = getattr(item, "funcargs", {}).get("worker")
    if report.failed and isinstance(service, app_processes.Service):
        title = f"{service.log_path.name} (last lines)"
        tail = log_tail(service.log_path, 60, max_bytes=1 << 20, drop=LOG_NOISE)
        report.sections.append((title, tail))
