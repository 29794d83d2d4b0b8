"""streams.recovery_watch: a table restore that stops receiving records is read again,
and a worker whose restore never resumes stops instead of looking alive."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any, NamedTuple

from streams import recovery_watch as rw
from streams.faust_adapter import RecoveryView


class TP(NamedTuple):
    topic: str
    partition: int


P0, P1 = TP("cl", 0), TP("cl", 1)


def view(remaining: dict, read_to: dict, last: dict | None = None, started=100.0, on=True):
    return RecoveryView(on, started, remaining, read_to, last or {})


class Worker:
    def __init__(self, v: RecoveryView) -> None:
        self.view, self.now = v, 100.0
        self.rereads: list[Mapping[Any, int]] = []
        self.crashed: list[BaseException] = []
        self.watch = rw.RecoveryWatch(
            view=lambda: self.view, reread=self._reread, give_up=self._crash, clock=lambda: self.now
        )

    async def _reread(self, positions: Mapping[Any, int]) -> None:
        self.rereads.append(dict(positions))

    async def _crash(self, exc: BaseException) -> None:
        self.crashed.append(exc)

    def tick(self, at: float) -> None:
        self.now = at
        asyncio.run(self.watch.check())


def test_a_partition_with_nothing_read_since_the_start_is_read_again_from_its_offset():
    v = view({P0: 40, P1: 0}, {P0: 9, P1: 30})
    assert rw.stalled(v, 100 + rw.STALL_S, 0.0) == {P0: 10}
    assert rw.stalled(v, 100 + rw.STALL_S - 1, 0.0) == {}


def test_a_partition_never_read_starts_at_zero_and_one_still_reading_is_left_alone():
    v = view({P0: 40, P1: 5}, {P0: -1, P1: 3}, last={P1: 119.0})
    assert rw.stalled(v, 120.0, 0.0) == {P0: 0}


def test_nothing_is_touched_outside_a_recovery_or_once_it_has_all_it_needs():
    assert rw.stalled(view({P0: 40}, {P0: 1}, on=False), 1e9, 0.0) == {}
    assert rw.stalled(view({P0: 0}, {P0: 1}), 1e9, 0.0) == {}


def test_restarts_are_spaced_by_the_stall_time_then_the_worker_gives_up():
    w = Worker(view({P0: 40}, {P0: 4}))
    w.tick(100 + rw.STALL_S)
    assert w.rereads == [{P0: 5}]
    w.tick(100 + rw.STALL_S + 1)  # just restarted: its records get time to arrive
    assert len(w.rereads) == 1
    for n in range(2, rw.ATTEMPTS + 1):
        w.tick(100 + n * rw.STALL_S)
    assert len(w.rereads) == rw.ATTEMPTS and not w.crashed
    w.tick(100 + (rw.ATTEMPTS + 1) * rw.STALL_S)
    assert len(w.rereads) == rw.ATTEMPTS and len(w.crashed) == 1


def test_records_arriving_after_a_restart_end_the_stall_and_a_new_recovery_counts_afresh():
    w = Worker(view({P0: 40}, {P0: 4}))
    w.tick(100 + rw.STALL_S)
    w.view = view({P0: 10}, {P0: 34}, last={P0: 100 + rw.STALL_S + 2})
    w.tick(100 + rw.STALL_S + 5)
    assert len(w.rereads) == 1
    w.view = view({P0: 40}, {P0: 4}, started=500.0)  # the next rebalance
    for n in range(1, rw.ATTEMPTS + 1):
        w.tick(500 + n * rw.STALL_S)
    assert len(w.rereads) == 1 + rw.ATTEMPTS and not w.crashed
