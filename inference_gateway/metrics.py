"""The gateway's Prometheus metrics; names and labels are a contract (DESIGN.md, "Observability").

Defined once per process, in the default registry, so that `GET /metrics` serves them and
several batchers (one per model version) share the same families.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

# items waiting in the batchers' queues; summed over the versions of a model
QUEUE_DEPTH = Gauge(
    "inference_queue_depth",
    "Inputs queued in the gateway's batchers, waiting for a batch.",
    ["model"],
)

BATCH_SIZE = Histogram(
    "inference_batch_size",
    "Inputs per batch sent to Triton.",
    ["model"],
    buckets=(1, 2, 4, 8, 16, 32, 64),
)

# per request: from submit to answer, queueing included, as a caller of the batcher sees it
INFERENCE_LATENCY = Histogram(
    "ai_inference_latency_seconds",
    "Seconds from a request entering the batcher until its scores are back.",
    ["model", "version"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
)

REQUESTS = Counter(
    "gateway_requests_total",
    "Predict requests answered, by outcome (ok or an error code).",
    ["model", "outcome"],
)
