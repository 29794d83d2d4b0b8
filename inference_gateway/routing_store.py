"""The routing config's store: parsing a config strictly, publishing it to its compacted
topic and reading the latest per name back. The CLI (`inference_gateway/cli.py`) and the
rollout (`inference_gateway/model/rollout.py`) share it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationError

from inference_gateway.routing_watch import kafka_security
from inference_gateway.topic_scan import scan_topic
from schemas.routing import RoutingConfig


class RoutingFileError(ValueError):
    """A routing config file that cannot be used; the message names the fields."""


def describe_errors(error: ValidationError) -> str:
    """One line per problem, each naming its field ("versions.v2: ...")."""
    lines = []
    for e in error.errors(include_url=False, include_input=False):
        loc = ".".join(str(p) for p in e["loc"])
        msg = e["msg"].removeprefix("Value error, ")
        lines.append(f"{loc}: {msg}" if loc else msg)
    return "\n".join(lines)


def parse_routing(data: bytes | str) -> RoutingConfig:
    """A `RoutingConfig` from JSON, or `RoutingFileError` naming the offending fields."""
    try:
        return RoutingConfig.model_validate_json(data)
    except ValidationError as error:
        raise RoutingFileError(describe_errors(error)) from None


def validate_routing_file(path: Path) -> RoutingConfig:
    try:
        data = path.read_bytes()
    except OSError as error:
        raise RoutingFileError(f"{path}: {error.strerror or error}") from None
    return parse_routing(data)


def publish(config: RoutingConfig, bootstrap: str, topic: str, timeout_s: float = 15.0) -> None:
    """Publish `config` keyed by its name (creating the compacted topic if missing)."""
    publish_record(topic, config.name, config.model_dump_json().encode(), bootstrap, timeout_s)


def publish_record(
    topic: str, key: str, value: bytes, bootstrap: str, timeout_s: float = 15.0
) -> None:
    """Publish one record to a compacted topic, creating the topic if missing."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap, **kafka_security()})
    if topic not in admin.list_topics(timeout=timeout_s).topics:
        compact = {"cleanup.policy": "compact"}
        new = NewTopic(topic, num_partitions=1, replication_factor=1, config=compact)
        for future in admin.create_topics([new], operation_timeout=timeout_s).values():
            try:
                future.result()
            except Exception as error:  # someone created it first: fine
                if "TOPIC_ALREADY_EXISTS" not in str(error):
                    raise
    errors: list[str] = []
    producer = Producer(
        {"bootstrap.servers": bootstrap, **kafka_security(), "enable.idempotence": True}
    )
    producer.produce(
        topic,
        key=key.encode(),
        value=value,
        on_delivery=lambda e, _m: errors.append(str(e)) if e is not None else None,
    )
    if producer.flush(timeout_s) != 0:
        raise RuntimeError(f"the config was not delivered to {topic} within {timeout_s:.0f} s")
    if errors:
        raise RuntimeError(f"publishing to {topic} failed: {errors[0]}")


def read_configs(bootstrap: str, topic: str, timeout_s: float = 10.0) -> dict[str, Any]:
    """The latest record per config name on the topic: RoutingConfig, or the raw text of an
    invalid one (as the gateways see it: they keep the previous config)."""
    latest: dict[str, Any] = {}
    for raw_key, value in scan_topic(bootstrap, topic, "ticketflow-config-cli", timeout_s):
        key = raw_key.decode("utf-8", "replace")
        if value is None:
            latest.pop(key, None)
            continue
        try:
            latest[key] = parse_routing(value)
        except RoutingFileError:
            latest[key] = value.decode("utf-8", "replace")
    return latest
