"""take_ready: a batch as soon as nothing more is queued, acked after it was handled."""

from __future__ import annotations

import asyncio

from streams.take import take_ready


class FakeStream:
    """What take_ready uses of a Faust stream: noack(), channel.queue, events(), ack()."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue = asyncio.Queue()
        self.channel = self
        self.acked: list[int] = []

    def noack(self) -> FakeStream:
        return self

    async def events(self):
        while True:
            yield await self.queue.get()

    async def ack(self, event: int) -> bool:
        self.acked.append(event)
        return True


async def _batches(stream: FakeStream, count: int, **kwargs) -> list[list[int]]:
    got = []
    async for batch in take_ready(stream, **kwargs):
        got.append(list(batch))
        if len(got) == count:
            break
    return got


def test_what_is_queued_comes_in_batches_of_at_most_max() -> None:
    async def run() -> tuple[list[list[int]], list[int]]:
        stream = FakeStream()
        for i in range(10):
            stream.queue.put_nowait(i)
        return await _batches(stream, 3, max_=4), stream.acked

    batches, acked = asyncio.run(run())
    assert batches == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert acked == list(range(8))  # the last batch's body had not finished when we left


def test_a_lone_event_waits_one_linger_not_a_clock() -> None:
    async def run() -> tuple[list[list[int]], float]:
        stream = FakeStream()
        loop = asyncio.get_running_loop()
        loop.call_later(0.05, stream.queue.put_nowait, 1)
        start = loop.time()
        got = await _batches(stream, 1, max_=256, linger_s=0.001)
        return got, loop.time() - start

    batches, took = asyncio.run(run())
    assert batches == [[1]]
    assert took < 0.5


def test_what_arrives_during_the_linger_joins_the_batch() -> None:
    async def run() -> list[list[int]]:
        stream = FakeStream()
        stream.queue.put_nowait(1)
        asyncio.get_running_loop().call_later(0.005, stream.queue.put_nowait, 2)
        return await _batches(stream, 1, max_=256, linger_s=0.05)

    assert asyncio.run(run()) == [[1, 2]]


def test_events_are_acked_only_after_their_batch_was_handled() -> None:
    async def run() -> list[tuple[str, list[int]]]:
        stream = FakeStream()
        for i in range(3):
            stream.queue.put_nowait(i)
        seen = []
        async for _batch in take_ready(stream, max_=2):
            seen.append(("handling", list(stream.acked)))
            await asyncio.sleep(0)
            if len(seen) == 2:
                break
        seen.append(("after", list(stream.acked)))
        return seen

    assert asyncio.run(run()) == [("handling", []), ("handling", [0, 1]), ("after", [0, 1])]


def test_a_batch_whose_handling_failed_is_not_acked() -> None:
    async def run() -> list[int]:
        stream = FakeStream()
        stream.queue.put_nowait(1)
        try:
            async for _batch in take_ready(stream, max_=8):
                raise RuntimeError("the handler failed")
        except RuntimeError:
            pass
        return stream.acked

    assert asyncio.run(run()) == []
