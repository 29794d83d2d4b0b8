"""Admission against the real Triton (v2: ~10 ms a ticket on 2 CPU cores): a full gateway
queue answers 429 at once, an input that expired in the queue is never sent to Triton, and a
deadline the queue cannot meet is refused at once."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Sequence

import numpy as np
import pytest

from inference_gateway.client import GatewayClient
from inference_gateway.config import GatewayConfig
from inference_gateway.errors import GatewayError
from inference_gateway.server import GatewayServer
from inference_gateway.triton import TritonClient
from schemas.gateway import PredictInput

pytestmark = pytest.mark.integration

MODEL = "ticket_classifier"
TRITON_URL = os.environ.get("TICKETFLOW_TRITON_GRPC", "127.0.0.1:8001")


class RecordingTriton(TritonClient):
    """The real client, noting every text it sends."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.sent: list[str] = []

    async def infer(
        self, texts: Sequence[str], version: str, timeout_s: float, *, model: str | None = None
    ) -> np.ndarray:
        self.sent += list(texts)
        return await super().infer(texts, version, timeout_s, model=model)


@pytest.fixture
async def triton() -> AsyncIterator[RecordingTriton]:
    client = RecordingTriton(TRITON_URL)
    if not await client.ready(MODEL, "v2"):
        await client.close()
        reason = f"no Triton serving {MODEL} v2 at {TRITON_URL}"
        if os.environ.get("CI"):
            pytest.fail(f"{reason} (CI is set: integration tests must not skip)")
        pytest.skip(f"{reason}; `make model`, then (re)start Triton")
    yield client


async def serve(triton: RecordingTriton, **config: object) -> GatewayServer:
    options = {"port": 0, "cache_size": 0, "dedupe": False, "shutdown_grace_s": 5, **config}
    server = GatewayServer(GatewayConfig(triton_url=TRITON_URL, **options), backend=triton)
    await server.start()
    return server


def ticket(i: int, text: str = "my parcel has not arrived, order {i}") -> list[PredictInput]:
    return [PredictInput(id=f"adm-{i}", text=text.format(i=i))]


async def timed(call) -> tuple[str, float]:
    started = time.monotonic()
    try:
        await call
        return "ok", time.monotonic() - started
    except GatewayError as error:
        return error.code.value, time.monotonic() - started


async def test_a_full_queue_answers_429_at_once(triton: RecordingTriton) -> None:
    server = await serve(triton, max_batch_size=4, max_queue_size=8, max_inflight_batches=1)
    try:
        async with GatewayClient(server.url) as client:
            calls = [client.predict(MODEL, ticket(i), 10_000, version="v2") for i in range(40)]
            results = await asyncio.gather(*(timed(c) for c in calls))
    finally:
        await server.stop()
    refused = [t for code, t in results if code == "OVERLOADED"]
    served = [t for code, t in results if code == "ok"]
    assert refused, "a queue of 8 must overflow with 40 callers"
    # at once, not after waiting for room (room is made only when a batch completes): every
    # refusal is back before the first input is served. A bound in seconds failed on a
    # loaded machine (all 32 refusals at 0.26 s against 0.25); here 22 ms against 55 ms.
    assert max(refused) < min(served)
    assert len(refused) + len(served) == 40
    assert len(triton.sent) == len(served)  # a refused input never reached Triton


async def test_an_input_that_expired_in_the_queue_is_never_dispatched(
    triton: RecordingTriton,
) -> None:
    server = await serve(triton, max_batch_size=64, max_inflight_batches=1, admission=False)
    try:
        async with GatewayClient(server.url) as client:
            backlog = [PredictInput(id=f"b{i}", text=f"refund for order {i}") for i in range(64)]
            busy = asyncio.ensure_future(client.predict(MODEL, backlog, 20_000, version="v2"))
            await asyncio.sleep(0.05)  # the 64-ticket batch is at Triton now
            code, _ = await timed(
                client.predict(MODEL, ticket(0, "EXPIRES IN THE QUEUE"), 30, version="v2")
            )
            await busy
            await asyncio.sleep(0.2)
        stats = server.service.batcher(MODEL, "v2").stats
    finally:
        await server.stop()
    assert code == "TIMEOUT"
    assert "EXPIRES IN THE QUEUE" not in triton.sent
    assert sum(stats.batch_sizes) == 64  # the backlog went; the expired input did not


async def test_a_deadline_the_queue_cannot_meet_is_refused_at_once(
    triton: RecordingTriton,
) -> None:
    server = await serve(triton, max_batch_size=16, max_inflight_batches=1)
    try:
        async with GatewayClient(server.url) as client:
            for i in range(4):  # let the batcher time a few batches of 16
                warm = [PredictInput(id=f"w{i}-{j}", text=f"invoice {i} {j}") for j in range(16)]
                await client.predict(MODEL, warm, 20_000, version="v2")
            backlog = [
                asyncio.ensure_future(client.predict(MODEL, ticket(i), 20_000, version="v2"))
                for i in range(64)
            ]
            await asyncio.sleep(0.05)
            with pytest.raises(GatewayError) as refused:
                await client.predict(MODEL, ticket(999), 50, version="v2")
            await asyncio.gather(*backlog)
    finally:
        await server.stop()
    assert refused.value.code.value in ("OVERLOADED", "TIMEOUT")
    # by admission, before it queued: not a timeout after waiting out the 50 ms (a bound
    # in milliseconds failed on a busy machine at 65 ms, so the path is checked instead)
    assert "refused at once" in refused.value.message, refused.value.message
    assert "my parcel has not arrived, order 999" not in triton.sent
