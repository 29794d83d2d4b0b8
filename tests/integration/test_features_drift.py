"""Drift checks on a real store: a reference from one period, an unshifted period without a
report of drift, a shifted one with it, published to features.drift and on the gauge."""

from __future__ import annotations

import asyncio
import random
import time
import uuid

import orjson
import pytest
import redis.asyncio as aioredis
from confluent_kafka import Consumer
from confluent_kafka.admin import AdminClient

from feature_jobs import metrics
from feature_jobs.cli import _publish
from feature_jobs.drift import DriftChecker
from feature_jobs.store import MARK_BUILT_LUA, ViewKeys, marker_ttl_ms
from feature_jobs.views import VIEWS
from feature_jobs.writer import FeatureWriter
from schemas.tickets import DriftReport
from streams.settings import Settings
from streams.topics import Topics
from tests.integration.test_features_store import iso, redis_url

pytestmark = pytest.mark.integration

RUN = uuid.uuid4().hex[:8]
VIEW = VIEWS["user_ticket_stats"]
WORDS = [
    "order",
    "account",
    "password",
    "invoice",
    "delivery",
    "broken",
    "screen",
    "login",
    "charge",
    "package",
]


def period(tag: str, users: int, seed: int, shift: bool = False) -> list[bytes]:
    rng = random.Random(seed)
    now = int(time.time() * 1000)
    out = []
    for u in range(users):
        for k in range(rng.randint(1, 4) + (3 if shift else 0)):
            words = rng.randint(3, 30) * (3 if shift else 1)
            channel = (
                "api" if shift and rng.random() < 0.4 else rng.choice(["email", "chat", "web"])
            )
            out.append(
                orjson.dumps(
                    {
                        "ticket_id": f"{tag}-{u}-{k}",
                        "text": " ".join(rng.choice(WORDS) for _ in range(words)),
                        "user_id": f"{tag}-u{u}",
                        "channel": channel,
                        "created_at": iso(now - rng.randint(0, 1_800_000)),
                    }
                )
            )
    return out


async def scenario(prefix: str, settings: Settings) -> list[DriftReport]:
    r = aioredis.from_url(redis_url())
    writer = FeatureWriter(r, [VIEW], prefix, recent_per_batch=10_000)
    await writer.load_script()
    keys = ViewKeys.of(VIEW, prefix)
    await r.eval(MARK_BUILT_LUA, 2, keys.built, keys.pointer, keys.signature, marker_ttl_ms(VIEW))
    checker = DriftChecker(redis_url(), VIEWS, prefix, sample_size=300)
    reports = []
    try:
        marks = []
        for tag, seed, shift in (("ref", 1, False), ("same", 2, False), ("moved", 3, True)):
            since = int(time.time() * 1000)
            await writer.apply(period(f"{RUN}{tag}", 300, seed, shift))
            marks.append((since, int(time.time() * 1000) + 1))
            await asyncio.sleep(0.01)
        (s0, u0), (s1, u1), (s2, u2) = marks
        first = await checker.check(VIEW.name, since_ms=s0, until_ms=u0)
        assert not first.drifted and "reference profile built" in str(first.features)
        assert await checker.load_reference(VIEW.name) is not None
        reports.append(await checker.check(VIEW.name, since_ms=s1, until_ms=u1))
        reports.append(await checker.check(VIEW.name, since_ms=s2, until_ms=u2))
        # the reference is a key with a TTL like every other
        assert await r.ttl(keys.reference) > 0 and await r.ttl(keys.recent) > 0
    finally:
        await checker.close()
        async for k in r.scan_iter(match=f"{prefix}:*", count=1000):
            await r.delete(k)
        await r.aclose()
    return reports


def test_shifted_distribution_raises_a_drift_report_and_unshifted_does_not():
    settings = Settings(topic_prefix=f"itd{RUN}.")
    same, moved = asyncio.run(scenario(f"itd{RUN}:fv", settings))
    assert not same.drifted, {k: v.get("reasons") for k, v in same.features.items()}
    assert same.sample_size == 300 and same.excluded_fallback == 0
    assert moved.drifted
    drifted = {k for k, v in moved.features.items() if v["drifted"]}
    assert {"mean_text_len_7d", "channels", "tickets_1h"} <= drifted
    assert moved.features["channels"]["unexpected_values"] == ["api"]
    assert metrics.DRIFT.labels(VIEW.name, "mean_text_len_7d")._value.get() == 1

    # published to features.drift, keyed by view
    _publish(settings, [same, moved])
    c = Consumer(
        {
            "bootstrap.servers": settings.kafka_bootstrap,
            "group.id": f"itd{RUN}",
            "auto.offset.reset": "earliest",
        }
    )
    c.subscribe([Topics(settings.topic_prefix).features_drift])
    got = []
    deadline = time.monotonic() + 20
    try:
        while len(got) < 2 and time.monotonic() < deadline:
            msg = c.poll(0.5)
            if msg is not None and not msg.error():
                got.append((msg.key(), DriftReport.model_validate_json(msg.value())))
    finally:
        c.close()
        admin = AdminClient({"bootstrap.servers": settings.kafka_bootstrap})
        admin.delete_topics([Topics(settings.topic_prefix).features_drift])
        admin.delete_consumer_groups([f"itd{RUN}"])
    assert [k for k, _ in got] == [VIEW.name.encode()] * 2
    assert [r.drifted for _, r in got] == [False, True]
