"""The data layer's Prometheus metrics (the first three names are a contract:
docs/architecture.md)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

FETCH_SECONDS = Histogram(
    "feature_fetch_seconds",
    "Online feature read latency",
    ["view"],
    buckets=(0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0),
)
COVERAGE = Gauge(
    "feature_coverage_ratio",
    "Share of real (non-fallback) values served over the last minute",
    ["view"],
)
DRIFT = Gauge(
    "feature_drift_detected", "1 when the last drift check found drift", ["view", "feature"]
)

READS = Counter(
    "feature_reads_total",
    "Online reads by how they were answered (cache, redis, fallback, mismatch, unreadable)",
    ["view", "result"],
)
EVENTS = Counter(
    "feature_job_events_total",
    "Source events by what the feature job did with them "
    "(applied, duplicate, late, future, no_entity, invalid, failed)",
    ["view", "outcome"],
)
LAG = Gauge(
    "feature_job_lag_seconds", "Now minus the event time of the newest applied event", ["view"]
)
WRITE_RETRIES = Counter(
    "feature_job_write_retries_total",
    "Batches written again after Redis failed them, by the error's type",
    ["error"],
)
BATCH_SECONDS = Histogram(
    "feature_job_batch_seconds",
    "One pipelined write of a batch of events to Redis",
    buckets=(0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
)
BUILT = Gauge("feature_view_built", "1 once the view is rebuilt under its signature", ["view"])
