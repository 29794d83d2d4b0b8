"""The gateway's work, apart from HTTP: route a request, batch it, shape the answer, drain.

`InferenceService` owns the router and one `DynamicBatcher` per (model, version), created
on first use. Its backend is anything with `TritonClient`'s `infer`/`ready`/`close`, so the
tests run it on a fake.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from inference_gateway.batcher import DynamicBatcher
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


class InferenceService:
    def __init__(
        self, backend: InferenceBackend, config: GatewayConfig, router: Router | None = None
    ) -> None:
        self.backend = backend
        self.config = config
        self.router = router or Router()
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
        # one version per request, chosen by its first input's id: a request's outputs then
        # share one `version`, and a caller sending one ticket per request is sticky per ticket
        version = self.router.choose(model, request.inputs[0].id, request.version)
        timeout_ms = request.timeout_ms or self.config.default_timeout_ms
        deadline = time.monotonic() + timeout_ms / 1000
        texts = [item.text for item in request.inputs]
        batcher = await self._batcher_for(model, version)
        scores = await batcher.submit(texts, deadline)
        return {
            "model": model,
            "version": version,
            "outputs": outputs_of(request.inputs, scores),
            "latency_ms": round((time.perf_counter() - started) * 1000, 3),
        }

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
        return ready, {"ready": ready, "versions": versions}

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


def outputs_of(inputs: Sequence[PredictInput], scores: np.ndarray) -> list[dict[str, Any]]:
    """One `{"id", "label", "confidence", "scores"}` per input, labels in CATEGORIES order."""
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
        }
        for i, item in enumerate(inputs)
    ]
