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

from collections.abc import Callable
from typing import Any, Protocol

import faust
import orjson
from faust.utils.json import on_default

_DELETED = object()
# what Faust's "json" codec writes (faust.utils.json.dumps), byte for byte, without its
# per-record codec lookup and topic preparation (about 7 -> 1.5 µs for a key and a value)
_JSON_OPTIONS = orjson.OPT_NON_STR_KEYS | orjson.OPT_UTC_Z


def _json(obj: Any) -> bytes:
    return orjson.dumps(obj, default=on_default, option=_JSON_OPTIONS)


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
    _dirty: dict[tuple[int | None, Any], Any]
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
        key_of, value_of = self._serializers(topic)
        for (partition, key), value in pending.items():
            raw_value = None if value is _DELETED else value_of(value)
            self._sink.produce(name, key_of(key), raw_value, None, partition)
        return len(pending)

    def _serializers(self, topic: Any) -> tuple[Callable[[Any], Any], Callable[[Any], Any]]:
        """(key, value) -> bytes as the changelog topic would prepare them."""
        plain = self.key_type is None and self.value_type is None
        if plain and self.key_serializer == "json" and self.value_serializer == "json":
            return _json, _json
        return (
            lambda key: topic.prepare_key(key, self.key_serializer)[0],
            lambda value: topic.prepare_value(value, self.value_serializer)[0],
        )
