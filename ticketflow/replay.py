"""`ticketflow dlq replay`: send dead letters back to where they failed.

A record that failed in `validate` goes back to `tickets.in` unchanged; one that failed in
a later step goes back to that step's topic (the envelope as the step received it), so
the ticket resumes where it stopped. Each replay adds one to `x-replay-count`; the
workers park a record that fails again after its replays (`tickets.dlq.parked`). Replay
reads through a consumer group, so running it twice replays each dead letter once;
anything replayed twice anyway is caught by the workflow's idempotency.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from streams.headers import DLQ_PREFIX, REPLAY_COUNT
from streams.producer import BASE_CONFIG
from streams.settings import Settings
from streams.topics import Topics

GROUP = "ticketflow-dlq-replay"


@dataclass(frozen=True)
class Filters:
    error_class: str | None = None
    step: str | None = None
    since: datetime | None = None
    until: datetime | None = None

    def match(self, headers: dict[str, str], timestamp_ms: int) -> bool:
        if self.error_class and headers.get("x-dlq-error-class") != self.error_class:
            return False
        if self.step and headers.get("x-dlq-step") != self.step:
            return False
        if self.since and timestamp_ms < self.since.timestamp() * 1000:
            return False
        return not (self.until and timestamp_ms > self.until.timestamp() * 1000)


@dataclass(frozen=True)
class Planned:
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    target: str
    headers: list[tuple[str, bytes]]


def target_topic(topics: Topics, headers: dict[str, str]) -> str:
    step = headers.get("x-dlq-step", "validate")
    return topics.tickets_in if step == "validate" else topics.step(step)


def replay_headers(headers: dict[str, str]) -> list[tuple[str, bytes]]:
    count = int(headers.get(REPLAY_COUNT, "0") or 0) + 1
    kept = [
        (k, v.encode())
        for k, v in headers.items()
        if k == "traceparent" or k.startswith(DLQ_PREFIX)
    ]
    return [*kept, (REPLAY_COUNT, str(count).encode())]


def plan(
    settings: Settings, consumer: Consumer, filters: Filters, idle_s: float = 2.0
) -> Iterator[Planned]:
    topics = Topics(settings.topic_prefix)
    last = time.monotonic()
    while time.monotonic() - last < idle_s:
        msg = consumer.poll(0.2)
        if msg is None:
            continue
        if msg.error():
            if msg.error().code() == KafkaError._PARTITION_EOF:
                continue
            raise RuntimeError(str(msg.error()))
        last = time.monotonic()
        headers = {k: (v or b"").decode("utf-8", "replace") for k, v in msg.headers() or []}
        if not filters.match(headers, msg.timestamp()[1]):
            continue
        yield Planned(
            msg.partition(),
            msg.offset(),
            msg.key(),
            msg.value(),
            target_topic(topics, headers),
            replay_headers(headers),
        )


def replay(
    settings: Settings,
    filters: Filters,
    dry_run: bool = False,
    rate: float = 500.0,
    from_beginning: bool = False,
) -> list[Planned]:
    """Replay matching dead letters (at most `rate` a second); return what was replayed."""
    topics = Topics(settings.topic_prefix)
    consumer = Consumer(
        {
            "bootstrap.servers": settings.kafka_bootstrap,
            "group.id": f"{settings.topic_prefix}{GROUP}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    producer = Producer({"bootstrap.servers": settings.kafka_bootstrap, **BASE_CONFIG})
    if from_beginning:
        consumer.subscribe([topics.dlq], on_assign=_rewind)
    else:
        consumer.subscribe([topics.dlq])
    done: list[Planned] = []
    try:
        with Progress(
            TextColumn("replaying"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()
        ) as bar:
            task = bar.add_task("dlq", total=None)
            for item in plan(settings, consumer, filters):
                if not dry_run:
                    producer.produce(
                        item.target, key=item.key, value=item.value, headers=item.headers
                    )
                    producer.poll(0)
                    time.sleep(1 / rate)
                done.append(item)
                bar.advance(task)
        if not dry_run:
            if producer.flush(30):
                raise RuntimeError("replayed records not delivered within 30 s")
            if done:
                consumer.commit(asynchronous=False)  # only now: a crash above replays again
    finally:
        consumer.close()
    return done


def _rewind(consumer: Consumer, partitions: list[TopicPartition]) -> None:
    for tp in partitions:
        tp.offset = -2  # OFFSET_BEGINNING
    consumer.assign(partitions)
