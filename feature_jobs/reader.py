"""The online feature reader used by the workflow's `features` step.

One Redis round trip per ticket (a pipeline of the view's hash and its signature), a short
in-process TTL cache in front, and an answer within the caller's timeout: when Redis is slow
or down the view's defaults come back flagged `is_fallback`, and the ticket goes on.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import orjson
import redis.asyncio as aioredis
from prometheus_client import Gauge, Histogram

from schemas.features import FeatureView
from schemas.tickets import FeatureValue

FETCH_SECONDS = Histogram(
    "feature_fetch_seconds",
    "Online feature read latency",
    ["view"],
    buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0),
)
COVERAGE = Gauge("feature_coverage_ratio", "Share of real (non-fallback) values served", ["view"])


def data_key(view: str, entity_id: str) -> str:
    return f"tf:fv:{view}:{entity_id}"


def signature_key(view: str) -> str:
    return f"tf:fv:{view}:__signature__"


class SignatureMismatch(RuntimeError):
    def __init__(self, view: str, stored: str, code: str) -> None:
        super().__init__(
            f"feature view {view!r}: stored signature {stored[:12]} differs from the code's "
            f"{code[:12]}; rebuild the view before serving it"
        )


class OnlineFeatureReader:
    def __init__(self, redis_url: str, views: dict[str, FeatureView], cache_ttl_s: float = 2.0):
        self._redis = aioredis.from_url(redis_url, socket_timeout=1.0, socket_connect_timeout=0.5)
        self._views = views
        self._cache_ttl_s = cache_ttl_s
        self._cache: dict[tuple[str, str], tuple[float, dict[str, FeatureValue]]] = {}
        self._served = {name: [0, 0] for name in views}  # real, total

    async def read(
        self, view: str, entity_id: str | None, timeout_s: float
    ) -> dict[str, FeatureValue]:
        spec = self._views[view]
        if entity_id is None:
            return self._count(view, _fallback(spec))
        cached = self._cache.get((view, entity_id))
        if cached and cached[0] > time.monotonic():
            return self._count(view, cached[1])
        with FETCH_SECONDS.labels(view).time():
            try:
                values = await asyncio.wait_for(self._fetch(spec, entity_id), timeout_s)
            except SignatureMismatch:
                raise
            except (TimeoutError, aioredis.RedisError, OSError):
                return self._count(view, _fallback(spec))
        self._cache[(view, entity_id)] = (time.monotonic() + self._cache_ttl_s, values)
        return self._count(view, values)

    async def _fetch(self, spec: FeatureView, entity_id: str) -> dict[str, FeatureValue]:
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.get(signature_key(spec.name))
            pipe.hgetall(data_key(spec.name, entity_id))
            stored_sig, raw = await pipe.execute()
        if stored_sig is not None and stored_sig.decode() != spec.signature():
            raise SignatureMismatch(spec.name, stored_sig.decode(), spec.signature())
        return _merge(spec, raw or {})

    def _count(self, view: str, values: dict[str, FeatureValue]) -> dict[str, FeatureValue]:
        served = self._served[view]
        served[0] += sum(not v.is_fallback for v in values.values())
        served[1] += len(values)
        COVERAGE.labels(view).set(served[0] / served[1] if served[1] else 0.0)
        return values

    async def close(self) -> None:
        await self._redis.aclose()


def _fallback(spec: FeatureView) -> dict[str, FeatureValue]:
    return {f.name: FeatureValue(value=f.default, is_fallback=True) for f in spec.features}


def _merge(spec: FeatureView, raw: dict[bytes, bytes]) -> dict[str, FeatureValue]:
    out: dict[str, FeatureValue] = {}
    for f in spec.features:
        stored = raw.get(f.name.encode())
        if stored is None:
            out[f.name] = FeatureValue(value=f.default, is_fallback=True)
        else:
            out[f.name] = FeatureValue(value=_load(stored), is_fallback=False)
    return out


def _load(stored: bytes) -> Any:
    try:
        return orjson.loads(stored)
    except orjson.JSONDecodeError:
        return stored.decode("utf-8", "replace")
