import asyncio

import pytest

from agents import engine


def test_a_failed_batch_is_retried_until_it_succeeds(monkeypatch):
    monkeypatch.setattr(engine, "RETRY_BATCH_MAX_S", 0.0)
    calls = []

    async def handle(batch):
        calls.append(batch)
        if len(calls) < 3:
            raise RuntimeError("ledger not read in time")

    asyncio.run(engine.until_done("step x", handle, ["t1", "t2"]))
    assert calls == [["t1", "t2"]] * 3  # the same batch each time, never dropped


def test_cancellation_is_not_retried():
    async def handle():
        raise asyncio.CancelledError

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(engine.until_done("step x", handle))
