"""confluent-kafka producers for the workflow's outputs: a plain one and a transactional one.

Why not Faust's own producer for step outputs: librdkafka batches and sends from its own
C thread, so a produce call costs microseconds of our event loop instead of the
hundreds that a pure-Python client spends per record; the profile of the pipeline said
that produce was its largest cost. For the same reason no asyncio future is made per
record: delivery is awaited in bulk (`drain`), which the workflow does before Faust
commits the offsets of the inputs (at-least-once).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer

from streams.kafka_errors import kafka_error
from streams.topics import DLQ_MAX_MESSAGE_BYTES

log = logging.getLogger(__name__)

Headers = Sequence[tuple[str, bytes]]
# (topic, key, value, headers, partition); a None value is a tombstone
Record = tuple[str, "bytes | None", "bytes | None", Headers, "int | None"]

# the Java client's partitioner, as Faust and aiokafka use: the same key lands on the same
# partition whichever of our producers writes it, so every topic stays co-partitioned
BASE_CONFIG: dict[str, Any] = {
    "partitioner": "murmur2_random",
    "linger.ms": 1,
    "enable.idempotence": True,
    # librdkafka leaves Nagle's algorithm on; our records are small and latency-bound, and
    # linger.ms already batches them (asyncio, so aiokafka, turns Nagle off too)
    "socket.nagle.disable": True,
    # room for a dead letter: an input record at the broker's limit plus x-dlq-* headers
    "message.max.bytes": DLQ_MAX_MESSAGE_BYTES + 64 * 1024,
}


class AsyncProducer:
    def __init__(self, kafka: Mapping[str, Any], **config: Any) -> None:
        self._producer = Producer(
            {
                **kafka,  # bootstrap and security (streams/kafka_config.py)
                **BASE_CONFIG,
                # a Python callback per delivered record takes the GIL from the event loop
                # thousands of times a second; only failures need one (drain() reads them)
                "delivery.report.only.error": True,
                # one callback for the producer, not one handed over with each record (a
                # reference librdkafka keeps per message: 1.3 of the 3.7 µs a produce cost)
                "on_delivery": self._on_delivery,
                "error_cb": self._on_error,
                **config,
            }
        )
        self._failed: list[KafkaError] = []
        self._closed = threading.Event()
        self._poller = threading.Thread(target=self._poll, name="kafka-producer-poll", daemon=True)
        self._poller.start()

    def _poll(self) -> None:
        while not self._closed.is_set():
            self._producer.poll(0.05)

    def _on_delivery(self, err: KafkaError | None, _msg: Any) -> None:
        if err is not None:  # on the poll thread; looked at by drain()
            self._failed.append(err)

    def _on_error(self, err: KafkaError) -> None:
        if err.fatal():
            self._failed.append(err)

    def produce(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: Headers | None = None,
        partition: int | None = None,
    ) -> None:
        """Queue one record; `drain()` says when it (and all before it) are on the broker."""
        self.produce_many(((topic, key, value, headers or (), partition),))

    def produce_many(self, records: Iterable[Record]) -> None:
        """Queue records (topic, key, value, headers, partition) in one hand-off: a batch's
        outputs cost one call here, not one per record."""
        produce = self._producer.produce
        for topic, key, value, headers, partition in records:
            hdrs = headers if isinstance(headers, list) else list(headers)
            while True:
                try:
                    if partition is None:
                        produce(topic, value, key, headers=hdrs)
                    else:
                        produce(topic, value, key, partition, headers=hdrs)
                    break
                except BufferError:  # librdkafka's queue is full: let it drain
                    self._producer.poll(0.01)

    async def drain(self, wait_s: float = 30) -> None:
        """Wait until every record produced so far is delivered; raise if one never will be.

        A broker that is away only makes this wait (librdkafka retries until the message
        timeout); a record librdkafka gave up on raises, since its input must be redone.
        """
        while len(self._producer):
            if not await asyncio.to_thread(self._producer.flush, wait_s):
                break
            log.warning(
                "%d record(s) still undelivered after %.0f s; waiting", len(self._producer), wait_s
            )
            self._check_failed()
        self._check_failed()

    def _check_failed(self) -> None:
        if self._failed:
            failed, self._failed = self._failed, []
            raise KafkaException(failed[0])

    def close(self) -> None:
        self._producer.flush(10)
        self._closed.set()


class TransactionalProducer:
    """One transactional producer per input partition (Kafka Streams' EOS-v1 model).

    Its `transactional.id` names the partition, so whichever worker owns that partition
    next fences this one when it calls `init_transactions`: a zombie can never commit.
    Blocking calls run in a thread so the event loop keeps serving other partitions.
    """

    def __init__(self, kafka: Mapping[str, Any], transactional_id: str, **config: Any) -> None:
        self.transactional_id = transactional_id
        self._producer = Producer(
            {
                **kafka,
                **BASE_CONFIG,
                "transactional.id": transactional_id,
                "transaction.timeout.ms": 30_000,
                **config,
            }
        )
        self._ready = False

    async def init(self, timeout_s: float = 30) -> None:
        if not self._ready:
            await asyncio.to_thread(self._producer.init_transactions, timeout_s)
            self._ready = True

    async def commit(self, records: Sequence[Record], timeout_s: float = 30) -> None:
        """Write `records` (topic, key, value, headers, partition) atomically."""
        await self.init()
        await asyncio.to_thread(self._commit_sync, records, timeout_s)

    def _commit_sync(self, records: Sequence[Record], timeout_s: float) -> None:
        self._producer.begin_transaction()
        try:
            for topic, key, value, headers, partition in records:
                kwargs: dict[str, Any] = {"key": key, "value": value, "headers": list(headers)}
                if partition is not None:
                    kwargs["partition"] = partition
                self._producer.produce(topic, **kwargs)
            self._producer.commit_transaction(timeout_s)
        except KafkaException as exc:
            err = kafka_error(exc)
            if err is not None and err.txn_requires_abort():
                self._producer.abort_transaction(timeout_s)
            raise

    def close(self) -> None:
        self._producer.flush(5)
