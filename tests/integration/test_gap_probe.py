"""The gap guard's probe against the real broker: transaction markers are not records, and
a partition's head is its group's committed offset."""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from faust.types import TP

from streams.admin import ensure_topics
from streams.gaps import KafkaProbe
from streams.kafka_config import aiokafka_kwargs
from streams.settings import Settings

pytestmark = pytest.mark.integration


def _write(settings: Settings, topic: str) -> None:
    """Offsets 0-1 committed, 2 marker, 3 aborted, 4 marker, 5 committed, 6 marker."""
    p = Producer({"bootstrap.servers": settings.kafka_bootstrap, "transactional.id": topic})
    p.init_transactions(30)
    for commit, values in ((True, [b"a", b"b"]), (False, [b"x"]), (True, [b"c"])):
        p.begin_transaction()
        for value in values:
            p.produce(topic, value, partition=0)
        p.flush(30)
        (p.commit_transaction if commit else p.abort_transaction)(30)


@pytest.fixture
def topic(live_stack: Settings) -> str:
    name = f"probe-{uuid.uuid4().hex[:8]}"
    ensure_topics(live_stack, {name: {}})
    _write(live_stack, name)
    return name


async def test_the_probe_steps_over_transaction_markers(live_stack: Settings, topic: str) -> None:
    probe = KafkaProbe(aiokafka_kwargs(live_stack), f"g-{topic}", "read_uncommitted")
    tp = TP(topic, 0)
    try:
        assert await probe.next_record(tp, 1) == 1
        assert await probe.next_record(tp, 2) == 3  # past the first commit marker
        assert await probe.next_record(tp, 4) == 5  # past the abort marker
    finally:
        await probe.close()


async def test_read_committed_probe_passes_over_aborted_records(
    live_stack: Settings, topic: str
) -> None:
    probe = KafkaProbe(aiokafka_kwargs(live_stack), f"g-{topic}", "read_committed")
    try:
        assert await probe.next_record(TP(topic, 0), 2) == 5  # marker, aborted, marker
    finally:
        await probe.close()


async def test_the_head_is_the_groups_committed_offset_else_the_log_start(
    live_stack: Settings, topic: str
) -> None:
    group = f"g-{topic}"
    probe = KafkaProbe(aiokafka_kwargs(live_stack), group)
    tp = TP(topic, 0)
    try:
        assert await probe.head(tp) == 0  # nothing committed: where earliest reads from
        c = Consumer({"bootstrap.servers": live_stack.kafka_bootstrap, "group.id": group})
        try:
            c.commit(offsets=[TopicPartition(topic, 0, 3)], asynchronous=False)
        finally:
            c.close()
        assert await probe.head(tp) == 3
    finally:
        await probe.close()
