"""The KafkaError that a confluent-kafka exception carries, for code that decides by it."""

from __future__ import annotations

from confluent_kafka import KafkaError, KafkaException


def kafka_error(exc: BaseException) -> KafkaError | None:
    """`exc`'s KafkaError, or None for any other exception (or one raised without it)."""
    if isinstance(exc, KafkaException) and exc.args and isinstance(exc.args[0], KafkaError):
        return exc.args[0]
    return None
