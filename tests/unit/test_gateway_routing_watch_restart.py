"""The routing watcher through a broker restart, on a stand-in broker: it says it is
disconnected while no broker answers, and afterwards follows config.routing again even when
the consumer it had never fetches another record."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError, KafkaException

from inference_gateway.routing import Router
from inference_gateway.routing_watch import RoutingWatcher

TOPIC = "p.config.routing"
CANARY = b'{"name": "ticket_classifier", "versions": {"v1": 90, "v2": 10}, "default": "v1"}'
ROLLBACK = b'{"name": "ticket_classifier", "versions": {"v1": 100}, "default": "v1"}'


class Broker:
    """One partition of config.routing, and whether the broker is up."""

    def __init__(self) -> None:
        self.log: list[tuple[bytes, bytes]] = []
        self.up = True

    def check(self) -> None:
        if not self.up:
            raise KafkaException(KafkaError(KafkaError._TRANSPORT))


class Msg:
    def __init__(self, offset: int, record: tuple[bytes, bytes] | None) -> None:
        self._offset, self._record = offset, record

    def error(self) -> KafkaError | None:
        return KafkaError(KafkaError._PARTITION_EOF) if self._record is None else None

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return self._offset

    def key(self) -> bytes | None:
        return self._record[0] if self._record else None

    def value(self) -> bytes | None:
        return self._record[1] if self._record else None


class Consumer:
    """A consumer that, like the one this fixes, may never fetch again after an outage."""

    def __init__(self, broker: Broker, settings: dict[str, Any]) -> None:
        self.broker = broker
        self.on_error: Callable[[KafkaError], None] = settings.get("error_cb", lambda _e: None)
        self.position = self.assigned_at = 0
        self.stuck = self.closed = self.eof_sent = False

    def list_topics(self, topic: str, timeout: float) -> Any:
        self.broker.check()
        partition = type("T", (), {"error": None, "partitions": {0: object()}})()
        return type("M", (), {"topics": {topic: partition}})()

    def assign(self, parts: list) -> None:
        self.position = self.assigned_at = max(parts[0].offset, 0)  # OFFSET_BEGINNING is < 0

    def poll(self, timeout: float) -> Msg | None:
        time.sleep(min(timeout, 0.005))
        if not self.broker.up:
            self.stuck = True
            self.on_error(KafkaError(KafkaError._TRANSPORT))
            return None
        if self.stuck:
            return None
        if self.position < len(self.broker.log):
            self.position += 1
            self.eof_sent = False
            return Msg(self.position - 1, self.broker.log[self.position - 1])
        if not self.eof_sent:
            self.eof_sent = True
            return Msg(self.position, None)
        return None

    def get_watermark_offsets(self, tp: Any, timeout: float, cached: bool) -> tuple[int, int]:
        self.broker.check()
        return 0, len(self.broker.log)

    def close(self) -> None:
        self.closed = True


def wait_until(what: str, condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout_s} s: {what}"
        time.sleep(0.01)


def watch(broker: Broker) -> tuple[RoutingWatcher, Router, list[Consumer]]:
    made: list[Consumer] = []

    def factory(settings: dict[str, Any]) -> Consumer:
        made.append(Consumer(broker, settings))
        return made[-1]

    router = Router()
    watcher = RoutingWatcher(
        router, "unused:9092", TOPIC, poll_s=0.01, check_s=0.05, consumer_factory=factory
    )
    broker.log.append((b"ticket_classifier", CANARY))
    assert watcher.start()
    return watcher, router, made


def test_after_a_broker_restart_it_reconnects_and_follows_later_changes() -> None:
    broker = Broker()
    watcher, router, made = watch(broker)
    try:
        assert watcher.status.connected
        broker.up = False
        wait_until("connected: false while no broker answers", lambda: not watcher.status.connected)
        broker.up = True
        broker.log.append((b"ticket_classifier", ROLLBACK))
        wait_until(
            "the rollback published after the restart",
            lambda: router.config("ticket_classifier").versions == {"v1": 100},
        )
        assert watcher.status.connected
        assert made[0].closed and made[-1].assigned_at == 1  # on from where it was
        assert watcher.status.applied == 2  # the canary was not applied a second time
    finally:
        watcher.stop()


def test_a_consumer_that_brings_nothing_while_records_wait_is_replaced() -> None:
    broker = Broker()
    watcher, router, made = watch(broker)
    try:
        made[0].stuck = True  # no error at all: only the end offsets tell
        broker.log.append((b"ticket_classifier", ROLLBACK))
        wait_until(
            "the change behind a stalled fetch",
            lambda: router.config("ticket_classifier").versions == {"v1": 100},
        )
        assert len(made) == 2 and watcher.status.connected
    finally:
        watcher.stop()


def test_it_stays_disconnected_while_the_broker_is_down() -> None:
    broker = Broker()
    watcher, router, _made = watch(broker)
    try:
        broker.up = False
        time.sleep(0.3)  # several checks fail in this time
        assert not watcher.status.connected and "_TRANSPORT" in (watcher.status.last_error or "")
        assert router.config("ticket_classifier").versions == {"v1": 90, "v2": 10}
    finally:
        watcher.stop()
