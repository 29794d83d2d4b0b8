"""A failing batch: infrastructure errors are retried, a deterministic one is split until
the one record at fault is dead-lettered alone."""

import asyncio

import pytest
from confluent_kafka import KafkaException

from agents import batches
from agents.batches import process_isolated


@pytest.fixture(autouse=True)
def no_waiting(monkeypatch):
    monkeypatch.setattr(batches, "MAX_BACKOFF_S", 0.0)


def run(handle, events):
    poisoned: list = []
    asyncio.run(process_isolated("t", handle, events, lambda e, exc: poisoned.append(e)))
    return poisoned


def test_a_deterministic_failure_is_isolated_to_its_record():
    handled: list = []

    async def handle(batch):
        if 13 in batch:
            raise ValueError("bad record")
        handled.extend(batch)

    poisoned = run(handle, list(range(40)))
    assert poisoned == [13]
    assert sorted(handled) == [e for e in range(40) if e != 13]


def test_several_bad_records_each_go_alone():
    handled: list = []

    async def handle(batch):
        if any(e % 10 == 0 for e in batch):
            raise KeyError("x")
        handled.extend(batch)

    poisoned = run(handle, list(range(1, 35)))
    assert poisoned == [10, 20, 30]
    assert len(handled) == 31


def test_an_infrastructure_error_is_retried_not_dead_lettered():
    calls: list = []

    async def handle(batch):
        calls.append(list(batch))
        if len(calls) < 4:
            raise KafkaException("broker away")

    assert run(handle, [1, 2, 3]) == []
    assert calls == [[1, 2, 3]] * 4  # the whole batch, never split for an outage


def test_backoff_is_bounded(monkeypatch):
    monkeypatch.setattr(batches, "MAX_BACKOFF_S", 5.0)
    assert batches.backoff_s(1) < batches.backoff_s(3)
    assert batches.backoff_s(100) == 5.0


def test_a_batch_failing_record_by_record_is_the_system_not_the_records():
    # an outage can surface as an error nobody listed: every record fails, each alone
    calls = {"n": 0}
    handled: list = []

    async def handle(batch):
        calls["n"] += 1
        if calls["n"] < 30:
            raise RuntimeError("changelog shows no partitions")
        handled.extend(batch)

    assert run(handle, list(range(8))) == []
    assert sorted(handled) == list(range(8))


def test_a_record_that_passes_when_tried_again_is_not_dead_lettered():
    seen: list = []

    async def handle(batch):
        seen.append(list(batch))
        if batch == [5] and seen.count([5]) == 1:
            raise ValueError("flaky once")

    assert run(handle, [5]) == []


def test_a_record_failing_alone_every_time_is_dead_lettered_after_confirmation():
    tries: list = []

    async def handle(batch):
        tries.append(list(batch))
        raise ValueError("always")

    assert run(handle, [7]) == [7]
    assert tries.count([7]) == 1 + batches.CONFIRM_ATTEMPTS


def test_a_kafka_error_about_the_record_is_the_records_fault():
    from confluent_kafka import KafkaError

    too_large = KafkaException(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE))
    assert not batches.is_infrastructure(too_large)
    assert batches.is_infrastructure(KafkaException(KafkaError(KafkaError._TRANSPORT)))
    assert batches.is_infrastructure(ConnectionRefusedError())
    assert not batches.is_infrastructure(ValueError())
