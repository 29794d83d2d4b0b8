"""Keeps a `Router` in step with the compacted `config.routing` topic, without restarts.

A daemon thread reads the topic from its beginning with confluent-kafka (no consumer group:
every gateway reads every config, and nothing is committed) and hands each valid
`RoutingConfig` to `Router.update`, keyed by config name. At start it reads up to the end of
the topic before the gateway serves (bounded by `initial_timeout_s`), so the first requests
already follow the published config; after that, a change published by `ticketflow config
set` takes effect within about one poll (`poll_s`). An invalid record is logged, counted
(`inference_routing_updates_total{result="invalid"}`) and ignored: the config in force
stays. A tombstone (null value) removes the config; for the default model that means back
to `routing.DEFAULT_CONFIG` (all to v1). Rollback is publishing the previous config.

If Kafka cannot be reached, the gateway serves with what it has (the default config at
first) and the thread keeps trying; `status` says what it last saw (for /readyz). Every
`check_s` the thread asks the broker for the topic's end offsets: that keeps `connected`
true to the broker's state, and when the broker comes back after an outage, or the end has
moved while the consumer brought nothing, the consumer is replaced by a fresh one that goes
on from the offsets already applied, so no later change is missed and no old one re-applied.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from pydantic import ValidationError

from inference_gateway import metrics
from inference_gateway.routing import DEFAULT_CONFIG, Router
from schemas.routing import RoutingConfig

log = logging.getLogger(__name__)

TOPIC = "config.routing"


def routing_topic(prefix: str = "") -> str:
    """The topic name: TICKETFLOW_TOPIC_PREFIX + "config.routing" (docs/architecture.md, Topics)."""
    return f"{prefix}{TOPIC}"


@dataclass
class WatchStatus:
    topic: str
    connected: bool = False
    caught_up: bool = False
    applied: int = 0
    invalid: int = 0
    last_error: str | None = None
    last_update_at: float | None = None
    configs: dict[str, dict[str, Any]] = field(default_factory=dict)


def apply_record(router: Router, key: bytes | None, value: bytes | None) -> str:
    """Apply one record of the topic to `router`: "applied", "removed" or "invalid"."""
    name = key.decode("utf-8", "replace") if key else None
    if value is None:
        if name is None:
            return "invalid"
        if name == DEFAULT_CONFIG.name:
            router.update(DEFAULT_CONFIG)
        else:
            router.remove(name)
        return "removed"
    try:
        config = RoutingConfig.model_validate_json(value)
        if name is not None and name != config.name:
            raise ValueError(f"record key {name!r} is not the config's name {config.name!r}")
        router.update(config)
    except (ValidationError, ValueError) as error:
        log.warning("ignoring an invalid routing config (key %r): %s", name, error)
        return "invalid"
    except Exception as error:  # a GatewayError from update: a version Triton cannot serve
        log.warning("ignoring a routing config Triton cannot follow (key %r): %s", name, error)
        return "invalid"
    log.info("routing for %s is now %s (default %s)", config.name, config.versions, config.default)
    return "applied"


class _Rebuild(Exception):
    """The consumer is to be replaced (broker back after an outage, or a stalled fetch)."""


def kafka_security(env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """librdkafka's security settings from the TICKETFLOW_KAFKA_* variables (docs/architecture.md,
    "Security"), read here because this layer does not import `streams`; the same rules as
    streams/kafka_config.py. Empty for PLAINTEXT."""
    env = os.environ if env is None else env
    if env.get("TICKETFLOW_KAFKA_SECURITY_PROTOCOL", "PLAINTEXT").upper() != "SASL_SSL":
        return {}
    password = env.get("TICKETFLOW_KAFKA_PASSWORD")
    if password is None and env.get("TICKETFLOW_KAFKA_PASSWORD_FILE"):
        with open(env["TICKETFLOW_KAFKA_PASSWORD_FILE"]) as fh:
            password = (fh.read().splitlines() or [""])[0]
    config = {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": env.get("TICKETFLOW_KAFKA_SASL_MECHANISM", "SCRAM-SHA-512"),
        "sasl.username": env.get("TICKETFLOW_KAFKA_USERNAME", ""),
        "sasl.password": password or "",
    }
    if env.get("TICKETFLOW_KAFKA_CA_FILE"):
        config["ssl.ca.location"] = env["TICKETFLOW_KAFKA_CA_FILE"]
    return config


class RoutingWatcher:
    def __init__(
        self,
        router: Router,
        bootstrap: str,
        topic: str,
        *,
        poll_s: float = 0.5,
        initial_timeout_s: float = 5.0,
        check_s: float = 5.0,
        consumer_factory: Callable[[dict[str, Any]], Any] | None = None,
    ) -> None:
        self.router = router
        self.bootstrap = bootstrap
        self.topic = topic
        self.poll_s = poll_s
        self.initial_timeout_s = initial_timeout_s
        self.check_s = check_s
        self._factory = consumer_factory
        self._stop = threading.Event()
        self._caught_up = threading.Event()
        self._thread: threading.Thread | None = None
        # per partition, the offset after the last record applied (or the end it reached)
        self._next: dict[int, int] = {}
        self._outage = False  # an error said no broker answers; cleared by a rebuild
        self._lag: dict[int, int] = {}  # records waiting at the last check
        self.status = WatchStatus(topic)

    def start(self) -> bool:
        """Start the thread; wait (bounded) until the topic has been read to its end."""
        self._thread = threading.Thread(target=self._run, name="routing-watch", daemon=True)
        self._thread.start()
        return self._caught_up.wait(self.initial_timeout_s)

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _consumer(self) -> Any:
        settings = {
            "bootstrap.servers": self.bootstrap,
            **kafka_security(),
            "group.id": f"ticketflow-gateway-routing-{id(self)}",  # never committed
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "enable.partition.eof": True,
            "socket.connection.setup.timeout.ms": 3000,
            "reconnect.backoff.max.ms": 2000,
            "topic.metadata.refresh.interval.ms": 2000,
            "logger": logging.getLogger("inference_gateway.kafka"),
            # without it librdkafka only logs a lost broker: poll() never says so
            "error_cb": self._on_error,
        }
        if self._factory is not None:
            return self._factory(settings)
        from confluent_kafka import Consumer

        return Consumer(settings)

    def _on_error(self, error: Any) -> None:
        from confluent_kafka import KafkaError

        self.status.last_error = str(error)
        # librdkafka's words for "no broker answers": it reconnects by itself, we report it
        down = (KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN, KafkaError._RESOLVE)
        if error.code() in down:
            self.status.connected = False
            self._outage = True

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._consume()
            except _Rebuild as why:
                log.info("routing watch on %s: %s; reading on with a new consumer", self.topic, why)
            except Exception as error:  # keep serving with the configs we have; try again
                self.status.connected = False
                self.status.last_error = repr(error)
                log.warning("routing watch on %s failed: %r; retrying", self.topic, error)
                self._stop.wait(2.0)

    def _consume(self) -> None:
        from confluent_kafka import OFFSET_BEGINNING, TopicPartition

        consumer = self._consumer()
        try:
            partitions = self._partitions(consumer)
            # where the last consumer stopped: a new one neither re-applies old configs
            # (the topic's history) nor skips any
            consumer.assign(
                [
                    TopicPartition(self.topic, p, self._next.get(p, OFFSET_BEGINNING))
                    for p in partitions
                ]
            )
            self.status.connected = True
            self._outage, self._lag = False, {}
            pending = set(partitions) - set(self._next)  # partitions not yet read to their end
            if not pending:
                self._mark_caught_up()
            checked_at = time.monotonic()
            while not self._stop.is_set():
                if time.monotonic() - checked_at >= self.check_s:
                    checked_at = time.monotonic()
                    self._check(consumer, partitions)
                message = consumer.poll(self.poll_s)
                if message is not None:
                    self._on_message(message, pending)
        finally:
            consumer.close()

    def _on_message(self, message: Any, pending: set[int]) -> None:
        from confluent_kafka import KafkaError

        error = message.error()
        if error is None:
            self._next[message.partition()] = message.offset() + 1
            self._apply(message.key(), message.value())
        elif error.code() == KafkaError._PARTITION_EOF:
            self._next[message.partition()] = message.offset()
            pending.discard(message.partition())
            if not pending:
                self._mark_caught_up()
        else:
            self.status.last_error = str(error)
            if error.fatal():
                raise RuntimeError(str(error))

    def _check(self, consumer: Any, partitions: list[int]) -> None:
        """Ask the broker for the end offsets: it answers, or we are not connected; a
        consumer that outlived an outage, or brings nothing while records wait, is replaced."""
        from confluent_kafka import KafkaException, TopicPartition

        try:
            ends = {
                p: consumer.get_watermark_offsets(
                    TopicPartition(self.topic, p), timeout=self.check_s, cached=False
                )[1]
                for p in partitions
            }
        except KafkaException as error:
            self.status.connected = False
            self.status.last_error = str(error)
            self._outage = True
            return
        self.status.connected = True
        if self._outage:
            raise _Rebuild("the broker answers again")
        lag = {p: end - self._next[p] for p, end in ends.items() if end > self._next.get(p, end)}
        stalled = lag and lag == self._lag
        self._lag = lag
        if stalled:
            raise _Rebuild(f"{sum(lag.values())} record(s) waiting and none fetched")

    def _partitions(self, consumer: Any) -> list[int]:
        # the topic may not exist yet (no config ever published): wait for it, reading nothing
        while not self._stop.is_set():
            meta = consumer.list_topics(self.topic, timeout=5.0)
            topic = meta.topics.get(self.topic)
            if topic is not None and topic.error is None and topic.partitions:
                return sorted(topic.partitions)
            self.status.connected = True
            self._mark_caught_up()  # nothing to read: the default config is the config
            self._stop.wait(2.0)
        return []

    def _mark_caught_up(self) -> None:
        if not self._caught_up.is_set():
            self.status.caught_up = True
            self._caught_up.set()

    def _apply(self, key: bytes | None, value: bytes | None) -> None:
        result = apply_record(self.router, key, value)
        metrics.ROUTING_UPDATES.labels("invalid" if result == "invalid" else "applied").inc()
        if result == "invalid":
            self.status.invalid += 1
            return
        self.status.applied += 1
        self.status.last_update_at = time.time()
        self.status.configs = {
            # config(m) is None only for a model not in router.models (and this thread is the
            # router's only writer)
            m: cast(RoutingConfig, self.router.config(m)).model_dump()
            for m in self.router.models
        }
