"""The producer behind `202`: idempotent, acks=all, and one awaitable per request.

librdkafka batches and sends from its own thread (as `streams.producer` explains, a
produce call then costs microseconds of the event loop). Unlike the workflow's producers,
ingest needs to know when each request's own records are acknowledged, so every record
has a delivery callback; the callbacks of one request count down one shared state, and
the poll thread hands the requests it completed to the event loop in one call per poll,
instead of a future and a loop wake-up per record.

A broker that does not acknowledge within `message.timeout.ms` fails the record (the
caller gets 503); the idempotent producer's sequence numbers keep librdkafka's own
retries from writing a record twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from confluent_kafka import KafkaError, KafkaException, Producer

from streams.kafka_config import KafkaConfig, confluent_config
from streams.producer import BASE_CONFIG
from streams.settings import Settings

if TYPE_CHECKING:
    from ingest.settings import IngestSettings


def kafka_config(settings: IngestSettings) -> KafkaConfig:
    """Ingest's librdkafka configuration: its bootstrap, and the shared Kafka security
    settings (TICKETFLOW_KAFKA_*, read by streams.settings.Settings)."""
    return confluent_config(
        Settings().model_copy(update={"kafka_bootstrap": settings.kafka_bootstrap})
    )


log = logging.getLogger(__name__)

Headers = Sequence[tuple[str, bytes]]
# the records of a request that were not acknowledged: key -> why
Failures = dict[bytes, str]


class _Request:
    """One request's records in flight; its callbacks run on the poll thread."""

    __slots__ = ("failed", "future", "left", "lock", "owner")

    def __init__(self, owner: AckProducer, future: asyncio.Future[Failures], n: int) -> None:
        self.owner, self.future, self.left = owner, future, n
        self.failed: Failures = {}
        self.lock = threading.Lock()

    def settle(self, key: bytes, error: str | None) -> bool:
        """Count one record done; True when it was the last."""
        with self.lock:
            if error is not None:
                self.failed[key] = error
            self.left -= 1
            return self.left == 0

    def on_delivery(self, err: KafkaError | None, msg: Any) -> None:
        if self.settle(msg.key(), err.str() if err is not None else None):
            self.owner._done.append(self)


class AckProducer:
    def __init__(self, kafka: Mapping[str, Any], timeout_s: float, **config: Any) -> None:
        self._producer = Producer(
            {
                **kafka,  # bootstrap and security: kafka_config() below
                **BASE_CONFIG,
                "acks": "all",
                "enable.idempotence": True,
                "message.timeout.ms": int(timeout_s * 1000),
                "error_cb": self._on_error,
                **config,
            }
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        self._done: list[_Request] = []
        self._closed = threading.Event()
        self._poller: threading.Thread | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._poller = threading.Thread(target=self._poll, name="ingest-producer", daemon=True)
        self._poller.start()

    def _poll(self) -> None:
        while not self._closed.is_set():
            self._producer.poll(0.05)
            if self._done and self._loop is not None:
                done, self._done = self._done, []
                try:
                    self._loop.call_soon_threadsafe(_resolve, done)
                except RuntimeError:  # the loop is closed: nobody waits any more
                    return

    def _on_error(self, err: KafkaError) -> None:
        # the broker's address may be in it, never a record: fine to log
        log.warning("kafka: %s", err)

    def produce(
        self, topic: str, records: Sequence[tuple[bytes, bytes]], headers: Headers
    ) -> asyncio.Future[Failures]:
        """Queue (key, value) records; the future resolves once the broker acknowledged or
        refused each of them, with the refused ones."""
        assert self._loop is not None, "start() first"
        future: asyncio.Future[Failures] = self._loop.create_future()
        request = _Request(self, future, len(records))
        hdrs: list[tuple[str, str | bytes | None]] = list(headers)
        for i, (key, value) in enumerate(records):
            try:
                self._producer.produce(
                    topic, key=key, value=value, headers=hdrs, on_delivery=request.on_delivery
                )
            except (BufferError, KafkaException, RuntimeError) as exc:
                # the local queue is full (the broker has been away a while), the producer
                # failed for good or was closed: refuse the rest now rather than queue them
                self._refuse(request, records[i:], str(exc) or type(exc).__name__)
                break
        return future

    def _refuse(self, request: _Request, records: Sequence[tuple[bytes, bytes]], why: str) -> None:
        last = False
        for key, _ in records:
            last = request.settle(key, why)
        if last and not request.future.done():
            request.future.set_result(request.failed)

    def broker_reachable(self, timeout_s: float = 1.0) -> bool:
        """Whether the cluster answers a metadata request (blocking: run it in a thread)."""
        try:
            self._producer.list_topics(timeout=timeout_s)
        except (KafkaException, RuntimeError):  # RuntimeError: closed
            return False
        return True

    def close(self, timeout_s: float = 10) -> None:
        """Deliver what the broker takes within `timeout_s`, refuse the rest (their callers
        get the failure, not silence), then release the client: an unclosed one keeps
        reconnecting to its broker for the life of the process."""
        if self._closed.is_set():
            return
        self._producer.flush(timeout_s)
        self._producer.purge()
        self._producer.poll(0)  # the purged records' delivery reports
        self._closed.set()
        if self._poller is not None:
            self._poller.join(timeout=2)
        if self._done and self._loop is not None:
            done, self._done = self._done, []
            with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits any more
                self._loop.call_soon_threadsafe(_resolve, done)
        self._producer.close()


def _resolve(done: list[_Request]) -> None:
    for request in done:
        if not request.future.done():
            request.future.set_result(request.failed)
