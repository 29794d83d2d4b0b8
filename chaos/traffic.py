"""The traffic of a round: valid tickets at a steady rate and hostile records at their
planned times, from a stock producer configured as a user's client would be."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

import orjson
from confluent_kafka import Producer


def hostile_record(kind: str, key: str) -> tuple[bytes, list[tuple[str, bytes]] | None]:
    """(value, headers) of a record `validate` must dead-letter."""
    broken = b'{"ticket_id": "' + key.encode() + b'", "text": '  # cut off mid-object
    if kind == "bad_json":
        return broken, None
    if kind == "not_utf8":
        return b"\xff\xfe\xfa not utf-8 \xc3\x28", None
    if kind == "schema":  # well-formed JSON, but the text is empty and the date is not one
        return orjson.dumps({"ticket_id": key, "text": "", "created_at": "yesterday"}), None
    if kind == "too_large":
        return orjson.dumps({"ticket_id": key, "text": "x" * 70_000, "created_at": now_iso()}), None
    if kind == "bad_replay_count":
        return broken, [("x-replay-count", b"abc")]
    if kind == "bad_header_bytes":
        return broken, [("traceparent", b"\xff\xfe\x00"), ("x-replay-count", b"\xc3\x28")]
    raise ValueError(f"unknown hostile kind {kind!r}")


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat()


class Traffic(threading.Thread):
    """A stock producer: valid tickets at a steady rate, hostile records at their times."""

    def __init__(
        self,
        kafka: Mapping[str, Any],
        topic: str,
        tag: str,
        rate: float,
        hostile: Sequence[tuple[float, str]],
        texts: Sequence[str],
    ) -> None:
        super().__init__(name=f"chaos-traffic-{tag}", daemon=True)
        # defaults as a user's client would have them: no idempotence, librdkafka's partitioner
        # log_level 0: librdkafka's reconnect lines through a broker outage are expected
        self.producer = Producer({**kafka, "linger.ms": 5, "log_level": 0})
        self.topic, self.tag, self.rate, self.texts = topic, tag, rate, texts
        self.pending = list(hostile)
        self.sent: list[str] = []
        self.acked: set[str] = set()
        self.failed: dict[str, str] = {}
        self.hostile_sent: dict[str, str] = {}  # key -> kind
        self.halt = threading.Event()

    def run(self) -> None:
        start, n = time.monotonic(), 0
        while not self.halt.is_set():
            elapsed = time.monotonic() - start
            while self.pending and self.pending[0][0] <= elapsed:
                self._hostile(self.pending.pop(0)[1])
            if n / self.rate > elapsed:
                self.halt.wait(min(n / self.rate - elapsed, 0.05))
                self.producer.poll(0)
                continue
            self._ticket(n)
            n += 1
        for _, kind in self.pending:  # a round cut short: every planned hostile is checked
            self._hostile(kind)
        self.producer.flush(120)

    def _ticket(self, n: int) -> None:
        tid = f"{self.tag}-{n}"
        value = orjson.dumps(
            {
                "ticket_id": tid,
                "text": self.texts[n % len(self.texts)],
                "user_id": f"u{n % 50}",
                "channel": "email",
                "created_at": now_iso(),
            }
        )
        self._produce(tid, value, None)
        self.sent.append(tid)

    def _hostile(self, kind: str) -> None:
        key = f"{self.tag}-hostile-{kind}"
        value, headers = hostile_record(kind, key)
        self._produce(key, value, headers)
        self.hostile_sent[key] = kind

    def _produce(self, key: str, value: bytes, headers: list | None) -> None:
        def on_delivery(err, _msg) -> None:
            if err is None:
                self.acked.add(key)
            else:
                self.failed[key] = str(err)

        while True:
            try:
                self.producer.produce(
                    self.topic,
                    key=key.encode(),
                    value=value,
                    headers=headers,
                    on_delivery=on_delivery,
                )
                break
            except BufferError:  # the local queue is full (a long broker outage): wait
                self.producer.poll(0.1)
        self.producer.poll(0)


def corpus_texts(seed: int) -> list[str]:
    """Ticket texts of the corpus generator, drawn by the round's seed."""
    from training.corpus import generate

    return [t["text"] for t in generate(300, seed=seed % 100_000)]
