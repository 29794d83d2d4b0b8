"""Issue 11 in the data layer and on config.routing: a record is skipped, never a stall.

The feature job plans each source record on its own (`FeatureWriter.plan`, pure): whatever
the bytes, it answers an outcome or a script call per view, never an exception. A script
error for one event counts that event as failed; Redis being down is retried with a capped
backoff. The reader falls back for an entity whose state it cannot read, and the gateway's
routing watcher keeps its last good config through any record on config.routing.
"""

from __future__ import annotations

import json
from typing import Any

import hiredis
import pytest
import redis.asyncio as aioredis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from redis.exceptions import ConnectionError as RedisConnectionError

from feature_jobs import job, metrics
from feature_jobs.reader import OnlineFeatureReader
from feature_jobs.store import ViewKeys
from feature_jobs.views import USER_TICKET_STATS, VIEWS
from feature_jobs.writer import FeatureWriter
from inference_gateway.routing import DEFAULT_CONFIG, Router
from inference_gateway.routing_watch import apply_record
from schemas.features import FeatureView
from schemas.routing import RoutingConfig

NOW_MS = 1_780_000_000_000
OUTCOMES = {"invalid", "no_entity", "future"}
PROPERTY = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# a view over a plain JSON topic, with every aggregation reading fields of any type
ORDERS = FeatureView.model_validate(
    {
        "name": "order_stats",
        "entity": "customer",
        "source_topic": "orders",
        "event_time_field": "at",
        "event_id_field": "id",
        "ttl_seconds": 300,
        "features": [
            {"name": "n", "type": "int", "default": 0, "aggregation": "count"},
            {"name": "big", "type": "int", "default": 0, "aggregation": "count_matching",
             "field": "note", "match": "urgent"},
            {"name": "len", "type": "float", "default": 0.0, "aggregation": "mean",
             "field": "note", "transform": "length", "window_seconds": 3600},
            {"name": "avg", "type": "float", "default": 0.0, "aggregation": "mean",
             "field": "amount"},
            {"name": "kinds", "type": "list[str]", "default": [], "aggregation": "distinct",
             "field": "kind"},
            {"name": "last", "type": "str", "default": None, "aggregation": "last",
             "field": "kind"},
        ],
    }
)  # fmt: skip


def writer(view: FeatureView) -> FeatureWriter:
    # no connection is made until a batch is applied
    return FeatureWriter(aioredis.from_url("redis://127.0.0.1:1/0"), [view], record_metrics=False)


json_values = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(min_value=-(2**63), max_value=2**63 - 1),
        st.floats(allow_nan=False, allow_infinity=False),
        st.text(max_size=20),
    ),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner),
    max_leaves=8,
)
order_like = st.fixed_dictionaries(
    {},
    optional={
        k: json_values
        for k in ("customer", "at", "id", "note", "amount", "kind", "user_id", "created_at")
    },
).map(lambda d: json.dumps(d).encode())
raw_values = st.one_of(st.none(), st.binary(max_size=300), order_like, st.integers())


def assert_planned(plan: list, views: int) -> None:
    assert len(plan) == views
    for step in plan:
        if isinstance(step, str):
            assert step in OUTCOMES
        else:
            ts, entity, command = step
            assert isinstance(ts, int) and isinstance(entity, str) and command.startswith(b"*")


@PROPERTY
@given(raw_values)
def test_any_record_on_a_json_source_is_planned_or_skipped(raw):
    assert_planned(writer(ORDERS).plan(raw, NOW_MS), 1)


@PROPERTY
@given(st.one_of(raw_values, st.binary(min_size=70_000, max_size=70_001)))
def test_any_record_on_tickets_in_is_planned_or_skipped(raw):
    assert_planned(writer(USER_TICKET_STATS).plan(raw, NOW_MS), 1)


def test_odd_but_parseable_fields_are_skipped_not_raised():
    w = writer(ORDERS)
    for odd in [
        {"customer": "c", "at": 1e300, "id": 1, "note": 5},  # len() of an int
        {"customer": {"x": 1}, "at": "0001-01-01T00:00:00+23:59", "id": [1]},
        {"customer": "c", "at": -1e20, "id": "x", "amount": 2**62},
        {"customer": "", "at": 1, "id": "x"},
    ]:
        assert_planned(w.plan(json.dumps(odd).encode(), NOW_MS), 1)


class FakeLink:
    """A batch's connection, answering each command with the replies given."""

    def __init__(self, replies: list[Any]) -> None:
        self._replies = replies
        self.sent = 0

    async def send(self, data: bytes) -> None:
        self.sent += 1

    async def replies(self, n: int) -> list[Any]:
        return (self._replies * n)[:n]

    async def abort(self) -> None:
        return None

    async def release(self) -> None:
        return None


def ticket(i: int) -> bytes:
    return json.dumps(
        {"ticket_id": f"t{i}", "text": "hi", "user_id": f"u{i}", "created_at": NOW_MS / 1000}
    ).encode()


async def test_a_script_error_for_one_event_counts_it_failed_and_keeps_the_batch(monkeypatch):
    w = writer(USER_TICKET_STATS)
    error = hiredis.ReplyError("ERR user_script:20: attempt to perform arithmetic on a nil value")
    replies = [0, error, 0, 1, 0, 0, 0]  # three events, then the recent-entity commands

    async def link() -> FakeLink:
        return FakeLink(replies)

    monkeypatch.setattr(w, "_link", link)
    outcomes = await w.apply([ticket(i) for i in range(3)] + [b"not json"], now_ms=NOW_MS)
    counts = outcomes[USER_TICKET_STATS.name]
    assert counts == {"applied": 2, "failed": 1, "invalid": 1}


@pytest.mark.parametrize("reply", ["OOM command not allowed", "LOADING Redis is loading"])
async def test_a_server_that_cannot_write_now_fails_the_batch_for_a_retry(monkeypatch, reply):
    w = writer(USER_TICKET_STATS)

    async def link() -> FakeLink:
        return FakeLink([hiredis.ReplyError(reply)])

    monkeypatch.setattr(w, "_link", link)
    with pytest.raises(Exception, match=reply.split()[0]):
        await w.apply([ticket(1)], now_ms=NOW_MS)


async def test_redis_down_is_retried_with_capped_backoff_and_counted():
    class Flaky:
        calls = 0

        async def apply(self, values):
            self.calls += 1
            if self.calls < 4:
                raise RedisConnectionError("connection refused")

    flaky = Flaky()
    counter = metrics.WRITE_RETRIES.labels("ConnectionError")
    before = counter._value.get()
    await job.write_until_done(flaky, [b"x"], first_delay_s=0.001, max_delay_s=0.002)
    assert flaky.calls == 4 and counter._value.get() - before == 3


class CorruptRedis:
    """A Redis whose entity hash this code cannot read."""

    def __init__(self, keys: ViewKeys) -> None:
        self._keys = keys

    def pipeline(self, transaction: bool = False) -> CorruptRedis:
        return self

    async def __aenter__(self) -> CorruptRedis:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    def get(self, key: str) -> None:
        return None

    def hgetall(self, key: str) -> None:
        return None

    async def execute(self) -> list[Any]:
        sig = self._keys.signature.encode()
        return [sig, sig, {b"0|5": b"no-colon-here", b"5": b"garbage:{"}]

    async def aclose(self) -> None:
        return None


async def test_an_entity_whose_state_cannot_be_read_gets_fallbacks():
    reader = OnlineFeatureReader("redis://127.0.0.1:1/0", VIEWS, key_prefix="x")
    reader._redis = CorruptRedis(ViewKeys.of(USER_TICKET_STATS, "x"))
    values = await reader.read(USER_TICKET_STATS.name, "u1", timeout_s=0.5)
    assert values and all(v.is_fallback for v in values.values())


@PROPERTY
@given(st.none() | st.binary(max_size=60), st.none() | st.binary(max_size=200) | st.just(b"{}"))
def test_any_routing_record_keeps_a_usable_config(key, value):
    good = RoutingConfig(name="ticket_classifier", versions={"v1": 90, "v2": 10}, default="v1")
    router = Router([good])
    result = apply_record(router, key, value)
    assert result in {"applied", "removed", "invalid"}
    if result == "invalid":
        assert router.config("ticket_classifier") == good
    for model in router.models:  # whatever is left routes
        router.choose_each(model, ["a", "b"])


@pytest.mark.parametrize(
    "value",
    [
        b'{"name": "ticket_classifier", "versions": {"v1\\n": 100}, "default": "v1\\n"}',
        b'{"name": "ticket_classifier", "versions": {"v1": "100"}, "default": "v1"}',
        b'{"name": "ticket_classifier", "versions": {"v1": 100}, "default": "v1"',
        b"\xff",
    ],
)
def test_a_malformed_routing_record_is_ignored_keeping_the_last_good_config(value):
    router = Router([DEFAULT_CONFIG])
    assert apply_record(router, b"ticket_classifier", value) == "invalid"
    assert router.config("ticket_classifier") == DEFAULT_CONFIG
