"""`ticketflow trace` on a ticket the session's worker processed: its audit records are
found on the one partition the producers' partitioner gives its id, and drawn. And the
spans a worker and a gateway export over OTLP when given an endpoint: one ticket, one trace
across both processes."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import threading
import time
import uuid
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import ClassVar

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from devstack import app_processes
from streams.settings import Settings
from streams.topics import Topics
from tests.integration.kafka_helpers import body, plain_producer, tickets
from ticketflow.trace import partition_of, read_audit, waterfall

pytestmark = pytest.mark.integration


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ticketflow.cli", *args],
        capture_output=True,
        text=True,
        env=os.environ.copy(),  # the session's topic prefix
        timeout=120,
    )


def wait_for_route(settings, ticket_id: str, timeout_s: float = 90):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        scan = read_audit(settings, ticket_id, idle_s=0.5)
        if any(r.step == "route" for r in scan.records):
            return scan
        time.sleep(0.5)
    raise AssertionError("the ticket's route step was never audited")


def test_trace_draws_a_processed_tickets_path_from_its_audit_partition(settings, worker, tmp_path):
    ticket = tickets(1, f"trace-{uuid.uuid4().hex[:6]}", seed=21)[0]
    tid = ticket["ticket_id"]
    p = plain_producer(settings.kafka_bootstrap)
    p.produce(Topics(settings.topic_prefix).tickets_in, key=tid, value=body(ticket))
    assert p.flush(10) == 0

    scan = wait_for_route(settings, tid)
    assert scan.partition == partition_of(tid.encode(), settings.partitions)
    steps = [r.step for r in sorted(scan.records, key=lambda r: r.at)]
    assert steps[0] == "validate" and steps[-1] == "route" and "infer" in steps
    assert len({r.trace_id for r in scan.records}) == 1
    assert all(r.ticket_id == tid for r in scan.records)

    png = tmp_path / "trace.png"
    out = cli("trace", tid, "--png", str(png))
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert scan.records[0].trace_id in out.stdout and "result: " in out.stdout
    rows = [line.split()[0] for line in lines[3 : 3 + len(scan.records)]]
    assert rows == [b.label.split()[0] for b in waterfall(scan.records).bars]
    assert png.read_bytes()[:4] == b"\x89PNG"

    # from a time after the ticket: nothing to show, and the id is not echoed back
    later = (datetime.now(timezone.utc) + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%S")
    none = cli("trace", tid, "--since", later, "--no-png")
    assert none.returncode == 1 and tid not in none.stderr + none.stdout
    # from a time before it: the same records, read from the offset of that time
    earlier = (datetime.now(timezone.utc) - timedelta(minutes=10)).strftime("%Y-%m-%dT%H:%M:%S")
    since = cli("trace", tid, "--since", earlier, "--no-png")
    assert since.returncode == 0 and since.stdout.splitlines()[3:-1] == lines[3:-2]


# ---- spans of the real processes ------------------------------------------------------------


class Collector(BaseHTTPRequestHandler):
    """An OTLP/HTTP endpoint that keeps every span it is sent."""

    spans: ClassVar[list[dict]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        for resource in ExportTraceServiceRequest.FromString(body).resource_spans:
            service = {a.key: a.value.string_value for a in resource.resource.attributes}
            for scope in resource.scope_spans:
                Collector.spans += [_span(s, service["service.name"]) for s in scope.spans]
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def _span(span, service: str) -> dict:
    return {
        "service": service,
        "name": span.name,
        "trace": span.trace_id.hex(),
        "id": span.span_id.hex(),
        "parent": span.parent_span_id.hex() or None,
        "links": [link.span_id.hex() for link in span.links],
    }


@pytest.fixture
def traced(live_stack: Settings):
    """A gateway and a worker of their own that export spans to a collector here."""
    Collector.spans = []
    server = HTTPServer(("127.0.0.1", 0), Collector)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    env = {
        "TICKETFLOW_TOPIC_PREFIX": f"{live_stack.topic_prefix}otel{uuid.uuid4().hex[:6]}.",
        "TICKETFLOW_WORKER_WEB_PORT": str(app_processes.free_port()),
        "TICKETFLOW_GATEWAY_URL": f"http://127.0.0.1:{app_processes.free_port()}",
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{server.server_port}",
        "OTEL_BSP_SCHEDULE_DELAY": "200",  # ms: export soon after a span ends
    }
    settings = live_stack.model_copy(
        update={
            "topic_prefix": env["TICKETFLOW_TOPIC_PREFIX"],
            "worker_web_port": int(env["TICKETFLOW_WORKER_WEB_PORT"]),
            "gateway_url": env["TICKETFLOW_GATEWAY_URL"],
        }
    )
    started = []
    try:
        started.append(app_processes.start_gateway(settings, env))
        started.append(
            app_processes.start_worker(
                settings, env, log_name=f"worker-{env['TICKETFLOW_TOPIC_PREFIX']}"
            )
        )
        yield settings
    finally:
        for service in reversed(started):
            service.stop()
        server.shutdown()


def test_one_ticket_is_one_trace_across_the_worker_and_gateway_processes(traced):
    ticket = tickets(1, f"otel-{uuid.uuid4().hex[:6]}", seed=22)[0]
    p = plain_producer(traced.kafka_bootstrap)
    p.produce(Topics(traced.topic_prefix).tickets_in, key=ticket["ticket_id"], value=body(ticket))
    assert p.flush(10) == 0
    trace_id = wait_for_route(traced, ticket["ticket_id"]).records[0].trace_id

    want = {"step validate", "step clean", "step features", "step infer", "step rules"}
    want |= {"step route", "gateway predict", "triton infer"}
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        ours = [s for s in Collector.spans if s["trace"] == trace_id]
        if want <= {s["name"] for s in ours}:
            break
        time.sleep(0.3)
    named = {s["name"]: s for s in ours}
    assert want <= set(named), sorted(named)
    # each step's span is the child of the step that sent it the record
    chain = ["validate", "clean", "features", "infer", "rules"]
    for before, after in itertools.pairwise(chain):
        assert named[f"step {after}"]["parent"] == named[f"step {before}"]["id"], after
    call, request = named["gateway predict"], named["POST /v1/models/{model}/predict"]
    assert call["service"] == "ticketflow-worker" and request["service"] == "ticketflow-gateway"
    assert call["parent"] == named["step infer"]["id"]
    assert request["parent"] == call["id"]
    batch = next(s for s in ours if s["name"].startswith("batch ticket_classifier"))
    assert batch["parent"] == request["id"]
    assert named["triton infer"]["parent"] == batch["id"]
