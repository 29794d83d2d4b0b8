"""The in-memory hand-off of envelopes a worker wrote to a partition it reads itself."""

from __future__ import annotations

import math
from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agents.decoding import read_envelope
from agents.emitter import Emitter
from agents.errors import BadRecord
from agents.handoff import Handoff, plain
from schemas.tickets import Envelope, FeatureValue, Prediction
from streams.bundles import is_bundle, unpack
from streams.codecs import encode
from streams.partitioning import partition_for
from streams.topics import Topics
from tests.unit.step_fakes import envelope

TOPIC = "p.tickets.step.rules"

_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
)
_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.tuples(inner),
        st.dictionaries(st.text(max_size=4), inner, max_size=3),
    ),
    max_leaves=8,
)


def _with(features: dict[str, object], scores: dict[str, float] | None = None) -> Envelope:
    env = envelope("t-1", "rules")
    env.context.features = {k: FeatureValue(value=v) for k, v in features.items()}
    if scores is not None:
        env.context.prediction = Prediction.model_construct(
            category="billing", confidence=0.5, scores=scores, model_name="m", model_version="1"
        )
    return env


@given(st.dictionaries(st.text(max_size=6), _values, max_size=4))
def test_a_plain_envelope_is_what_its_bytes_decode_to(features) -> None:
    env = _with(features)
    try:
        raw = encode(env)
    except Exception:  # pydantic cannot encode it: it is never sent, so never kept
        return
    if plain(env):
        assert Envelope.model_validate_json(raw) == env


@pytest.mark.parametrize(
    "value", [math.nan, math.inf, (1, 2), 2**64, [1, (2,)], {"a": math.nan}, {1: "a"}, b"x"]
)
def test_values_json_would_change_are_not_plain(value) -> None:
    assert not plain(_with({"f": value}))


def test_a_non_finite_score_is_not_plain() -> None:
    assert plain(_with({}, {"billing": 0.5}))
    assert not plain(_with({}, {"billing": math.nan}))


def test_a_taken_envelope_is_gone_and_the_oldest_goes_first() -> None:
    handoff = Handoff(limit=2)
    envs = [envelope(f"t-{i}", "rules") for i in range(3)]
    for env in envs:
        handoff.keep(encode(env), env)
    assert len(handoff) == 2
    assert handoff.take(encode(envs[0])) is None  # evicted
    assert handoff.take(encode(envs[2])) is envs[2]
    assert handoff.take(encode(envs[2])) is None  # a second read decodes the bytes afresh
    assert handoff.take("not bytes") is None and handoff.taken == 1


def test_a_non_plain_envelope_is_not_kept() -> None:
    handoff = Handoff()
    env = _with({"f": math.nan})
    handoff.keep(b"{}", env)
    assert len(handoff) == 0


class Producer:
    def __init__(self) -> None:
        self.records: list[tuple] = []

    def produce_many(self, records) -> None:
        self.records.extend(records)


def _parts(producer: Producer) -> list[tuple[int, bytes]]:
    out = []
    for _topic, _key, value, _headers, partition in producer.records:
        values = [v for _, v in unpack(value)] if is_bundle(value) else [value]
        out += [(partition, v) for v in values]
    return out


@pytest.mark.parametrize("count", [1, 12])
def test_only_envelopes_for_partitions_read_here_are_kept_under_their_bytes(count) -> None:
    handoff, producer = Handoff(), Producer()
    handoff.reading([(TOPIC, 0), (TOPIC, 2), ("p.tickets.step.infer", 1)])
    emitter = Emitter(producer, Topics("p."), 3, lambda topic: 4, handoff)  # type: ignore[arg-type]
    envs = {f"t-{i}": envelope(f"t-{i}", "rules") for i in range(count)}
    emitter.send_to_steps([(TOPIC, e) for e in envs.values()])
    for partition, value in _parts(producer):
        taken = handoff.take(value)
        if partition in (0, 2):
            assert taken is not None
            assert taken == Envelope.model_validate_json(value)
            assert partition == partition_for(taken.ticket.ticket_id.encode(), 4)
        else:
            assert taken is None
    assert len(handoff) == 0


def test_a_handed_envelope_still_passes_every_check_of_a_read() -> None:
    env = envelope("t-1", "rules")
    raw = encode(env)
    steps, versions = {"rules", "route"}, {1}
    with pytest.raises(BadRecord, match="topic of step"):
        read_envelope(raw, steps, versions, step="route", written=env)
    with pytest.raises(BadRecord, match="record key"):
        read_envelope(raw, steps, versions, key=b"t-2", written=env)
    env.started_at += timedelta(days=1)  # a clock ahead: clamped as a parsed one would be
    assert read_envelope(raw, steps, versions, key=b"t-1", written=env).started_at < (
        envelope("t-1", "rules").started_at + timedelta(seconds=5)
    )
