"""An asyncio face on confluent-kafka's producer, and its transactional sibling.

Why not Faust's own producer for step outputs: librdkafka batches and sends from its own
C thread, so a produce call costs microseconds of our event loop instead of the
hundreds that a pure-Python client spends per record; the profile of the pipeline said
that produce was its largest cost. Delivery reports come back on a poll thread and
resolve asyncio futures, so a step can await its outputs before it acknowledges its
inputs, or (as the workflow does) let Faust's offset commit wait on `drain()`.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from typing import Any

from confluent_kafka import KafkaException, Producer, TopicPartition

Headers = Sequence[tuple[str, bytes]]

# the Java client's partitioner, as Faust and aiokafka use: the same key lands on the same
# partition whichever of our producers writes it, so every topic stays co-partitioned
BASE_CONFIG: dict[str, Any] = {
    "partitioner": "murmur2_random",
    "linger.ms": 1,
    "enable.idempotence": True,
}


class AsyncProducer:
    def __init__(self, bootstrap: str, **config: Any) -> None:
        self._producer = Producer({"bootstrap.servers": bootstrap, **BASE_CONFIG, **config})
        self._closed = threading.Event()
        self._outstanding: set[asyncio.Future[None]] = set()
        self._poller = threading.Thread(target=self._poll, name="kafka-producer-poll", daemon=True)
        self._poller.start()

    def _poll(self) -> None:
        while not self._closed.is_set():
            self._producer.poll(0.05)

    def produce(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: Headers | None = None,
        partition: int | None = None,
    ) -> asyncio.Future[None]:
        """Queue one record; the future resolves when the broker has it."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()

        def on_delivery(err: Any, _msg: Any) -> None:
            loop.call_soon_threadsafe(_settle, future, err)

        self._outstanding.add(future)
        future.add_done_callback(self._outstanding.discard)

        kwargs: dict[str, Any] = {
            "key": key,
            "value": value,
            "headers": list(headers or ()),
            "on_delivery": on_delivery,
        }
        if partition is not None:
            kwargs["partition"] = partition
        while True:
            try:
                self._producer.produce(topic, **kwargs)
                return future
            except BufferError:  # librdkafka's queue is full: let it drain
                self._producer.poll(0.01)

    async def drain(self) -> None:
        """Wait until every record produced so far is on the broker (or raise its error)."""
        while self._outstanding:
            await asyncio.gather(*list(self._outstanding))

    async def flush(self, timeout_s: float = 30) -> None:
        remaining = await asyncio.to_thread(self._producer.flush, timeout_s)
        if remaining:
            raise KafkaException(f"{remaining} record(s) not delivered in {timeout_s} s")

    def close(self) -> None:
        self._producer.flush(10)
        self._closed.set()


def _settle(future: asyncio.Future[None], err: Any) -> None:
    if future.done():
        return
    if err is None:
        future.set_result(None)
    else:
        future.set_exception(KafkaException(err))


class TransactionalProducer:
    """One transactional producer per input partition (Kafka Streams' EOS-v1 model).

    Its `transactional.id` names the partition, so whichever worker owns that partition
    next fences this one when it calls `init_transactions`: a zombie can never commit.
    Blocking calls run in a thread so the event loop keeps serving other partitions.
    """

    def __init__(self, bootstrap: str, transactional_id: str, **config: Any) -> None:
        self.transactional_id = transactional_id
        self._producer = Producer(
            {
                "bootstrap.servers": bootstrap,
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

    async def commit(
        self,
        records: Sequence[tuple[str, bytes, bytes, Headers, int | None]],
        timeout_s: float = 30,
    ) -> None:
        """Write `records` (topic, key, value, headers, partition) atomically."""
        await self.init()
        await asyncio.to_thread(self._commit_sync, records, timeout_s)

    def _commit_sync(
        self, records: Sequence[tuple[str, bytes, bytes, Headers, int | None]], timeout_s: float
    ) -> None:
        self._producer.begin_transaction()
        try:
            for topic, key, value, headers, partition in records:
                kwargs: dict[str, Any] = {"key": key, "value": value, "headers": list(headers)}
                if partition is not None:
                    kwargs["partition"] = partition
                self._producer.produce(topic, **kwargs)
            self._producer.commit_transaction(timeout_s)
        except KafkaException as exc:
            if exc.args and exc.args[0].txn_requires_abort():
                self._producer.abort_transaction(timeout_s)
            raise

    def close(self) -> None:
        self._producer.flush(5)


__all__ = ["AsyncProducer", "TopicPartition", "TransactionalProducer"]
