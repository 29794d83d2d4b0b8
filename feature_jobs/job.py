"""The streaming feature job: Faust agents on the views' source topics, writing Redis.

* One agent per source topic takes batches of events and applies them with `FeatureWriter`
  (one pipelined round trip per batch); the batch is acknowledged only after Redis took it,
  and a Redis outage makes the agent wait and retry, never skip (at least once, and the
  writes are idempotent).
* The app id (the consumer group) carries a digest of the views' signatures. A changed
  definition therefore starts a new group, which replays the source topic from its start into
  the new signature's keys; once the group's committed offsets reach the end offsets seen at
  start, the view is marked built and the reader serves it.
* Timers refresh the built markers, and (on the leader) run the drift checks, publishing each
  `DriftReport` to `features.drift`.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import logging
import time
from collections import defaultdict
from collections.abc import Iterable
from functools import partial

import faust
import mode
import redis.asyncio as aioredis
from prometheus_client import generate_latest

from feature_jobs import metrics
from feature_jobs.drift import DriftChecker, Thresholds, preload_great_expectations
from feature_jobs.settings import FeatureSettings
from feature_jobs.store import MARK_BUILT_LUA, REFRESH_BUILT_LUA, ViewKeys, marker_ttl_ms
from feature_jobs.writer import FeatureWriter
from schemas.features import FeatureView
from streams.admin import ensure_topics
from streams.app import create_app, use_uvloop
from streams.codecs import encode
from streams.kafka_config import confluent_config
from streams.redis_config import async_client
from streams.settings import Settings
from streams.topics import Topics
from streams.watermarks import settled, watermarks

log = logging.getLogger(__name__)

APP_ID = "ticketflow-features"
METRICS_CONTENT_TYPE = "text/plain; version=0.0.4"


def views_digest(views: Iterable[FeatureView]) -> str:
    joined = ",".join(sorted(f"{v.name}={v.signature()}" for v in views))
    return hashlib.sha256(joined.encode()).hexdigest()[:12]


def job_app_id(views: Iterable[FeatureView]) -> str:
    """The job's Faust app id (its consumer group, less the topic prefix)."""
    return f"{APP_ID}-{views_digest(views)}"


def source_topic(settings: Settings, view: FeatureView) -> str:
    return f"{settings.topic_prefix}{view.source_topic}"


class BuildTracker:
    """Knows which views are built under their signature, and marks them when they are."""

    def __init__(
        self,
        settings: Settings,
        redis: aioredis.Redis,
        views: list[FeatureView],
        prefix: str,
        group_id: str,
    ) -> None:
        self._settings = settings
        self._redis = redis
        self._views = views
        self._keys = {v.name: ViewKeys.of(v, prefix) for v in views}
        self._group = group_id
        self.pending: dict[str, FeatureView] = {}
        self._targets: dict[str, dict[int, tuple[int, int]]] = {}
        self._consumer = None

    async def start(self) -> None:
        for v in self._views:
            k = self._keys[v.name]
            built = await self._redis.get(k.built)
            if built is not None and built.decode() == k.signature:
                metrics.BUILT.labels(v.name).set(1)
                continue
            metrics.BUILT.labels(v.name).set(0)
            self.pending[v.name] = v
            pointer = await self._redis.get(k.pointer)
            log.warning(
                "feature view %s: building signature %s from %s (the store names %s)",
                v.name,
                k.tag,
                source_topic(self._settings, v),
                pointer.decode()[:16] if pointer else "none",
            )
        if self.pending:
            topics = {source_topic(self._settings, v) for v in self.pending.values()}
            self._targets = await asyncio.to_thread(self._end_offsets, topics)

    def _end_offsets(self, topics: set[str]) -> dict[str, dict[int, tuple[int, int]]]:
        from confluent_kafka import Consumer, TopicPartition

        c = Consumer(
            confluent_config(self._settings, {"group.id": self._group, "enable.auto.commit": False})
        )
        try:
            meta = c.list_topics(timeout=10)
            out: dict[str, dict[int, tuple[int, int]]] = {}
            for t in topics:
                parts = meta.topics.get(t)
                out[t] = {}
                if parts is None or parts.error is not None:
                    continue
                for p in parts.partitions:
                    out[t][p] = watermarks(c, TopicPartition(t, p))
            return out
        finally:
            c.close()

    def _caught_up(self) -> set[str]:
        from confluent_kafka import Consumer, TopicPartition

        if self._consumer is None:  # one client for the whole build: making one costs
            self._consumer = Consumer(
                confluent_config(
                    self._settings, {"group.id": self._group, "enable.auto.commit": False}
                )
            )
        done = set()
        for topic, parts in self._targets.items():
            tps = [TopicPartition(topic, p) for p, (lo, hi) in parts.items() if hi > lo]
            asked = settled(partial(self._consumer.committed, tps))
            committed = {tp.partition: tp.offset for tp in asked}
            if all(committed.get(tp.partition, -1) >= parts[tp.partition][1] for tp in tps):
                done.add(topic)
        return done

    def _close_consumer(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None

    async def check(self) -> None:
        if not self.pending:
            return
        done_topics = await asyncio.to_thread(self._caught_up)
        for name, v in list(self.pending.items()):
            if source_topic(self._settings, v) not in done_topics:
                continue
            k = self._keys[name]
            await self._redis.eval(
                MARK_BUILT_LUA, 2, k.built, k.pointer, k.signature, marker_ttl_ms(v)
            )
            del self.pending[name]
            metrics.BUILT.labels(name).set(1)
            log.warning("feature view %s: built under signature %s, now served", name, k.tag)
        if not self.pending:
            await asyncio.to_thread(self._close_consumer)

    async def refresh(self) -> None:
        for v in self._views:
            if v.name in self.pending:
                continue
            k = self._keys[v.name]
            await self._redis.eval(
                REFRESH_BUILT_LUA, 2, k.built, k.pointer, k.signature, marker_ttl_ms(v)
            )


async def event_batches(app: faust.App, stream, max_n: int, within_s: float):
    """Batches of an agent's events, acknowledged once the caller is done with each batch.

    `Stream.take_events` hands events over one at a time through the stream's machinery
    (several tasks per event), which caps a worker near 7k events/s on two cores; this reads
    the agent's channel queue directly, as `Stream.__aiter__` does inline, keeping its
    bookkeeping: messages are tracked before processing and acked after, and events of a
    previous consumer generation (from before a rebalance) are acked without processing,
    since the new owner of their partition will see them again.
    """
    from faust.types import EventT

    channel = aiter(stream.channel)  # registers the channel with the conductor
    queue = channel.queue
    loop = asyncio.get_running_loop()
    acking = app.topics.acking_topics
    while True:
        try:
            batch = [await queue.get()]
        except StopAsyncIteration:  # the channel closes when the worker stops
            return
        deadline = loop.time() + within_s
        while len(batch) < max_n:
            if not queue.empty():
                batch.append(queue.get_nowait())
            elif loop.time() < deadline:
                await asyncio.sleep(0.001)  # let the consumer deliver what it fetched
            else:
                break
        consumer = app.consumer
        generation = app.consumer_generation_id
        flowing = app.flow_control.is_active()
        events = []
        for event in batch:
            if not isinstance(event, EventT):
                continue
            message = event.message
            if message.topic in acking and not message.tracked:
                message.tracked = True
                consumer.track_message(message)
            if flowing and message.generation_id == generation:
                events.append(event)
        try:
            yield events
        finally:
            message_out = app.sensors.on_message_out
            for event in batch:
                if isinstance(event, EventT) and event.ack():
                    message = event.message
                    message_out(message.tp, message.offset, message)


async def write_until_done(
    writer: FeatureWriter, values: list, first_delay_s: float = 0.2, max_delay_s: float = 5.0
) -> None:
    """Apply a batch, trying again with backoff (capped at `max_delay_s`) until it is in.

    The batch is not acknowledged meanwhile, so the consumer waits for Redis: at least once,
    never skipped. Records cannot be the cause (`FeatureWriter.plan` skips what it cannot
    read), so what fails here is Redis or the network; every retry is counted in
    `feature_job_write_retries_total` and logged, the first and then every tenth.
    """
    delay = first_delay_s
    for attempt in itertools.count(1):
        try:
            await writer.apply(values)
            return
        except Exception as exc:
            metrics.WRITE_RETRIES.labels(type(exc).__name__).inc()
            redis_down = isinstance(exc, (aioredis.RedisError, OSError))
            if attempt == 1 or attempt % 10 == 0:
                log.log(
                    logging.WARNING if redis_down else logging.ERROR,
                    "feature writes failed %d time(s) (%r); retrying in %.1f s",
                    attempt,
                    exc,
                    delay,
                )
            await asyncio.sleep(delay)
            delay = min(delay * 2, max_delay_s)


def job_topics(settings: Settings, views: Iterable[FeatureView]) -> dict[str, dict]:
    """The topics the job reads and writes, for `ensure_topics` before it subscribes."""
    wanted: dict[str, dict] = {source_topic(settings, v): {} for v in views}
    wanted[Topics(settings.topic_prefix).features_drift] = {}
    return wanted


def build_job(
    settings: Settings,
    fsettings: FeatureSettings,
    views: dict[str, FeatureView],
    **app_overrides,
) -> faust.App:
    view_list = list(views.values())
    topics = Topics(settings.topic_prefix)
    app_id = job_app_id(view_list)
    overrides = {
        # offsets only matter for restarts and for telling when a rebuild is through: a
        # commit a second is plenty, and commits cost this job more than its Redis writes
        "broker_commit_interval": 1.0,
        **app_overrides,
    }
    app = create_app(settings, app_id=app_id, web_port=fsettings.web_port, **overrides)
    group_id = f"{settings.topic_prefix}{app_id}"
    redis = async_client(settings.redis, socket_timeout=5.0, socket_connect_timeout=2.0)
    prefix = fsettings.key_prefix
    tracker = BuildTracker(settings, redis, view_list, prefix, group_id)

    by_topic: dict[str, list[FeatureView]] = defaultdict(list)
    for v in view_list:
        by_topic[source_topic(settings, v)].append(v)
    writers: list[FeatureWriter] = []

    def make_agent(topic_name: str, writer: FeatureWriter) -> None:
        channel = app.topic(
            topic_name,
            key_type=bytes,
            value_type=bytes,
            key_serializer="raw",
            value_serializer="raw",
        )

        async def update(stream):
            batches = event_batches(app, stream, fsettings.batch_size, fsettings.batch_within_s)
            async for events in batches:
                if not events:
                    continue
                await write_until_done(writer, [e.value for e in events])

        app.agent(channel, name=f"features.{topic_name}")(update)

    for topic_name, vs in by_topic.items():
        writer = FeatureWriter(
            redis,
            vs,
            prefix,
            max_record_bytes=settings.max_record_bytes,
            recent_retention_s=max(3600.0, 2 * fsettings.drift_period_s),
        )
        writers.append(writer)
        make_agent(topic_name, writer)

    drift_topic = app.topic(topics.features_drift, key_serializer="raw", value_serializer="raw")
    checker = DriftChecker(
        settings.redis,
        views,
        prefix,
        sample_size=fsettings.drift_sample_size,
        period_s=fsettings.drift_period_s,
        thresholds=Thresholds(min_sample=fsettings.drift_min_sample),
    )

    @app.service
    class _Lifecycle(mode.Service):
        async def on_start(self) -> None:
            for w in writers:
                await w.load_script()
            await tracker.start()
            if fsettings.drift_enabled:
                # GE takes seconds to import: do it now, in a thread, not at the first check
                asyncio.get_running_loop().run_in_executor(None, preload_great_expectations)

        async def on_stop(self) -> None:
            await checker.close()
            await redis.aclose()

    @app.timer(2.0)
    async def _build_check() -> None:
        try:
            await tracker.check()
        except Exception as exc:  # the next tick tries again
            log.warning("build check failed: %r", exc)

    @app.timer(30.0)
    async def _refresh() -> None:
        try:
            await tracker.refresh()
        except aioredis.RedisError as exc:
            log.warning("refreshing the built markers failed: %r", exc)
        now = time.time()
        for w in writers:
            for name, newest in w.newest_ms.items():
                metrics.LAG.labels(name).set(max(0.0, now - newest / 1000))

    if fsettings.drift_enabled:

        @app.timer(fsettings.drift_period_s, on_leader=True)
        async def _drift() -> None:
            for name in views:
                if name in tracker.pending:
                    continue
                try:
                    report = await checker.check(name)
                except Exception as exc:
                    log.warning("drift check of %s failed: %r", name, exc)
                    continue
                await drift_topic.send(key=name.encode(), value=encode(report))
                if report.drifted:
                    drifted = [f for f, v in report.features.items() if v.get("drifted")]
                    log.warning("feature drift in %s: %s", name, drifted)

    @app.page("/metrics")
    async def _metrics(web, request):
        # aiohttp refuses a charset inside content_type (CONTENT_TYPE_LATEST has one)
        return web.bytes(generate_latest(), content_type=METRICS_CONTENT_TYPE)

    @app.page("/ready")
    async def _ready(web, request):
        assigned = bool(app.consumer.assignment()) if app.consumer else False
        ok = assigned and not app.rebalancing
        body = {"ready": ok, "assigned": assigned, "building": sorted(tracker.pending)}
        return web.json(body, status=200 if ok else 503)

    return app


def run_job(
    settings: Settings,
    fsettings: FeatureSettings,
    views: dict[str, FeatureView],
    loglevel: str = "warning",
) -> None:
    use_uvloop()
    for name in ("aiokafka", "faust", "mode"):
        logging.getLogger(name).setLevel(logging.WARNING)
    # before Faust subscribes: a topic missing then is only seen at the next metadata refresh
    ensure_topics(settings, job_topics(settings, views.values()))
    app = build_job(settings, fsettings, views)
    worker = faust.Worker(app, loglevel=loglevel, quiet=True)
    worker.execute_from_commandline()
