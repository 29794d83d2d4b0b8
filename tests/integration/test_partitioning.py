"""A bundle goes to the partition a keyed produce of each of its tickets would pick: the
partitioner of streams/partitioning.py against the broker and our librdkafka producers."""

from __future__ import annotations

import uuid

from confluent_kafka import Producer

from streams.admin import delete_prefixed, ensure_topics
from streams.kafka_config import confluent_config
from streams.partitioning import partition_for
from streams.producer import BASE_CONFIG
from streams.settings import Settings


def test_keys_land_where_partition_for_says(live_stack: Settings) -> None:
    prefix = f"part-{uuid.uuid4().hex[:6]}."
    topic = f"{prefix}keys"
    ensure_topics(live_stack, {topic: {}})
    n = live_stack.partitions
    landed: dict[bytes, int] = {}

    def delivered(err, msg) -> None:
        assert err is None
        landed[msg.key()] = msg.partition()

    producer = Producer({**BASE_CONFIG, **confluent_config(live_stack), "on_delivery": delivered})
    keys = [f"t-{i}-{uuid.uuid4().hex[:8]}".encode() for i in range(200)]
    try:
        for key in keys:
            producer.produce(topic, b"{}", key)
        assert producer.flush(30) == 0
        assert len(landed) == len(keys)
        assert {k: partition_for(k, n) for k in keys} == landed
        assert len(set(landed.values())) == n  # the keys did spread over the partitions
    finally:
        delete_prefixed(live_stack, prefix, prefix)
