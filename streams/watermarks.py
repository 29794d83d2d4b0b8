"""A partition's watermarks, or any other question to the cluster, asked through the
moments a broker cannot yet answer.

A topic created a moment ago, or a broker just back from a restart, answers "not leader
for partition" (or "leader not available") until its partitions' leaders are elected.
confluent-kafka's binding raises those without marking them retriable, so every caller of
`get_watermark_offsets` saw a transient state of the cluster as a failure. This is the one
place that waits them out; an error that says anything else (authorization, a topic that
stays unknown past the deadline) is raised as it is.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol, TypeVar

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from streams.kafka_errors import kafka_error

# the cluster has not settled yet: asking again shortly gets the answer
TRANSIENT = frozenset(
    {
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError.BROKER_NOT_AVAILABLE,
        KafkaError.REPLICA_NOT_AVAILABLE,
        KafkaError.NOT_ENOUGH_REPLICAS,
        KafkaError.OFFSET_NOT_AVAILABLE,
        KafkaError._TIMED_OUT,
        KafkaError._TRANSPORT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError._UNKNOWN_PARTITION,
        KafkaError._UNKNOWN_TOPIC,
        KafkaError._WAIT_COORD,
    }
)
PAUSE_S = 0.25
T = TypeVar("T")


class _Watermarked(Protocol):
    def get_watermark_offsets(
        self, partition: TopicPartition, timeout: float = ..., cached: bool = ...
    ) -> tuple[int, int]: ...


def transient(exc: KafkaException) -> bool:
    err = kafka_error(exc)
    return err is not None and (err.code() in TRANSIENT or err.retriable())


def watermarks(
    consumer: _Watermarked, tp: TopicPartition, timeout_s: float = 15.0
) -> tuple[int, int]:
    """(low, high) of `tp` as the broker has them now."""
    return settled(
        lambda wait: consumer.get_watermark_offsets(tp, timeout=wait, cached=False), timeout_s
    )


def settled(ask: Callable[[float], T], timeout_s: float = 15.0) -> T:
    """`ask(wait_s)`, asked again on a transient error until `timeout_s` has passed."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return ask(max(1.0, min(5.0, deadline - time.monotonic())))
        except KafkaException as exc:
            if not transient(exc) or time.monotonic() + PAUSE_S > deadline:
                raise
        time.sleep(PAUSE_S)
