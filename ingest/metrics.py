"""Ingest's Prometheus metrics, in the default registry (served at `/metrics`).

`route` is the route's template (`/v1/tickets/{ticket_id}`), never the path itself, and
`unmatched` for any other path: a caller must not be able to grow a label without bound.
"""

from __future__ import annotations

from prometheus_client import Counter, Histogram

REQUESTS = Counter(
    "ingest_requests_total",
    "HTTP requests answered by ingest, by route, method and status code.",
    ["route", "method", "status"],
)

REQUEST_SECONDS = Histogram(
    "ingest_request_duration_seconds",
    "Seconds from a request's arrival to its answer, by route and method.",
    ["route", "method"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
)

RECORDS = Counter(
    "ingest_records_total",
    "Tickets in submissions, by outcome: accepted (acknowledged by Kafka), invalid, "
    "too_large, taken (another client's ticket_id), undelivered (Kafka refused or timed out).",
    ["outcome"],
)

PRODUCE_SECONDS = Histogram(
    "ingest_produce_seconds",
    "Seconds from handing a record to the producer until the broker acknowledged it.",
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0),
)

REDIS_FAILURES = Counter(
    "ingest_redis_failures_total",
    "Redis calls that failed, by what they were for, and whether the request went on "
    "(fail open) or was refused.",
    ["purpose", "outcome"],
)

RATE_LIMITED = Counter(
    "ingest_rate_limited_total",
    "Requests refused with 429, by the bucket that was empty (key or ip).",
    ["bucket"],
)
