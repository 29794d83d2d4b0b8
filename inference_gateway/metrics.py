"""The gateway's Prometheus metrics; names are a contract (docs/architecture.md, "Observability").

Defined once per process, in the default registry, so that `GET /metrics` serves them and
several batchers (one per model version) share the same families. The contract names carry
a `version` label beside `model` (a query on `{model="..."}` sums over versions).
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

# inputs waiting in a batcher's queue for a batch
QUEUE_DEPTH = Gauge(
    "inference_queue_depth",
    "Inputs queued in the gateway's batchers, waiting for a batch.",
    ["model", "version"],
)

BATCH_SIZE = Histogram(
    "inference_batch_size",
    "Inputs per batch sent to Triton.",
    ["model", "version"],
    buckets=(1, 2, 4, 8, 16, 32, 64),
)

# per request: from submit to answer, queueing included, as a caller of the batcher sees it
INFERENCE_LATENCY = Histogram(
    "ai_inference_latency_seconds",
    "Seconds from a request entering the batcher until its scores are back.",
    ["model", "version"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
)

# per batch: the Triton call alone (what the adaptive batch delay is sized from)
BATCH_SECONDS = Histogram(
    "inference_batch_seconds",
    "Seconds of one batch's call to Triton.",
    ["model", "version"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
)

BATCH_DELAY = Gauge(
    "inference_batch_delay_seconds",
    "The longest a batch waits to fill now (fixed, or sized from batch cost when adaptive).",
    ["model", "version"],
)

REQUESTS = Counter(
    "gateway_requests_total",
    "Predict requests answered, by outcome (ok or an error code).",
    ["model", "outcome"],
)

OUTPUTS = Counter(
    "gateway_outputs_total",
    "Outputs answered, by the model version that produced them.",
    ["model", "version"],
)

CACHE = Counter(
    "inference_cache_lookups_total",
    "Inputs looked up in the response cache: hit, miss, or shared (joined an identical input "
    "already in flight).",
    ["model", "version", "result"],
)

CACHE_HIT_RATIO = Gauge(
    "inference_cache_hit_ratio",
    "Share of inputs answered from the response cache since start.",
    ["model", "version"],
)

CACHE_ENTRIES = Gauge("inference_cache_entries", "Entries in the response cache.")

ROUTING_WEIGHT = Gauge(
    "inference_routing_weight",
    "Canary weight (0-100) of each version in the routing config in force.",
    ["model", "version"],
)

ROUTING_UPDATES = Counter(
    "inference_routing_updates_total",
    "Routing configs read from config.routing: applied, or refused as invalid.",
    ["result"],
)
