"""The order of a commit, in one place (modelled on quix-streams' `Checkpoint.commit`).

An input offset may be committed only once everything its processing wrote is safely on
the broker. `CommitBarrier.commit` runs the phases in this order:

1. results: the router's per-partition transactions are committed;
2. outputs: every envelope, audit record and dead letter is delivered;
3. state: the write-behind state table is flushed to its changelog, and delivered;
4. offsets: committed, only for partitions still assigned and only if no rebalance
   happened while phases 1-3 ran (offsets chosen in an earlier generation may cover
   records whose work was handed to another worker and dropped here).

A phase that fails leaves the offsets uncommitted; the inputs are then read again. A
record the producer gave up on cannot be tied to its input, so after such a failure no
commit is allowed any more and the worker stops (`on_broken`): its successor redoes
everything since the last commit.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

log = logging.getLogger(__name__)


class Drains(Protocol):
    async def drain(self) -> None: ...


class Flushes(Protocol):
    def flush_changelog(self) -> int: ...


class Offsets(Protocol):
    """The consumer side of a commit (streams.faust_adapter.FaustOffsets)."""

    def generation(self) -> int: ...

    def assignment(self) -> set[Any]: ...

    async def commit(self, offsets: Mapping[Any, int]) -> bool: ...


class CommitBarrier:
    def __init__(
        self,
        results: Drains,
        outputs: Drains,
        state: Flushes,
        on_broken: Callable[[BaseException], Awaitable[None]] | None = None,
    ) -> None:
        self._results = results
        self._outputs = outputs
        self._state = state
        self._on_broken = on_broken
        self.broken: BaseException | None = None
        self.held = 0  # commits refused, for metrics and tests

    async def prepare(self) -> None:
        """Phases 1 to 3: everything written so far is on the broker."""
        await self._results.drain()
        await self._outputs.drain()
        if self._state.flush_changelog():
            await self._outputs.drain()

    async def commit(self, offsets: Mapping[Any, int], consumer: Offsets) -> bool:
        if self.broken is not None:
            self.held += 1
            return False
        generation = consumer.generation()
        try:
            await self.prepare()
        except Exception as exc:
            self.broken = exc
            self.held += 1
            log.error("outputs were not delivered (%r): no offset will be committed", exc)
            if self._on_broken is not None:
                await self._on_broken(exc)
            return False
        if consumer.generation() != generation:
            self.held += 1
            log.info("a rebalance happened during the commit: offsets not committed")
            return False
        assigned = consumer.assignment()
        mine = {tp: offset for tp, offset in offsets.items() if tp in assigned}
        return bool(mine) and await consumer.commit(mine)
