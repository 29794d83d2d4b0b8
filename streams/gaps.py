"""A guard against Faust committing past records its fetcher dropped.

faust-streaming 0.15 treats any jump in the offsets it reads from a partition as a "gap"
(meant for compacted topics and transaction markers) and counts the skipped offsets as
acknowledged, so the next commit moves past them. Its fetcher can also drop records it
has already fetched (a batch cut short by a rebalance or a flow stop, a partition briefly
out of its active set); the gap logic then turns that drop into a committed loss. We saw
exactly this after a SIGKILL under a large backlog: 336 offsets of one partition skipped
and committed, their tickets never processed.

Our step and retry topics are written without transactions and never compacted, so on
them a jump can only mean records not yet read. There the guard never counts a gap as
acknowledged, so the commit stays below it and a restart reads the records again; and if
the commit is still held there after a few seconds, it seeks the consumer back to its
committed offsets so that they are read now.
Topics outside `guarded` (such as `tickets.in`, which a user may write transactionally)
keep Faust's behaviour.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import faust

log = logging.getLogger(__name__)


STUCK_S = 5.0  # a partition's commit held below a gap this long is read again


class GapGuard:
    def __init__(self, app: faust.App, guarded: Callable[[str], bool]) -> None:
        self.app = app
        self.guarded = guarded
        self.rewinds = 0  # rewinds done, for tests and metrics
        # partition -> [first skipped offset, when first seen]
        self._pending: dict[Any, list[float]] = {}
        self._last_rewind = 0.0

    def install(self) -> None:
        consumer = self.app.consumer
        faust_add_gap = consumer._add_gap

        async def add_gap(tp: Any, offset_from: int, offset_to: int) -> None:
            if not self.guarded(tp.topic):
                await faust_add_gap(tp, offset_from, offset_to)
                return
            seen = self._pending.setdefault(tp, [offset_from, time.monotonic()])
            seen[0] = min(seen[0], offset_from)

        consumer._add_gap = add_gap

    async def rewind_if_needed(self) -> None:
        """Read skipped records again once a commit has been held below them (call often).

        A jump is not always a loss: the records may still arrive and be processed (after
        Faust's own seek on start-up, say), and the commit then passes the gap by itself.
        Only a commit still held below the gap after STUCK_S asks for a rewind, at most
        one per STUCK_S, so a rewind never chases its own re-reads.
        """
        committed = self.app.consumer._committed_offset
        for tp, (first, _) in list(self._pending.items()):
            done = committed.get(tp)
            if done is not None and done > first:  # processed after all: the commit passed
                del self._pending[tp]
        now = time.monotonic()
        stuck = [tp for tp, (_, since) in self._pending.items() if now - since >= STUCK_S]
        if not stuck or self.app.rebalancing or now - self._last_rewind < STUCK_S:
            return
        for tp in stuck:
            log.warning(
                "%s[%d]: records from offset %d were skipped by the fetcher and are still "
                "unprocessed; reading them again",
                tp.topic,
                tp.partition,
                int(self._pending[tp][0]),
            )
            self._pending[tp][1] = now
        self._last_rewind = now
        await self.app.consumer.perform_seek()
        self.rewinds += 1
