"""The commit guard: Faust never commits past a record that was not processed.

Two ways lead Faust 0.15 past unprocessed records, both closed here:
- its fetcher can drop records it already fetched (a batch cut short by a rebalance or a
  flow stop), and it counts any jump in the offsets it reads as a "gap" of acknowledged
  offsets (meant for compaction and transaction markers);
- its choice of the offset to commit lets the run of acknowledged offsets start one past
  the committed offset, and checks nothing while it does not know that offset
  (faust-streaming #606).

The guard replaces both hooks (through `streams.faust_adapter.OffsetBook`) and decides
with the pure rule of `streams.offsets.committable_offset`: only the run of acknowledged
offsets that starts exactly at the committed offset moves the commit, plus spans known to
hold no record. On our step and retry topics (`trusted`: written without transactions,
never compacted) every offset is a record, so a jump or a hole at the head is held and
read again. On any other topic a `probe` first reads the range: markers only pass,
records are held. A partition held below unprocessed records for `STUCK_S` is sought back
to its committed offset, so they are read now. The history is in docs/workflow.md.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

import faust
from aiokafka import AIOKafkaConsumer, TopicPartition

from streams.faust_adapter import OffsetBook
from streams.offsets import committable_offset

log = logging.getLogger(__name__)


STUCK_S = 5.0  # a partition's commit held below unprocessed records this long is read again
# a partition with records behind its commit that has not committed for this long is read
# again: the records were dropped before any later one was acknowledged (see `_watch`)
STALL_S = 20.0


class Probe(Protocol):
    async def next_record(self, tp: Any, first: int) -> int | None:
        """The offset of tp's first record at or after `first` (None: cannot tell yet)."""

    async def head(self, tp: Any) -> int:
        """Where the group's reading of tp starts: its committed offset, else the log start."""


class GapGuard:
    def __init__(self, app: faust.App, trusted: Callable[[str], bool], probe: Probe) -> None:
        self.app = app
        self.book = OffsetBook(app)
        self.trusted = trusted
        self.probe = probe
        self.rewinds = 0  # rewinds done, for tests and metrics
        # partition -> [first unprocessed offset, when first seen]
        self._pending: dict[Any, list[float]] = {}
        # partition -> jumps on untrusted topics not yet probed: (offset_from, offset_to)
        self._unverified: dict[Any, list[tuple[int, int]]] = {}
        # partition -> its committed offset as the broker told us, while Faust knows none
        self._heads: dict[Any, int] = {}
        self._unknown_heads: set[Any] = set()
        # partition -> (head, first acknowledged offset): a hole at the commit's head to probe
        self._holes: dict[Any, tuple[int, int]] = {}
        self._last_rewind = 0.0
        # partition -> (its committed offset when last seen to move, since when)
        self._progress: dict[Any, tuple[int | None, float]] = {}
        self.stalls = 0  # partitions found stalled, for tests and metrics

    def install(self) -> None:
        self.book.replace_hooks(self._add_gap, self._new_offset)

    async def _add_gap(
        self, tp: Any, offset_from: int, offset_to: int, faust_add_gap: Callable[..., Awaitable]
    ) -> None:
        if self.trusted(tp.topic):
            self._hold(tp, offset_from)
        else:  # Faust's offset_to is the record it did read: [from, to) was skipped
            self._unverified.setdefault(tp, []).append((offset_from, offset_to))

    def _new_offset(self, tp: Any) -> int | None:
        """The offset to commit for tp: the run of acknowledged offsets from its head."""
        acked = self.book.acked(tp)
        if not acked:
            return None
        head = self.book.committed(tp)
        if head is None:
            head = self._heads.get(tp)
        if head is None:  # held until check() has asked the broker
            self._unknown_heads.add(tp)
            return None
        gaps = self.book.gaps(tp)
        spans = [(span.begin, span.end) for span in gaps]
        new, covered = committable_offset(acked, head, spans)
        self.book.forget_acked(tp, covered)
        if new is not None:
            gaps.chop(0, new)
            return new
        ahead = [o for o in acked if o > head]
        if ahead:
            self._hole_at_head(tp, head, min(ahead))
        return None

    def _hole_at_head(self, tp: Any, head: int, first: int) -> None:
        if self.trusted(tp.topic):  # every offset is a record: wait, or read it again
            if tp not in self._pending:
                log.info("%s[%d]: commit held at %d, %d acknowledged first", *_at(tp), head, first)
            self._hold(tp, head)
        else:  # markers, or records skipped: check() probes
            self._holes[tp] = (head, first)

    def _hold(self, tp: Any, first: int) -> None:
        seen = self._pending.setdefault(tp, [first, time.monotonic()])
        seen[0] = min(seen[0], first)

    async def check(self) -> None:
        """Probe new jumps, then reread what is still skipped (call often, from a timer)."""
        self._forget_revoked()
        await self._resolve_heads()
        await self._verify()
        await self._probe_holes()
        await self._watch()
        await self.rewind_if_needed()

    async def _watch(self) -> None:
        """Hold a partition whose commit stays put while records wait behind it.

        The hooks above see records dropped between fetch and agent only through a later
        acknowledgement (a jump, or a hole at the head). When every record after the drop
        was dropped too (Faust clears the agents' buffers on a rebalance and during table
        recovery, faust-streaming #596, and its fetch loop drops records below a read offset
        that a stale iteration set after a seek), nothing is ever acknowledged again and
        the partition would wait for ever. A commit that has not moved for STALL_S while
        the broker holds records past it is therefore read again; if the work was only
        slow, the cost is a repeat, which at-least-once steps and the router's ledger absorb.
        """
        now = time.monotonic()
        for tp in self.book.assignment():
            if not self._watched(tp):
                continue
            committed = self.book.committed(tp)
            seen = self._progress.get(tp)
            # work acknowledged and waiting for a commit (a broker that is away, a hole
            # the hooks hold) is not a stall: only a partition with nothing acknowledged is
            if seen is None or seen[0] != committed or self.book.acked(tp):
                self._progress[tp] = (committed, now)
                continue
            if now - seen[1] < STALL_S or tp in self._pending:
                continue
            if await self._records_behind(tp, committed or 0):
                log.warning(
                    "%s[%d]: no commit for %.0f s with records waiting from offset %s; "
                    "reading them again",
                    *_at(tp),
                    now - seen[1],
                    committed,
                )
                self.stalls += 1
                self._hold(tp, committed or 0)
                self._pending[tp][1] = now - STUCK_S  # due at once
            self._progress[tp] = (committed, now)

    async def _records_behind(self, tp: Any, committed: int) -> bool:
        end = self.book.highwater(tp)
        if end <= committed:
            return False
        if self.trusted(tp.topic):  # every offset is a record
            return True
        found = await self._next_record(tp, committed)  # markers are no records
        return found is not None and found < end

    def _watched(self, tp: Any) -> bool:
        return not self.book.is_changelog(tp)  # the group commits no changelog offsets

    def _forget_revoked(self) -> None:
        # whoever is assigned a partition next seeks to its committed offset and so
        # rereads whatever was skipped on it
        assigned = self.book.assignment()
        for jumps in (self._pending, self._unverified, self._heads, self._holes, self._progress):
            for tp in [tp for tp in jumps if tp not in assigned]:
                del jumps[tp]

    async def _resolve_heads(self) -> None:
        while self._unknown_heads:
            tp = self._unknown_heads.pop()
            if tp not in self.book.assignment() or self.book.committed(tp) is not None:
                continue
            try:
                self._heads[tp] = await self.probe.head(tp)
            except Exception as exc:  # the broker is away: the commit simply waits
                log.warning("%s[%d]: committed offset not known (%r)", *_at(tp), exc)
                self._unknown_heads.add(tp)
                return

    async def _probe_holes(self) -> None:
        for tp, (head, first) in list(self._holes.items()):
            found = await self._next_record(tp, head)
            if found is None:
                continue
            del self._holes[tp]
            if found >= first:  # markers only: counted as acknowledged, as Faust counts gaps
                self.book.add_empty_span(tp, head, first)
            else:
                log.warning("%s[%d]: records %d..%d were never processed", *_at(tp), head, first)
                self._hold(tp, head)

    async def _next_record(self, tp: Any, first: int) -> int | None:
        """The probe's answer; None, to ask again on the next tick, when it cannot tell."""
        try:
            return await self.probe.next_record(tp, first)
        except Exception as exc:  # the broker is away: the commit simply waits
            log.warning("%s[%d]: gap probe failed (%r); retrying", *_at(tp), exc)
            return None

    async def _verify(self) -> None:
        """One probe answers for every jump below the record it finds."""
        for tp, spans in list(self._unverified.items()):
            while spans:
                found = await self._next_record(tp, spans[0][0])
                if found is None:
                    break  # try again on the next tick
                while spans and spans[0][1] <= found:  # markers or deleted records only
                    self.book.add_empty_span(tp, *spans.pop(0))
                if spans and spans[0][0] <= found:  # a record Faust never gave us
                    first, end = spans.pop(0)
                    log.warning("%s[%d]: the fetcher skipped records %d..%d", *_at(tp), first, end)
                    self._hold(tp, first)
            if not spans:
                del self._unverified[tp]

    async def rewind_if_needed(self) -> None:
        """Read skipped records again once a commit has been held below them.

        A jump is not always a loss: the records may still arrive and be processed (after
        Faust's own seek on start-up, say), and the commit then passes them by itself.
        Only a commit still held below them after STUCK_S asks for a rewind, at most one
        per STUCK_S, so a rewind never chases its own re-reads.
        """
        for tp, (first, _) in list(self._pending.items()):
            done = self.book.committed(tp)
            if done is not None and done > first:  # processed after all: the commit passed
                del self._pending[tp]
        now = time.monotonic()
        stuck = [tp for tp, (_, since) in self._pending.items() if now - since >= STUCK_S]
        if not stuck or self.app.rebalancing or now - self._last_rewind < STUCK_S:
            return
        for tp in stuck:
            log.warning(
                "%s[%d]: records from offset %d are still unprocessed; reading them again",
                *_at(tp),
                int(self._pending[tp][0]),
            )
            self._pending[tp][1] = now
        self._last_rewind = now
        await self.book.seek({tp: int(self._pending[tp][0]) for tp in stuck})
        self.rewinds += 1


def _at(tp: Any) -> tuple[str, int]:
    return tp.topic, tp.partition


class KafkaProbe:
    """Reads a skipped range with a consumer of its own (joins no group, commits nothing).

    Its isolation level must be the worker's: what read_committed legitimately skips
    (aborted records) a read_uncommitted reader would have been given. It names the
    worker's group only to read its committed offsets: it never joins it.
    """

    def __init__(
        self, kafka: Mapping[str, Any], group_id: str, isolation_level: str = "read_uncommitted"
    ) -> None:
        self._kafka = kafka  # streams/kafka_config.aiokafka_kwargs
        self._group_id = group_id
        self._isolation_level = isolation_level
        self._consumer: AIOKafkaConsumer | None = None

    async def next_record(self, tp: Any, first: int) -> int | None:
        consumer = await self._started()
        part = TopicPartition(tp.topic, tp.partition)
        consumer.assign([part])
        log_start = (await consumer.beginning_offsets([part]))[part]
        consumer.seek(part, max(first, log_start))
        batch = await consumer.getmany(part, timeout_ms=2000, max_records=1)
        records = batch.get(part, [])
        if records:
            return records[0].offset
        # nothing yet: an open transaction holds read_committed back, or a slow broker;
        # but whatever retention deleted below the log start is no record any more
        return log_start if log_start > first else None

    async def head(self, tp: Any) -> int:
        consumer = await self._started()
        part = TopicPartition(tp.topic, tp.partition)
        committed = await consumer.committed(part)
        if committed is not None and committed >= 0:
            return committed
        return (await consumer.beginning_offsets([part]))[part]  # auto_offset_reset=earliest

    async def _started(self) -> AIOKafkaConsumer:
        if self._consumer is None:
            self._consumer = AIOKafkaConsumer(
                **self._kafka,
                group_id=self._group_id,
                enable_auto_commit=False,
                isolation_level=self._isolation_level,
                auto_offset_reset="earliest",
            )
            await self._consumer.start()
        return self._consumer

    async def close(self) -> None:
        if self._consumer is not None:
            await self._consumer.stop()
            self._consumer = None
