"""config.routing -> Router: valid configs applied, invalid ones ignored, tombstones; the
watcher thread on a stand-in consumer (the real Kafka is in tests/integration)."""

from __future__ import annotations

import threading
import time

from confluent_kafka import KafkaError
from prometheus_client import REGISTRY

from inference_gateway.routing import DEFAULT_CONFIG, Router
from inference_gateway.routing_watch import RoutingWatcher, apply_record, routing_topic
from schemas.routing import RoutingConfig

CANARY = b'{"name": "ticket_classifier", "versions": {"v1": 90, "v2": 10}, "default": "v1"}'


def test_the_topic_name_takes_the_prefix() -> None:
    assert routing_topic() == "config.routing"
    assert routing_topic("it1.") == "it1.config.routing"


def test_a_valid_config_is_applied() -> None:
    router = Router()
    assert apply_record(router, b"ticket_classifier", CANARY) == "applied"
    assert router.config("ticket_classifier").versions == {"v1": 90, "v2": 10}
    weight = {"model": "ticket_classifier", "version": "v2"}
    assert REGISTRY.get_sample_value("inference_routing_weight", weight) == 10


def test_an_invalid_config_is_ignored_and_the_old_one_stays() -> None:
    router = Router()
    apply_record(router, b"ticket_classifier", CANARY)
    bad = [
        b'{"name": "ticket_classifier", "versions": {"v1": "50", "v2": 50}, "default": "v1"}',
        b'{"name": "ticket_classifier", "versions": {"v1": 90}, "default": "v1"}',
        b'{"name": "ticket_classifier", "versions": {"latest": 100}, "default": "latest"}',
        b"not json",
        b'{"name": "other", "versions": {"v1": 100}, "default": "v1"}',  # key != name
    ]
    for value in bad:
        assert apply_record(router, b"ticket_classifier", value) == "invalid"
    assert router.config("ticket_classifier").versions == {"v1": 90, "v2": 10}


def test_a_tombstone_restores_the_default_or_forgets_the_model() -> None:
    router = Router()
    apply_record(router, b"ticket_classifier", CANARY)
    apply_record(router, b"other", b'{"name": "other", "versions": {"v1": 100}, "default": "v1"}')
    assert apply_record(router, b"ticket_classifier", None) == "removed"
    assert router.config("ticket_classifier") == DEFAULT_CONFIG
    apply_record(router, b"other", None)
    assert "other" not in router.models


class _Message:
    def __init__(self, key, value, partition=0, eof=False, offset=0) -> None:
        self._key, self._value, self._partition, self._eof = key, value, partition, eof
        self._offset = offset

    def offset(self):
        return self._offset

    def error(self):
        return KafkaError(KafkaError._PARTITION_EOF) if self._eof else None

    def key(self):
        return self._key

    def value(self):
        return self._value

    def partition(self):
        return self._partition


class _Meta:
    def __init__(self, topic: str) -> None:
        partition_meta = type("P", (), {})()
        topic_meta = type("T", (), {"error": None, "partitions": {0: partition_meta}})()
        self.topics = {topic: topic_meta}


class FakeConsumer:
    """One partition: the records given, an EOF, then whatever `feed` adds."""

    def __init__(self, topic: str, records: list[tuple[bytes, bytes | None]]) -> None:
        self.topic = topic
        self.queue = [_Message(k, v) for k, v in records] + [_Message(None, None, eof=True)]
        self.lock = threading.Lock()
        self.closed = False

    def list_topics(self, topic: str, timeout: float):
        return _Meta(self.topic)

    def assign(self, partitions) -> None:
        assert [p.topic for p in partitions] == [self.topic]

    def poll(self, timeout: float):
        with self.lock:
            if self.queue:
                return self.queue.pop(0)
        time.sleep(min(timeout, 0.01))
        return None

    def feed(self, key: bytes, value: bytes | None) -> None:
        with self.lock:
            self.queue.append(_Message(key, value))

    def close(self) -> None:
        self.closed = True


def test_the_watcher_catches_up_then_follows_changes_without_restart() -> None:
    consumer = FakeConsumer("p.config.routing", [(b"ticket_classifier", CANARY)])
    router = Router()
    watcher = RoutingWatcher(
        router, "unused:9092", "p.config.routing", poll_s=0.01, consumer_factory=lambda _: consumer
    )
    assert watcher.start()  # read to the end before serving
    try:
        assert router.config("ticket_classifier").versions == {"v1": 90, "v2": 10}
        assert watcher.status.caught_up and watcher.status.applied == 1
        consumer.feed(b"ticket_classifier", b"{broken")
        consumer.feed(
            b"ticket_classifier",
            RoutingConfig(name="ticket_classifier", versions={"v1": 100}, default="v1")
            .model_dump_json()
            .encode(),
        )
        deadline = time.monotonic() + 2
        while router.config("ticket_classifier").versions != {"v1": 100}:
            assert time.monotonic() < deadline, "the rollback was not picked up"
            time.sleep(0.01)
        assert watcher.status.invalid == 1
    finally:
        watcher.stop()
    assert consumer.closed
