"""A guard against Faust committing past records its fetcher dropped.

faust-streaming 0.15 treats any jump in the offsets it reads from a partition as a "gap"
(meant for compacted topics and transaction markers) and counts the skipped offsets as
acknowledged, so the next commit moves past them. Its fetcher can also drop records it
has already fetched (a batch cut short by a rebalance or a flow stop, a partition briefly
out of its active set); the gap logic then turns that drop into a committed loss. We saw
exactly this after a SIGKILL under a large backlog: 336 offsets of one partition skipped
and committed, their tickets never processed.

Our step and retry topics (`trusted`) are written without transactions and never
compacted, so on them a jump can only mean records not yet read. On any other topic
(`tickets.in`, which a user may write transactionally) a jump may be legitimate, so a
`probe` reads the skipped offsets: if they hold no record (transaction markers only, or
records already deleted by retention) the gap goes to Faust as before; if they hold records,
it is treated like a jump on a trusted topic.

A skipped range is never acknowledged, so the commit stays below it and a restart reads the
records again; and if the commit is still held there after a few seconds, the consumer is
sought back to its committed offsets so that they are read now.

The commit itself is checked too (`_new_offset`). Faust 0.15 commits the first run of
consecutive acknowledged offsets, but lets that run start one offset past the committed
one (meant for a transaction marker), and checks nothing at all while it does not know
the committed offset: after a rebalance until its seek, on a partition never committed,
or one committed at 0. An event still in flight across a rebalance or a rewind, acked in
that window, can then move the commit past records not yet read, and the next seek skips
them. A CI run lost 43 tickets at the router after a SIGKILL, silently; this is the one
path we found by which Faust commits past unprocessed records without a jump. So the run
must start exactly at the committed offset (asked of the broker when Faust does not
know it). A hole there is held and read again on a trusted topic; on any other topic
the probe first tells transaction markers (the commit passes) from records (held).
"""

from __future__ import annotations

import bisect
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import faust
from aiokafka import AIOKafkaConsumer, TopicPartition
from faust.utils.functional import consecutive_numbers

log = logging.getLogger(__name__)


STUCK_S = 5.0  # a partition's commit held below a gap this long is read again


class Probe(Protocol):
    async def next_record(self, tp: Any, first: int) -> int | None:
        """The offset of tp's first record at or after `first` (None: cannot tell yet)."""

    async def head(self, tp: Any) -> int:
        """Where the group's reading of tp starts: its committed offset, else the log start."""


class GapGuard:
    def __init__(
        self, app: faust.App, trusted: Callable[[str], bool], probe: Probe | None = None
    ) -> None:
        self.app = app
        self.trusted = trusted
        self.probe = probe
        self.rewinds = 0  # rewinds done, for tests and metrics
        # partition -> [first skipped offset, when first seen]: records known skipped
        self._pending: dict[Any, list[float]] = {}
        # partition -> jumps on untrusted topics not yet probed: (offset_from, offset_to)
        self._unverified: dict[Any, list[tuple[int, int]]] = {}
        self._faust_add_gap: Callable[[Any, int, int], Awaitable[None]] | None = None
        self._faust_new_offset: Callable[[Any], int | None] | None = None
        # partition -> its committed offset as the broker told us, while Faust knows none
        self._heads: dict[Any, int] = {}
        self._unknown_heads: set[Any] = set()
        # partition -> (head, first acknowledged offset): a hole at the commit's head to probe
        self._holes: dict[Any, tuple[int, int]] = {}
        self._last_rewind = 0.0

    def install(self) -> None:
        consumer = self.app.consumer
        self._faust_add_gap = consumer._add_gap

        async def add_gap(tp: Any, offset_from: int, offset_to: int) -> None:
            if self.trusted(tp.topic):
                self._hold(tp, offset_from)
            elif self.probe is None:
                await self._faust_add_gap(tp, offset_from, offset_to)
            else:  # Faust's offset_to is the record it did read: [from, to) was skipped
                self._unverified.setdefault(tp, []).append((offset_from, offset_to))

        consumer._add_gap = add_gap
        self._faust_new_offset = consumer._new_offset
        consumer._new_offset = self._new_offset

    def _new_offset(self, tp: Any) -> int | None:
        """The offset to commit for tp: the run of acknowledged offsets from its head."""
        consumer = self.app.consumer
        trusted = self.trusted(tp.topic)
        if self.probe is None and not trusted:  # nothing to tell a marker from a record
            return self._faust_new_offset(tp)  # type: ignore[misc]
        acked = consumer._acked[tp]
        if not acked:
            return None
        head = consumer._committed_offset.get(tp)
        if head is None:
            head = self._heads.get(tp)
        if head is None and self.probe is None:  # nobody to ask: Faust's rule, not no commit
            return self._faust_new_offset(tp)  # type: ignore[misc]
        if head is None:  # held until check() has asked the broker
            self._unknown_heads.add(tp)
            return None
        if not trusted:
            _merge_gaps(consumer._gap[tp], acked)  # jumps the probe found empty
        index = consumer._acked_index[tp]
        acked.sort()
        behind = bisect.bisect_left(acked, head)  # acknowledged again after their commit
        if behind:
            index.difference_update(acked[:behind])
            del acked[:behind]
        if not acked or (acked[0] != head and not self._nothing_between(tp, head, acked[0])):
            return None
        run = next(consecutive_numbers(acked))
        del acked[: len(run)]
        index.difference_update(run)
        return run[-1] + 1

    def _nothing_between(self, tp: Any, head: int, first: int) -> bool:
        """Whether [head, first) holds no record; until known, the commit waits."""
        if self.trusted(tp.topic):  # every offset is a record: wait, or read it again
            if tp not in self._pending:
                log.info("%s[%d]: commit held at %d, %d acknowledged first", *_at(tp), head, first)
            self._hold(tp, head)
            return False
        self._holes[tp] = (head, first)  # markers, or records skipped: check() probes
        return False

    def _hold(self, tp: Any, first: int) -> None:
        seen = self._pending.setdefault(tp, [first, time.monotonic()])
        seen[0] = min(seen[0], first)

    async def check(self) -> None:
        """Probe new jumps, then reread what is still skipped (call often, from a timer)."""
        self._forget_revoked()
        await self._resolve_heads()
        await self._verify()
        await self._probe_holes()
        await self.rewind_if_needed()

    def _forget_revoked(self) -> None:
        # whoever is assigned a partition next seeks to its committed offset and so
        # rereads whatever was skipped on it
        assigned = self.app.consumer.assignment()
        for jumps in (self._pending, self._unverified, self._heads, self._holes):
            for tp in [tp for tp in jumps if tp not in assigned]:
                del jumps[tp]

    async def _resolve_heads(self) -> None:
        consumer = self.app.consumer
        while self._unknown_heads:
            tp = self._unknown_heads.pop()
            if tp not in consumer.assignment() or consumer._committed_offset.get(tp) is not None:
                continue
            try:
                self._heads[tp] = await self.probe.head(tp)  # type: ignore[union-attr]
            except Exception as exc:  # the broker is away: the commit simply waits
                log.warning("%s[%d]: committed offset not known (%r)", *_at(tp), exc)
                self._unknown_heads.add(tp)
                return

    async def _probe_holes(self) -> None:
        consumer = self.app.consumer
        for tp, (head, first) in list(self._holes.items()):
            found = await self._next_record(tp, head)
            if found is None:
                continue
            del self._holes[tp]
            if found >= first:  # markers only: counted as acknowledged, as Faust counts gaps
                # (not through Faust's _add_gap, which leaves out the committed offset)
                consumer._gap[tp].addi(head, first)
            else:
                log.warning("%s[%d]: records %d..%d were never processed", *_at(tp), head, first)
                self._hold(tp, head)

    async def _next_record(self, tp: Any, first: int) -> int | None:
        """The probe's answer; None, to ask again on the next tick, when it cannot tell."""
        try:
            return await self.probe.next_record(tp, first)  # type: ignore[union-attr]
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
                    await self._faust_add_gap(tp, *spans.pop(0))  # type: ignore[misc]
                if spans and spans[0][0] <= found:  # a record Faust never gave us
                    first, end = spans.pop(0)
                    log.warning("%s[%d]: the fetcher skipped records %d..%d", *_at(tp), first, end)
                    self._hold(tp, first)
            if not spans:
                del self._unverified[tp]

    async def rewind_if_needed(self) -> None:
        """Read skipped records again once a commit has been held below them.

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
                "%s[%d]: records from offset %d are still unprocessed; reading them again",
                *_at(tp),
                int(self._pending[tp][0]),
            )
            self._pending[tp][1] = now
        self._last_rewind = now
        await self.app.consumer.perform_seek()
        self.rewinds += 1


def _merge_gaps(gaps: Any, acked: list[int]) -> None:
    """Faust's own step: count the jumps handed to it (`_add_gap`) as acknowledged."""
    if not gaps:
        return
    top = max(acked)
    spans = sorted(gaps.overlap(0, top), key=lambda span: span.begin)
    if spans:
        filled = [offset for span in spans for offset in range(span.begin, span.end)]
        acked.extend(filled)
        gaps.chop(0, max(filled[-1], top + 1))


def _at(tp: Any) -> tuple[str, int]:
    return tp.topic, tp.partition


class KafkaProbe:
    """Reads a skipped range with a consumer of its own (joins no group, commits nothing).

    Its isolation level must be the worker's: what read_committed legitimately skips
    (aborted records) a read_uncommitted reader would have been given. It names the
    worker's group only to read its committed offsets: it never joins it.
    """

    def __init__(
        self, bootstrap: str, group_id: str, isolation_level: str = "read_uncommitted"
    ) -> None:
        self._bootstrap = bootstrap
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
                bootstrap_servers=self._bootstrap,
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
