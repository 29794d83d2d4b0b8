"""GatewayClient against a real gateway server on a fake Triton, and against broken servers."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from inference_gateway.client import GatewayClient
from inference_gateway.config import GatewayConfig
from inference_gateway.errors import ErrorCode, GatewayError
from inference_gateway.server import GatewayServer
from inference_gateway.testing import FakeBackend
from schemas.gateway import PredictInput, PredictResponse

MODEL = "ticket_classifier"
INPUTS = [PredictInput(id="t-1", text="where is my parcel"), PredictInput(id="t-2", text="退款")]


@pytest.fixture
def backend() -> FakeBackend:
    return FakeBackend()


@pytest.fixture
async def gateway(backend: FakeBackend) -> AsyncIterator[GatewayServer]:
    config = GatewayConfig(port=0, max_queue_delay_us=500, shutdown_grace_s=1)
    async with GatewayServer(config, backend) as server:
        yield server


async def serve_app(app: web.Application) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}"


async def test_predict_returns_a_typed_response(gateway: GatewayServer) -> None:
    async with GatewayClient(gateway.url) as client:
        answer = await client.predict(MODEL, INPUTS, timeout_ms=1000)
    assert isinstance(answer, PredictResponse)
    assert [o.id for o in answer.outputs] == ["t-1", "t-2"]
    assert answer.version == "v1"
    assert [o.version for o in answer.outputs] == ["v1", "v1"]  # each output names its own


async def test_version_and_headers_travel(gateway: GatewayServer, backend: FakeBackend) -> None:
    async with GatewayClient(gateway.url) as client:
        answer = await client.predict(
            MODEL, INPUTS[:1], timeout_ms=1000, version="v2", headers={"traceparent": "00-x"}
        )
    assert answer.version == "v2"
    assert backend.calls[-1][1] == "v2"


async def test_one_session_serves_every_call(gateway: GatewayServer) -> None:
    client = GatewayClient(gateway.url)
    await client.predict(MODEL, INPUTS, timeout_ms=1000)
    session = client._session
    await asyncio.gather(*(client.predict(MODEL, INPUTS, timeout_ms=1000) for _ in range(10)))
    assert client._session is session
    await client.close()
    assert session is not None and session.closed


@pytest.mark.parametrize(
    ("code", "retryable"),
    [
        (ErrorCode.OVERLOADED, True),
        (ErrorCode.MODEL_UNAVAILABLE, True),
        (ErrorCode.INVALID_INPUT, False),
        (ErrorCode.INTERNAL, False),
    ],
)
async def test_an_error_body_is_raised_as_gateway_error(
    gateway: GatewayServer, backend: FakeBackend, code: ErrorCode, retryable: bool
) -> None:
    backend.error = GatewayError(code, "from Triton")
    async with GatewayClient(gateway.url) as client:
        with pytest.raises(GatewayError) as caught:
            await client.predict(MODEL, INPUTS, timeout_ms=1000)
    assert caught.value.code is code
    assert caught.value.retryable is retryable
    assert "from Triton" in caught.value.message


async def test_the_gateways_own_timeout_arrives_as_timeout(
    gateway: GatewayServer, backend: FakeBackend
) -> None:
    backend.delay_s = 0.3
    async with GatewayClient(gateway.url) as client:
        with pytest.raises(GatewayError) as caught:
            await client.predict(MODEL, INPUTS, timeout_ms=50)
    assert caught.value.code is ErrorCode.TIMEOUT
    assert caught.value.retryable


async def test_a_server_that_never_answers_is_a_client_timeout() -> None:
    release = asyncio.Event()

    async def hang(request: web.Request) -> web.Response:
        await release.wait()
        return web.Response()

    app = web.Application()
    app.router.add_post("/v1/models/{model}/predict", hang)
    runner, url = await serve_app(app)
    try:
        async with GatewayClient(url, grace_ms=0) as client:
            with pytest.raises(GatewayError) as caught:
                await client.predict(MODEL, INPUTS, timeout_ms=100)
        assert caught.value.code is ErrorCode.TIMEOUT
        assert "100 ms" in caught.value.message
    finally:
        release.set()
        await runner.cleanup()


async def test_a_refused_connection_is_retryable_model_unavailable() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    async with GatewayClient(f"http://127.0.0.1:{port}") as client:
        with pytest.raises(GatewayError) as caught:
            await client.predict(MODEL, INPUTS, timeout_ms=1000)
        assert not await client.ready()
    assert caught.value.code is ErrorCode.MODEL_UNAVAILABLE
    assert caught.value.retryable


@pytest.mark.parametrize(
    ("status", "code"),
    [(502, ErrorCode.MODEL_UNAVAILABLE), (429, ErrorCode.OVERLOADED), (500, ErrorCode.INTERNAL)],
)
async def test_a_foreign_error_page_maps_by_status(status: int, code: ErrorCode) -> None:
    async def proxy(request: web.Request) -> web.Response:
        return web.Response(status=status, text="<html>Bad Gateway</html>")

    app = web.Application()
    app.router.add_post("/v1/models/{model}/predict", proxy)
    runner, url = await serve_app(app)
    try:
        async with GatewayClient(url) as client:
            with pytest.raises(GatewayError) as caught:
                await client.predict(MODEL, INPUTS, timeout_ms=1000)
        assert caught.value.code is code
        assert str(status) in caught.value.message
    finally:
        await runner.cleanup()


async def test_ready_follows_readyz(gateway: GatewayServer, backend: FakeBackend) -> None:
    async with GatewayClient(gateway.url) as client:
        assert await client.ready()


async def test_the_base_url_defaults_to_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TICKETFLOW_GATEWAY_URL", "http://gateway.example:9000/")
    assert GatewayClient().base_url == "http://gateway.example:9000"
    monkeypatch.delenv("TICKETFLOW_GATEWAY_URL")
    assert GatewayClient().base_url == "http://127.0.0.1:8088"


async def test_stop_drains_then_closes_the_backend(backend: FakeBackend) -> None:
    backend.delay_s = 0.2
    server = GatewayServer(GatewayConfig(port=0, shutdown_grace_s=5), backend)
    await server.start()
    client = GatewayClient(server.url)
    admitted = asyncio.create_task(client.predict(MODEL, INPUTS, timeout_ms=2000))
    await asyncio.sleep(0.05)

    await server.stop()

    assert isinstance(await admitted, PredictResponse)
    assert backend.closed
    await client.close()


def test_config_reads_the_contract_environment_names() -> None:
    config = GatewayConfig.from_env(
        {
            "TICKETFLOW_TRITON_GRPC": "triton:9001",
            "TICKETFLOW_GATEWAY_URL": "http://0.0.0.0:9088",
            "TICKETFLOW_GATEWAY_MAX_BATCH_SIZE": "16",
        },
        max_queue_size=None,
        max_queue_delay_us=100,
    )
    assert (config.triton_url, config.host, config.port) == ("triton:9001", "0.0.0.0", 9088)
    assert (config.max_batch_size, config.max_queue_size, config.max_queue_delay_us) == (
        16,
        1024,
        100,
    )
    assert GatewayConfig.from_env({}).triton_url == "127.0.0.1:8001"
    assert GatewayConfig.from_env({}).port == 8088
