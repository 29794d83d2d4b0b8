"""Bundles: a batch's envelopes for one partition of the next step, in one record."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from aiokafka.partitioner import DefaultPartitioner
from hypothesis import given
from hypothesis import strategies as st

from agents.emitter import Emitter
from agents.parts import Part, carrier, open_bundles
from schemas.tickets import Envelope
from streams.bundles import MAGIC, MAX_PARTS, BadBundle, chunks, is_bundle, pack, unpack
from streams.partitioning import partition_for
from streams.topics import Topics
from streams.tracing import step_spans
from tests.unit.step_fakes import envelope

parts_st = st.lists(st.tuples(st.binary(max_size=40), st.binary(max_size=200)), min_size=1)


@given(parts_st)
def test_a_bundle_opens_into_the_parts_it_was_packed_from(parts) -> None:
    assert unpack(pack(parts)) == [tuple(p) for p in parts]


@given(st.binary(max_size=300))
def test_any_bytes_after_the_magic_open_or_raise_badbundle(tail: bytes) -> None:
    try:
        parts = unpack(MAGIC + tail)
    except BadBundle:
        return
    assert pack(parts) == MAGIC + tail


@pytest.mark.parametrize(
    "record",
    [
        MAGIC,  # no parts
        MAGIC + b"\x00\x00",  # a truncated header
        MAGIC + b"\x00\x00\x00\x01\x00\x00\x00\x05k1234",  # a value past the end
        MAGIC + b"\xff\xff\xff\xff\x00\x00\x00\x00",  # a key length past the end
        b'{"ticket": 1}',  # not a bundle at all
    ],
)
def test_a_malformed_bundle_raises(record: bytes) -> None:
    with pytest.raises(BadBundle):
        unpack(record)


def test_a_bundle_claiming_more_parts_than_any_batch_is_refused() -> None:
    with pytest.raises(BadBundle):
        unpack(pack([(b"", b"")] * (MAX_PARTS + 1)))


def test_json_is_never_taken_for_a_bundle() -> None:
    assert not is_bundle(b'{"a": 1}') and not is_bundle(None) and is_bundle(pack([(b"k", b"v")]))


@given(parts_st, st.integers(min_value=16, max_value=600))
def test_chunks_keep_every_part_in_order_within_the_limit(parts, limit) -> None:
    runs = list(chunks(parts, limit))
    assert [p for run in runs for p in run] == parts
    for run in runs:
        assert len(run) == 1 or len(pack(run)) <= limit


@given(st.binary(min_size=1, max_size=64), st.integers(min_value=1, max_value=64))
def test_the_partition_is_the_java_clients(key: bytes, n: int) -> None:
    assert partition_for(key, n) == DefaultPartitioner()(key, list(range(n)), list(range(n)))


def _event(value, partition=3, offset=7, key=b"k"):
    msg = SimpleNamespace(
        topic="p.tickets.step.rules",
        partition=partition,
        offset=offset,
        timestamp=1.5,
        headers=[],
        key=key,
        value=value,
    )
    return SimpleNamespace(message=msg)


def test_parts_stand_in_for_their_records_and_belong_to_the_bundles_event() -> None:
    bundle = _event(pack([(b"t-1", b"one"), (b"t-2", b"two")]))
    plain = _event(b'{"x": 1}', offset=8)
    items = open_bundles([bundle, plain])
    assert [carrier(i) for i in items] == [bundle, bundle, plain]
    first, second = items[0], items[1]
    assert isinstance(first, Part) and isinstance(second, Part)
    assert (first.message.key, first.message.value) == (b"t-1", b"one")
    assert (second.message.partition, second.message.offset) == (3, 7)
    assert items[2] is plain


def test_a_malformed_bundle_stays_one_record_to_be_dead_lettered_alone() -> None:
    bad = _event(MAGIC + b"\x00\x00")
    assert open_bundles([bad]) == [bad]


class Producer:
    def __init__(self) -> None:
        self.records: list[tuple] = []

    def produce_many(self, records) -> None:
        self.records.extend(records)


def _emitter(partitions):
    producer = Producer()
    return Emitter(producer, Topics("p."), 3, partitions), producer  # type: ignore[arg-type]


def _opened(producer: Producer) -> dict[str, list[tuple[int | None, str]]]:
    """Per topic: (partition, ticket_id) of every envelope, bundled or not."""
    out: dict[str, list[tuple[int | None, str]]] = {}
    for topic, _key, value, _headers, partition in producer.records:
        values = [v for _, v in unpack(value)] if is_bundle(value) else [value]
        for v in values:
            env = Envelope.model_validate_json(v)
            out.setdefault(topic, []).append((partition, env.ticket.ticket_id))
    return out


def test_a_batch_goes_as_one_bundle_per_partition_each_where_its_key_would_go() -> None:
    emitter, producer = _emitter(lambda topic: 4)
    envs = [envelope(f"t-{i}", "rules") for i in range(40)]
    emitter.send_to_steps([("p.tickets.step.rules", e) for e in envs])
    assert len(producer.records) <= 4
    seen = _opened(producer)["p.tickets.step.rules"]
    assert sorted(t for _, t in seen) == sorted(e.ticket.ticket_id for e in envs)
    for partition, tid in seen:
        assert partition == partition_for(tid.encode(), 4)


def test_one_envelope_or_unknown_partitions_go_as_keyed_records() -> None:
    emitter, producer = _emitter(lambda topic: None)
    emitter.send_to_steps([("p.tickets.step.rules", envelope(f"t-{i}", "rules")) for i in range(3)])
    assert [(r[1], r[4]) for r in producer.records] == [
        (b"t-0", None),
        (b"t-1", None),
        (b"t-2", None),
    ]
    emitter, producer = _emitter(lambda topic: 4)
    emitter.send_to_steps([("p.tickets.step.rules", envelope("t-9", "rules"))])
    assert producer.records[0][1] == b"t-9" and not is_bundle(producer.records[0][2])


def test_with_tracing_on_every_envelope_keeps_its_own_record(monkeypatch) -> None:
    emitter, producer = _emitter(lambda topic: 4)
    monkeypatch.setattr(step_spans, "on", True)  # after the emitter configured tracing
    emitter.send_to_steps([("p.tickets.step.rules", envelope(f"t-{i}", "rules")) for i in range(5)])
    assert len(producer.records) == 5 and not any(is_bundle(r[2]) for r in producer.records)
