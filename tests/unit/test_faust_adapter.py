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


def _delivery():
    """The worker app's consumer after deliver_inline, with a record of what Faust's own
    wait_first was asked to wait for."""
    app = _app()
    consumer = app.consumer
    asked: list[int] = []
    faust_wait_first = type(consumer).wait_first

    async def original(*coros, timeout=None):
        asked.append(len(coros))
        return await faust_wait_first(consumer, *coros, timeout=timeout)

    consumer.wait_first = original
    faust_adapter.deliver_inline(app)
    return consumer, asked


def test_a_record_that_needs_no_wait_is_delivered_without_tasks() -> None:
    async def main():
        consumer, asked = _delivery()
        delivered: list[str] = []

        async def callback(value: str) -> str:
            delivered.append(value)
            return value

        result = await consumer.wait_first(callback("r1"), consumer.suspend_flow.wait())
        return delivered, asked, result

    delivered, asked, result = asyncio.run(main())
    assert delivered == ["r1"]
    assert asked == []  # no task, no asyncio.wait: run in place
    assert result.results == ["r1"] and not result.stopped


def test_a_record_that_waits_finishes_under_fausts_wait_first() -> None:
    async def main():
        consumer, asked = _delivery()
        room = asyncio.Event()
        delivered: list[str] = []

        async def callback(value: str) -> str:
            await room.wait()  # a full stream queue
            await asyncio.sleep(0)
            delivered.append(value)
            return value

        asyncio.get_running_loop().call_later(0.01, room.set)
        result = await consumer.wait_first(callback("r2"), consumer.suspend_flow.wait())
        return delivered, asked, result

    delivered, asked, result = asyncio.run(main())
    assert delivered == ["r2"] and asked == [2]
    assert result.results == ["r2"]


def test_a_suspended_flow_abandons_a_waiting_record_as_faust_does() -> None:
    async def main():
        consumer, asked = _delivery()
        started: list[str] = []

        async def callback(value: str) -> None:
            started.append(value)
            await asyncio.Event().wait()  # never gets room
            raise AssertionError("delivered after the flow was suspended")

        asyncio.get_running_loop().call_later(0.01, consumer.suspend_flow.set)
        await asyncio.wait_for(consumer.wait_first(callback("r3"), consumer.suspend_flow.wait()), 1)
        # once suspended, a new record goes Faust's way unchanged
        await consumer.wait_first(callback("r4"), consumer.suspend_flow.wait())
        return started, asked

    started, asked = asyncio.run(main())
    assert started == ["r3", "r4"] and asked == [2, 2]


def test_a_failing_delivery_raises_to_the_fetch_loop() -> None:
    async def main():
        consumer, _ = _delivery()

        async def callback() -> None:
            raise ValueError("decode")

        await consumer.wait_first(callback(), consumer.suspend_flow.wait())

    with pytest.raises(ValueError):
        asyncio.run(main())


def test_the_monitor_keeps_no_per_event_statistics() -> None:
    app = _app()
    assert isinstance(app.monitor, faust_adapter.QuietMonitor)
    app.monitor.on_message_in(None, 1, None)
    assert app.monitor.messages_received_total == 0
