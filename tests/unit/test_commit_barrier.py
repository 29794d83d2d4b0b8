"""The order of a commit, with fakes: results, outputs, state, then offsets, and nothing
committed after a failure or across a rebalance."""

import asyncio

import pytest
from confluent_kafka import KafkaException

from streams.commit import CommitBarrier
from streams.faust_adapter import UnsupportedFaust, check_version


class Log:
    def __init__(self) -> None:
        self.calls: list[str] = []


class Results:
    def __init__(self, log: Log) -> None:
        self.log = log

    async def drain(self) -> None:
        self.log.calls.append("results")


class Outputs:
    def __init__(self, log: Log, fail: bool = False) -> None:
        self.log, self.fail = log, fail

    async def drain(self) -> None:
        self.log.calls.append("outputs")
        if self.fail:
            raise KafkaException("a record was not delivered")


class State:
    def __init__(self, log: Log, dirty: int = 2) -> None:
        self.log, self.dirty = log, dirty

    def flush_changelog(self) -> int:
        self.log.calls.append("state")
        dirty, self.dirty = self.dirty, 0
        return dirty


class Consumer:
    def __init__(self, log: Log, assigned=("a", "b"), rebalance_during=False) -> None:
        self.log = log
        self.gen = 1
        self.assigned = set(assigned)
        self.rebalance_during = rebalance_during
        self.committed: list[dict] = []

    def generation(self) -> int:
        gen = self.gen
        if self.rebalance_during:
            self.gen += 1
        return gen

    def assignment(self):
        return self.assigned

    async def commit(self, offsets) -> bool:
        self.log.calls.append("offsets")
        self.committed.append(dict(offsets))
        return True


def barrier(log: Log, fail=False, broken=None) -> CommitBarrier:
    return CommitBarrier(Results(log), Outputs(log, fail), State(log), broken)


def test_phases_run_in_order_then_offsets_are_committed():
    log = Log()
    consumer = Consumer(log)
    assert asyncio.run(barrier(log).commit({"a": 5}, consumer))
    # outputs are delivered again after the state flush: the changelog is on the broker
    assert log.calls == ["results", "outputs", "state", "outputs", "offsets"]
    assert consumer.committed == [{"a": 5}]


def test_no_state_to_flush_needs_no_second_drain():
    log = Log()
    b = CommitBarrier(Results(log), Outputs(log), State(log, dirty=0))
    asyncio.run(b.commit({"a": 5}, Consumer(log)))
    assert log.calls == ["results", "outputs", "state", "offsets"]


def test_an_undelivered_output_commits_nothing_ever_again():
    log = Log()
    seen: list = []

    async def broken(exc):
        seen.append(exc)

    b = barrier(log, fail=True, broken=broken)
    consumer = Consumer(log)
    assert not asyncio.run(b.commit({"a": 5}, consumer))
    assert not asyncio.run(b.commit({"a": 6}, consumer))
    assert consumer.committed == [] and len(seen) == 1 and b.held == 2


def test_a_rebalance_during_the_commit_commits_nothing():
    log = Log()
    consumer = Consumer(log, rebalance_during=True)
    assert not asyncio.run(barrier(log).commit({"a": 5}, consumer))
    assert consumer.committed == []


def test_only_assigned_partitions_are_committed():
    log = Log()
    consumer = Consumer(log, assigned=("a",))
    asyncio.run(barrier(log).commit({"a": 5, "gone": 9}, consumer))
    assert consumer.committed == [{"a": 5}]


def test_the_adapter_refuses_another_faust():
    check_version()  # the installed one is the pinned one
    with pytest.raises(UnsupportedFaust):
        check_version("0.11.0")
