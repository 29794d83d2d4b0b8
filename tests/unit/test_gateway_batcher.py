"""The dynamic batcher, on a fake inference function: merging, deadlines, a bounded queue."""

from __future__ import annotations

import asyncio
import itertools
import time

import numpy as np
import pytest
from prometheus_client import REGISTRY

from inference_gateway.batcher import CostModel, DynamicBatcher
from inference_gateway.errors import ErrorCode, GatewayError
from inference_gateway.testing import fake_scores

_names = itertools.count()


class FakeInfer:
    """Records each batch; `gate` (when set) holds every call until it is opened."""

    def __init__(self, gated: bool = False, error: Exception | None = None) -> None:
        self.batches: list[list[str]] = []
        self.gate = asyncio.Event()
        if not gated:
            self.gate.set()
        self.error = error
        self.running = 0
        self.max_running = 0

    async def __call__(self, texts: list[str], timeout_s: float) -> np.ndarray:
        self.batches.append(list(texts))
        self.running += 1
        self.max_running = max(self.max_running, self.running)
        try:
            await self.gate.wait()
            if self.error is not None:
                raise self.error
            return fake_scores(texts)
        finally:
            self.running -= 1


def make(infer: FakeInfer, **options: int | bool) -> DynamicBatcher:
    # a fresh model name per batcher keeps the Prometheus samples of tests apart
    return DynamicBatcher(infer, model=f"test-model-{next(_names)}", version="v1", **options)


def soon(seconds: float = 2.0) -> float:
    return time.monotonic() + seconds


async def test_concurrent_submits_are_merged_into_few_batches() -> None:
    infer = FakeInfer()
    batcher = make(infer, max_batch_size=8, max_queue_delay_us=20_000)
    texts = [f"ticket {'x' * i}" for i in range(20)]

    results = await asyncio.gather(*(batcher.submit([t], soon()) for t in texts))

    assert len(infer.batches) < 20
    assert all(len(b) <= 8 for b in infer.batches)
    assert sorted(t for b in infer.batches for t in b) == sorted(texts)
    for text, scores in zip(texts, results, strict=True):
        np.testing.assert_array_equal(scores, fake_scores([text]))
    await batcher.close()


async def test_a_full_batch_goes_without_waiting_for_the_delay() -> None:
    infer = FakeInfer()
    batcher = make(infer, max_batch_size=4, max_queue_delay_us=5_000_000)
    started = time.monotonic()

    await asyncio.gather(*(batcher.submit([f"t{i}"], soon(10)) for i in range(4)))

    assert time.monotonic() - started < 1.0
    assert [len(b) for b in infer.batches] == [4]
    await batcher.close()


async def test_a_partial_batch_goes_after_the_delay() -> None:
    infer = FakeInfer()
    batcher = make(infer, max_batch_size=32, max_queue_delay_us=50_000)
    started = time.monotonic()

    await batcher.submit(["alone"], soon())

    assert 0.045 <= time.monotonic() - started < 1.0
    assert infer.batches == [["alone"]]
    await batcher.close()


async def test_a_large_request_is_split_across_batches_in_order() -> None:
    infer = FakeInfer()
    batcher = make(infer, max_batch_size=8, max_queue_delay_us=0)
    texts = ["y" * i for i in range(1, 21)]

    scores = await batcher.submit(texts, soon())

    assert [len(b) for b in infer.batches] == [8, 8, 4]
    np.testing.assert_array_equal(scores, fake_scores(texts))
    await batcher.close()


async def test_an_expired_input_is_dropped_before_dispatch() -> None:
    infer = FakeInfer(gated=True)
    batcher = make(infer, max_batch_size=1, max_queue_delay_us=0, max_inflight_batches=1)
    first = asyncio.create_task(batcher.submit(["first"], soon()))
    await asyncio.sleep(0.01)  # "first" is at the (blocked) backend, holding the only slot

    with pytest.raises(GatewayError) as caught:
        await batcher.submit(["late"], time.monotonic() + 0.05)
    infer.gate.set()
    await first

    assert caught.value.code is ErrorCode.TIMEOUT
    assert caught.value.retryable
    assert ["late"] not in infer.batches  # never sent: its deadline passed in the queue
    await batcher.close()


async def test_the_worker_answers_timeout_for_inputs_that_expired_in_the_queue() -> None:
    infer = FakeInfer(gated=True)
    batcher = make(infer, max_batch_size=1, max_queue_delay_us=0, max_inflight_batches=1)
    first = asyncio.create_task(batcher.submit(["first"], soon()))
    await asyncio.sleep(0.01)
    late = asyncio.create_task(batcher.submit(["late"], time.monotonic() + 0.05))
    await asyncio.sleep(0.1)  # "late" has expired; the caller's wait has already given up
    infer.gate.set()

    await first
    with pytest.raises(GatewayError) as caught:
        await late
    assert caught.value.code is ErrorCode.TIMEOUT
    assert infer.batches == [["first"]]
    assert batcher.depth == 0
    await batcher.close()


async def test_a_full_queue_answers_overloaded_at_once() -> None:
    infer = FakeInfer(gated=True)
    batcher = make(
        infer, max_batch_size=1, max_queue_delay_us=0, max_queue_size=4, max_inflight_batches=1
    )
    busy = asyncio.create_task(batcher.submit(["at the backend"], soon()))
    await asyncio.sleep(0.01)
    queued = asyncio.create_task(batcher.submit(["a", "b", "c", "d"], soon()))
    await asyncio.sleep(0.01)
    assert batcher.depth == 4

    started = time.monotonic()
    with pytest.raises(GatewayError) as caught:
        await asyncio.wait_for(batcher.submit(["one too many"], soon()), timeout=0.5)

    assert caught.value.code is ErrorCode.OVERLOADED
    assert caught.value.retryable
    assert time.monotonic() - started < 0.05
    infer.gate.set()
    await asyncio.gather(busy, queued)
    await batcher.close()


async def test_batches_pipeline_up_to_max_inflight() -> None:
    for inflight in (1, 2):
        infer = FakeInfer(gated=True)
        batcher = make(infer, max_batch_size=1, max_queue_delay_us=0, max_inflight_batches=inflight)
        tasks = [asyncio.create_task(batcher.submit([f"t{i}"], soon())) for i in range(4)]
        await asyncio.sleep(0.05)
        assert infer.running == inflight
        infer.gate.set()
        await asyncio.gather(*tasks)
        assert infer.max_running == inflight
        await batcher.close()


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (GatewayError(ErrorCode.OVERLOADED, "Triton queue full"), ErrorCode.OVERLOADED),
        (GatewayError(ErrorCode.INVALID_INPUT, "bad"), ErrorCode.INVALID_INPUT),
        (RuntimeError("a bug"), ErrorCode.INTERNAL),
    ],
)
async def test_a_failing_batch_fails_each_of_its_requests(
    error: Exception, code: ErrorCode
) -> None:
    infer = FakeInfer(error=error)
    batcher = make(infer, max_batch_size=8, max_queue_delay_us=10_000)

    results = await asyncio.gather(
        *(batcher.submit([f"t{i}"], soon()) for i in range(3)), return_exceptions=True
    )

    assert all(isinstance(r, GatewayError) and r.code is code for r in results)
    await batcher.close()


async def test_a_wrong_number_of_rows_is_internal() -> None:
    async def short(texts: list[str], timeout_s: float) -> np.ndarray:
        return fake_scores(texts[:-1])

    batcher = DynamicBatcher(short, model="test-short", version="v1", max_queue_delay_us=0)
    with pytest.raises(GatewayError) as caught:
        await batcher.submit(["a", "b"], soon())
    assert caught.value.code is ErrorCode.INTERNAL
    await batcher.close()


async def test_the_deadline_reaches_the_backend_as_a_timeout() -> None:
    seen: list[float] = []

    async def infer(texts: list[str], timeout_s: float) -> np.ndarray:
        seen.append(timeout_s)
        return fake_scores(texts)

    batcher = DynamicBatcher(infer, model="test-deadline", version="v1", max_queue_delay_us=0)
    await batcher.submit(["a"], time.monotonic() + 0.3)
    assert 0.2 < seen[0] <= 0.3
    await batcher.close()


async def test_close_answers_queued_inputs_and_refuses_new_ones() -> None:
    infer = FakeInfer(gated=True)
    batcher = make(infer, max_batch_size=1, max_queue_delay_us=0, max_inflight_batches=1)
    busy = asyncio.create_task(batcher.submit(["busy"], soon()))
    await asyncio.sleep(0.01)
    queued = asyncio.create_task(batcher.submit(["queued"], soon()))
    await asyncio.sleep(0.01)

    closing = asyncio.create_task(batcher.close())
    await asyncio.sleep(0.01)
    infer.gate.set()  # the batch at the backend finishes
    await closing

    np.testing.assert_array_equal(await busy, fake_scores(["busy"]))
    with pytest.raises(GatewayError) as caught:
        await queued
    assert caught.value.code is ErrorCode.MODEL_UNAVAILABLE
    with pytest.raises(GatewayError):
        await batcher.submit(["after"], soon())


async def test_metrics_batch_size_latency_and_queue_depth() -> None:
    infer = FakeInfer()
    batcher = make(infer, max_batch_size=4, max_queue_delay_us=10_000)
    labels = {"model": batcher.model, "version": "v1"}

    await asyncio.gather(*(batcher.submit([f"t{i}"], soon()) for i in range(4)))

    assert REGISTRY.get_sample_value("inference_batch_size_count", labels) == 1
    assert REGISTRY.get_sample_value("inference_batch_size_sum", labels) == 4
    assert REGISTRY.get_sample_value("inference_queue_depth", labels) == 0
    assert REGISTRY.get_sample_value("ai_inference_latency_seconds_count", labels) == 4
    assert REGISTRY.get_sample_value("inference_batch_seconds_count", labels) == 1
    await batcher.close()


class SlowInfer(FakeInfer):
    """Each batch takes `base + per_input * size` seconds."""

    def __init__(self, base: float, per_input: float) -> None:
        super().__init__()
        self.base, self.per_input = base, per_input

    async def __call__(self, texts: list[str], timeout_s: float) -> np.ndarray:
        await asyncio.sleep(self.base + self.per_input * len(texts))
        return await super().__call__(texts, timeout_s)


def test_the_cost_model_tells_fixed_from_per_input_cost() -> None:
    fixed, linear = CostModel(), CostModel()
    for size in (1, 4, 16, 32) * 5:
        fixed.add(size, 0.001)
        linear.add(size, 0.010 * size)
    assert fixed.predict(1) == pytest.approx(0.001, rel=0.05)
    assert fixed.predict(32) == pytest.approx(0.001, rel=0.05)
    assert linear.predict(1) == pytest.approx(0.010, rel=0.05)
    assert linear.predict(32) == pytest.approx(0.320, rel=0.05)
    one_size = CostModel()
    one_size.add(8, 0.08)
    assert one_size.predict(2) == pytest.approx(0.02)  # proportional: errs towards admitting
    assert CostModel().predict(4) is None


async def _timed_batches(batcher: DynamicBatcher, n: int) -> None:
    for _ in range(n):
        await asyncio.gather(*(batcher.submit([f"warm{i}"], soon()) for i in range(4)))


async def test_a_deadline_the_queue_cannot_meet_is_refused_at_once() -> None:
    infer = SlowInfer(base=0.0, per_input=0.02)
    batcher = make(infer, max_batch_size=4, max_queue_delay_us=1000, max_inflight_batches=1)
    await _timed_batches(batcher, 3)  # now it knows: ~20 ms an input
    backlog = [asyncio.ensure_future(batcher.submit([f"b{i}"], soon(5))) for i in range(16)]
    await asyncio.sleep(0)

    started = time.monotonic()
    with pytest.raises(GatewayError) as caught:
        await batcher.submit(["late"], time.monotonic() + 0.1)  # ~0.3 s of queue ahead
    assert caught.value.code is ErrorCode.OVERLOADED and caught.value.retryable
    assert "refused at once" in caught.value.message
    assert time.monotonic() - started < 0.05
    assert batcher.stats.rejected_late == 1
    await asyncio.gather(*backlog)
    assert "late" not in [t for b in infer.batches for t in b]

    with pytest.raises(GatewayError) as caught:  # shorter than one batch, even unqueued
        await batcher.submit(["a", "b", "c", "d"], time.monotonic() + 0.03)
    assert caught.value.code is ErrorCode.TIMEOUT
    await batcher.submit(["fits"], time.monotonic() + 0.5)  # a small one still fits
    await batcher.close()


async def test_admission_can_be_turned_off() -> None:
    infer = SlowInfer(base=0.0, per_input=0.02)
    batcher = make(infer, max_batch_size=4, max_inflight_batches=1, admission=False)
    await _timed_batches(batcher, 3)
    with pytest.raises(GatewayError) as caught:
        await batcher.submit(["a", "b", "c", "d"], time.monotonic() + 0.03)
    assert caught.value.code is ErrorCode.TIMEOUT and batcher.stats.rejected_late == 0
    await batcher.close()


async def test_adaptive_delay_goes_at_once_for_a_cheap_model_at_low_load() -> None:
    infer = SlowInfer(base=0.001, per_input=0.0)
    batcher = make(infer, max_batch_size=8, max_queue_delay_us=200_000, adaptive_delay=True)
    assert batcher.current_delay_s() == 0.2  # nothing measured yet: the fixed delay
    await _timed_batches(batcher, 2)
    await asyncio.sleep(0.05)  # a quiet spell: inputs arrive slowly

    started = time.monotonic()
    await batcher.submit(["alone"], soon())
    assert time.monotonic() - started < 0.1  # not the 200 ms of the fixed delay
    assert batcher.current_delay_s() < 0.01
    await batcher.close()


async def test_adaptive_delay_waits_a_fraction_of_an_expensive_batch() -> None:
    infer = SlowInfer(base=0.1, per_input=0.0)
    batcher = make(infer, max_batch_size=64, max_queue_delay_us=30_000, adaptive_delay=True)
    await _timed_batches(batcher, 1)
    # inputs arriving every ~1 ms: worth waiting up to the cap for more
    for _ in range(5):
        batcher._gap.add(0.001)
    assert batcher.current_delay_s() == pytest.approx(0.03)
    await batcher.close()
