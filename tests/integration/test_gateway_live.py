"""The gateway in-process against the real Triton at TICKETFLOW_TRITON_GRPC.

Skipped, with the reason, when no Triton answers there on a developer's machine; under CI
(env `CI` set) an unreachable Triton fails the run instead, so it cannot pass by skipping.

    python -m inference_gateway.triton_server --grpc-port 8001 &   # or `ticketflow stack up`
    pytest -m integration tests/integration/test_gateway_live.py -s
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from collections.abc import AsyncIterator

import numpy as np
import pytest
from prometheus_client import REGISTRY

from inference_gateway.client import GatewayClient
from inference_gateway.config import GatewayConfig
from inference_gateway.errors import ErrorCode, GatewayError
from inference_gateway.server import GatewayServer
from inference_gateway.triton import TritonClient
from schemas.gateway import PredictInput
from schemas.tickets import CATEGORIES

pytestmark = pytest.mark.integration

MODEL = "ticket_classifier"
TRITON_URL = os.environ.get("TICKETFLOW_TRITON_GRPC", "127.0.0.1:8001")
TICKETS = [
    "I want a refund for my broken headphones",
    "where is my parcel? the tracking has not moved for a week",
    "我的账户登录不了，密码重置邮件也收不到",
    "I was charged twice on this month's invoice",
    "the app crashes every time I open settings",
    # a request, not a question about the returns policy, which the categories call general
    "买的耳机坏了，想退货",
]


@pytest.fixture
async def triton() -> AsyncIterator[TritonClient]:
    client = TritonClient(TRITON_URL)
    if not await client.ready(MODEL, "v1"):
        await client.close()
        reason = f"no Triton serving {MODEL} v1 at TICKETFLOW_TRITON_GRPC={TRITON_URL}"
        if os.environ.get("CI"):
            pytest.fail(f"{reason} (CI is set: integration tests must not skip)")
        pytest.skip(f"{reason}; start one with `python -m inference_gateway.triton_server`")
    yield client
    await client.close()


@pytest.fixture
async def gateway(triton: TritonClient) -> AsyncIterator[GatewayServer]:
    config = GatewayConfig(triton_url=TRITON_URL, port=0, shutdown_grace_s=5)
    async with GatewayServer(config) as server:
        yield server


@pytest.fixture
async def client(gateway: GatewayServer) -> AsyncIterator[GatewayClient]:
    async with GatewayClient(gateway.url) as gateway_client:
        yield gateway_client


def inputs(texts: list[str], prefix: str = "live") -> list[PredictInput]:
    return [PredictInput(id=f"{prefix}-{i}", text=t) for i, t in enumerate(texts)]


async def direct_scores(triton: TritonClient, texts: list[str]) -> np.ndarray:
    # straight to Triton, in chunks within the model's max_batch_size (64)
    chunks = [texts[i : i + 64] for i in range(0, len(texts), 64)]
    return np.concatenate([await triton.infer(c, "v1", timeout_s=5.0) for c in chunks])


async def test_readyz_passes_with_a_real_test_inference(client: GatewayClient) -> None:
    assert await client.ready(timeout_ms=5000)


async def test_predict_matches_triton_row_for_row(
    client: GatewayClient, triton: TritonClient
) -> None:
    answer = await client.predict(MODEL, inputs(TICKETS), timeout_ms=2000)
    direct = await triton.infer(TICKETS, "v1", timeout_s=2.0)

    assert (answer.model, answer.version) == (MODEL, "v1")
    assert [o.id for o in answer.outputs] == [f"live-{i}" for i in range(len(TICKETS))]
    for output, row in zip(answer.outputs, direct, strict=True):
        assert list(output.scores) == list(CATEGORIES)
        np.testing.assert_allclose(list(output.scores.values()), row, rtol=1e-5)
        assert output.label == CATEGORIES[int(row.argmax())]
        assert output.confidence == pytest.approx(float(row.max()))
        assert sum(output.scores.values()) == pytest.approx(1.0, abs=1e-4)
    labels = [o.label for o in answer.outputs]
    assert labels[:2] == ["after_sales", "shipping"]  # the two least ambiguous tickets


async def test_concurrent_callers_are_batched_and_not_mixed_up(
    client: GatewayClient, triton: TritonClient
) -> None:
    texts = [f"{TICKETS[i % len(TICKETS)]} (order {i})" for i in range(96)]
    labels = {"model": MODEL, "version": "v1"}
    before = REGISTRY.get_sample_value("inference_batch_size_count", labels) or 0
    rows_before = REGISTRY.get_sample_value("inference_batch_size_sum", labels) or 0

    answers = await asyncio.gather(
        *(client.predict(MODEL, inputs([t], f"c{i}"), timeout_ms=5000) for i, t in enumerate(texts))
    )

    batches = REGISTRY.get_sample_value("inference_batch_size_count", labels) - before
    rows = REGISTRY.get_sample_value("inference_batch_size_sum", labels) - rows_before
    assert rows == len(texts)  # every input went to Triton once (distinct texts: no cache)
    assert batches < len(texts)  # 96 callers, fewer Triton calls
    assert rows / batches > 1.5  # batches really formed
    direct = await direct_scores(triton, texts)
    for answer, row in zip(answers, direct, strict=True):
        np.testing.assert_allclose(list(answer.outputs[0].scores.values()), row, rtol=1e-5)


async def test_a_request_larger_than_a_batch_is_split_and_reassembled(
    client: GatewayClient, triton: TritonClient
) -> None:
    texts = [f"{TICKETS[i % len(TICKETS)]} #{i}" for i in range(150)]
    answer = await client.predict(MODEL, inputs(texts), timeout_ms=5000)
    got = np.array([list(o.scores.values()) for o in answer.outputs])
    np.testing.assert_allclose(got, await direct_scores(triton, texts), rtol=1e-5)


async def test_an_unserved_version_is_retryable_model_unavailable(client: GatewayClient) -> None:
    with pytest.raises(GatewayError) as caught:
        await client.predict(MODEL, inputs(TICKETS[:1]), timeout_ms=2000, version="v99")
    assert caught.value.code is ErrorCode.MODEL_UNAVAILABLE
    assert caught.value.retryable


@pytest.fixture
async def triton_v2(triton: TritonClient) -> TritonClient:
    if not await triton.ready(MODEL, "v2"):
        reason = f"Triton at {TRITON_URL} does not serve {MODEL} v2 (make model; restart Triton)"
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    return triton


async def test_v2_reads_chinese_and_english(client: GatewayClient, triton_v2: TritonClient) -> None:
    answer = await client.predict(MODEL, inputs(TICKETS, "v2"), timeout_ms=5000, version="v2")
    direct = await triton_v2.infer(TICKETS, "v2", timeout_s=5.0)

    assert answer.version == "v2"
    for output, row in zip(answer.outputs, direct, strict=True):
        np.testing.assert_allclose(list(output.scores.values()), row, rtol=1e-4, atol=1e-6)
    labels = [o.label for o in answer.outputs]
    assert labels == ["after_sales", "shipping", "account", "billing", "technical", "after_sales"]


async def test_v2_scores_do_not_depend_on_batch_mates(triton_v2: TritonClient) -> None:
    alone = np.concatenate([await triton_v2.infer([t], "v2", timeout_s=5.0) for t in TICKETS])
    together = await triton_v2.infer(TICKETS, "v2", timeout_s=5.0)
    np.testing.assert_allclose(alone, together, atol=1e-5)


async def test_gateway_overhead_at_batch_one(client: GatewayClient, triton: TritonClient) -> None:
    """Prints p50/p99 of direct Triton vs through the gateway (run with -s to see them)."""
    text, rounds = TICKETS[1], 200
    for _ in range(20):  # warm both paths: channels, connections, the model
        await triton.infer([text], "v1", timeout_s=2.0)
        await client.predict(MODEL, inputs([text]), timeout_ms=2000)
    direct = await _timed(lambda: triton.infer([text], "v1", timeout_s=2.0), rounds)
    gateway = await _timed(lambda: client.predict(MODEL, inputs([text]), timeout_ms=2000), rounds)
    p50_direct, p50_gateway = statistics.median(direct), statistics.median(gateway)
    print(
        f"\nbatch 1, {rounds} sequential calls: direct Triton p50 {p50_direct:.2f} ms "
        f"p99 {_p99(direct):.2f} ms; via gateway p50 {p50_gateway:.2f} ms "
        f"p99 {_p99(gateway):.2f} ms; overhead p50 {p50_gateway - p50_direct:.2f} ms"
    )
    # generous: the batch delay (2 ms) plus HTTP and JSON should stay far below this
    assert p50_gateway - p50_direct < 25.0


async def _timed(call, rounds: int) -> list[float]:
    samples = []
    for _ in range(rounds):
        started = time.perf_counter()
        await call()
        samples.append((time.perf_counter() - started) * 1000)
    return samples


def _p99(samples: list[float]) -> float:
    return sorted(samples)[int(len(samples) * 0.99) - 1]
