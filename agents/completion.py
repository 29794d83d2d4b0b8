"""The completion ledger: which tickets already have their one `TicketResult`.

Results and their ledger entries are written in one Kafka transaction by the partition's
transactional producer, so for `read_committed` readers a result exists exactly when its
ledger entry does. The ledger is the compacted topic `tickets.completed`, partitioned like
the route step's input: the owner of a partition loads that partition's entries after
fencing any previous owner, and skips a ticket already in it.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Mapping
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from agents.decoding import ledger_key
from streams.watermarks import watermarks

log = logging.getLogger(__name__)


class CompletionLedger:
    def __init__(self, kafka: Mapping[str, Any], topic: str) -> None:
        self._kafka = kafka
        self.topic = topic
        self._done: dict[int, set[str]] = {}

    def loaded(self, partition: int) -> bool:
        return partition in self._done

    async def load(self, partition: int, timeout_s: float = 60) -> None:
        self._done[partition] = await asyncio.to_thread(self._read, partition, timeout_s)

    def forget(self, partition: int) -> None:
        self._done.pop(partition, None)

    def has(self, partition: int, ticket_id: str) -> bool:
        return ticket_id in self._done[partition]

    def add(self, partition: int, ticket_id: str) -> None:
        self._done[partition].add(ticket_id)

    def _read(self, partition: int, timeout_s: float) -> set[str]:
        consumer = Consumer(
            {
                **self._kafka,
                "group.id": f"ledger-{uuid.uuid4().hex}",  # never commits: assign() only
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
                "enable.partition.eof": True,
            }
        )
        tp = TopicPartition(self.topic, partition, OFFSET_BEGINNING)
        done: set[str] = set()
        try:
            _low, high = watermarks(consumer, tp)
            if high <= 0:
                return done
            consumer.assign([tp])
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                msg = consumer.poll(0.5)
                if msg is not None and not msg.error():
                    self._take(done, partition, msg.key(), msg.offset())
                position = consumer.position([tp])[0].offset
                if position >= high:
                    return done
            raise TimeoutError(f"{self.topic}[{partition}]: ledger not read in {timeout_s} s")
        finally:
            consumer.close()

    def _take(self, done: set[str], partition: int, key: object, offset: int | None) -> None:
        """Add an entry's ticket_id; a key that names none (null, not UTF-8) is skipped:
        no result was written under it, and raising here would stop the partition's
        router for good, the ledger being read again on every retry."""
        ticket_id = ledger_key(key)
        if ticket_id is None:
            log.warning(
                "%s[%d]@%d: ledger entry without a ticket_id key skipped",
                self.topic,
                partition,
                offset,
            )
            return
        done.add(ticket_id)
