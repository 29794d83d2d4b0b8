"""Topic creation with the configured partition counts and per-topic configs."""

from __future__ import annotations

from collections.abc import Iterable

from confluent_kafka.admin import AdminClient, NewTopic

from streams.kafka_config import confluent_config
from streams.settings import Settings
from streams.topics import AUDIT_RETENTION_MS, DLQ_MAX_MESSAGE_BYTES, Topics
from streams.watermarks import watermarks

RETRY_TIERS_MS = (200, 400, 800, 1600, 3200)


def pipeline_topics(topics: Topics, steps: Iterable[str], routes: Iterable[str]) -> dict[str, dict]:
    """Every topic of a workflow, mapped to its topic-level config."""
    dlq = {"max.message.bytes": str(DLQ_MAX_MESSAGE_BYTES)}
    names: dict[str, dict] = {topics.tickets_in: {}, topics.dlq: dlq, topics.dlq_parked: dlq}
    names.update({topics.step(s): {} for s in steps})
    names.update({topics.retry(d): {} for d in RETRY_TIERS_MS})
    names.update({topics.out(r): {} for r in [*routes, "reviewed"]})
    names[topics.review_decisions] = {}
    names[topics.review_spot_checks] = {}
    names[topics.review_outcomes] = {}
    names[topics.state] = {}
    names[topics.completed] = {"cleanup.policy": "compact"}
    names[topics.audit] = {"retention.ms": str(AUDIT_RETENTION_MS)}
    names[topics.config_routing] = {"cleanup.policy": "compact"}
    names[topics.features_drift] = {}
    return names


def ensure_topics(settings: Settings, wanted: dict[str, dict], timeout_s: float = 30) -> list[str]:
    """Create the topics that do not exist yet; return the names created."""
    admin = AdminClient(confluent_config(settings))
    existing = set(admin.list_topics(timeout=timeout_s).topics)
    new = [
        NewTopic(name, num_partitions=settings.partitions, replication_factor=1, config=cfg)
        for name, cfg in wanted.items()
        if name not in existing
    ]
    if not new:
        return []
    for _name, future in admin.create_topics(new, operation_timeout=timeout_s).items():
        try:
            future.result()
        except Exception as exc:  # an already-existing topic is fine: someone raced us
            if "TOPIC_ALREADY_EXISTS" not in str(exc):
                raise
    return [t.topic for t in new]


def delete_prefixed(settings: Settings, topic_prefix: str, group_prefix: str) -> None:
    """Delete the topics and consumer groups a run left behind (benchmarks, tests)."""
    admin = AdminClient(confluent_config(settings))
    topics = [t for t in admin.list_topics(timeout=10).topics if t.startswith(topic_prefix)]
    if topics:
        admin.delete_topics(topics)
    groups = [g.group_id for g in admin.list_consumer_groups().result().valid]
    ours = [g for g in groups if g.startswith(group_prefix)]
    if ours:
        admin.delete_consumer_groups(ours)


def topic_size(settings: Settings, topic: str) -> int:
    """Records in `topic` now (high minus low watermark, summed); 0 if it does not exist."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer(confluent_config(settings, {"group.id": "ticketflow-size"}))
    try:
        meta = c.list_topics(topic, timeout=10).topics.get(topic)
        if meta is None or meta.error is not None:
            return 0
        marks = [watermarks(c, TopicPartition(topic, p)) for p in meta.partitions]
        return sum(high - low for low, high in marks)
    finally:
        c.close()
