"""AckProducer's close, against a closed port: a real librdkafka client, no broker."""

from __future__ import annotations

import asyncio
import socket
import time

from ingest.producer import AckProducer


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_close_refuses_what_is_still_queued_and_releases_the_client() -> None:
    producer = AckProducer({"bootstrap.servers": f"127.0.0.1:{_closed_port()}"}, 30.0)
    producer.start(asyncio.get_running_loop())
    pending = producer.produce("t", [(b"k1", b"{}"), (b"k2", b"{}")], [])
    start = time.monotonic()
    await asyncio.to_thread(producer.close, 0.2)
    # the records' 30 s timeout did not hold the close: they were refused, each by key
    assert time.monotonic() - start < 5
    failed = await asyncio.wait_for(pending, 5)
    assert set(failed) == {b"k1", b"k2"}
    # closed: no metadata, nothing queued, and closing again is a no-op
    assert producer.broker_reachable(0.1) is False
    late = await asyncio.wait_for(producer.produce("t", [(b"k3", b"{}")], []), 5)
    assert set(late) == {b"k3"}
    producer.close()
