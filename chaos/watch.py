"""Watching a round's results: a read_committed consumer of the result and dead-letter
topics, and a look into every topic of the round for where a lost ticket got to."""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from streams.topics import Topics
from streams.watermarks import watermarks

ROUTES = ("auto_classify", "manual_review", "after_sales")


@dataclass(frozen=True)
class Seen:
    topic: str
    key: str
    at: float  # wall clock when this read_committed consumer got it
    dead_letter: str = ""  # for a dead letter: "<class> at <step>: <reason>"


class Watcher(threading.Thread):
    """A read_committed consumer of the result and dead-letter topics, from their start.

    Partitions are assigned, not subscribed: no group to rejoin after a broker restart.
    """

    def __init__(self, kafka: Mapping[str, Any], topics: Sequence[str]) -> None:
        super().__init__(name="chaos-watcher", daemon=True)
        self.consumer = Consumer(
            {
                **kafka,
                "group.id": f"chaos-watch-{uuid.uuid4().hex[:8]}",
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
                "log_level": 0,
            }
        )
        parts = []
        for topic in topics:
            meta = self.consumer.list_topics(topic, timeout=30).topics[topic]
            parts += [TopicPartition(topic, p, OFFSET_BEGINNING) for p in meta.partitions]
        self.consumer.assign(parts)
        self.halt = threading.Event()
        self._seen: list[Seen] = []
        self._lock = threading.Lock()

    def run(self) -> None:
        try:
            while not self.halt.is_set():
                for msg in self.consumer.consume(500, 0.2):
                    if not msg.error():
                        self._keep(msg)
        finally:
            self.consumer.close()

    def _keep(self, msg) -> None:
        h = {k: (v or b"").decode("utf-8", "replace") for k, v in msg.headers() or []}
        why = ""
        if "x-dlq-error-class" in h:
            reason = h.get("x-dlq-reason", "").splitlines()[0][:80] if h.get("x-dlq-reason") else ""
            why = f"{h['x-dlq-error-class']} at {h.get('x-dlq-step', '?')}: {reason}"
        key = (msg.key() or b"").decode("utf-8", "replace")
        with self._lock:
            self._seen.append(Seen(msg.topic(), key, time.time(), why))

    def seen(self) -> list[Seen]:
        with self._lock:
            return list(self._seen)


def locate(
    kafka: Mapping[str, Any], prefix: str, keys: set[str], timeout_s: float = 60
) -> dict[str, dict[str, int]]:
    """How many records keyed by each of `keys` every topic under `prefix` holds (read
    uncommitted, so an aborted result counts too): where a lost ticket got to."""
    c = Consumer(
        {
            **kafka,
            "group.id": f"chaos-locate-{uuid.uuid4().hex[:8]}",
            "isolation.level": "read_uncommitted",
            "enable.auto.commit": False,
            "log_level": 0,
        }
    )
    found: dict[str, Counter[str]] = {k: Counter() for k in keys}
    deadline = time.monotonic() + timeout_s
    try:
        meta = c.list_topics(timeout=10).topics
        ends = {
            TopicPartition(t, p): watermarks(c, TopicPartition(t, p))[1]
            for t in meta
            if t.startswith(prefix)
            for p in meta[t].partitions
        }
        todo = {(tp.topic, tp.partition): high for tp, high in ends.items() if high > 0}
        c.assign([TopicPartition(t, p, OFFSET_BEGINNING) for t, p in todo])
        while todo and time.monotonic() < deadline:
            for msg in c.consume(5000, 0.5):
                key = None if msg.error() else (msg.key() or b"").decode("utf-8", "replace")
                if key in found:
                    found[key][msg.topic().removeprefix(prefix)] += 1
            # the position, not the last record: it also steps over a closing txn marker
            for tp in c.position([TopicPartition(t, p) for t, p in todo]):
                if tp.offset >= todo[(tp.topic, tp.partition)]:
                    del todo[(tp.topic, tp.partition)]
    finally:
        c.close()
    return {k: dict(v) for k, v in found.items()}


def watched_topics(topics: Topics) -> list[str]:
    """Every topic a round's tickets end on: the routes and the dead-letter topics."""
    return [*(topics.out(r) for r in ROUTES), topics.dlq, topics.dlq_parked]
