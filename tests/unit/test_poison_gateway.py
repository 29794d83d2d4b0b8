"""Issue 11 at the gateway: one input never fails another's answer.

An input that grows past the limit under NFKC is answered on its first MAX_TEXT_CHARS
normalised characters, with the others of its request; a text the model refuses (or fails
on) in a batch merged from several requests fails its own request only.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Sequence

import numpy as np
import pytest
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inference_gateway.batcher import DynamicBatcher
from inference_gateway.config import GatewayConfig
from inference_gateway.errors import ErrorCode, GatewayError
from inference_gateway.routing import Router
from inference_gateway.server import create_app
from inference_gateway.testing import FakeBackend, fake_scores
from schemas.routing import RoutingConfig
from schemas.tickets import MAX_TEXT_CHARS

PREDICT = "/v1/models/ticket_classifier/predict"
POISON = "poison"
_names = itertools.count()


class PickyModel:
    """A model that fails any batch holding POISON, the way `error` says."""

    def __init__(self, error: Exception) -> None:
        self.error = error
        self.batches: list[list[str]] = []

    async def __call__(self, texts: list[str], timeout_s: float) -> np.ndarray:
        self.batches.append(list(texts))
        await asyncio.sleep(0.001)
        if POISON in texts:
            raise self.error
        return fake_scores(texts)


def batcher(infer: PickyModel) -> DynamicBatcher:
    # a long delay and a big batch: every request of a test lands in one merged batch
    return DynamicBatcher(
        infer,
        model=f"poison-{next(_names)}",
        version="v1",
        max_batch_size=64,
        max_queue_delay_us=20_000,
    )


async def outcomes(b: DynamicBatcher, requests: Sequence[list[str]]) -> list[object]:
    deadline = time.monotonic() + 5
    return await asyncio.gather(*(b.submit(r, deadline) for r in requests), return_exceptions=True)


@pytest.mark.parametrize(
    "error",
    [
        GatewayError(ErrorCode.INVALID_INPUT, "Triton refused the input"),
        GatewayError(ErrorCode.INTERNAL, "Triton ran out of memory", False),
        RuntimeError("the model crashed on this text"),
    ],
)
async def test_a_merged_batch_failing_for_one_request_fails_that_request_only(error):
    model = PickyModel(error)
    b = batcher(model)
    got = await outcomes(b, [["a", "b"], ["c", POISON], ["d"]])
    assert isinstance(got[1], GatewayError) and not got[1].retryable
    assert all(isinstance(g, np.ndarray) for g in (got[0], got[2]))
    assert model.batches[0] == ["a", "b", "c", POISON, "d"]  # merged, then split
    await b.close()


async def test_a_retryable_failure_still_fails_the_whole_batch():
    model = PickyModel(GatewayError(ErrorCode.OVERLOADED, "Triton is overloaded"))
    b = batcher(model)
    got = await outcomes(b, [["a"], [POISON]])
    assert all(isinstance(g, GatewayError) and g.code == ErrorCode.OVERLOADED for g in got)
    assert len(model.batches) == 1  # nothing to learn from splitting it
    await b.close()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.lists(st.sampled_from(["a", "bb", "ccc", POISON]), min_size=1, max_size=5),
        min_size=1,
        max_size=10,
    )
)
async def test_exactly_the_requests_holding_a_poison_fail(requests):
    model = PickyModel(GatewayError(ErrorCode.INVALID_INPUT, "refused"))
    b = batcher(model)
    got = await outcomes(b, requests)
    for texts, outcome in zip(requests, got, strict=True):
        if POISON in texts:
            assert isinstance(outcome, GatewayError) and outcome.code == ErrorCode.INVALID_INPUT
        else:
            np.testing.assert_array_equal(outcome, fake_scores(texts))
    await b.close()


async def test_an_input_that_grows_past_the_limit_is_answered_with_the_others():
    backend = FakeBackend()
    router = Router([RoutingConfig(name="ticket_classifier", versions={"v1": 100}, default="v1")])
    app = create_app(GatewayConfig(max_queue_delay_us=500), backend, router)
    bomb = "\ufdfa" * 1112  # 1,112 characters in, 20,016 once normalised
    inputs = [{"id": "a", "text": "where is my parcel"}, {"id": "b", "text": bomb}]
    async with TestClient(TestServer(app)) as http:
        response = await http.post(PREDICT, json={"inputs": [*inputs, {"id": "c", "text": "x"}]})
        assert response.status == 200, await response.text()
        outputs = (await response.json())["outputs"]
    assert [o["id"] for o in outputs] == ["a", "b", "c"]
    sent = [t for _, _, texts in backend.calls for t in texts]
    assert max(len(t) for t in sent) == MAX_TEXT_CHARS
