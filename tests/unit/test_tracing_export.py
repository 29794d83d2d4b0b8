"""With OTEL_EXPORTER_OTLP_ENDPOINT set, a worker's and a gateway's spans reach it over
OTLP/HTTP; without it, nothing is installed. Each case runs in a child process: the API's
global provider can be set once per process."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import ClassVar

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

CHILD = """
import sys
from opentelemetry import trace
from inference_gateway import tracing as gateway
from streams import tracing
from tests.unit.test_tracing import envelope

side = sys.argv[1]
on = tracing.configure("ticketflow-worker") if side == "worker" else gateway.configure("gw")
print("on" if on else "off")
if side == "worker":
    env = envelope("t-1", "clean")
    tracing.step_spans.start("clean", [(env, None)])
    tracing.step_spans.finish(env, "clean", "ok", 1.0)
else:
    with gateway.server_span({}, "ticket_classifier"), gateway.triton_span("m", "v1", 1):
        pass
if on:
    trace.get_tracer_provider().shutdown()  # flushes the batch processor
"""


class Receiver(BaseHTTPRequestHandler):
    received: ClassVar[list[tuple[str, bytes]]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        Receiver.received.append((self.path, body))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def collector():
    Receiver.received = []
    server = HTTPServer(("127.0.0.1", 0), Receiver)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


def run_child(side: str, **env: str) -> str:
    base = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    out = subprocess.run(
        [sys.executable, "-c", CHILD, side],
        capture_output=True,
        text=True,
        env={**base, **env},
        timeout=60,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip()


def spans_received() -> list[tuple[str, str]]:
    """(service.name, span name) of every span the collector got."""
    found = []
    for path, body in Receiver.received:
        assert path == "/v1/traces"
        request = ExportTraceServiceRequest.FromString(body)
        for resource in request.resource_spans:
            attrs = {a.key: a.value.string_value for a in resource.resource.attributes}
            for scope in resource.scope_spans:
                found += [(attrs["service.name"], span.name) for span in scope.spans]
    return found


@pytest.mark.parametrize(
    ("side", "expected"),
    [
        ("worker", [("ticketflow-worker", "step clean")]),
        (
            "gateway",
            [("gw", "triton infer"), ("gw", "POST /v1/models/{model}/predict")],
        ),
    ],
)
def test_spans_are_exported_over_otlp_http_to_the_configured_endpoint(collector, side, expected):
    assert run_child(side, OTEL_EXPORTER_OTLP_ENDPOINT=collector) == "on"
    assert sorted(spans_received()) == sorted(expected)


def test_no_endpoint_no_export(collector):
    assert run_child("worker") == "off"
    assert run_child("gateway", OTEL_EXPORTER_OTLP_ENDPOINT=collector, OTEL_SDK_DISABLED="true")
    assert Receiver.received == []


def test_the_service_name_can_be_set_the_standard_way(collector):
    run_child("worker", OTEL_EXPORTER_OTLP_ENDPOINT=collector, OTEL_SERVICE_NAME="worker-7")
    assert spans_received() == [("worker-7", "step clean")]
