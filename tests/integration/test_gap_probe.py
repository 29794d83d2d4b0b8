"""The gap guard's probe against the real broker: transaction markers are not records."""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka import Producer
from faust.types import TP

from streams.admin import ensure_topics
from streams.gaps import KafkaProbe
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


async def test_markers_alone_hold_no_record_and_a_skipped_record_is_seen(
    live_stack: Settings, topic: str
) -> None:
    probe = KafkaProbe(live_stack.kafka_bootstrap, "read_uncommitted")
    tp = TP(topic, 0)
    try:
        assert await probe.holds_records(tp, 2, 3) is False  # the first commit marker
        assert await probe.holds_records(tp, 1, 3) is True  # offset 1 was skipped
        assert await probe.holds_records(tp, 3, 5) is True  # read_uncommitted sees aborts
    finally:
        await probe.close()


async def test_read_committed_probe_passes_over_aborted_records(
    live_stack: Settings, topic: str
) -> None:
    probe = KafkaProbe(live_stack.kafka_bootstrap, "read_committed")
    try:
        assert await probe.holds_records(TP(topic, 0), 3, 5) is False  # abort + its marker
    finally:
        await probe.close()
