"""Applies source events to the feature views in Redis: one EVALSHA per event and view,
all of a batch's in one pipeline (one round trip), each atomic for its entity."""

from __future__ import annotations

import hashlib
import logging
import random
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import hiredis
import orjson
import redis.asyncio as aioredis
from pydantic import ValidationError
from redis.exceptions import NoScriptError, ResponseError

from feature_jobs import metrics
from feature_jobs.resp import ReplyError, RespConnection
from feature_jobs.store import OUTCOMES, UPDATE_LUA, ViewEncoder
from schemas.features import FeatureView
from schemas.tickets import Ticket

UPDATE_SHA = hashlib.sha1(UPDATE_LUA.encode()).hexdigest()
SEND_CHUNK = 64  # commands per socket write within a batch
_UPDATE_HEAD = ("EVALSHA", UPDATE_SHA, "2")
# error replies that say the server cannot take writes now: the batch is tried again
TRANSIENT_REPLIES = ("OOM", "BUSY", "LOADING", "READONLY", "MASTERDOWN", "TRYAGAIN", "CLUSTERDOWN")
log = logging.getLogger(__name__)
# per view: a script call (event time, entity, packed command), or the outcome instead
Planned = tuple[int, str, bytes] | str


def parse_ticket(raw: bytes | str | Any) -> Any:
    if isinstance(raw, (bytes, str)):
        return Ticket.model_validate_json(raw)
    if isinstance(raw, dict):
        return Ticket.model_validate(raw)
    return raw


def parse_json(raw: bytes | str | Any) -> Any:
    if isinstance(raw, (bytes, str)):
        value = orjson.loads(raw)
        if not isinstance(value, dict):
            raise ValueError("not a JSON object")
        return value
    return raw


def parser_for(source_topic: str) -> Callable[[Any], Any]:
    # records of tickets.in are counted only when they are tickets the workflow would accept
    return parse_ticket if source_topic == "tickets.in" else parse_json


class FeatureWriter:
    """Writes the views of one source topic.

    `apply` is idempotent: the script refuses an event id already seen (within the grace
    period) and any event older than the entity's watermark by more than the grace period,
    so a redelivered batch or a replay of the topic never counts an event twice.
    """

    def __init__(
        self,
        redis: aioredis.Redis,
        views: Sequence[FeatureView],
        key_prefix: str = "tf:fv",
        *,
        max_record_bytes: int = 64 * 1024,
        recent_per_batch: int = 100,
        recent_cap: int = 20_000,
        recent_retention_s: float = 3600.0,
        record_metrics: bool = True,
    ) -> None:
        topics = {v.source_topic for v in views}
        if len(topics) != 1:
            raise ValueError(f"one writer per source topic, got {sorted(topics)}")
        self._redis = redis
        self.views = list(views)
        self.encoders = [ViewEncoder(v, key_prefix) for v in views]
        self._parse = parser_for(topics.pop())
        self._max_bytes = max_record_bytes
        self._recent_per_batch = recent_per_batch
        self._recent_cap = recent_cap
        self._recent_retention_ms = int(recent_retention_s * 1000)
        self._metrics = record_metrics
        self.newest_ms: dict[str, int] = {}
        self._resp = RespConnection.for_client(redis)

    async def load_script(self) -> None:
        await self._redis.script_load(UPDATE_LUA)

    async def apply(
        self, values: Sequence[Any], now_ms: int | None = None, _reloaded: bool = False
    ) -> dict[str, Counter[str]]:
        """Apply a batch of raw records (bytes) or parsed ones; outcome counts per view."""
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        outcomes: dict[str, Counter[str]] = {e.view.name: Counter() for e in self.encoders}
        calls: list[tuple[int, int]] = []  # (encoder, event time) of each script call
        touched: list[list[str]] = [[] for _ in self.encoders]
        link = await self._link()
        try:
            started = time.perf_counter()
            sent = await self._send(link, values, now_ms, outcomes, calls, touched)
            results = await link.replies(sent)
        except BaseException:
            await link.abort()
            raise
        finally:
            await link.release()
        if any(_is_noscript(r) for r in results):
            # Redis lost its scripts (a restart): load it and run the batch again, which the
            # script's de-duplication makes safe for the events that did get through
            if _reloaded:
                raise NoScriptError(str(next(r for r in results if _is_noscript(r))))
            await self.load_script()
            return await self.apply(values, now_ms, _reloaded=True)
        if self._metrics and sent:
            metrics.BATCH_SECONDS.observe(time.perf_counter() - started)
        names = [e.view.name for e in self.encoders]
        newest = self.newest_ms
        for (k, ts), r in zip(calls, results, strict=False):
            name = names[k]
            if not isinstance(r, int):
                _raise_if_transient(r)
                # this event's doing (or its entity's state's): the others must not wait on it
                log.warning("feature view %s: an event's update failed: %.200s", name, r)
                outcomes[name]["failed"] += 1
                continue
            outcomes[name][OUTCOMES[r]] += 1
            if r == 0 and ts > newest.get(name, 0):
                newest[name] = ts
        for r in results[len(calls) :]:
            if isinstance(r, Exception):
                raise ResponseError(f"recent-entities update failed: {r!r}")
        self._count(outcomes)
        return outcomes

    async def _link(self) -> _Link:
        if self._resp is not None:
            return _RespLink(self._resp)
        conn = await self._redis.connection_pool.get_connection()
        return _PoolLink(self._redis, conn)

    async def _send(self, link, values, now_ms, outcomes, calls, touched) -> int:
        """Encode and send the batch's commands, a chunk at a time (Redis runs the first
        chunks while the next are encoded); returns how many replies to read."""
        chunk: list[bytes] = []
        sent = 0
        for raw in values:
            for k, step in enumerate(self.plan(raw, now_ms)):
                if isinstance(step, str):
                    outcomes[self.encoders[k].view.name][step] += 1
                    continue
                ts, entity, command = step
                chunk.append(command)
                calls.append((k, ts))
                touched[k].append(entity)
            if len(chunk) >= SEND_CHUNK:
                await link.send(b"".join(chunk))
                sent += len(chunk)
                chunk = []
        pack = hiredis.pack_command
        for k, enc in enumerate(self.encoders):
            entities = touched[k]
            if not entities:
                continue
            if len(entities) > self._recent_per_batch:
                entities = random.sample(entities, self._recent_per_batch)
            recent = enc.keys.recent
            zadd: list[Any] = ["ZADD", recent]
            for e in entities:
                zadd += [now_ms, e]
            cutoff = f"({now_ms - self._recent_retention_ms}"
            chunk.append(pack(tuple(zadd)))
            chunk.append(pack(("ZREMRANGEBYSCORE", recent, "-inf", cutoff)))
            chunk.append(pack(("ZREMRANGEBYRANK", recent, 0, -self._recent_cap - 1)))
            chunk.append(pack(("PEXPIRE", recent, self._recent_retention_ms)))
        if chunk:
            await link.send(b"".join(chunk))
            sent += len(chunk)
        return sent

    def plan(self, raw: Any, now_ms: int) -> list[Planned]:
        """Per view, what one source record asks of Redis: (event time, entity, the packed
        script call), or the outcome that says why nothing (invalid, no_entity, future).

        Never raises: whatever a record on the source topic holds (not JSON, odd types,
        huge values), it is skipped and counted as `invalid`, never retried, so it cannot
        hold up the records behind it.
        """
        try:
            rec = self._record(raw)
            return [self._plan_view(enc, rec, now_ms) for enc in self.encoders]
        except Exception as exc:
            log.info("source record skipped as invalid: %s", type(exc).__name__)
            return ["invalid"] * len(self.encoders)

    def _record(self, raw: Any) -> Any:
        """The parsed record, or None for one that is too large or does not parse."""
        if raw is None or (isinstance(raw, (bytes, str)) and len(raw) > self._max_bytes):
            return None
        try:
            return self._parse(raw)
        except (ValidationError, ValueError):
            return None

    @staticmethod
    def _plan_view(enc: ViewEncoder, rec: Any, now_ms: int) -> Planned:
        if rec is None:
            return "invalid"
        entity = enc.entity(rec)
        if entity is None:
            return "no_entity"
        ts, event_id = enc.event_ms(rec), enc.event_id(rec)
        if ts is None or event_id is None:
            return "invalid"
        if ts > now_ms + enc.grace_ms:
            return "future"
        args = enc.args(rec, entity, event_id, ts, now_ms)
        return ts, entity, hiredis.pack_command((*_UPDATE_HEAD, *args))

    def _count(self, outcomes: dict[str, Counter[str]]) -> None:
        if not self._metrics:
            return
        now = time.time()
        for name, counts in outcomes.items():
            for outcome, n in counts.items():
                metrics.EVENTS.labels(name, outcome).inc(n)
            newest = self.newest_ms.get(name)
            if newest is not None:
                metrics.LAG.labels(name).set(max(0.0, now - newest / 1000))


def _raise_if_transient(reply: Any) -> None:
    """Raise for a reply that is no script outcome unless it is the event's own failure."""
    if not isinstance(reply, (ReplyError, ResponseError)):
        raise ResponseError(f"update script answered {reply!r}")
    if str(reply).startswith(TRANSIENT_REPLIES):
        raise ResponseError(f"update script failed: {reply!r}")


def _is_noscript(reply: Any) -> bool:
    return isinstance(reply, (ReplyError, ResponseError)) and str(reply).startswith("NOSCRIPT")


class _Link:
    """Where a batch's commands go: the lean connection, or a redis-py pool connection."""

    async def send(self, data: bytes) -> None:
        raise NotImplementedError

    async def replies(self, n: int) -> list[Any]:
        raise NotImplementedError

    async def abort(self) -> None:
        return None

    async def release(self) -> None:
        return None


class _RespLink(_Link):
    def __init__(self, conn: RespConnection) -> None:
        self._conn = conn

    async def send(self, data: bytes) -> None:
        await self._conn.send(data)

    async def replies(self, n: int) -> list[Any]:
        return await self._conn.replies(n)

    async def abort(self) -> None:
        self._conn.close()


class _PoolLink(_Link):
    """Through a redis-py pool connection (TLS, unix sockets): slower, same protocol."""

    def __init__(self, client: aioredis.Redis, conn: Any) -> None:
        self._client, self._conn = client, conn

    async def send(self, data: bytes) -> None:
        await self._conn.send_packed_command(data, check_health=False)

    async def replies(self, n: int) -> list[Any]:
        out: list[Any] = []
        for _ in range(n):
            try:
                out.append(await self._conn.read_response())
            except ResponseError as exc:
                out.append(exc)
        return out

    async def abort(self) -> None:
        await self._conn.disconnect()

    async def release(self) -> None:
        await self._client.connection_pool.release(self._conn)
