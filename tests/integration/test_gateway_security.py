"""Gateway security against the real Triton and Kafka: a gateway process of its own (free
port, the token set, a request cap of 2), started by `ticketflow gateway` as in production.

    no token / a wrong token -> 401, the right one -> 200 (also through GatewayClient)
    a body over the limit -> 413 from its Content-Length, the body unread and not repeated
    a failure inside Triton (a routed model Triton does not have) -> Triton's words absent
    more requests than the cap -> 503 with Retry-After
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator

import aiohttp
import pytest
from tritonclient.grpc.aio import InferenceServerClient
from tritonclient.utils import InferenceServerException

from devstack import app_processes
from inference_gateway.client import GatewayClient
from inference_gateway.config import largest_legal_body
from inference_gateway.errors import ErrorCode, GatewayError
from inference_gateway.routing_store import publish
from inference_gateway.routing_watch import routing_topic
from inference_gateway.triton import INPUT_NAME, encode_texts
from schemas.gateway import PredictInput
from schemas.routing import RoutingConfig
from streams.settings import Settings

pytestmark = pytest.mark.integration

TOKEN = f"it-{uuid.uuid4().hex}"
MODEL = "ticket_classifier"
PREDICT = f"/v1/models/{MODEL}/predict"
SECRET_TEXT = "card 4111111111111111 of Ms Example"
CAP = 2


@pytest.fixture(scope="module")
def gateway_url(live_stack: Settings) -> Iterator[str]:
    port = app_processes.free_port()
    url = f"http://127.0.0.1:{port}"
    env = {
        "TICKETFLOW_GATEWAY_URL": url,
        "TICKETFLOW_GATEWAY_TOKEN": TOKEN,
        "TICKETFLOW_GATEWAY_MAX_CONCURRENT_REQUESTS": str(CAP),
    }
    service = app_processes.start(
        "gateway", ["gateway"], live_stack, env, log_name=f"gateway-security-{port}"
    )
    try:
        app_processes.wait_until(
            lambda: app_processes.http_ok(f"{url}/readyz"), service, 90, "ready"
        )
        yield url
    finally:
        service.stop()


def body(*texts: str) -> dict:
    return {"inputs": [{"id": f"s-{i}", "text": t} for i, t in enumerate(texts)]}


async def test_the_token_is_required_and_checked(gateway_url: str) -> None:
    async with aiohttp.ClientSession(gateway_url) as http:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
            async with http.post(PREDICT, json=body("refund please"), headers=headers) as r:
                assert r.status == 401
                assert r.headers["WWW-Authenticate"].startswith("Bearer")
                assert (await r.json())["error"]["code"] == "UNAUTHORIZED"
        right = {"Authorization": f"Bearer {TOKEN}"}
        async with http.post(PREDICT, json=body("refund please"), headers=right) as r:
            assert r.status == 200
            assert (await r.json())["outputs"][0]["id"] == "s-0"
        for probe in ("/healthz", "/readyz", "/metrics"):
            async with http.get(probe) as r:
                assert r.status == 200, probe


async def test_the_workers_client_sends_the_token(gateway_url: str) -> None:
    inputs = [PredictInput(id="c-1", text="where is my parcel")]
    async with GatewayClient(gateway_url, token=TOKEN) as client:
        answer = await client.predict(MODEL, inputs, timeout_ms=2000)
    assert answer.outputs[0].id == "c-1"
    async with GatewayClient(gateway_url, token="wrong") as client:
        with pytest.raises(GatewayError) as caught:
            await client.predict(MODEL, inputs, timeout_ms=2000)
    assert (caught.value.code, caught.value.retryable) == (ErrorCode.MODEL_UNAVAILABLE, False)


async def test_an_oversized_body_is_413_unread_and_not_repeated(gateway_url: str) -> None:
    host, port = gateway_url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        # the declared length is one byte past the largest legal batch; only a few bytes
        # follow: an answer proves the gateway did not wait to read the rest
        writer.write(
            f"POST {PREDICT} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {largest_legal_body() + 1}\r\n"
            f"\r\n".encode()
            + f'{{"inputs": [{{"id": "a", "text": "{SECRET_TEXT}'.encode()
        )
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(4096), 5)
    finally:
        writer.close()
    assert answer.startswith(b"HTTP/1.1 413")
    assert b"INVALID_INPUT" in answer
    assert SECRET_TEXT.encode() not in answer


async def test_tritons_own_error_text_never_reaches_the_caller(
    gateway_url: str, live_stack: Settings
) -> None:
    ghost = f"ghost_{uuid.uuid4().hex[:8]}"
    # what Triton itself says about this model
    triton = InferenceServerClient(live_stack.triton_grpc)
    try:
        from tritonclient.grpc import InferInput

        data = InferInput(INPUT_NAME, [1, 1], "BYTES")
        data.set_data_from_numpy(encode_texts(["x"]))
        with pytest.raises(InferenceServerException) as raw:
            await triton.infer(ghost, [data], model_version="1")
    finally:
        await triton.close()
    triton_words = raw.value.message()
    assert triton_words and ghost in triton_words
    # route the model through the gateway, so its request reaches Triton
    config = RoutingConfig(name=ghost, versions={"v1": 100}, default="v1")
    await asyncio.to_thread(
        publish, config, live_stack.kafka_bootstrap, routing_topic(live_stack.topic_prefix)
    )
    right = {"Authorization": f"Bearer {TOKEN}"}
    async with aiohttp.ClientSession(gateway_url) as http:
        deadline = time.monotonic() + 20
        while True:
            async with http.post(f"/v1/models/{ghost}/predict", json=body("x"), headers=right) as r:
                status, text = r.status, await r.text()
            if "unknown model" not in text or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.3)
    assert status == 503, text
    assert "MODEL_UNAVAILABLE" in text and "[triton " in text
    assert triton_words not in text
    assert "Request for unknown model" not in text


async def test_past_the_cap_requests_are_503_with_retry_after(gateway_url: str) -> None:
    right = {"Authorization": f"Bearer {TOKEN}"}
    # distinct long texts, so neither the cache nor dedupe answers them at once; v2 on the
    # CPU takes ~15 ms a ticket, so 64 of them keep a request busy for a while
    texts = [f"{uuid.uuid4().hex} my order arrived broken " * 40 for _ in range(64)]
    payload = body(*texts)
    payload["version"] = "v2"
    payload["timeout_ms"] = 30_000
    async with aiohttp.ClientSession(gateway_url) as http:

        async def one() -> tuple[int, str | None]:
            async with http.post(PREDICT, json=payload, headers=right) as r:
                await r.read()
                return r.status, r.headers.get("Retry-After")

        answers = await asyncio.gather(*(one() for _ in range(CAP + 4)))
    statuses = sorted(status for status, _ in answers)
    assert statuses.count(200) >= CAP, answers
    refused = [retry for status, retry in answers if status == 503]
    assert refused, answers
    assert all(retry == "1" for retry in refused)
