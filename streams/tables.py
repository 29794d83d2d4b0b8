"""A Faust table whose changelog is written behind, as Kafka Streams' record cache does.

Why: a stock Faust table sends every write through Faust's producer buffer, one aiokafka
send at a time, and stops the consumer whenever more than 100 writes wait. The workflow
writes a ticket's state at every hop, so under load the buffer fills, fetching stops
for up to a second, and the whole pipeline runs at the speed of that one Python loop
(the profile of `ticketflow bench pipeline` showed these stalls every few seconds).

This table keeps the newest value of each changed key in memory and writes it to the
changelog when `flush_changelog()` is called, through any producer with a librdkafka
style `produce` (ours: `streams.producer.AsyncProducer`). Several writes of one key
between two flushes become one changelog record. Reads see every write at once.

Correctness is Kafka Streams' at-least-once rule: flush before the input offsets are
committed (the worker does it in the commit's producer flush), so a committed input
always has its state on the changelog; a crash loses only writes whose inputs are
processed again.
"""

from __future__ import annotations

from typing import Any, Protocol

import faust

_DELETED = object()


class Produce(Protocol):
    def produce(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: Any = None,
        partition: int | None = None,
    ) -> None: ...


class WriteBehindTable(faust.Table):
    """For plain key-value tables: the key expiry of windowed tables is not kept here."""

    # newest value per (partition, key) since the last flush
    _dirty: dict[tuple[int, Any], Any]
    _sink: Produce | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        self._dirty = {}

    def write_through(self, sink: Produce) -> None:
        """Send flushed changelog records through `sink` (set before the app starts)."""
        self._sink = sink

    @property
    def dirty(self) -> int:
        return len(self._dirty)

    def on_key_set(self, key: Any, value: Any) -> None:
        partition = self.partition_for_key(key)
        self._dirty[(partition, key)] = value
        self.app.sensors.on_table_set(self, key, value)

    def on_key_del(self, key: Any) -> None:
        partition = self.partition_for_key(key)
        self._dirty[(partition, key)] = _DELETED
        self.app.sensors.on_table_del(self, key)

    def flush_changelog(self) -> int:
        """Queue every pending write on the sink; how many."""
        if self._sink is None:
            raise RuntimeError(f"table {self.name}: write_through() was never called")
        pending, self._dirty = self._dirty, {}
        topic = self.changelog_topic
        name = topic.get_topic_name()
        for (partition, key), value in pending.items():
            raw_key, _ = topic.prepare_key(key, self.key_serializer)
            raw_value = None
            if value is not _DELETED:
                raw_value, _ = topic.prepare_value(value, self.value_serializer)
            self._sink.produce(name, raw_key, raw_value, None, partition)
        return len(pending)
