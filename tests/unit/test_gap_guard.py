import asyncio
from collections import defaultdict
from types import SimpleNamespace

from faust.types import TP
from intervaltree import IntervalTree

from streams import gaps
from streams.gaps import GapGuard
from streams.topics import Topics

TOPICS = Topics("p.")
FEATURES = TP(TOPICS.step("features"), 1)
TICKETS_IN = TP(TOPICS.tickets_in, 0)


class FakeProbe:
    """Answers from a fixed map: first offset asked -> next record's offset (or None)."""

    def __init__(self, answers: dict, heads: dict | None = None) -> None:
        self.answers = answers
        self.heads = heads or {}
        self.asked: list[tuple] = []

    async def next_record(self, tp, first):
        self.asked.append((tp.topic, first))
        return self.answers[first]

    async def head(self, tp):
        self.asked.append((tp.topic, "head"))
        return self.heads[tp]


class FakeConsumer:
    def __init__(self) -> None:
        self.faust_gaps: list[tuple] = []
        self.seeks = 0
        self.positions: dict = {}
        self._committed_offset: dict = {}
        self._acked: defaultdict = defaultdict(list)
        self._acked_index: defaultdict = defaultdict(set)
        self._gap: defaultdict = defaultdict(IntervalTree)
        self.assigned: set = {FEATURES, TICKETS_IN}
        self.ends: dict = {}
        self._thread = FakeConsumerThread(self)

    def highwater(self, tp):
        return self.ends.get(tp, 0)

    def _new_offset(self, tp):
        return "faust's"

    def acked(self, tp, offsets) -> None:
        self._acked[tp].extend(offsets)
        self._acked_index[tp].update(offsets)

    def assignment(self):
        return self.assigned

    async def _add_gap(self, tp, offset_from, offset_to):
        self.faust_gaps.append((tp.topic, offset_from, offset_to))


class FakeConsumerThread:
    """Faust's consumer thread: seeks run there (streams.faust_adapter.OffsetBook.seek)."""

    def __init__(self, consumer: FakeConsumer) -> None:
        self._consumer = consumer

    async def seek_wait(self, positions: dict) -> None:
        for tp, offset in positions.items():
            self._consumer.seeks += 1
            self._consumer.positions[tp] = offset


def spans(consumer) -> list[tuple]:
    """The spans counted as holding no record, as Faust's gap tree holds them."""
    return sorted(
        (tp.topic, span.begin, span.end) for tp, tree in consumer._gap.items() for span in tree
    )


def guard(monkeypatch, stuck_s=0.0, probe=None):
    probe = probe or FakeProbe({})
    monkeypatch.setattr(gaps, "STUCK_S", stuck_s)
    app = SimpleNamespace(
        consumer=FakeConsumer(),
        rebalancing=False,
        tables=SimpleNamespace(changelog_topics=set()),
    )
    g = GapGuard(app, TOPICS.carries_envelopes, probe)
    g.install()
    return g, app.consumer


def test_a_jump_on_a_step_topic_is_never_acknowledged_and_is_read_again(monkeypatch):
    g, consumer = guard(monkeypatch)

    async def scenario():
        await consumer._add_gap(FEATURES, 257, 593)
        consumer._committed_offset[FEATURES] = 257  # held below the gap
        await g.rewind_if_needed()

    asyncio.run(scenario())
    assert spans(consumer) == []  # Faust would have committed past offsets 257..592
    assert consumer.seeks == 1 and g.rewinds == 1


def test_a_jump_whose_records_arrive_after_all_asks_for_nothing(monkeypatch):
    g, consumer = guard(monkeypatch)

    async def scenario():
        await consumer._add_gap(FEATURES, 257, 593)
        consumer._committed_offset[FEATURES] = 600  # they were processed: commit passed
        await g.rewind_if_needed()

    asyncio.run(scenario())
    assert consumer.seeks == 0


def test_a_rewind_waits_for_the_commit_to_stay_stuck(monkeypatch):
    g, consumer = guard(monkeypatch, stuck_s=60.0)

    async def scenario():
        await consumer._add_gap(FEATURES, 10, 20)
        await g.rewind_if_needed()

    asyncio.run(scenario())
    assert consumer.seeks == 0  # not yet: the records may still arrive


def test_no_rewind_during_a_rebalance(monkeypatch):
    g, consumer = guard(monkeypatch)
    g.app.rebalancing = True

    async def scenario():
        await consumer._add_gap(TP(TOPICS.retry(400), 0), 3, 9)
        await g.rewind_if_needed()
        g.app.rebalancing = False
        await g.rewind_if_needed()

    asyncio.run(scenario())
    assert consumer.seeks == 1


def test_a_jump_over_transaction_markers_on_tickets_in_goes_to_faust(monkeypatch):
    probe = FakeProbe({5: 7})  # offsets 5-6: a commit marker and an abort's marker
    g, consumer = guard(monkeypatch, probe=probe)

    async def scenario():
        await consumer._add_gap(TICKETS_IN, 5, 7)
        await consumer._add_gap(TICKETS_IN, 8, 10)
        assert spans(consumer) == []  # not before the probe has looked
        probe.answers[5] = 10  # the next record is the one Faust read after the second jump
        await g.check()

    asyncio.run(scenario())
    assert probe.asked == [(TOPICS.tickets_in, 5)]  # one probe answered for both jumps
    assert spans(consumer) == [(TOPICS.tickets_in, 5, 7), (TOPICS.tickets_in, 8, 10)]
    assert consumer.seeks == 0


def test_records_skipped_on_tickets_in_are_held_and_read_again(monkeypatch):
    # offsets 5-6 are markers; after offset 40 the ticket at 41 was dropped by the fetcher
    probe = FakeProbe({5: 7, 41: 41})
    g, consumer = guard(monkeypatch, probe=probe)

    async def scenario():
        await consumer._add_gap(TICKETS_IN, 5, 7)
        await consumer._add_gap(TICKETS_IN, 41, 42)
        probe.answers[5] = 41
        consumer._committed_offset[TICKETS_IN] = 40
        await g.check()

    asyncio.run(scenario())
    assert spans(consumer) == [(TOPICS.tickets_in, 5, 7)]  # never past offset 41
    assert consumer.seeks == 1


def test_a_probe_that_cannot_tell_yet_is_asked_again(monkeypatch):
    probe = FakeProbe({8: None})
    g, consumer = guard(monkeypatch, probe=probe)

    async def scenario():
        await consumer._add_gap(TICKETS_IN, 8, 12)
        await g.check()
        probe.answers[8] = 12
        await g.check()

    asyncio.run(scenario())
    assert len(probe.asked) == 2
    assert spans(consumer) == [(TOPICS.tickets_in, 8, 12)] and consumer.seeks == 0


def test_a_revoked_partition_is_forgotten(monkeypatch):
    g, consumer = guard(monkeypatch)

    async def scenario():
        await consumer._add_gap(FEATURES, 3, 9)
        consumer.assigned = set()  # its next owner seeks to the committed offset itself
        await g.check()

    asyncio.run(scenario())
    assert consumer.seeks == 0


def test_a_failing_probe_is_asked_again_and_acknowledges_nothing(monkeypatch):
    class Unreachable(FakeProbe):
        async def next_record(self, tp, first):
            self.asked.append((tp.topic, first))
            if len(self.asked) == 1:
                raise ConnectionError("broker down")
            return 9

    probe = Unreachable({})
    g, consumer = guard(monkeypatch, probe=probe)

    async def scenario():
        await consumer._add_gap(TICKETS_IN, 3, 9)
        await g.check()
        assert spans(consumer) == []
        await g.check()

    asyncio.run(scenario())
    assert spans(consumer) == [(TOPICS.tickets_in, 3, 9)]


# ---- the commit's head check --------------------------------------------------------------


def test_the_run_from_the_committed_offset_is_committed(monkeypatch):
    _, consumer = guard(monkeypatch, stuck_s=60.0)
    consumer._committed_offset[FEATURES] = 10
    consumer.acked(FEATURES, [12, 10, 11, 14])
    assert consumer._new_offset(FEATURES) == 13
    assert consumer._acked[FEATURES] == [14] and consumer._acked_index[FEATURES] == {14}


def test_a_one_record_hole_at_the_head_is_held_and_read_again(monkeypatch):
    g, consumer = guard(monkeypatch)
    consumer._committed_offset[FEATURES] = 10
    consumer.acked(FEATURES, [11, 12, 13])  # Faust would commit 14, past record 10
    assert consumer._new_offset(FEATURES) is None
    asyncio.run(g.rewind_if_needed())
    assert consumer.seeks == 1


def test_offsets_acknowledged_again_below_the_head_are_dropped(monkeypatch):
    _, consumer = guard(monkeypatch, stuck_s=60.0)
    consumer._committed_offset[FEATURES] = 10
    consumer.acked(FEATURES, [8, 9, 10, 11])
    assert consumer._new_offset(FEATURES) == 12
    assert consumer._acked_index[FEATURES] == set()


def test_an_unknown_head_is_asked_of_the_broker_before_anything_is_committed(monkeypatch):
    # after a rebalance, before Faust's seek: an event from before it is acknowledged
    probe = FakeProbe({}, heads={FEATURES: 250})
    g, consumer = guard(monkeypatch, stuck_s=60.0, probe=probe)
    consumer.acked(FEATURES, [300, 301])
    assert consumer._new_offset(FEATURES) is None  # Faust would commit 302, past 250..299
    asyncio.run(g.check())
    assert probe.asked == [(FEATURES.topic, "head")]
    assert consumer._new_offset(FEATURES) is None  # 250..299 are not processed yet
    consumer.acked(FEATURES, range(250, 300))
    assert consumer._new_offset(FEATURES) == 302


def test_a_hole_of_transaction_markers_on_tickets_in_is_probed_then_passed(monkeypatch):
    probe = FakeProbe({10: 11})  # offset 10: the marker after the last commit
    g, consumer = guard(monkeypatch, stuck_s=60.0, probe=probe)
    consumer._committed_offset[TICKETS_IN] = 10
    consumer.acked(TICKETS_IN, [11, 12])
    assert consumer._new_offset(TICKETS_IN) is None  # not before the probe has looked
    asyncio.run(g.check())
    assert consumer._new_offset(TICKETS_IN) == 13


def test_a_record_never_processed_on_tickets_in_is_held_and_read_again(monkeypatch):
    probe = FakeProbe({10: 10})  # offset 10 is a ticket: Faust would commit past it
    g, consumer = guard(monkeypatch, probe=probe)
    consumer._committed_offset[TICKETS_IN] = 10
    consumer.acked(TICKETS_IN, [11, 12])
    assert consumer._new_offset(TICKETS_IN) is None
    asyncio.run(g.check())  # the probe finds the record, and the guard reads it again
    assert consumer._new_offset(TICKETS_IN) is None
    assert consumer.seeks == 1


def test_jumps_handed_to_faust_still_count_as_acknowledged(monkeypatch):
    _, consumer = guard(monkeypatch, probe=FakeProbe({}))
    consumer._committed_offset[TICKETS_IN] = 5
    consumer._gap[TICKETS_IN].addi(5, 8)  # markers, as the probe found
    consumer.acked(TICKETS_IN, [8, 9])
    assert consumer._new_offset(TICKETS_IN) == 10


def test_a_partition_whose_records_were_all_dropped_is_read_again(monkeypatch):
    # nothing after the drop was acknowledged, so no hook ever sees it: only the watch does
    monkeypatch.setattr(gaps, "STALL_S", 0.0)
    g, consumer = guard(monkeypatch, stuck_s=0.0)
    consumer.assigned = {FEATURES}
    consumer._committed_offset[FEATURES] = 133
    consumer.ends[FEATURES] = 1500
    asyncio.run(g.check())  # first sight of this commit
    asyncio.run(g.check())  # it has not moved, with 1,367 records behind it
    assert g.stalls == 1 and consumer.positions == {FEATURES: 133}


def test_a_partition_never_committed_is_read_again_from_its_start(monkeypatch):
    # Faust's perform_seek leaves a partition without a committed offset where it is
    monkeypatch.setattr(gaps, "STALL_S", 0.0)
    probe = FakeProbe({0: 0})  # offset 0 of a fresh tickets.in partition: a ticket
    g, consumer = guard(monkeypatch, probe=probe)
    consumer.assigned = {TICKETS_IN}
    consumer.ends[TICKETS_IN] = 1
    asyncio.run(g.check())
    asyncio.run(g.check())
    assert consumer.positions == {TICKETS_IN: 0}


def test_a_caught_up_partition_is_left_alone(monkeypatch):
    monkeypatch.setattr(gaps, "STALL_S", 0.0)
    g, consumer = guard(monkeypatch)
    consumer.assigned = {FEATURES}
    consumer._committed_offset[FEATURES] = 1500
    consumer.ends[FEATURES] = 1500
    asyncio.run(g.check())
    asyncio.run(g.check())
    assert g.stalls == 0 and consumer.seeks == 0


def test_transaction_markers_after_the_commit_are_no_stall(monkeypatch):
    monkeypatch.setattr(gaps, "STALL_S", 0.0)
    probe = FakeProbe({100: 101})  # offset 100 is the marker ending the last transaction
    g, consumer = guard(monkeypatch, probe=probe)
    consumer.assigned = {TICKETS_IN}
    consumer._committed_offset[TICKETS_IN] = 100
    consumer.ends[TICKETS_IN] = 101
    asyncio.run(g.check())
    asyncio.run(g.check())
    assert g.stalls == 0 and consumer.seeks == 0


def test_acknowledged_work_waiting_for_a_commit_is_no_stall(monkeypatch):
    # the broker is away: nothing commits, but the partition is not stuck
    monkeypatch.setattr(gaps, "STALL_S", 0.0)
    g, consumer = guard(monkeypatch)
    consumer.assigned = {FEATURES}
    consumer._committed_offset[FEATURES] = 133
    consumer.ends[FEATURES] = 1500
    consumer.acked(FEATURES, [140, 141])  # a hole at 133..139, which the hooks handle
    asyncio.run(g.check())
    asyncio.run(g.check())
    assert g.stalls == 0
