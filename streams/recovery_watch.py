"""Restarts a table restore whose changelog records stop arriving.

Faust's recovery reads every active changelog partition up to the highwater it noted at
the rebalance, and keeps the partition's input paused until then. When no record of a
partition it still needs arrives, it only logs "No event received ... since recovery
start", for ever: the worker stays in its group, holds its partitions and processes
nothing (seen in CI after a rebalance of a long-lived worker, docs/workflow.md).

The watch restarts the reading of such a partition from the last offset read, with the
same seek recovery itself uses, which clears every position, buffer and read offset that
could hold it back. If `ATTEMPTS` restarts bring nothing, the worker crashes: a process
that cannot restore its state must not look alive, and its successor restores from the
changelog (inputs are committed only with their state, so nothing is lost or doubled).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import faust

from streams import faust_adapter
from streams.faust_adapter import RecoveryView

log = logging.getLogger(__name__)

STALL_S = 20.0  # no record of a partition still to read for this long: restart its reading
ATTEMPTS = 3


def stalled(view: RecoveryView, now: float, since: float) -> dict[Any, int]:
    """Active partitions with records left and none read for STALL_S, each with the offset
    to read from. `since` is the latest restart of the reading (or the recovery's start)."""
    if not view.in_recovery or view.started_at is None:
        return {}
    out = {}
    for tp, left in view.remaining.items():
        last = max(view.last_event_at.get(tp, view.started_at), since)
        if left > 0 and now - last >= STALL_S:
            out[tp] = view.read_to.get(tp, -1) + 1
    return out


class RecoveryWatch:
    def __init__(
        self,
        view: Callable[[], RecoveryView],
        reread: Callable[[Mapping[Any, int]], Awaitable[None]],
        give_up: Callable[[BaseException], Awaitable[None]],
        describe: Callable[[Any], Any] = lambda tps: "",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._view, self._reread, self._give_up = view, reread, give_up
        self._describe, self._clock = describe, clock
        self._recovery: float | None = None  # the start of the recovery being watched
        self._since = 0.0
        self.restarts = 0  # in the current recovery

    async def check(self) -> None:
        view = self._view()
        if view.started_at != self._recovery:  # a new recovery: a fresh count
            self._recovery, self._since, self.restarts = view.started_at, 0.0, 0
        now = self._clock()
        positions = stalled(view, now, self._since)
        if not positions:
            return
        self._since = now
        where = ", ".join(f"{tp.topic}[{tp.partition}]@{o}" for tp, o in sorted(positions.items()))
        if self.restarts >= ATTEMPTS:
            log.error("table restore still stalled after %d restarts (%s): %s",
                      self.restarts, where, self._describe(positions))  # fmt: skip
            stuck = f"table restore stalled on {len(positions)} partitions"
            await self._give_up(RuntimeError(stuck))
            return
        self.restarts += 1
        log.warning("table restore stalled for %.0f s; reading again from %s: %s",
                    STALL_S, where, self._describe(positions))  # fmt: skip
        await self._reread(positions)


def watch(app: faust.App) -> RecoveryWatch:
    return RecoveryWatch(
        view=lambda: faust_adapter.recovery_view(app),
        reread=lambda positions: faust_adapter.reread_changelogs(app, positions),
        give_up=app.crash,
        describe=lambda tps: faust_adapter.fetch_state(app, tps),
    )
