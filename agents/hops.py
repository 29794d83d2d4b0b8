"""Where a hop between two steps spends its time, as Prometheus histograms.

A hop starts when a step produces an envelope (the record's CreateTime, stamped by our
producer) and ends when the next step's handler starts on it. Two points split it:

- fetched: the worker's consumer thread has the record from the broker (the producer's
  linger, the broker's append, and the wait for the consumer's next fetch);
- delivered: the step's handler starts (the hand-over from the consumer thread to the
  event loop, Faust's delivery to the agent's stream, and the wait for a batch).

`ticketflow bench pipeline` reads both from the worker's /metrics to explain the hop.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from prometheus_client import Histogram

_HOP = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.035, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)

FETCHED = Histogram(
    "workflow_hop_fetched_seconds",
    "From an envelope produced to the worker's consumer fetching it, by receiving step",
    ["step"],
    buckets=_HOP,
)
DELIVERED = Histogram(
    "workflow_hop_delivered_seconds",
    "From an envelope produced to its step's handler starting on it",
    ["step"],
    buckets=_HOP,
)


class HopClock:
    """Observes the two points of every hop into a step topic named in `step_of_topic`."""

    def __init__(self, step_of_topic: Mapping[str, str]) -> None:
        self._fetched = {t: FETCHED.labels(s) for t, s in step_of_topic.items()}
        self._delivered = {s: DELIVERED.labels(s) for s in step_of_topic.values()}

    def fetched(self, records: Mapping[Any, Iterable[Any]], at: float) -> None:
        """On the consumer thread: aiokafka records, CreateTime in ms."""
        for tp, batch in records.items():
            child = self._fetched.get(tp.topic)
            if child is not None:
                for record in batch:
                    child.observe(at - record.timestamp / 1000)

    def delivered(self, step: str, events: Sequence[Any]) -> None:
        """At the handler: Faust events, timestamp in seconds."""
        child = self._delivered.get(step)
        if child is not None:
            now = time.time()
            for event in events:
                child.observe(now - event.message.timestamp)
