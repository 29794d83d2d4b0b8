"""Plain confluent-kafka producing and consuming for the command line and the demo."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition


@dataclass(frozen=True)
class Record:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: dict[str, str]
    timestamp_ms: int


# what every function here takes as `kafka`: streams.kafka_config.confluent_config(settings),
# or a bare bootstrap string for a PLAINTEXT broker
Kafka = str | Mapping[str, Any]


def _base(kafka: Kafka) -> dict[str, Any]:
    return {"bootstrap.servers": kafka} if isinstance(kafka, str) else dict(kafka)


def producer(kafka: Kafka, **config: object) -> Producer:
    return Producer({**_base(kafka), "linger.ms": 5, "enable.idempotence": True, **config})


def produce_all(
    kafka: Kafka,
    topic: str,
    records: Iterable[tuple[bytes | None, bytes]],
    rate: float | None = None,
) -> int:
    """Publish every record (at most `rate` a second when given) and wait for delivery."""
    p = producer(kafka)
    n, start = 0, time.monotonic()
    for key, value in records:
        if rate and (ahead := n / rate - (time.monotonic() - start)) > 0:
            time.sleep(ahead)
        while True:
            try:
                p.produce(topic, key=key, value=value)
                break
            except BufferError:  # local queue full: let deliveries drain
                p.poll(0.1)
        n += 1
        p.poll(0)
    if p.flush(30) != 0:
        raise RuntimeError(f"{topic}: not every record was delivered within 30 s")
    return n


def consumer(kafka: Kafka, group: str | None = None, **config: object) -> Consumer:
    return Consumer(
        {
            **_base(kafka),
            "group.id": group or f"ticketflow-cli-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            **config,
        }
    )


def _decode_headers(headers: list[tuple[str, bytes]] | None) -> dict[str, str]:
    return {k: (v or b"").decode("utf-8", "replace") for k, v in headers or []}


def read_topic(kafka: Kafka, topic: str, idle_s: float = 1.0) -> Iterator[Record]:
    """Every record of `topic` from the beginning until it has been idle for `idle_s`."""
    c = consumer(kafka)
    meta = c.list_topics(topic, timeout=10).topics.get(topic)
    if meta is None or meta.error is not None:
        c.close()
        return
    c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in meta.partitions])
    yield from _drain(c, idle_s)


def follow(kafka: Kafka, topics: list[str], idle_s: float | None = None) -> Iterator[Record]:
    """Records of `topics` from the beginning, following new ones (until idle, if given)."""
    c = consumer(kafka)
    c.subscribe(topics)
    yield from _drain(c, idle_s)


def _drain(c: Consumer, idle_s: float | None) -> Iterator[Record]:
    last = time.monotonic()
    try:
        while idle_s is None or time.monotonic() - last < idle_s:
            msg = c.poll(0.2)
            if msg is None:
                continue
            if msg.error():
                if msg.error().code() in (
                    KafkaError._PARTITION_EOF,
                    KafkaError.UNKNOWN_TOPIC_OR_PART,
                ):
                    continue
                raise RuntimeError(str(msg.error()))
            last = time.monotonic()
            yield Record(
                msg.topic(),
                msg.partition(),
                msg.offset(),
                msg.key(),
                msg.value(),
                _decode_headers(msg.headers()),
                msg.timestamp()[1],
            )
    finally:
        c.close()
