"""Reading a topic once, from its beginning to its end as it is now.

For the commands that want a topic's whole content, not a stream of it: the routing configs
(`ticketflow config get|set`, `ticketflow model ...`) and the reviewers' decisions that
`ticketflow model build` trains on. read_committed, as every consumer of our transactional
topics. (`ticketflow.kafka_io` has its twin for the command line's other readers; this layer
may not import it.)
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from inference_gateway.routing_watch import kafka_security

METADATA_TIMEOUT_S = 10.0


def scan_topic(
    bootstrap: str, topic: str, group_id: str, timeout_s: float
) -> Iterator[tuple[bytes, bytes | None]]:
    """(key, value) of every record of `topic` up to its end now; None values are tombstones.

    A missing topic yields nothing; one not read to its end within `timeout_s` raises
    TimeoutError, rather than letting a caller act on part of it without a word.
    """
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            **kafka_security(),
            "group.id": group_id,
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "isolation.level": "read_committed",
        }
    )
    try:
        wait_s = min(METADATA_TIMEOUT_S, timeout_s)
        meta = consumer.list_topics(topic, timeout=wait_s).topics.get(topic)
        if meta is None or meta.error is not None or not meta.partitions:
            return
        parts = sorted(meta.partitions)
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
        pending, deadline = set(parts), time.monotonic() + timeout_s
        while pending:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{topic} not read to its end within {timeout_s:.0f} s")
            message = consumer.poll(0.5)
            if message is None:
                continue
            error = message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    pending.discard(message.partition())
                continue
            yield message.key() or b"", message.value()
    finally:
        consumer.close()
