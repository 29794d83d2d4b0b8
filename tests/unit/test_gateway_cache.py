"""The response cache (LRU + TTL, normalised keys) and in-flight dedupe, on a fake Triton."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import numpy as np
import pytest
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import REGISTRY

from inference_gateway.cache import ResponseCache, cache_key, normalize_text
from inference_gateway.config import GatewayConfig
from inference_gateway.errors import ErrorCode, GatewayError
from inference_gateway.routing import Router
from inference_gateway.server import SERVICE, create_app
from inference_gateway.testing import FakeBackend
from schemas.routing import RoutingConfig

PREDICT = "/v1/models/ticket_classifier/predict"


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def row(x: float) -> np.ndarray:
    return np.full(6, x, np.float32)


def test_normalisation_folds_width_and_whitespace() -> None:
    assert normalize_text("  Ｒｅｆｕｎｄ\tplease \n 退款  ") == "Refund please 退款"
    assert normalize_text("a b") == normalize_text("a  b")
    assert normalize_text("Refund") != normalize_text("refund")  # v2 reads case


def test_keys_are_per_version_and_hold_no_text() -> None:
    k1 = cache_key("m", "v1", "my card number is 4111")
    assert k1 != cache_key("m", "v2", "my card number is 4111")
    assert b"4111" not in k1[2] and len(k1[2]) == 16


def test_lru_evicts_the_least_recently_used() -> None:
    cache = ResponseCache(max_entries=2, ttl_s=60)
    a, b, c = (cache_key("m", "v1", t) for t in "abc")
    cache.put(a, row(1))
    cache.put(b, row(2))
    assert cache.get(a) is not None  # a is now the most recent
    cache.put(c, row(3))
    assert cache.get(b) is None
    assert cache.get(a) is not None and cache.get(c) is not None
    assert len(cache) == 2


def test_entries_expire_after_the_ttl() -> None:
    clock = Clock()
    cache = ResponseCache(max_entries=10, ttl_s=5, clock=clock)
    key = cache_key("m", "v1", "x")
    cache.put(key, row(1))
    clock.now = 4.9
    assert cache.get(key) is not None
    clock.now = 5.0
    assert cache.get(key) is None
    assert len(cache) == 0
    assert cache.hits == 1 and cache.misses == 1 and cache.hit_ratio == 0.5


def test_a_cache_of_size_zero_is_off() -> None:
    cache = ResponseCache(max_entries=0)
    key = cache_key("m", "v1", "x")
    cache.put(key, row(1))
    assert not cache.enabled and cache.get(key) is None and len(cache) == 0


def make_client(backend: FakeBackend, **config: object):
    router = Router([RoutingConfig(name="ticket_classifier", versions={"v1": 100}, default="v1")])
    app = create_app(GatewayConfig(max_queue_delay_us=2000, **config), backend, router)
    return TestClient(TestServer(app))


@pytest.fixture
async def http() -> AsyncIterator[tuple[TestClient, FakeBackend]]:
    backend = FakeBackend()
    async with make_client(backend) as client:
        yield client, backend


def texts_sent(backend: FakeBackend) -> list[str]:
    return [t for _, _, batch in backend.calls for t in batch]


async def predict(client: TestClient, *texts: str, prefix: str = "t") -> dict:
    payload = {"inputs": [{"id": f"{prefix}-{i}", "text": t} for i, t in enumerate(texts)]}
    response = await client.post(PREDICT, json=payload)
    assert response.status == 200, await response.text()
    return await response.json()


async def test_a_repeated_input_is_answered_from_the_cache(http) -> None:
    client, backend = http
    first = await predict(client, "where is my parcel?")
    again = await predict(client, "  where   is my parcel?  ", prefix="other")

    assert texts_sent(backend) == ["where is my parcel?"]  # the normalised text, once
    assert first["outputs"][0]["scores"] == again["outputs"][0]["scores"]
    assert again["version"] == "v1" and again["outputs"][0]["id"] == "other-0"
    labels = {"model": "ticket_classifier", "version": "v1"}
    assert REGISTRY.get_sample_value("inference_cache_hit_ratio", labels) > 0
    service = client.server.app[SERVICE]
    assert service.hit_ratio("ticket_classifier", "v1") == 0.5


async def test_duplicates_within_a_request_are_computed_once(http) -> None:
    client, backend = http
    answer = await predict(client, "refund", "refund", "Refund", "refund ")
    assert sorted(texts_sent(backend)) == ["Refund", "refund"]
    assert [o["id"] for o in answer["outputs"]] == ["t-0", "t-1", "t-2", "t-3"]
    assert answer["outputs"][0]["scores"] == answer["outputs"][3]["scores"]


async def test_identical_inputs_in_flight_share_one_computation() -> None:
    backend = FakeBackend(delay_s=0.05)
    async with make_client(backend, cache_size=0) as client:  # dedupe alone, no cache
        answers = await asyncio.gather(
            *(predict(client, "the app crashes on start", prefix=f"c{i}") for i in range(12))
        )
    assert texts_sent(backend) == ["the app crashes on start"]
    assert len({str(a["outputs"][0]["scores"]) for a in answers}) == 1
    shared = REGISTRY.get_sample_value(
        "inference_cache_lookups_total",
        {"model": "ticket_classifier", "version": "v1", "result": "shared"},
    )
    assert shared and shared >= 11


async def test_without_cache_and_dedupe_every_input_is_sent() -> None:
    backend = FakeBackend()
    async with make_client(backend, cache_size=0, dedupe=False) as client:
        await predict(client, "same", "same")
        await predict(client, "same")
    assert texts_sent(backend) == ["same", "same", "same"]


async def test_errors_are_not_cached_and_reach_every_sharer() -> None:
    backend = FakeBackend(delay_s=0.05, error=GatewayError(ErrorCode.OVERLOADED, "busy"))
    async with make_client(backend) as client:
        payload = {"inputs": [{"id": "x", "text": "hello"}]}
        statuses = await asyncio.gather(*(client.post(PREDICT, json=payload) for _ in range(3)))
        assert [r.status for r in statuses] == [429, 429, 429]
        backend.error = None
        backend.delay_s = 0
        assert (await client.post(PREDICT, json=payload)).status == 200
    assert len(backend.calls) == 2  # one shared failure, then a real computation
