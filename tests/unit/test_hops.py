"""The hop clock: the two points of a hop, observed per receiving step."""

from __future__ import annotations

import asyncio
import time
from collections import namedtuple
from types import SimpleNamespace

from agents.hops import DELIVERED, FETCHED, HopClock
from streams import faust_adapter


def _sample(metric, step: str, suffix: str) -> float:
    samples = metric.collect()[0].samples
    found = [s.value for s in samples if s.name.endswith(suffix) and s.labels["step"] == step]
    return found[0] if found else 0.0


TP = namedtuple("TP", "topic partition")


def _record(ts_ms: float) -> SimpleNamespace:
    return SimpleNamespace(timestamp=ts_ms)


def test_fetched_observes_step_topics_only() -> None:
    clock = HopClock({"p.tickets.step.infer": "hoptest-infer"})
    before = _sample(FETCHED, "hoptest-infer", "_count")
    now = time.time()
    records = {
        TP("p.tickets.step.infer", 0): [_record(now * 1000 - 20)] * 3,
        TP("p.tickets.in", 0): [_record(now * 1000 - 20)],  # not a hop
    }
    clock.fetched(records, now)
    assert _sample(FETCHED, "hoptest-infer", "_count") - before == 3
    total = _sample(FETCHED, "hoptest-infer", "_sum")
    assert total > 0.059  # three hops of 20 ms each (float ms stamps)


def test_delivered_reads_faust_seconds() -> None:
    clock = HopClock({"p.tickets.step.rules": "hoptest-rules"})
    before = _sample(DELIVERED, "hoptest-rules", "_sum")
    sent = time.time() - 0.5
    events = [SimpleNamespace(message=SimpleNamespace(timestamp=sent))]
    clock.delivered("hoptest-rules", events)
    clock.delivered("unknown-step", events)  # no series for a step that is not a hop's end
    spent = _sample(DELIVERED, "hoptest-rules", "_sum") - before
    assert 0.5 <= spent < 5


def test_observe_fetches_sees_every_non_empty_batch() -> None:
    batches = [{"tp": [1, 2]}, {}, {"tp": [3]}]

    async def fetch(*_args, **_kwargs):
        return batches.pop(0)

    thread = SimpleNamespace(_fetch_records=fetch)
    app = SimpleNamespace(consumer=SimpleNamespace(_thread=thread))
    seen: list[tuple[dict, float]] = []
    faust_adapter.observe_fetches(app, lambda records, at: seen.append((records, at)))

    async def run() -> list:
        return [await thread._fetch_records(None, None, timeout=1.0) for _ in range(3)]

    results = asyncio.run(run())
    assert results == [{"tp": [1, 2]}, {}, {"tp": [3]}]  # what Faust gets is unchanged
    assert [r for r, _ in seen] == [{"tp": [1, 2]}, {"tp": [3]}]
    assert all(abs(at - time.time()) < 5 for _, at in seen)
