"""The workflow layer's Prometheus metrics (names are a contract: docs/architecture.md)."""

from __future__ import annotations

from typing import Any

from prometheus_client import Counter, Gauge, Histogram

_LATENCY = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

WORKFLOW_DURATION = Histogram(
    "workflow_duration_seconds", "From arrival to result, per ticket", buckets=_LATENCY
)
STEP_DURATION = Histogram(
    "workflow_step_duration_seconds", "Time spent in one step", ["step"], buckets=_LATENCY
)
# the labelled child per step, looked up once: `labels()` builds and locks on every call,
# and every ticket observes six of them
_STEP_SECONDS: dict[str, Any] = {}


def step_seconds(step: str) -> Any:
    """`STEP_DURATION.labels(step)`, kept."""
    child = _STEP_SECONDS.get(step)
    if child is None:
        child = _STEP_SECONDS[step] = STEP_DURATION.labels(step)
    return child


TICKETS = Counter("workflow_tickets_total", "Tickets completed, by route", ["route"])
DLQ = Counter("dlq_records_total", "Records dead-lettered", ["step", "error_class"])
RETRIES = Counter("retries_total", "Step attempts sent to a retry tier", ["step"])
BUNDLED = Counter(
    "workflow_bundled_envelopes_total", "Envelopes sent to a step inside a bundle record"
)
HANDED = Counter(
    "workflow_handed_envelopes_total",
    "Envelopes a step took in memory from its own writer instead of parsing (agents/handoff.py)",
)
DUPLICATES = Counter("workflow_duplicates_total", "Second arrivals of a ticket_id, dropped")
BREAKER = Gauge("circuit_breaker_state", "0 closed, 1 half-open, 2 open", ["target"])
REVIEWS = Counter("workflow_review_decisions_total", "Review decisions, by outcome", ["outcome"])
# the human-measured quality of each model version: agreement rate = agree / (agree + disagree)
REVIEW_AGREEMENT = Counter(
    "workflow_review_agreement_total",
    "Reviewers' decisions set against the category the pipeline proposed, by model version, "
    "kind (spot_check, manual) and verdict (agree, disagree)",
    ["model_version", "kind", "verdict"],
)
INFRA_RETRIES = Counter(
    "workflow_infra_retries_total",
    "Batches or commits retried after an infrastructure error (broker, Redis, gateway)",
    ["what"],
)
BATCH_SPLITS = Counter(
    "workflow_batch_splits_total", "Failing batches split to find the record at fault", ["step"]
)
COMMITS_HELD = Counter(
    "workflow_commits_held_total", "Offset commits refused because outputs were not delivered"
)
# read by the alert rules (deploy/alerts): neither Kafka nor Redis exports metrics here
DEPENDENCY_UP = Gauge(
    "workflow_dependency_up",
    "1 when the worker's last probe (every 5 s) reached the dependency (kafka, redis)",
    ["dependency"],
)
CONSUMER_LAG = Gauge(
    "workflow_consumer_lag",
    "Records on the worker's assigned partitions not yet fetched, per topic",
    ["topic"],
)
