"""Per-input routing in one request: inputs split by version, sent through each version's
batcher, outputs reassembled in the request's order, each naming its version."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

import numpy as np
import pytest
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import REGISTRY

from inference_gateway.config import GatewayConfig
from inference_gateway.errors import ErrorCode, GatewayError
from inference_gateway.routing import Router, pick_version
from inference_gateway.server import create_app
from inference_gateway.service import version_groups
from inference_gateway.testing import FakeBackend
from schemas.gateway import PredictOutput, PredictResponse
from schemas.routing import RoutingConfig

MODEL = "ticket_classifier"
PREDICT = f"/v1/models/{MODEL}/predict"
CANARY = RoutingConfig(name=MODEL, versions={"v1": 50, "v2": 50}, default="v1")
IDS = [f"ticket-{i}" for i in range(40)]


def client_for(backend: FakeBackend, **config: object) -> TestClient:
    app = create_app(GatewayConfig(max_queue_delay_us=500, **config), backend, Router([CANARY]))
    return TestClient(TestServer(app))


@pytest.fixture
def backend() -> FakeBackend:
    return FakeBackend()


@pytest.fixture
async def http(backend: FakeBackend) -> AsyncIterator[TestClient]:
    async with client_for(backend) as client:
        yield client


def body(ids: Sequence[str], texts: Sequence[str] | None = None, **extra: object) -> dict:
    texts = texts or [f"text of {i}" for i in ids]
    return {"inputs": [{"id": i, "text": t} for i, t in zip(ids, texts, strict=True)], **extra}


async def answer(client: TestClient, payload: dict) -> PredictResponse:
    response = await client.post(PREDICT, json=payload)
    assert response.status == 200, await response.text()
    return PredictResponse.model_validate(await response.json())


def outputs_counted(version: str) -> float:
    labels = {"model": MODEL, "version": version}
    return REGISTRY.get_sample_value("gateway_outputs_total", labels) or 0.0


def test_version_groups_keep_request_order_within_and_between_groups() -> None:
    assert version_groups(["v2", "v1", "v2", "v2", "v1"]) == {"v2": [0, 2, 3], "v1": [1, 4]}


def test_choose_each_agrees_with_choose_and_a_pin_applies_to_all() -> None:
    router = Router([CANARY])
    assert router.choose_each(MODEL, IDS) == [router.choose(MODEL, i) for i in IDS]
    assert router.choose_each(MODEL, IDS, "v2") == ["v2"] * len(IDS)
    with pytest.raises(GatewayError) as error:
        router.choose_each("nope", IDS)
    assert error.value.code is ErrorCode.INVALID_INPUT


async def test_each_input_goes_to_its_own_version_in_request_order(
    http: TestClient, backend: FakeBackend
) -> None:
    want = [pick_version(CANARY, i) for i in IDS]
    assert set(want) == {"v1", "v2"}  # the ids cover both halves
    got = await answer(http, body(IDS))

    assert [o.id for o in got.outputs] == IDS
    assert [o.version for o in got.outputs] == want
    assert got.version == want[0]  # the top-level version is the first output's
    # each version computed exactly its own inputs' texts, in request order
    for version in ("v1", "v2"):
        sent = [t for _, v, texts in backend.calls if v == version for t in texts]
        mine = [i for i, v in zip(IDS, want, strict=True) if v == version]
        assert sent == [f"text of {i}" for i in mine]


async def test_each_output_carries_its_own_versions_scores() -> None:
    class ByVersion(FakeBackend):
        async def infer(self, texts, version, timeout_s, *, model=None) -> np.ndarray:
            scores = await super().infer(texts, version, timeout_s, model=model)
            scores[:, 0] = 0.9 if version == "v2" else 0.01  # v2 says billing, v1 does not
            return scores

    async with client_for(ByVersion()) as client:
        got = await answer(client, body(IDS))
    for output in got.outputs:
        assert (output.label == "billing") == (output.version == "v2")


async def test_routing_is_sticky_across_requests_and_answered_from_the_cache(
    http: TestClient, backend: FakeBackend
) -> None:
    first = await answer(http, body(IDS))
    calls = len(backend.calls)
    again = await answer(http, body(list(reversed(IDS))))
    assert len(backend.calls) == calls  # every input a cache hit of its own version
    assert {o.id: o.version for o in again.outputs} == {o.id: o.version for o in first.outputs}


async def test_the_same_text_on_two_versions_is_computed_by_each(
    http: TestClient, backend: FakeBackend
) -> None:
    v1 = next(i for i in IDS if pick_version(CANARY, i) == "v1")
    v2 = next(i for i in IDS if pick_version(CANARY, i) == "v2")
    got = await answer(http, body([v1, v2, v1 + "-again"], ["same text"] * 3))
    assert [o.version for o in got.outputs] == ["v1", "v2", pick_version(CANARY, v1 + "-again")]
    per_version = sorted((version, texts) for _, version, texts in backend.calls)
    assert per_version == [("v1", ["same text"]), ("v2", ["same text"])]  # deduped per version


async def test_a_pinned_version_serves_every_input(http: TestClient, backend: FakeBackend) -> None:
    got = await answer(http, body(IDS, version="v2"))
    assert {o.version for o in got.outputs} == {"v2"} and got.version == "v2"
    assert {version for _, version, _ in backend.calls} == {"v2"}


async def test_outputs_are_counted_under_the_version_that_produced_them(
    http: TestClient,
) -> None:
    before = {v: outputs_counted(v) for v in ("v1", "v2")}
    await answer(http, body(IDS))
    want = [pick_version(CANARY, i) for i in IDS]
    for version in ("v1", "v2"):
        assert outputs_counted(version) - before[version] == want.count(version)


class FailsOn(FakeBackend):
    """Fails the versions named in `failing` with their error; answers the others."""

    def __init__(self, failing: dict[str, GatewayError]) -> None:
        super().__init__()
        self.failing = failing

    async def infer(self, texts, version, timeout_s, *, model=None) -> np.ndarray:
        self.calls.append((model, version, list(texts)))
        if version in self.failing:
            raise self.failing[version]
        return await super().infer(texts, version, timeout_s, model=model)


async def test_one_failing_group_fails_the_whole_request_with_its_error() -> None:
    backend = FailsOn({"v2": GatewayError(ErrorCode.MODEL_UNAVAILABLE, "v2 is down")})
    before = {v: outputs_counted(v) for v in ("v1", "v2")}
    async with client_for(backend) as client:
        response = await client.post(PREDICT, json=body(IDS))
        assert response.status == 503
        error = (await response.json())["error"]
        assert error["code"] == "MODEL_UNAVAILABLE" and "v2 is down" in error["message"]
        # the group that succeeded was still computed, and cached for the next request
        v1_ids = [i for i in IDS if pick_version(CANARY, i) == "v1"]
        calls = len(backend.calls)
        got = await answer(client, body(v1_ids))
        assert len(backend.calls) == calls and {o.version for o in got.outputs} == {"v1"}
    assert outputs_counted("v2") == before["v2"]  # a failed request answered nothing


async def test_when_groups_fail_differently_the_first_in_request_order_wins() -> None:
    backend = FailsOn(
        {
            "v1": GatewayError(ErrorCode.OVERLOADED, "v1 busy"),
            "v2": GatewayError(ErrorCode.INTERNAL, "v2 broken"),
        }
    )
    first = pick_version(CANARY, IDS[0])
    async with client_for(backend) as client:
        response = await client.post(PREDICT, json=body(IDS))
        error = (await response.json())["error"]
    assert error["code"] == ("OVERLOADED" if first == "v1" else "INTERNAL")


async def test_a_single_input_answers_as_before(http: TestClient) -> None:
    got = await answer(http, body(["only"]))
    assert got.version == got.outputs[0].version == pick_version(CANARY, "only")


def test_an_output_without_version_still_parses() -> None:
    # what a gateway from before per-output versions answers
    old = {"id": "a", "label": "billing", "confidence": 0.9, "scores": {"billing": 0.9}}
    assert PredictOutput.model_validate(old).version is None
