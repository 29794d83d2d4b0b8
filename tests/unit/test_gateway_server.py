"""The HTTP API on a fake Triton: predict, error bodies, readiness, metrics, draining."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp.test_utils import TestClient, TestServer

from inference_gateway.config import GatewayConfig
from inference_gateway.errors import ErrorCode, GatewayError
from inference_gateway.routing import Router
from inference_gateway.server import SERVICE, create_app
from inference_gateway.testing import FakeBackend
from schemas.gateway import PredictResponse
from schemas.routing import RoutingConfig

REPO = Path(__file__).resolve().parents[2]
PREDICT = "/v1/models/ticket_classifier/predict"
CONFIG = GatewayConfig(max_queue_delay_us=500, ready_cache_s=60)


@pytest.fixture
def backend() -> FakeBackend:
    return FakeBackend()


@pytest.fixture
async def http(backend: FakeBackend) -> AsyncIterator[TestClient]:
    router = Router([RoutingConfig(name="ticket_classifier", versions={"v1": 100}, default="v1")])
    async with TestClient(TestServer(create_app(CONFIG, backend, router))) as client:
        yield client


def body(*texts: str, **extra: Any) -> dict[str, Any]:
    return {"inputs": [{"id": f"t-{i}", "text": t} for i, t in enumerate(texts)], **extra}


async def error_of(response: Any) -> dict[str, Any]:
    payload = await response.json()
    assert set(payload) == {"error"}
    assert set(payload["error"]) == {"code", "message", "retryable"}
    return payload["error"]


async def test_predict_answers_each_input(http: TestClient, backend: FakeBackend) -> None:
    response = await http.post(PREDICT, json=body("my parcel is late", "refund please"))

    assert response.status == 200
    answer = PredictResponse.model_validate(await response.json())
    assert answer.model == "ticket_classifier"
    assert answer.version == "v1"
    assert [o.id for o in answer.outputs] == ["t-0", "t-1"]
    first = answer.outputs[0]
    assert first.label == max(first.scores, key=first.scores.__getitem__)
    assert first.confidence == pytest.approx(0.75)
    assert list(first.scores) == [
        "billing", "after_sales", "technical", "account", "shipping", "general",
    ]  # fmt: skip
    assert answer.latency_ms >= 0
    assert backend.calls == [("ticket_classifier", "v1", ["my parcel is late", "refund please"])]


async def test_an_explicit_version_is_used(http: TestClient, backend: FakeBackend) -> None:
    response = await http.post(PREDICT, json=body("hello", version="v2"))
    assert (await response.json())["version"] == "v2"
    assert backend.calls[0][1] == "v2"


async def test_a_pinned_version_triton_does_not_serve_gets_no_batcher(
    http: TestClient, backend: FakeBackend
) -> None:
    backend.is_ready = False
    response = await http.post(PREDICT, json=body("hello", version="v7"))
    assert response.status == 503
    assert (await error_of(response))["code"] == "MODEL_UNAVAILABLE"
    assert ("ticket_classifier", "v7") not in http.server.app[SERVICE]._batchers
    assert backend.calls == []


async def test_the_routing_config_picks_the_version(backend: FakeBackend) -> None:
    canary = RoutingConfig(name="ticket_classifier", versions={"v1": 0, "v2": 100}, default="v1")
    async with TestClient(TestServer(create_app(CONFIG, backend, Router([canary])))) as client:
        response = await client.post(PREDICT, json=body("hello"))
        assert (await response.json())["version"] == "v2"
        client.server.app[SERVICE].router.update(
            RoutingConfig(name="ticket_classifier", versions={"v1": 100}, default="v1")
        )
        response = await client.post(PREDICT, json=body("hello"))
        assert (await response.json())["version"] == "v1"


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        (body(""), "inputs.0.text"),
        ({"inputs": []}, "inputs"),
        ({"inputs": [{"id": "a"}]}, "inputs.0.text"),
        (body("x", timeout_ms=0), "timeout_ms"),
        (body("x", surprise=1), "<unknown field>"),
    ],
)
async def test_a_schema_violation_is_invalid_input_naming_the_field(
    http: TestClient, payload: dict[str, Any], field: str
) -> None:
    response = await http.post(PREDICT, json=payload)
    assert response.status == 400
    error = await error_of(response)
    assert error["code"] == "INVALID_INPUT"
    assert error["retryable"] is False
    assert field in error["message"]


async def test_invalid_json_is_invalid_input(http: TestClient) -> None:
    response = await http.post(
        PREDICT, data=b"{not json", headers={"Content-Type": "application/json"}
    )
    assert response.status == 400
    assert (await error_of(response))["code"] == "INVALID_INPUT"


async def test_an_unknown_model_is_invalid_input(http: TestClient) -> None:
    response = await http.post("/v1/models/nope/predict", json=body("x"))
    assert response.status == 400
    error = await error_of(response)
    assert "nope" not in error["message"]  # the path is the caller's text: not repeated
    assert "known: ticket_classifier" in error["message"]


@pytest.mark.parametrize(
    ("code", "status"),
    [
        (ErrorCode.MODEL_UNAVAILABLE, 503),
        (ErrorCode.OVERLOADED, 429),
        (ErrorCode.INVALID_INPUT, 400),
        (ErrorCode.INTERNAL, 500),
    ],
)
async def test_backend_errors_become_error_bodies(
    http: TestClient, backend: FakeBackend, code: ErrorCode, status: int
) -> None:
    backend.error = GatewayError(code, "from Triton")
    response = await http.post(PREDICT, json=body("x"))
    assert response.status == status
    error = await error_of(response)
    assert error["code"] == code.value
    assert error["retryable"] is GatewayError(code, "").retryable


async def test_a_slow_backend_is_a_timeout(http: TestClient, backend: FakeBackend) -> None:
    backend.delay_s = 1.0
    started = time.monotonic()
    response = await http.post(PREDICT, json=body("x", timeout_ms=50))
    assert response.status == 504
    assert (await error_of(response))["code"] == "TIMEOUT"
    assert time.monotonic() - started < 0.5


async def test_healthz(http: TestClient) -> None:
    response = await http.get("/healthz")
    assert response.status == 200


async def test_readyz_probes_once_then_trusts_the_result(
    http: TestClient, backend: FakeBackend
) -> None:
    for _ in range(3):
        response = await http.get("/readyz")
        assert response.status == 200
    assert (await response.json())["versions"] == {"ticket_classifier/v1": "ok"}
    assert backend.ready_calls == 1
    assert len(backend.calls) == 1  # one real test inference


async def test_readyz_fails_when_triton_is_not_ready(
    http: TestClient, backend: FakeBackend
) -> None:
    backend.is_ready = False
    response = await http.get("/readyz")
    assert response.status == 503
    assert (await response.json())["versions"] == {"ticket_classifier/v1": "not ready"}


async def test_readyz_fails_when_the_test_inference_fails(
    http: TestClient, backend: FakeBackend
) -> None:
    backend.error = GatewayError(ErrorCode.INTERNAL, "boom")
    response = await http.get("/readyz")
    assert response.status == 503


async def test_a_failing_canary_does_not_fail_readiness(backend: FakeBackend) -> None:
    class CanaryDown(FakeBackend):
        async def ready(self, model: str | None = None, version: str = "v1") -> bool:
            return version == "v1"

    router = Router(
        [RoutingConfig(name="ticket_classifier", versions={"v1": 90, "v2": 10}, default="v1")]
    )
    async with TestClient(TestServer(create_app(CONFIG, CanaryDown(), router))) as client:
        response = await client.get("/readyz")
        assert response.status == 200
        versions = (await response.json())["versions"]
    assert versions == {"ticket_classifier/v1": "ok", "ticket_classifier/v2": "not ready"}


async def test_metrics_expose_the_contract_names(http: TestClient) -> None:
    await http.post(PREDICT, json=body("x"))
    response = await http.get("/metrics")
    text = await response.text()
    assert response.status == 200
    assert response.headers["Content-Type"].startswith("text/plain")
    for name in ("ai_inference_latency_seconds", "inference_batch_size", "inference_queue_depth"):
        assert f"# TYPE {name}" in text
    assert 'ai_inference_latency_seconds_count{model="ticket_classifier",version="v1"}' in text


async def test_draining_refuses_new_requests_and_finishes_admitted_ones(
    http: TestClient, backend: FakeBackend
) -> None:
    backend.delay_s = 0.2
    admitted = asyncio.create_task(http.post(PREDICT, json=body("admitted")))
    await asyncio.sleep(0.05)
    service = http.server.app[SERVICE]
    drain = asyncio.create_task(service.drain(timeout_s=5))
    await asyncio.sleep(0)

    refused = await http.post(PREDICT, json=body("late"))
    assert refused.status == 503
    error = await error_of(refused)
    assert error["code"] == "MODEL_UNAVAILABLE"
    assert error["retryable"] is True
    assert (await http.get("/readyz")).status == 503

    assert (await admitted).status == 200
    assert await drain is True


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


async def test_the_module_serves_and_exits_cleanly_on_sigterm() -> None:
    port = _free_port()
    process = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "inference_gateway", "--port", str(port)),
        *("--triton-url", "127.0.0.1:1"),
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        assert await _wait_healthy(port), "the gateway did not start"
        process.send_signal(signal.SIGTERM)
        output, _ = await asyncio.wait_for(process.communicate(), 10)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode == 0
    assert b"draining" in output
    assert b"gateway stopped" in output


async def _wait_healthy(port: int, within_s: float = 10.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            await asyncio.sleep(0.05)
            continue
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        answer = await reader.read()
        writer.close()
        return answer.startswith(b"HTTP/1.1 200") and orjson.loads(answer.split(b"\r\n\r\n")[1])
    return False
