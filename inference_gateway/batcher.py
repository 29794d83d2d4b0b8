"""A dynamic batcher for one (model, version): many callers' inputs, few calls to Triton.

Callers `await submit(texts, deadline)`; one worker task merges what is queued into batches
of at most `max_batch_size` inputs, sending a batch when it is full or when its oldest input
has waited `max_queue_delay_us`, with up to `max_inflight_batches` batches at Triton at once
(so the next batch fills while the previous ones compute). The queue is bounded: a submit
that does not fit is answered OVERLOADED at once instead of waiting, and an input whose
deadline has passed is dropped before it is sent and answered TIMEOUT.

Admission: a request that cannot be answered in time is refused at once rather than queued
to expire. Once a few batches have been timed, the batcher knows what a batch costs (an
exponentially weighted mean of Triton call times) and estimates when a new request would be
answered: the batches ahead of it, spread over the in-flight slots, plus its own. Beyond its
deadline, it is refused: TIMEOUT when even an empty queue could not make it (the deadline is
shorter than one batch), else OVERLOADED (the queue is the problem; retry elsewhere or later).

Adaptive delay (`adaptive_delay=True`): instead of always waiting up to `max_queue_delay_us`
for a batch to fill, wait a fraction of the measured batch cost, capped by
`max_queue_delay_us`, and not at all when inputs arrive too slowly for another one to come in
that time. At low load a cheap model then answers without the full wait; under load, or for
an expensive model, batches fill as in the fixed mode (a fraction of a 100 ms batch is worth
waiting for, a fraction of a 1 ms one is not).

Deadlines are absolute `time.monotonic()` seconds (the clock of asyncio's default loop).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
from opentelemetry.trace import SpanContext

from inference_gateway import metrics, tracing
from inference_gateway.errors import ErrorCode, GatewayError

log = logging.getLogger(__name__)

# (texts, timeout_s) -> scores [len(texts), k]; a TritonClient.infer bound to model and version
InferFn = Callable[[list[str], float], Awaitable[np.ndarray]]


@dataclass(eq=False)
class _Request:
    """One caller's submit: answered when every one of its inputs has its scores."""

    texts: Sequence[str]
    deadline: float
    future: asyncio.Future[np.ndarray]
    enqueued_at: float
    pending: int
    scores: np.ndarray | None = None
    # the caller's span (tracing on), which the batch serving it links to
    span: SpanContext | None = None

    def fail(self, error: GatewayError) -> None:
        if not self.future.done():
            self.future.set_exception(error)

    def fill(self, start: int, rows: np.ndarray) -> None:
        if self.future.done():
            return
        if self.scores is None:
            self.scores = np.empty((len(self.texts), rows.shape[1]), dtype=rows.dtype)
        self.scores[start : start + len(rows)] = rows
        self.pending -= len(rows)
        if self.pending == 0:
            self.future.set_result(self.scores)


@dataclass(eq=False)
class _Slice:
    """Inputs [start, stop) of a request; a request larger than a batch spans several."""

    request: _Request
    start: int
    stop: int

    def __len__(self) -> int:
        return self.stop - self.start


@dataclass
class BatcherStats:
    """Counters for tests and debugging (Prometheus has the same as metrics)."""

    batches: int = 0
    # the latest sizes only, so a long-running gateway does not grow it forever
    batch_sizes: deque[int] = field(default_factory=lambda: deque(maxlen=4096))
    dropped_expired: int = 0
    rejected_full: int = 0
    rejected_late: int = 0  # refused at once: the estimate said the deadline cannot be met


class _Ewma:
    """An exponentially weighted mean; None until the first sample."""

    def __init__(self, alpha: float) -> None:
        self.alpha = alpha
        self.value: float | None = None

    def add(self, x: float) -> None:
        self.value = x if self.value is None else self.value + self.alpha * (x - self.value)


class CostModel:
    """seconds(batch size) ~ a + b * size, fitted by exponentially weighted least squares.

    v1's batches cost a fixed ~1 ms whatever their size; v2's grow with every input: a
    single mean of batch times would refuse a one-ticket request to v2 because the last
    32-ticket batch took 300 ms. With one batch size only seen so far, the cost is taken as
    proportional to size (optimistic for small batches: it errs towards admitting).
    """

    def __init__(self, alpha: float = 0.1) -> None:
        self.alpha = alpha
        self.samples = 0
        self._m = [0.0] * 5  # weighted means of 1, x, y, x*x, x*y

    def add(self, size: int, seconds: float) -> None:
        self.samples += 1
        w = max(self.alpha, 1.0 / self.samples)  # a plain mean until 1/alpha samples
        for i, v in enumerate((1.0, size, seconds, size * size, size * seconds)):
            self._m[i] += w * (v - self._m[i])

    def predict(self, size: int) -> float | None:
        if self.samples == 0:
            return None
        _, mx, my, mxx, mxy = self._m
        var = mxx - mx * mx
        if var > 1e-6 * max(mxx, 1.0):
            b = max((mxy - mx * my) / var, 0.0)
            a = max(my - b * mx, 0.0)
            return a + b * size
        return my * size / mx if mx > 0 else my

    @property
    def mean_s(self) -> float | None:
        return self._m[2] if self.samples else None


class DynamicBatcher:
    def __init__(
        self,
        infer: InferFn,
        *,
        model: str,
        version: str,
        max_batch_size: int = 32,
        max_queue_delay_us: int = 2000,
        max_queue_size: int = 1024,
        max_inflight_batches: int = 2,
        adaptive_delay: bool = False,
        adaptive_fraction: float = 0.5,
        admission: bool = True,
    ) -> None:
        self.model = model
        self.version = version
        self.max_batch_size = max_batch_size
        self.max_queue_size = max_queue_size
        self.max_inflight_batches = max_inflight_batches
        self.adaptive_delay = adaptive_delay
        self.adaptive_fraction = adaptive_fraction
        self.admission = admission
        self._infer = infer
        self._delay_s = max_queue_delay_us / 1e6
        self._cost = CostModel()  # seconds per Triton call, by batch size
        self._gap = _Ewma(0.2)  # seconds between arriving inputs
        self._last_arrival: float | None = None
        metrics.BATCH_DELAY.labels(model, version).set(self._delay_s)
        self._queue: deque[_Slice] = deque()
        self._depth = 0  # inputs in the queue
        self._wakeup = asyncio.Event()
        self._slots = asyncio.Semaphore(max_inflight_batches)
        self._worker: asyncio.Task[None] | None = None
        self._dispatches: set[asyncio.Task[None]] = set()
        self._closed = False
        self.stats = BatcherStats()

    @property
    def depth(self) -> int:
        return self._depth

    @property
    def cost_model(self) -> CostModel:
        return self._cost

    def current_delay_s(self) -> float:
        """How long a partial batch may wait for more inputs now."""
        if not self.adaptive_delay:
            return self._delay_s
        cost = self._cost.predict(self.max_batch_size)
        if cost is None:
            return self._delay_s
        delay = min(self._delay_s, self.adaptive_fraction * cost)
        gap = self._gap.value
        if gap is None or gap > delay:
            return 0.0  # no other input is likely to arrive in that time: go now
        return delay

    def estimate_s(self, n: int) -> float | None:
        """Seconds until a request of `n` inputs submitted now would be answered (a guess)."""
        if self._cost.samples < 3:
            return None
        queued = self._depth + n
        waves = math.ceil(queued / self.max_batch_size)
        full = self._cost.predict(self.max_batch_size) or 0.0
        last = self._cost.predict(queued - (waves - 1) * self.max_batch_size) or 0.0
        return (waves - 1) * full / self.max_inflight_batches + last

    async def submit(self, texts: Sequence[str], deadline: float) -> np.ndarray:
        """Scores [len(texts), k] for `texts`, or a `GatewayError` (OVERLOADED, TIMEOUT, ...)."""
        request = self._admit(texts, deadline)
        self._ensure_worker()
        try:
            scores = await asyncio.wait_for(request.future, deadline - time.monotonic())
        except asyncio.TimeoutError:
            # wait_for cancelled the future: its inputs are dropped if still queued
            raise GatewayError(ErrorCode.TIMEOUT, self._timeout_message(request)) from None
        metrics.INFERENCE_LATENCY.labels(self.model, self.version).observe(
            time.monotonic() - request.enqueued_at
        )
        return scores

    def _admit(self, texts: Sequence[str], deadline: float) -> _Request:
        n = len(texts)
        if self._closed:
            raise GatewayError(ErrorCode.MODEL_UNAVAILABLE, "the gateway is shutting down")
        if n == 0 or n > self.max_queue_size:
            raise GatewayError(
                ErrorCode.INVALID_INPUT, f"{n} inputs; a request holds 1 to {self.max_queue_size}"
            )
        if self._depth + n > self.max_queue_size:
            # never wait for room: a caller that is told at once can back off and retry
            self.stats.rejected_full += 1
            raise GatewayError(
                ErrorCode.OVERLOADED,
                f"queue of {self.model} {self.version} is full "
                f"({self._depth} of {self.max_queue_size} inputs waiting)",
            )
        now = time.monotonic()
        if deadline <= now:
            raise GatewayError(ErrorCode.TIMEOUT, "the deadline passed before the request queued")
        self._refuse_if_late(n, deadline - now)
        if self._last_arrival is not None:
            self._gap.add((now - self._last_arrival) / n)
        self._last_arrival = now
        future: asyncio.Future[np.ndarray] = asyncio.get_running_loop().create_future()
        request = _Request(texts, deadline, future, now, n, span=tracing.current())
        self._queue.append(_Slice(request, 0, n))
        self._change_depth(n)
        self._wakeup.set()
        return request

    def _refuse_if_late(self, n: int, left_s: float) -> None:
        if not self.admission:
            return
        estimate = self.estimate_s(n)
        if estimate is None or estimate <= left_s:
            return
        self.stats.rejected_late += 1
        cost = self._cost.predict(min(n, self.max_batch_size)) or 0.0
        if cost > left_s:
            raise GatewayError(
                ErrorCode.TIMEOUT,
                f"a deadline of {left_s * 1000:.0f} ms is shorter than one batch of "
                f"{self.model} {self.version} (~{cost * 1000:.0f} ms); refused at once",
            )
        raise GatewayError(
            ErrorCode.OVERLOADED,
            f"{self.model} {self.version} would answer in ~{estimate * 1000:.0f} ms "
            f"({self._depth} inputs queued), after the deadline of {left_s * 1000:.0f} ms; "
            "refused at once",
        )

    def _timeout_message(self, request: _Request) -> str:
        waited_ms = (time.monotonic() - request.enqueued_at) * 1000
        return (
            f"no answer from {self.model} {self.version} within the deadline ({waited_ms:.0f} ms)"
        )

    def _change_depth(self, delta: int) -> None:
        self._depth += delta
        metrics.QUEUE_DEPTH.labels(self.model, self.version).inc(delta)

    def _ensure_worker(self) -> None:
        # started lazily, on the loop of the first caller; restarted if it ever died
        if self._worker is None or self._worker.done():
            self._worker = asyncio.create_task(
                self._run(), name=f"batcher-{self.model}-{self.version}"
            )

    async def _run(self) -> None:
        while True:
            await self._wait_for_inputs()
            # a free slot first: while all slots are busy the queue keeps filling the next batch
            await self._slots.acquire()
            try:
                await self._wait_until_full_or_due()
                batch = self._take_batch()
            except BaseException:
                self._slots.release()
                raise
            if not batch:
                self._slots.release()
                continue
            task = asyncio.create_task(self._dispatch(batch))
            self._dispatches.add(task)
            task.add_done_callback(self._dispatches.discard)

    async def _wait_for_inputs(self) -> None:
        while not self._queue:
            self._wakeup.clear()
            await self._wakeup.wait()

    async def _wait_until_full_or_due(self) -> None:
        delay = self.current_delay_s()
        metrics.BATCH_DELAY.labels(self.model, self.version).set(delay)
        while self._depth < self.max_batch_size:
            due = self._queue[0].request.enqueued_at + delay
            left = due - time.monotonic()
            if left <= 0:
                return
            self._wakeup.clear()
            try:
                await asyncio.wait_for(self._wakeup.wait(), left)
            except asyncio.TimeoutError:
                return

    def _take_batch(self) -> list[_Slice]:
        """Pop up to max_batch_size live inputs off the queue, answering expired ones TIMEOUT."""
        batch: list[_Slice] = []
        room = self.max_batch_size
        now = time.monotonic()
        while self._queue and room > 0:
            piece = self._queue[0]
            request = piece.request
            if request.future.done() or request.deadline <= now:
                self._queue.popleft()
                self._change_depth(-len(piece))
                self._drop(request)
                continue
            if len(piece) > room:
                # split: the rest stays at the head and leads the next batch
                batch.append(_Slice(request, piece.start, piece.start + room))
                piece.start += room
                self._change_depth(-room)
                break
            self._queue.popleft()
            self._change_depth(-len(piece))
            batch.append(piece)
            room -= len(piece)
        return batch

    def _drop(self, request: _Request) -> None:
        if not request.future.done():
            self.stats.dropped_expired += 1
            request.fail(GatewayError(ErrorCode.TIMEOUT, self._timeout_message(request)))

    async def _dispatch(self, batch: list[_Slice]) -> None:
        try:
            await self._run_batch(batch)
        finally:
            self._slots.release()

    async def _run_batch(self, batch: list[_Slice]) -> None:
        """One call for `batch`; if it fails for its inputs, each request is served apart.

        An error that is not retryable (INVALID_INPUT, a model that fails on some text, out
        of memory) may be one request's doing: rather than fail every request the batch
        merged, the requests are split in halves and called again, until a failing request
        is alone. Only it fails; a retryable error (timeout, overload) fails them all.
        """
        try:
            texts = [t for s in batch for t in s.request.texts[s.start : s.stop]]
            self.stats.batches += 1
            self.stats.batch_sizes.append(len(texts))
            metrics.BATCH_SIZE.labels(self.model, self.version).observe(len(texts))
            # the latest deadline of the batch: no input is cut short by an earlier one
            timeout_s = max(s.request.deadline for s in batch) - time.monotonic()
            started = time.monotonic()
            causes = [r.span for r in _requests_of(batch)]
            with tracing.batch_span(self.model, self.version, len(texts), causes):
                scores = await self._call(texts, max(timeout_s, 0.001))
            cost = time.monotonic() - started
            self._cost.add(len(texts), cost)
            metrics.BATCH_SECONDS.labels(self.model, self.version).observe(cost)
            offset = 0
            for piece in batch:
                piece.request.fill(piece.start, scores[offset : offset + len(piece)])
                offset += len(piece)
        except Exception as error:
            if not isinstance(error, GatewayError):
                log.exception("batch of %s %s failed", self.model, self.version)
                # the class only: the exception's text (logged above) is internals
                error = GatewayError(ErrorCode.INTERNAL, f"batch failed ({type(error).__name__})")
            requests = _requests_of(batch)
            if error.retryable or len(requests) < 2:
                for piece in batch:
                    piece.request.fail(error)
                return
            await self._split(batch, requests)

    async def _split(self, batch: list[_Slice], requests: list[_Request]) -> None:
        halves = (set(requests[: len(requests) // 2]), set(requests[len(requests) // 2 :]))
        for half in halves:
            now = time.monotonic()
            live = []
            for piece in batch:
                if piece.request not in half:
                    continue
                if piece.request.future.done() or piece.request.deadline <= now:
                    self._drop(piece.request)
                else:
                    live.append(piece)
            if live:
                await self._run_batch(live)

    async def _call(self, texts: list[str], timeout_s: float) -> np.ndarray:
        try:
            scores = await self._infer(texts, timeout_s)
        except GatewayError:
            raise
        except Exception as error:
            log.exception("inference call of %s %s failed", self.model, self.version)
            raise GatewayError(
                ErrorCode.INTERNAL, f"inference failed ({type(error).__name__})"
            ) from error
        if len(scores) != len(texts):
            raise GatewayError(
                ErrorCode.INTERNAL, f"{len(scores)} rows of scores for {len(texts)} inputs"
            )
        return scores

    async def close(self) -> None:
        """Stop: queued inputs are answered MODEL_UNAVAILABLE, batches at Triton finish."""
        self._closed = True
        if self._worker is not None:
            self._worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._worker
        while self._queue:
            piece = self._queue.popleft()
            self._change_depth(-len(piece))
            piece.request.fail(GatewayError(ErrorCode.MODEL_UNAVAILABLE, "the batcher closed"))
        if self._dispatches:
            await asyncio.gather(*self._dispatches, return_exceptions=True)


def _requests_of(batch: list[_Slice]) -> list[_Request]:
    """The distinct requests of a batch, in order."""
    return list(dict.fromkeys(piece.request for piece in batch))
