"""What ingest does for a request, apart from HTTP: keys, quotas, tickets, the index.

Redis down, precisely (`TICKETFLOW_INGEST_AUTH_FAIL_OPEN`, `..._LIMITS_FAIL_OPEN`):

- keys: a key looked up within `key_cache_s` is served from the local cache either way.
  Closed (default): any other request gets 503 (no authentication without Redis; never
  401, since the key may well be valid). Open: a key looked up successfully within
  `stale_key_s` keeps working; unknown keys still get 503.
- limits: closed (default): 503. Open: the request passes without a bucket, and without
  RateLimit fields.
- the ticket index (owner of each ticket_id): follows the auth setting. Closed: 503.
  Open: tickets are produced without an index entry (GET then answers 404 for them).
- idempotency keys and `GET /v1/tickets/{id}`: 503 either way; a replay guarantee that
  cannot be kept must not be pretended.

Every such failure counts in `ingest_redis_failures_total{purpose,outcome}`.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

import aiohttp
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from ingest import metrics
from ingest.http_fields import Bucket, child_traceparent, retry_after, trace_id
from ingest.idempotency import IdempotencyStore
from ingest.index import TERMINAL, ResultIndexer, TicketIndex
from ingest.keys import TOKEN_RE, KeyCache, KeyRecord, KeyStore, digest
from ingest.limits import Limit, Limits, LimitStore, Verdict
from ingest.problems import Problem, ProblemError
from ingest.producer import AckProducer, Failures, kafka_config
from ingest.redis_mux import MuxRedis
from ingest.settings import IngestSettings
from ingest.tickets import Accepted, Rejected, Submission
from streams.redis_config import async_client
from streams.topics import Topics

log = logging.getLogger(__name__)

REDIS_RETRY_AFTER_S = 2
KAFKA_RETRY_AFTER_S = 5


def redis_client(settings: IngestSettings) -> Redis:
    # one quick retry for a pooled connection gone stale, no backoff: an outage must fail
    # a request in about `redis_timeout_s`, not hold it through redis-py's 10 retries
    return async_client(
        settings.redis,
        socket_timeout=settings.redis_timeout_s,
        socket_connect_timeout=settings.redis_timeout_s,
        retry=Retry(NoBackoff(), 1),
    )


def redis_unavailable() -> ProblemError:
    return ProblemError(
        Problem(
            503,
            "redis-unavailable",
            "try again later",
            headers={"Retry-After": str(REDIS_RETRY_AFTER_S)},
        )
    )


def kafka_unavailable(pointer: str | None = None) -> Problem:
    errors = [{"pointer": pointer, "detail": "not acknowledged"}] if pointer is not None else []
    return Problem(
        503,
        "kafka-unavailable",
        "Kafka did not acknowledge the record in time; nothing was accepted",
        errors,
        headers={"Retry-After": str(KAFKA_RETRY_AFTER_S)},
    )


@dataclass
class Outcome:
    """A submission's answer: the accepted and rejected tickets, and the trace they carry."""

    batch: bool
    traceparent: str
    accepted: list[dict] = field(default_factory=list)
    rejected: list[tuple[int, Problem]] = field(default_factory=list)
    undelivered: int = 0

    @property
    def retryable(self) -> bool:
        """Kafka refused some record: the request may be sent again as it is."""
        return self.undelivered > 0

    def body(self) -> dict:
        rejected = [
            {"index": i, "problem": p.body()} for i, p in sorted(self.rejected, key=lambda r: r[0])
        ]
        return {"accepted": self.accepted, "rejected": rejected}


class IngestService:
    def __init__(self, settings: IngestSettings, producer: AckProducer | None = None) -> None:
        self.settings = settings
        self.topics = Topics(settings.topic_prefix)
        self.redis = MuxRedis(settings.redis, settings.redis_timeout_s)
        prefix = settings.redis_prefix
        self.keys = KeyStore(self.redis, prefix)
        self.key_cache = KeyCache(settings.key_cache_s)
        defaults = Limits(
            key=Limit(rate=settings.key_rate, burst=settings.key_burst),
            ip=Limit(rate=settings.ip_rate, burst=settings.ip_burst),
        )
        self.limits = LimitStore(self.redis, prefix, defaults)
        lock_s = 2 * settings.produce_timeout_s + 30
        self.idempotency = IdempotencyStore(self.redis, prefix, settings.idempotency_ttl_s, lock_s)
        self.index = TicketIndex(self.redis, prefix, settings.ticket_ttl_s)
        self.producer = producer or AckProducer(kafka_config(settings), settings.produce_timeout_s)
        self.indexer: ResultIndexer | None = None
        self._http: aiohttp.ClientSession | None = None

    # ---- life ---------------------------------------------------------------------------------

    async def start(self) -> None:
        self.producer.start(asyncio.get_running_loop())
        self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=0.5))
        if self.settings.index_results:
            self.indexer = ResultIndexer(
                kafka_config(self.settings),
                self.topics,
                self.settings.redis,
                self.settings.redis_prefix,
            )
            self.indexer.start()

    async def close(self) -> None:
        await asyncio.to_thread(self.producer.close)
        if self.indexer is not None:
            await asyncio.to_thread(self.indexer.stop)
        if self._http is not None:
            await self._http.close()
        await self.redis.aclose()

    # ---- keys and quotas ------------------------------------------------------------------------

    async def authenticate(self, token: str | None) -> KeyRecord | None:
        if token is None or not TOKEN_RE.match(token):
            return None  # not one of ours: no need to ask Redis
        d = digest(token)
        cached = self.key_cache.get(d)
        if cached is not None:
            return cached.record
        try:
            record = await self.keys.lookup(d)
        except RedisError:
            return self._stale_key(d)
        self.key_cache.put(d, record)
        return record

    def _stale_key(self, d: str) -> KeyRecord:
        if self.settings.auth_fail_open:
            stale = self.key_cache.get(d, self.settings.stale_key_s)
            if stale is not None and stale.record is not None:
                metrics.REDIS_FAILURES.labels("auth", "open").inc()
                return stale.record
        metrics.REDIS_FAILURES.labels("auth", "closed").inc()
        raise redis_unavailable()

    async def take(self, ip: str, key: KeyRecord | None) -> Verdict | None:
        """The buckets' verdict; None when Redis is down and limits fail open."""
        try:
            return await self.limits.take(ip, key.id if key else None)
        except RedisError:
            if self.settings.limits_fail_open:
                metrics.REDIS_FAILURES.labels("limits", "open").inc()
                return None
            metrics.REDIS_FAILURES.labels("limits", "closed").inc()
            raise redis_unavailable() from None

    # ---- submitting ---------------------------------------------------------------------------

    async def submit(self, key: KeyRecord, sub: Submission, caller_trace: str | None) -> Outcome:
        """Produce every valid ticket; return once the broker answered for each."""
        traceparent = child_traceparent(caller_trace)
        out = Outcome(sub.batch, traceparent)
        for item in sub.items:
            if isinstance(item, Rejected):
                self._reject(out, item.index, item.problem, item.problem.kind)
        valid = sub.valid
        claims = await self._claim([a.ticket_id for a in valid], key, trace_id(traceparent))
        sending: list[tuple[Accepted, int]] = []
        for item, claim in zip(valid, claims, strict=True):
            if claim == 0:
                self._reject(out, item.index, _taken(sub.batch, item.index), "taken")
            else:
                sending.append((item, claim))
        failures = await self._produce([a for a, _ in sending], traceparent)
        failed: list[str] = []
        if failures:
            why = next(iter(failures.values()))
            log.warning("%d ticket(s) not acknowledged by Kafka: %s", len(failures), why)
        for item, claim in sending:
            if item.ticket_id.encode() not in failures:
                out.accepted.append(_accepted(item, self.settings.public_url.rstrip("/")))
                continue
            pointer = f"/tickets/{item.index}" if sub.batch else ""
            self._reject(out, item.index, kafka_unavailable(pointer), "undelivered")
            out.undelivered += 1
            if claim == 1:
                failed.append(item.ticket_id)
        metrics.RECORDS.labels("accepted").inc(len(out.accepted))
        await self._unclaim(failed, key)
        return out

    def _reject(self, out: Outcome, index: int, problem: Problem, outcome: str) -> None:
        out.rejected.append((index, problem))
        metrics.RECORDS.labels(_RECORD_OUTCOMES.get(outcome, outcome)).inc()

    async def _claim(self, ticket_ids: list[str], key: KeyRecord, trace: str) -> list[int]:
        if not ticket_ids:
            return []
        try:
            return await self.index.claim(ticket_ids, key.id, trace)
        except RedisError:
            if self.settings.auth_fail_open:
                metrics.REDIS_FAILURES.labels("index", "open").inc()
                return [2] * len(ticket_ids)  # produced, but never un-claimed
            metrics.REDIS_FAILURES.labels("index", "closed").inc()
            raise redis_unavailable() from None

    async def _unclaim(self, ticket_ids: list[str], key: KeyRecord) -> None:
        try:
            await self.index.unclaim(ticket_ids, key.id)
        except RedisError:  # the entry then says accepted until it expires; logged
            log.warning(
                "could not remove %d unacknowledged ticket(s) from the index", len(ticket_ids)
            )

    async def _produce(self, items: list[Accepted], traceparent: str) -> Failures:
        if not items:
            return {}
        loop = asyncio.get_running_loop()
        start = loop.time()
        failures = await self.producer.produce(
            self.topics.tickets_in,
            [(a.ticket_id.encode(), a.value) for a in items],
            [("traceparent", traceparent.encode())],
        )
        metrics.PRODUCE_SECONDS.observe(loop.time() - start)
        return failures

    # ---- reading --------------------------------------------------------------------------------

    async def lookup(self, ticket_id: str, key: KeyRecord) -> dict[str, str] | None:
        try:
            entry = await self.index.get(ticket_id)
        except RedisError:
            metrics.REDIS_FAILURES.labels("index", "closed").inc()
            raise redis_unavailable() from None
        if entry is None or (entry.get("owner") != key.id and not key.allows("admin")):
            return None  # another key's ticket is not disclosed, not even as 403
        return entry

    async def live_state(self, ticket_id: str, entry: dict[str, str]) -> dict | None:
        """The worker's view of a ticket with no outcome yet; None when it cannot say."""
        url = self.settings.live_state_url
        if url is None or entry.get("status") in TERMINAL or self._http is None:
            return None
        try:
            async with self._http.get(f"{url}/ticket/{ticket_id}") as resp:
                if resp.status != 200:
                    return None
                state = await resp.json(content_type=None)
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
            return None
        return state if isinstance(state, dict) else None

    # ---- readiness ------------------------------------------------------------------------------

    async def readiness(self) -> dict[str, bool]:
        try:
            redis_ok = bool(await self.redis.ping())
        except RedisError:
            redis_ok = False
        kafka_ok = await asyncio.to_thread(self.producer.broker_reachable, 1.0)
        return {"ready": redis_ok and kafka_ok, "redis": redis_ok, "kafka": kafka_ok}


_RECORD_OUTCOMES = {
    "invalid-ticket": "invalid",
    "record-too-large": "too_large",
    "taken": "taken",
    "undelivered": "undelivered",
}


def _accepted(item: Accepted, base: str) -> dict:
    return {
        "index": item.index,
        "ticket_id": item.ticket_id,
        "status_url": f"{base}/v1/tickets/{item.ticket_id}",
    }


def _taken(batch: bool, index: int) -> Problem:
    pointer = f"/tickets/{index}/ticket_id" if batch else "/ticket_id"
    return Problem(
        409,
        "ticket-id-taken",
        "another API key submitted a ticket with this ticket_id",
        [{"pointer": pointer, "detail": "taken"}],
    )


def limited(verdict: Verdict) -> ProblemError:
    empty = [b for b in verdict.buckets if b.tokens < 1]
    for b in empty:
        metrics.RATE_LIMITED.labels(b.name).inc()
    return ProblemError(
        Problem(
            429,
            "rate-limited",
            "over the " + " and ".join(f"{b.name} quota" for b in empty),
            headers={"Retry-After": str(retry_after(verdict.buckets))},
        )
    )


def buckets_of(verdict: Verdict | None) -> tuple[Bucket, ...]:
    return () if verdict is None else verdict.buckets
