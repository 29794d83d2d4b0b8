"""The online feature reader used by the workflow's `features` step.

One Redis round trip per read (a pipeline of the view's built marker, its signature pointer
and the entity's hash), a short in-process TTL cache in front, and an answer within the
caller's timeout: when Redis is slow or down the view's defaults come back flagged
`is_fallback`, and the ticket goes on. After a failure the reader answers with fallbacks at
once for `retry_after_s` instead of making every ticket wait for a dead server.

A view whose data was built under another definition is refused with `SignatureMismatch`,
naming both signatures; a view nobody has built yet (no feature job ran) reads as fallbacks.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from feature_jobs import metrics
from feature_jobs.store import ViewKeys, materialize
from schemas.features import FeatureView
from schemas.tickets import FeatureValue
from streams.redis_config import Target, async_client

log = logging.getLogger(__name__)

# kept for importers of the earlier module
FETCH_SECONDS = metrics.FETCH_SECONDS
COVERAGE = metrics.COVERAGE


def signature_key(view: str, prefix: str = "tf:fv") -> str:
    return f"{prefix}:{view}:__signature__"


class SignatureMismatch(RuntimeError):
    """The store's data for a view was built under another definition than the code's."""

    def __init__(self, view: str, stored: str, code: str) -> None:
        self.view, self.stored, self.code = view, stored, code
        super().__init__(
            f"feature view {view!r}: the store holds data built under signature {stored}, "
            f"the code defines signature {code}; rebuild the view (run the feature job, "
            "`ticketflow features`) before serving it"
        )


class _NotBuilt(Exception):
    pass


class _Unreadable(Exception):
    pass


class _Coverage:
    """Real and total values served over a sliding window of whole seconds."""

    def __init__(self, window_s: float) -> None:
        self._window = max(1, int(window_s))
        self._buckets: deque[list[int]] = deque()
        self.real = 0
        self.total = 0

    def add(self, real: int, total: int, now: float) -> float:
        sec = int(now)
        b = self._buckets
        if b and b[-1][0] == sec:
            b[-1][1] += real
            b[-1][2] += total
        else:
            b.append([sec, real, total])
        self.real += real
        self.total += total
        while b and b[0][0] <= sec - self._window:
            _, r, t = b.popleft()
            self.real -= r
            self.total -= t
        return self.real / self.total if self.total else 1.0


class OnlineFeatureReader:
    def __init__(
        self,
        redis_url: Target,
        views: dict[str, FeatureView],
        cache_ttl_s: float = 2.0,
        *,
        key_prefix: str | None = None,
        cache_size: int = 100_000,
        coverage_window_s: float = 60.0,
        retry_after_s: float = 0.5,
        record_metrics: bool = True,
    ):
        if key_prefix is None:
            from feature_jobs.settings import FeatureSettings

            key_prefix = FeatureSettings().key_prefix
        # no client-side retries: the caller's timeout and our fallback are the policy
        self._redis = async_client(
            redis_url,
            socket_timeout=1.0,
            socket_connect_timeout=0.5,
            retry=Retry(NoBackoff(), 0),
        )
        self._views = views
        self._keys = {name: ViewKeys.of(v, key_prefix) for name, v in views.items()}
        self._cache_ttl_s = cache_ttl_s
        self._cache_size = cache_size
        self._cache: dict[tuple[str, str], tuple[float, dict[str, FeatureValue]]] = {}
        self._coverage = {name: _Coverage(coverage_window_s) for name in views}
        self._retry_after_s = retry_after_s
        self._down_until = 0.0
        self._metrics = record_metrics
        self._warned: set[str] = set()

    async def read(
        self, view: str, entity_id: str | None, timeout_s: float
    ) -> dict[str, FeatureValue]:
        spec = self._views[view]
        if entity_id is None:
            return self._count(view, _fallback(spec), "no_entity")
        now = time.monotonic()
        key = (view, entity_id)
        cached = self._cache.get(key)
        if cached is not None:
            if cached[0] > now:
                return self._count(view, cached[1], "cache")
            del self._cache[key]
        if now < self._down_until:
            return self._count(view, _fallback(spec), "fallback")
        started = time.perf_counter()
        try:
            values = await asyncio.wait_for(self._fetch(spec, entity_id), timeout_s)
        except SignatureMismatch:
            self._observe(view, started, "mismatch")
            raise
        except _NotBuilt:
            self._observe(view, started, "not_built")
            return self._count(view, _fallback(spec), None)
        except _Unreadable:
            self._observe(view, started, "unreadable")
            return self._count(view, _fallback(spec), None)
        except (TimeoutError, aioredis.RedisError, OSError) as exc:
            self._down_until = time.monotonic() + self._retry_after_s
            self._observe(view, started, "fallback")
            log.debug("feature read %s/%s fell back: %r", view, entity_id, exc)
            return self._count(view, _fallback(spec), None)
        self._observe(view, started, "redis")
        if self._cache_ttl_s > 0:
            if len(self._cache) >= self._cache_size:
                self._evict(now)
            self._cache[key] = (now + self._cache_ttl_s, values)
        return self._count(view, values, None)

    async def _fetch(self, spec: FeatureView, entity_id: str) -> dict[str, FeatureValue]:
        keys = self._keys[spec.name]
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.get(keys.built)
            pipe.get(keys.pointer)
            pipe.hgetall(keys.state(entity_id))
            built, pointer, raw = await pipe.execute()
        if built is None or built.decode() != keys.signature:
            if pointer is not None and pointer.decode() != keys.signature:
                raise SignatureMismatch(spec.name, pointer.decode(), keys.signature)
            if spec.name not in self._warned:
                self._warned.add(spec.name)
                log.warning(
                    "feature view %s (signature %s) is not built: serving its defaults as "
                    "fallbacks until the feature job has built it",
                    spec.name,
                    keys.tag,
                )
            raise _NotBuilt
        try:
            values = materialize(spec, raw or {}, int(time.time() * 1000))
        except (ValueError, TypeError, IndexError) as exc:
            # a hash this code cannot read (written by hand, or by a buggy job): this
            # entity's tickets get fallbacks, as when Redis is down, and go on
            log.warning("feature view %s: unreadable state for an entity (%r)", spec.name, exc)
            raise _Unreadable from None
        return {name: FeatureValue(value=v, is_fallback=False) for name, v in values.items()}

    def _observe(self, view: str, started: float, result: str) -> None:
        if self._metrics:
            metrics.FETCH_SECONDS.labels(view).observe(time.perf_counter() - started)
            metrics.READS.labels(view, result).inc()

    def _count(
        self, view: str, values: dict[str, FeatureValue], result: str | None
    ) -> dict[str, FeatureValue]:
        real = sum(not v.is_fallback for v in values.values())
        ratio = self._coverage[view].add(real, len(values), time.monotonic())
        if self._metrics:
            metrics.COVERAGE.labels(view).set(ratio)
            if result is not None:
                metrics.READS.labels(view, result).inc()
        return values

    def coverage(self, view: str) -> float:
        """The share of real values this reader served over its coverage window."""
        c = self._coverage[view]
        c.add(0, 0, time.monotonic())
        return c.real / c.total if c.total else 1.0

    def _evict(self, now: float) -> None:
        expired = [k for k, (exp, _) in self._cache.items() if exp <= now]
        for k in expired:
            del self._cache[k]
        while len(self._cache) >= self._cache_size:
            del self._cache[next(iter(self._cache))]

    def invalidate(self) -> None:
        self._cache.clear()

    async def close(self) -> None:
        await self._redis.aclose()


def _fallback(spec: FeatureView) -> dict[str, FeatureValue]:
    return {f.name: FeatureValue(value=_copy(f.default), is_fallback=True) for f in spec.features}


def _copy(value: Any) -> Any:
    return list(value) if isinstance(value, list) else value
