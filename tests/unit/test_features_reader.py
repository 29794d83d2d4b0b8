"""The online reader without a Redis: fallbacks flagged, answered fast, coverage tracked."""

from __future__ import annotations

import asyncio
import socket
import time

from feature_jobs.reader import OnlineFeatureReader, SignatureMismatch, _Coverage
from feature_jobs.views import VIEWS

VIEW = "user_ticket_stats"


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_no_redis_gives_flagged_defaults_within_the_timeout():
    reader = OnlineFeatureReader(f"redis://127.0.0.1:{closed_port()}/0", VIEWS, key_prefix="x")
    try:
        started = time.perf_counter()
        values = await reader.read(VIEW, "u1", timeout_s=0.3)
        assert time.perf_counter() - started < 0.35
        assert values and all(v.is_fallback for v in values.values())
        assert values["tickets_1h"].value == 0 and values["channels"].value == []
        # while Redis is known down, reads answer at once
        started = time.perf_counter()
        await reader.read(VIEW, "u2", timeout_s=0.3)
        assert time.perf_counter() - started < 0.01
        assert reader.coverage(VIEW) == 0.0
    finally:
        await reader.close()


async def test_no_entity_is_a_fallback_and_fallback_defaults_are_copies():
    reader = OnlineFeatureReader(f"redis://127.0.0.1:{closed_port()}/0", VIEWS, key_prefix="x")
    try:
        a = await reader.read(VIEW, None, timeout_s=0.1)
        a["channels"].value.append("mutated")
        b = await reader.read(VIEW, None, timeout_s=0.1)
        assert b["channels"].value == [] and b["channels"].is_fallback
    finally:
        await reader.close()


def test_coverage_is_a_sliding_window():
    c = _Coverage(window_s=10)
    assert c.add(0, 6, now=100.0) == 0.0
    assert c.add(6, 6, now=105.0) == 0.5
    # the failures of t=100 leave the window at t=110
    assert c.add(6, 6, now=110.5) == 1.0


def test_signature_mismatch_names_both():
    exc = SignatureMismatch("v", "a" * 64, "b" * 64)
    assert "a" * 64 in str(exc) and "b" * 64 in str(exc) and "rebuild" in str(exc)


async def test_reader_answers_even_when_the_caller_is_busy():
    # many concurrent reads against a dead Redis all come back flagged, none raises
    reader = OnlineFeatureReader(f"redis://127.0.0.1:{closed_port()}/0", VIEWS, key_prefix="x")
    try:
        got = await asyncio.gather(*(reader.read(VIEW, f"u{i}", 0.2) for i in range(50)))
        assert all(all(v.is_fallback for v in g.values()) for g in got)
    finally:
        await reader.close()
