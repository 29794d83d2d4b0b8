"""The worker's gauges for the alert rules: dependency probes and consumer lag (mocks only)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from unittest import mock

import pytest

from agents import metrics, probes
from streams.settings import Settings


@dataclass(frozen=True)
class TP:
    topic: str
    partition: int


class FakeConsumer:
    def __init__(self, read: dict[TP, int | None], ends: dict[TP, int | None]) -> None:
        self._read_offset = read
        self._ends = ends

    def assignment(self) -> set[TP]:
        return set(self._ends)

    def highwater(self, tp: TP) -> int | None:
        return self._ends[tp]


def _value(gauge, *labels: str) -> float:
    return gauge.labels(*labels)._value.get()


def test_lag_is_the_log_end_minus_the_next_offset_summed_per_topic() -> None:
    a0, a1, b0 = TP("t.a", 0), TP("t.a", 1), TP("t.b", 0)
    consumer = FakeConsumer({a0: 9, a1: 4, b0: 99}, {a0: 20, a1: 5, b0: 100})
    assert probes.consumer_lag(consumer) == {"t.a": 10, "t.b": 0}


def test_partitions_without_a_position_or_an_end_are_left_out() -> None:
    a0, a1, c0 = TP("t.a", 0), TP("t.a", 1), TP("t.c", 0)
    consumer = FakeConsumer({a0: None, a1: 1}, {a0: 50, a1: None, c0: 7})
    assert probes.consumer_lag(consumer) == {}


def test_record_lag_drops_topics_no_longer_assigned() -> None:
    old, new = TP("t.old", 0), TP("t.new", 0)
    probes.record_lag(FakeConsumer({old: 0}, {old: 11}))
    assert _value(metrics.CONSUMER_LAG, "t.old") == 10
    probes.record_lag(FakeConsumer({new: 5}, {new: 9}))
    samples = {s.labels["topic"] for s in metrics.CONSUMER_LAG.collect()[0].samples}
    assert samples == {"t.new"}
    assert _value(metrics.CONSUMER_LAG, "t.new") == 3


def _probe(monkeypatch: pytest.MonkeyPatch, redis: mock.AsyncMock) -> probes.DependencyProbe:
    monkeypatch.setattr(probes, "async_client", lambda *a, **k: redis)
    return probes.DependencyProbe(Settings(kafka_bootstrap="127.0.0.1:1,127.0.0.1:2"))


def test_both_up(monkeypatch: pytest.MonkeyPatch) -> None:
    redis = mock.AsyncMock()
    redis.ping.return_value = True
    probe = _probe(monkeypatch, redis)
    writer = mock.Mock(wait_closed=mock.AsyncMock())
    opened = mock.AsyncMock(return_value=(mock.Mock(), writer))
    monkeypatch.setattr(probes.asyncio, "open_connection", opened)
    asyncio.run(probe.check())
    assert _value(metrics.DEPENDENCY_UP, "redis") == 1
    assert _value(metrics.DEPENDENCY_UP, "kafka") == 1
    writer.close.assert_called_once()
    opened.assert_awaited_once_with("127.0.0.1", 1)  # the first broker answered


def test_redis_error_and_every_broker_refusing_read_as_down(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    redis = mock.AsyncMock()
    redis.ping.side_effect = ConnectionError("refused")
    probe = _probe(monkeypatch, redis)
    opened = mock.AsyncMock(side_effect=ConnectionRefusedError())
    monkeypatch.setattr(probes.asyncio, "open_connection", opened)
    asyncio.run(probe.check())
    assert _value(metrics.DEPENDENCY_UP, "redis") == 0
    assert _value(metrics.DEPENDENCY_UP, "kafka") == 0
    assert [c.args for c in opened.await_args_list] == [("127.0.0.1", 1), ("127.0.0.1", 2)]
    asyncio.run(probe.close())
    redis.aclose.assert_awaited_once()


def test_a_second_broker_is_enough(monkeypatch: pytest.MonkeyPatch) -> None:
    redis = mock.AsyncMock()
    probe = _probe(monkeypatch, redis)
    writer = mock.Mock(wait_closed=mock.AsyncMock())
    opened = mock.AsyncMock(side_effect=[TimeoutError(), (mock.Mock(), writer)])
    monkeypatch.setattr(probes.asyncio, "open_connection", opened)
    asyncio.run(probe.check())
    assert _value(metrics.DEPENDENCY_UP, "kafka") == 1
