"""The producer behind `202`: idempotent, acks=all, and an awaitable delivery per record.

librdkafka batches and sends from its own thread (as `streams.producer` explains, a
produce call then costs microseconds of the event loop). Unlike the workflow's producers,
ingest needs each record's own delivery report, since a request is answered only for its
records: a poll thread collects the reports of one `poll()` and hands them to the event
loop in one call, instead of waking the loop once per record.

A broker that does not acknowledge within `message.timeout.ms` fails the record (the
caller gets 503); the idempotent producer's sequence numbers keep librdkafka's own
retries from writing a record twice.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer

from streams.producer import BASE_CONFIG

log = logging.getLogger(__name__)

Headers = Sequence[tuple[str, bytes]]


@dataclass(frozen=True)
class Delivery:
    """A record's fate: on the broker at (partition, offset), or its error."""

    partition: int = -1
    offset: int = -1
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


class AckProducer:
    def __init__(self, bootstrap: str, timeout_s: float, **config: Any) -> None:
        self._producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                **BASE_CONFIG,
                "acks": "all",
                "enable.idempotence": True,
                "message.timeout.ms": int(timeout_s * 1000),
                "error_cb": self._on_error,
                **config,
            }
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        self._reports: list[tuple[asyncio.Future[Delivery], Delivery]] = []
        self._closed = threading.Event()
        self._poller: threading.Thread | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._poller = threading.Thread(target=self._poll, name="ingest-producer", daemon=True)
        self._poller.start()

    def _poll(self) -> None:
        while not self._closed.is_set():
            self._producer.poll(0.05)
            if self._reports and self._loop is not None:
                reports, self._reports = self._reports, []
                self._loop.call_soon_threadsafe(_resolve, reports)

    def _on_error(self, err: KafkaError) -> None:
        # the broker's address may be in it, never a record: fine to log
        log.warning("kafka: %s", err)

    def produce(
        self, topic: str, key: bytes, value: bytes, headers: Headers
    ) -> asyncio.Future[Delivery]:
        """Queue one record; the future resolves when the broker acknowledged or refused it."""
        assert self._loop is not None, "start() first"
        future: asyncio.Future[Delivery] = self._loop.create_future()

        def on_delivery(err: KafkaError | None, msg: Any) -> None:  # on the poll thread
            report = Delivery(error=err.str()) if err else Delivery(msg.partition(), msg.offset())
            self._reports.append((future, report))

        try:
            self._producer.produce(
                topic, key=key, value=value, headers=list(headers), on_delivery=on_delivery
            )
        except (BufferError, KafkaException) as exc:
            # the local queue is full (the broker has been away a while) or the producer
            # failed for good: refuse now rather than queue for ever
            future.set_result(Delivery(error=str(exc) or type(exc).__name__))
        return future

    def broker_reachable(self, timeout_s: float = 1.0) -> bool:
        """Whether the cluster answers a metadata request (blocking: run it in a thread)."""
        try:
            self._producer.list_topics(timeout=timeout_s)
        except KafkaException:
            return False
        return True

    def close(self, timeout_s: float = 10) -> None:
        self._producer.flush(timeout_s)
        self._closed.set()
        if self._poller is not None:
            self._poller.join(timeout=2)


def _resolve(reports: list[tuple[asyncio.Future[Delivery], Delivery]]) -> None:
    for future, report in reports:
        if not future.done():  # a request that gave up (its client left) cancelled it
            future.set_result(report)
