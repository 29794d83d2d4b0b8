"""Batches of events as they arrive, for agents that handle a batch at a time.

Faust's `Stream.take_events(max, within)` runs on a clock: every `within` seconds it
hands over whatever has arrived. Each record therefore waits half a tick on average at
every step, and an idle agent still wakes at every tick (at 2 ms, six agents cost a
worker 9 % of a core doing nothing). `take_ready` waits for the first event with no
clock at all, then takes what is already queued behind it; a batch still small then
lingers `linger_s` once, as a producer's `linger.ms` does, so a trickle does not become
one batch per record. Under load the batch fills while the previous one is handled.

Events are acknowledged once the batch has been handled (the caller's loop body ran to
its end), so Faust's commit never passes an unhandled record. Unlike `take_events`, a batch
whose handling raised or was cancelled is not acknowledged on the way out.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any


async def take_ready(
    stream: Any, max_: int, linger_s: float = 0.001, small: int = 16
) -> AsyncIterator[list[Any]]:
    """Yield lists of up to `max_` events: each as soon as nothing more is queued."""
    manual = stream.noack()
    queue = manual.channel.queue
    batch: list[Any] = []
    lingered = False
    async for event in manual.events():
        batch.append(event)
        if len(batch) < max_ and not queue.empty():
            continue  # more is already here: take it into this batch
        if len(batch) < min(small, max_) and not lingered:
            lingered = True
            await asyncio.sleep(linger_s)
            if not queue.empty():
                continue
        yield batch
        # only once the caller asks for more: a batch whose handling raised or was
        # cancelled (a stopping worker) stays unacknowledged, so it is read again
        for done in batch:
            await manual.ack(done)
        batch, lingered = [], False
