"""The gateway's work, apart from HTTP: route a request, batch it, shape the answer, drain.

`InferenceService` owns the router, the response cache and one `DynamicBatcher` per (model,
version), created on first use. Its backend is anything with `TritonClient`'s
`infer`/`ready`/`close`, so the tests run it on a fake.

A request without a pinned `version` is routed per input id: its inputs are split into one
group per version, the groups go through their versions' batchers concurrently, and the
outputs come back in the request's order, each naming its `version`. If a group fails, the
request fails with that group's error (the first failing group's, in request order).

Within a group, each input's text is normalised once (`cache.normalize_text`) and then
looked up, in order:
1. the response cache, by (model, version, normalised text): a hit is answered at once;
2. the same text earlier in the request, or already in flight for another request: it
   shares that computation (`dedupe`); if that one fails for lack of *its* time (TIMEOUT) or
   its caller goes away while this one still has time, this one is computed on its own;
3. else it goes to the batcher, and its scores go into the cache.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, cast

import numpy as np

from inference_gateway import metrics
from inference_gateway.batcher import DynamicBatcher
from inference_gateway.cache import Key, ResponseCache, normalize_text, text_digest
from inference_gateway.config import GatewayConfig
from inference_gateway.errors import ErrorCode, GatewayError
from inference_gateway.routing import Router
from schemas.gateway import PredictInput, PredictRequest
from schemas.tickets import CATEGORIES

log = logging.getLogger(__name__)

PROBE_TEXT = "readiness probe: where is my parcel?"
PROBE_TIMEOUT_S = 2.0


class InferenceBackend(Protocol):
    async def infer(
        self, texts: Sequence[str], version: str, timeout_s: float, *, model: str | None = None
    ) -> np.ndarray: ...

    async def ready(self, model: str | None = None, version: str = "v1") -> bool: ...

    async def close(self) -> None: ...


@dataclass(eq=False)
class _Flight:
    """A text being computed for some request; others with the same text may await it."""

    future: asyncio.Future[np.ndarray]
    deadline: float


def _consume_exception(future: asyncio.Future[np.ndarray]) -> None:
    # a shared result nobody else awaited must not log "exception was never retrieved"
    if not future.cancelled():
        future.exception()


class InferenceService:
    def __init__(
        self, backend: InferenceBackend, config: GatewayConfig, router: Router | None = None
    ) -> None:
        self.backend = backend
        self.config = config
        self.router = router or Router()
        self.cache = ResponseCache(config.cache_size, config.cache_ttl_s)
        self._flights: dict[Key, _Flight] = {}
        self._lookups: dict[tuple[str, str], list[int]] = {}  # (hits, lookups)
        # set by the server when a routing watcher runs: its status goes into /readyz
        self.routing_status: Callable[[], dict[str, Any]] | None = None
        self._batchers: dict[tuple[str, str], DynamicBatcher] = {}
        self._draining = False
        self._inflight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._ready_until = 0.0
        self._ready_report: dict[str, Any] = {}
        self._probe_lock = asyncio.Lock()

    @property
    def draining(self) -> bool:
        return self._draining

    def batcher(self, model: str, version: str) -> DynamicBatcher:
        key = (model, version)
        if key not in self._batchers:
            infer = functools.partial(self._infer, model, version)
            self._batchers[key] = DynamicBatcher(
                infer,
                model=model,
                version=version,
                max_batch_size=self.config.max_batch_size,
                max_queue_delay_us=self.config.max_queue_delay_us,
                max_queue_size=self.config.max_queue_size,
                max_inflight_batches=self.config.max_inflight_batches,
                adaptive_delay=self.config.adaptive_delay,
                admission=self.config.admission,
            )
        return self._batchers[key]

    async def _batcher_for(self, model: str, version: str) -> DynamicBatcher:
        # a pinned version outside the routing config gets a batcher (kept for the process's
        # life) only once Triton serves it, so callers naming versions at random cannot grow
        # the gateway's batchers and metric labels without bound
        unknown = (model, version) not in self._batchers and not self._is_routed(model, version)
        if unknown and not await self.backend.ready(model, version):
            raise GatewayError(
                ErrorCode.MODEL_UNAVAILABLE, f"{model} {version} is not loaded in Triton"
            )
        return self.batcher(model, version)

    def _is_routed(self, model: str, version: str) -> bool:
        config = self.router.config(model)
        return config is not None and version in config.versions

    async def _infer(self, model: str, version: str, texts: list[str], timeout_s: float) -> Any:
        return await self.backend.infer(texts, version, timeout_s, model=model)

    async def predict(self, model: str, request: PredictRequest) -> dict[str, Any]:
        """The PredictResponse body (a dict: built for 1024 outputs, it skips re-validation)."""
        if self._draining:
            raise GatewayError(ErrorCode.MODEL_UNAVAILABLE, "the gateway is shutting down")
        self._inflight += 1
        self._idle.clear()
        try:
            return await self._predict(model, request)
        finally:
            self._inflight -= 1
            if self._inflight == 0:
                self._idle.set()

    async def _predict(self, model: str, request: PredictRequest) -> dict[str, Any]:
        started = time.perf_counter()
        # a version per input id, so routing stays sticky per ticket however callers batch
        # tickets; a pinned `version` applies to every input
        ids = [item.id for item in request.inputs]
        groups = version_groups(self.router.choose_each(model, ids, request.version))
        timeout_ms = request.timeout_ms or self.config.default_timeout_ms
        deadline = time.monotonic() + timeout_ms / 1000
        texts, digests = await normalize_all([item.text for item in request.inputs])
        batchers = [await self._batcher_for(model, version) for version in groups]
        scores = await self._group_scores(batchers, list(groups.values()), texts, digests, deadline)
        outputs: list[dict[str, Any]] = [{}] * len(texts)  # every slot filled: groups cover all
        for (version, indices), rows in zip(groups.items(), scores, strict=True):
            answered = outputs_of([request.inputs[i] for i in indices], rows, version)
            for i, output in zip(indices, answered, strict=True):
                outputs[i] = output
        for version, indices in groups.items():  # counted once the whole request succeeded
            metrics.OUTPUTS.labels(model, version).inc(len(indices))
        return {
            "model": model,
            "version": outputs[0]["version"],  # the first input's (see PredictResponse)
            "outputs": outputs,
            "latency_ms": round((time.perf_counter() - started) * 1000, 3),
        }

    async def _group_scores(
        self,
        batchers: list[DynamicBatcher],
        groups: list[list[int]],
        texts: list[str],
        digests: list[bytes],
        deadline: float,
    ) -> list[np.ndarray]:
        """Each version group's scores, the groups computed concurrently.

        Every group runs to its end (bounded by the shared deadline: no orphaned work, no
        unretrieved errors); if any failed, the request fails with the error of the first
        failing group in request order.
        """
        if len(groups) == 1:  # the common case: no task to spawn
            return [await self._scores(batchers[0], texts, digests, deadline)]
        results = await asyncio.gather(
            *(
                self._scores(
                    batcher, [texts[i] for i in indices], [digests[i] for i in indices], deadline
                )
                for batcher, indices in zip(batchers, groups, strict=True)
            ),
            return_exceptions=True,
        )
        scores: list[np.ndarray] = []
        for result in results:
            if isinstance(result, BaseException):
                raise result
            scores.append(result)
        return scores

    async def _scores(
        self, batcher: DynamicBatcher, texts: list[str], digests: list[bytes], deadline: float
    ) -> np.ndarray:
        """Scores [len(texts), k]: from the cache, shared with identical inputs, or computed."""
        model, version = batcher.model, batcher.version
        rows: list[np.ndarray | None] = [None] * len(texts)
        # texts to compute: (key, indices answered); keyed by cache key, or by index when
        # dedupe is off (every input is then computed, duplicates too)
        todo: dict[Any, tuple[Key, list[int]]] = {}
        joined: dict[int, asyncio.Future[np.ndarray]] = {}
        counts = {"hit": 0, "miss": 0, "shared": 0}
        for i, digest in enumerate(digests):
            key: Key = (model, version, digest)
            row = self.cache.get(key)
            if row is not None:
                rows[i] = row
                counts["hit"] += 1
            elif self.config.dedupe and key in todo:
                todo[key][1].append(i)
                counts["shared"] += 1
            elif (flight := self._joinable(key)) is not None:
                joined[i] = flight.future
                counts["shared"] += 1
            else:
                todo[key if self.config.dedupe else i] = (key, [i])
                counts["miss"] += 1
        self._count_lookups(model, version, counts)
        if todo:
            await self._compute(batcher, texts, todo, rows, deadline)
        for i, future in joined.items():
            rows[i] = await self._join(batcher, future, texts[i], deadline)
        # every row is set by now (cache hits, the computed ones, the joined ones): none is None
        return np.stack(cast(list[np.ndarray], rows))

    def _joinable(self, key: Key) -> _Flight | None:
        if not self.config.dedupe:
            return None
        flight = self._flights.get(key)
        return None if flight is None or flight.future.done() else flight

    async def _compute(
        self,
        batcher: DynamicBatcher,
        texts: list[str],
        todo: dict[Any, tuple[Key, list[int]]],
        rows: list[np.ndarray | None],
        deadline: float,
    ) -> None:
        loop = asyncio.get_running_loop()
        flights: list[_Flight] = []
        for key, _ in todo.values():
            flight = _Flight(loop.create_future(), deadline)
            flight.future.add_done_callback(_consume_exception)
            flights.append(flight)
            if self.config.dedupe:
                self._flights[key] = flight
        try:
            scores = await batcher.submit([texts[ix[0]] for _, ix in todo.values()], deadline)
        except asyncio.CancelledError:
            for flight in flights:
                flight.future.cancel()  # those who joined compute for themselves
            raise
        except BaseException as error:
            for flight in flights:
                flight.future.set_exception(error)
            raise
        finally:
            for (key, _), flight in zip(todo.values(), flights, strict=True):
                if self._flights.get(key) is flight:
                    del self._flights[key]
        for j, ((key, indices), flight) in enumerate(zip(todo.values(), flights, strict=True)):
            row = scores[j]
            self.cache.put(key, row)
            flight.future.set_result(row)
            for i in indices:
                rows[i] = row
        metrics.CACHE_ENTRIES.set(len(self.cache))

    async def _join(
        self,
        batcher: DynamicBatcher,
        future: asyncio.Future[np.ndarray],
        text: str,
        deadline: float,
    ) -> np.ndarray:
        try:
            return await asyncio.wait_for(asyncio.shield(future), deadline - time.monotonic())
        except asyncio.TimeoutError:
            raise GatewayError(
                ErrorCode.TIMEOUT,
                f"no answer from {batcher.model} {batcher.version} within the deadline",
            ) from None
        except asyncio.CancelledError:
            if not future.cancelled():
                raise  # we were cancelled, not the request we joined
        except GatewayError as error:
            # the request we joined ran out of *its* time; ours may be later: try ourselves
            if error.code is not ErrorCode.TIMEOUT or time.monotonic() >= deadline:
                raise
        # the request we joined was cancelled or timed out before us: compute ourselves
        return (await batcher.submit([text], deadline))[0]

    def _count_lookups(self, model: str, version: str, counts: dict[str, int]) -> None:
        if not self.cache.enabled and not self.config.dedupe:
            return
        for result, n in counts.items():
            if n:
                metrics.CACHE.labels(model, version, result).inc(n)
        tally = self._lookups.setdefault((model, version), [0, 0])
        tally[0] += counts["hit"]
        tally[1] += sum(counts.values())
        if self.cache.enabled:
            metrics.CACHE_HIT_RATIO.labels(model, version).set(tally[0] / tally[1])

    def hit_ratio(self, model: str, version: str) -> float:
        """Share of `model` `version`'s inputs answered from the cache since start."""
        hits, total = self._lookups.get((model, version), (0, 0))
        return hits / total if total else 0.0

    async def readiness(self) -> tuple[bool, dict[str, Any]]:
        """(ready, report): each model's default version is loaded and answered a probe."""
        if self._draining:
            return False, {"ready": False, "reason": "shutting down"}
        if time.monotonic() < self._ready_until:
            return True, self._ready_report
        async with self._probe_lock:  # one probe at a time, however many callers
            if time.monotonic() < self._ready_until:
                return True, self._ready_report
            ready, report = await self._probe_all()
            if ready:
                self._ready_until = time.monotonic() + self.config.ready_cache_s
                self._ready_report = report
            return ready, report

    async def _probe_all(self) -> tuple[bool, dict[str, Any]]:
        # a canary version that fails is reported but does not fail readiness: taking every
        # gateway out of service would turn a 10 % canary outage into a 100 % one
        ready, versions = True, {}
        for model in self.router.models:
            config = self.router.config(model)
            assert config is not None
            for version, weight in config.versions.items():
                if weight == 0 and version != config.default:
                    continue
                status = await self._probe(model, version)
                versions[f"{model}/{version}"] = status
                ready = ready and (status == "ok" or version != config.default)
        report: dict[str, Any] = {"ready": ready, "versions": versions}
        if self.routing_status is not None:
            report["routing"] = self.routing_status()
        return ready, report

    async def _probe(self, model: str, version: str) -> str:
        if not await self.backend.ready(model, version):
            return "not ready"
        try:
            scores = await self.backend.infer([PROBE_TEXT], version, PROBE_TIMEOUT_S, model=model)
            outputs_of([PredictInput(id="probe", text=PROBE_TEXT)], scores)
        except GatewayError as error:
            return f"{error.code.value}: {error.message}"
        return "ok"

    async def drain(self, timeout_s: float) -> bool:
        """Refuse new requests, wait up to `timeout_s` for admitted ones; True if all finished."""
        self._draining = True
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        except asyncio.TimeoutError:
            log.warning(
                "%d requests still running after %.1f s of draining", self._inflight, timeout_s
            )
            return False
        return True

    async def close(self) -> None:
        self._draining = True
        await asyncio.gather(*(b.close() for b in self._batchers.values()))
        await self.backend.close()


# characters normalised on the loop; more go to a thread. NFKC costs ~0.15 µs a character
# (up to ~5 ms for a 20,000-character text that NFKC lengthens), so this keeps any one stay
# on the loop under a millisecond while sparing single tickets the thread hand-off.
INLINE_NORMALIZE_CHARS = 4096


async def normalize_all(texts: list[str]) -> tuple[list[str], list[bytes]]:
    """(`normalize_text` of each text, its digest for the cache key), off the event loop
    when there is much to do: the thread lets go of the GIL between slices and texts, so
    the loop keeps serving meanwhile (hashing 1,024 long texts alone takes ~0.1 s)."""
    if sum(map(len, texts)) <= INLINE_NORMALIZE_CHARS:
        return _normalize_each(texts)
    return await asyncio.to_thread(_normalize_each, texts)


def _normalize_each(texts: list[str]) -> tuple[list[str], list[bytes]]:
    normalized = [normalize_text(text) for text in texts]
    return normalized, [text_digest(text) for text in normalized]


def version_groups(versions: Sequence[str]) -> dict[str, list[int]]:
    """The input indices of each version, groups in order of their first input."""
    groups: dict[str, list[int]] = {}
    for i, version in enumerate(versions):
        groups.setdefault(version, []).append(i)
    return groups


def outputs_of(
    inputs: Sequence[PredictInput], scores: np.ndarray, version: str | None = None
) -> list[dict[str, Any]]:
    """One `{"id", "label", "confidence", "scores", "version"}` per input, labels in
    CATEGORIES order; `version` is the one that computed `scores`."""
    if scores.shape != (len(inputs), len(CATEGORIES)) or not np.isfinite(scores).all():
        raise GatewayError(
            ErrorCode.INTERNAL,
            f"model returned scores of shape {scores.shape} (or non-finite), "
            f"expected ({len(inputs)}, {len(CATEGORIES)})",
        )
    best = scores.argmax(axis=1)
    rows = scores.tolist()
    return [
        {
            "id": item.id,
            "label": CATEGORIES[int(best[i])],
            "confidence": rows[i][int(best[i])],
            "scores": dict(zip(CATEGORIES, rows[i], strict=True)),
            "version": version,
        }
        for i, item in enumerate(inputs)
    ]
