"""The Faust adapter's start-up hooks: no fixed recovery sleep, a short fetch wait."""

from __future__ import annotations

import asyncio

import pytest

from streams import faust_adapter
from streams.app import FETCH_WAIT_MS, create_app
from streams.settings import Settings


def _app():
    return create_app(Settings(topic_prefix="adapter-test."), app_id="adapter")


def test_the_worker_consumer_waits_briefly_for_data() -> None:
    async def build():  # aiokafka builds its consumer inside a running loop
        app = _app()
        return app.consumer._thread._create_worker_consumer(app.transport)

    consumer = asyncio.run(build())
    assert consumer._fetch_max_wait_ms == FETCH_WAIT_MS < 1500


def test_recovery_starts_without_a_fixed_sleep(monkeypatch: pytest.MonkeyPatch) -> None:
    app = _app()
    manager = app.tables
    assert isinstance(manager, faust_adapter.PromptTableManager)
    calls: list[str] = []

    async def update_channels() -> None:
        calls.append("channels")

    class Recovery:
        async def start(self) -> None:
            calls.append("recovery")

    async def no_sleep(*_args) -> None:
        raise AssertionError("the table manager slept before recovery")

    monkeypatch.setattr(manager, "_update_channels", update_channels)
    monkeypatch.setattr(type(manager), "recovery", property(lambda _self: Recovery()))
    monkeypatch.setattr(manager, "sleep", no_sleep)
    asyncio.run(asyncio.wait_for(manager.on_start(), 0.5))
    assert calls == ["channels", "recovery"]


def test_an_unknown_aiokafka_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(faust_adapter, "version", lambda _name: "0.99.0")
    with pytest.raises(faust_adapter.UnsupportedFaust):
        faust_adapter.shorten_fetch_wait(object(), 100)  # refused before it touches the app


def test_a_rewind_seeks_on_the_consumer_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    # Faust's Consumer.seek calls aiokafka from the caller's thread, racing the consumer
    # thread's Fetcher.fetched_records (KeyError: Faust's fetcher crashes for good)
    app = _app()
    on_thread: list[dict] = []

    async def seek_wait(positions: dict) -> None:
        on_thread.append(positions)

    async def off_thread(*_args) -> None:
        raise AssertionError("seek from the caller's thread")

    monkeypatch.setattr(app.consumer._thread, "seek_wait", seek_wait)
    monkeypatch.setattr(app.consumer, "seek", off_thread)
    book = faust_adapter.OffsetBook(app)
    asyncio.run(book.seek({"tp-0": 12, "tp-1": 0}))
    asyncio.run(book.seek({}))
    assert on_thread == [{"tp-0": 12, "tp-1": 0}]
