"""DLQ replay without Kafka: where each dead letter goes back to, the headers it leaves with,
which offsets a run may commit, and a run over stand-in consumer and producer."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streams.admin import RETRY_TIERS_MS
from streams.headers import REPLAY_COUNT, replay_count
from streams.settings import Settings
from streams.topics import Topics
from ticketflow.replay import (
    METADATA_LIMIT,
    PARKED_REASON,
    Decision,
    Filters,
    Ledger,
    Routes,
    _records,
    _Run,
    decide,
    decode_metadata,
    replayed_headers,
)

TOPICS = Topics("p.")
ROUTES = Routes(
    topics=TOPICS,
    entry_steps=frozenset({"validate"}),
    later_steps=frozenset({"clean", "features", "infer", "rules", "route", "legacy"}),
    retry_topics=frozenset(TOPICS.retry(d) for d in RETRY_TIERS_MS),
    max_replays=3,
)


def dead(step: str | None, origin: str | None = None, count: bytes | None = None) -> dict:
    headers: dict[str, bytes | None] = {"x-dlq-error-class": b"INTERNAL"}
    if step is not None:
        headers["x-dlq-step"] = step.encode()
    if origin is not None:
        headers["x-dlq-origin-topic"] = origin.encode()
    if count is not None:
        headers[REPLAY_COUNT] = count
    return headers


# ---- where a dead letter goes back to -------------------------------------------------------


@pytest.mark.parametrize(
    ("headers", "topic"),
    [
        (dead("validate", "p.tickets.in"), "p.tickets.in"),
        (dead("infer", "p.tickets.step.infer"), "p.tickets.step.infer"),
        (dead("route"), "p.tickets.step.route"),
        (dead("legacy"), "p.tickets.step.legacy"),  # a step of an archived version
        (dead("retry", "p.tickets.retry.800"), "p.tickets.retry.800"),
        (dead("review", "p.tickets.review.decisions"), "p.tickets.review.decisions"),
    ],
)
def test_each_step_goes_back_to_a_topic_the_workers_consume(headers: dict, topic: str) -> None:
    decision = decide(headers, ROUTES)
    assert (decision.action, decision.topic, decision.count) == ("replay", topic, 1)


@pytest.mark.parametrize(
    ("headers", "why"),
    [
        (dead("translate"), "'translate' is in no workflow definition"),
        (dead(None), "no x-dlq-step header"),
        (dead("retry"), "not a retry tier"),
        (dead("retry", "p.tickets.retry.999"), "not a retry tier"),
        (dead("retry", "tickets.retry.800"), "not a retry tier"),  # another deployment's
        (dead("retry", "p.tickets.step.infer"), "not a retry tier"),
    ],
)
def test_a_dead_letter_nothing_would_consume_is_refused(headers: dict, why: str) -> None:
    decision = decide(headers, ROUTES)
    assert (decision.action, decision.topic) == ("refuse", None)
    assert why in decision.reason


@pytest.mark.parametrize("count", [b"-1", b"1.5", b"x", b"", b"9999999", b"\xff"])
def test_a_forged_count_is_parked_whatever_its_step(count: bytes) -> None:
    for step in ("infer", "translate"):
        decision = decide(dead(step, count=count), ROUTES)
        assert (decision.action, decision.topic) == ("park", "p.tickets.dlq.parked")
        assert "forged" in decision.reason


def test_a_spent_count_is_parked_and_the_last_replay_allowed_goes_back() -> None:
    spent = decide(dead("infer", count=b"3"), ROUTES)
    assert (spent.action, spent.topic) == ("park", "p.tickets.dlq.parked")
    assert "replayed 3 times" in spent.reason
    last = decide(dead("infer", count=b"2"), ROUTES)
    assert (last.action, last.count) == ("replay", 3)


header_values = st.one_of(st.none(), st.binary(max_size=40), st.text(max_size=40).map(str.encode))
steps = st.sampled_from(
    ["validate", "infer", "legacy", "retry", "review", "translate", "", "VALIDATE"]
)
origins = st.sampled_from(
    [*ROUTES.retry_topics, "p.tickets.in", "p.tickets.step.infer", "tickets.retry.200", "x"]
)
header_dicts = st.fixed_dictionaries(
    {},
    optional={
        "x-dlq-step": st.one_of(steps.map(str.encode), header_values),
        "x-dlq-origin-topic": st.one_of(origins.map(str.encode), header_values),
        REPLAY_COUNT: st.one_of(st.integers(-5, 10).map(lambda n: str(n).encode()), header_values),
        "traceparent": header_values,
    },
)
CONSUMED = {
    TOPICS.tickets_in,
    TOPICS.review_decisions,
    *ROUTES.retry_topics,
    *(TOPICS.step(s) for s in ROUTES.later_steps),
}


@given(header_dicts)
def test_every_dead_letter_is_replayed_to_a_consumed_topic_parked_or_refused(
    headers: dict,
) -> None:
    decision = decide(headers, ROUTES)
    count = replay_count(headers.get(REPLAY_COUNT))
    exhausted = count is None or count >= ROUTES.max_replays
    assert (decision.action == "park") == exhausted
    if decision.action == "park":
        assert decision.topic == TOPICS.dlq_parked and decision.count is None
    elif decision.action == "replay":
        assert decision.topic in CONSUMED
        assert decision.count == count + 1 <= ROUTES.max_replays
    else:
        assert decision.topic is None and decision.reason


def test_routes_come_from_the_definition_and_its_archive(tmp_path: Path) -> None:
    current = Path("agents/workflows/ticket_classify.yaml").read_text()
    (tmp_path / "wf.yaml").write_text(current.replace("version: 1", "version: 2"))
    (tmp_path / "archive").mkdir()
    older = current.replace(
        "  - {name: clean,",
        "  - {name: tidy, type: processor, handler: text_cleaner}\n  - {name: clean,",
    )
    (tmp_path / "archive" / "wf.v1.yaml").write_text(older)
    routes = Routes.of(Settings(workflow_file=tmp_path / "wf.yaml", topic_prefix="q."))
    assert routes.entry_steps == {"validate"}
    assert routes.later_steps == {"tidy", "clean", "features", "infer", "rules", "route"}
    assert decide(dead("tidy"), routes).topic == "q.tickets.step.tidy"
    assert routes.retry_topics == {f"q.tickets.retry.{d}" for d in RETRY_TIERS_MS}


# ---- headers --------------------------------------------------------------------------------


def test_a_replayed_record_keeps_its_context_and_one_new_count() -> None:
    headers = [
        ("x-dlq-step", b"infer"),
        ("traceparent", b"00-abc-def-01"),
        (REPLAY_COUNT, b"1"),
        ("x-other", b"dropped"),
        (REPLAY_COUNT, b"1"),
    ]
    out = replayed_headers(headers, Decision("replay", "t", "step infer", 2))
    assert out == [
        ("x-dlq-step", b"infer"),
        ("traceparent", b"00-abc-def-01"),
        (REPLAY_COUNT, b"2"),
    ]


def test_a_parked_record_keeps_every_header_as_it_was_and_says_why() -> None:
    headers = [("x-dlq-step", b"infer"), (REPLAY_COUNT, b"-7"), ("x-other", None)]
    out = replayed_headers(headers, Decision("park", "p.tickets.dlq.parked", "forged"))
    assert out == [*headers, (PARKED_REASON, b"forged")]


# ---- which offsets a run may commit ---------------------------------------------------------


def handled(ledger: Ledger, *offsets: int) -> Ledger:
    for o in offsets:
        ledger.read(o)
        ledger.accept(o)
        ledger.handle(o)
    return ledger


def test_a_partition_handled_to_its_end_commits_its_end() -> None:
    led = handled(Ledger(start=10, end=14), 10, 11, 12)
    led.read_to_end = True  # 13 is a transaction marker: the end of the partition said 14
    assert led.commit() == (14, "")


def test_a_record_left_holds_the_commit_and_names_those_handled_after_it() -> None:
    led = handled(Ledger(start=10, end=15), 10)
    led.read(11)
    led.leave(11)  # not matching the filters
    handled(led, 12, 14)
    assert led.commit() == (11, "replayed:1,3")
    assert decode_metadata(11, "replayed:1,3") == {12, 14}


def test_an_undelivered_record_holds_the_commit() -> None:
    led = handled(Ledger(start=0, end=3), 0)
    led.read(1)
    led.accept(1)  # sent, never confirmed
    handled(led, 2)
    assert led.commit() == (1, "replayed:1")


def test_the_next_run_skips_what_the_last_handled_past_its_commit() -> None:
    led = Ledger(start=11, end=15, committed=11, earlier=decode_metadata(11, "replayed:1,3"))
    assert led.was_handled_before(12) and led.was_handled_before(14)
    assert not led.was_handled_before(11) and not led.was_handled_before(13)
    handled(led, 11, 13)
    led.read(12)
    led.read(14)
    assert led.commit() == (15, "")


def test_a_run_that_moved_nothing_commits_nothing() -> None:
    assert Ledger(start=5, end=5, committed=5).commit() is None
    earlier = frozenset({7})
    led = Ledger(start=5, end=9, committed=5, earlier=earlier)
    led.read(5)
    led.leave(5)
    assert led.commit() is None


def test_a_run_cut_short_commits_up_to_what_it_read() -> None:
    assert handled(Ledger(start=0, end=100), 0, 1, 2).commit() == (3, "")


def test_reading_from_the_beginning_never_moves_the_commit_back() -> None:
    led = Ledger(start=0, end=8, committed=6)
    led.read(0)
    led.leave(0)  # already handled by an earlier run: not a hole
    handled(led, 1, 2, 3, 4, 5, 6, 7)
    assert led.commit() == (8, "")


def test_a_partition_stops_before_its_notes_outgrow_the_commit_metadata() -> None:
    led = Ledger(start=0, end=10_000)
    led.read(0)
    led.leave(0)
    accepted = 0
    for o in range(1, 10_000):
        if not led.may_accept(o):
            break
        handled(led, o)
        accepted += 1
    assert 100 < accepted < 10_000
    offset, metadata = led.commit()
    assert offset == 0 and len(metadata) <= METADATA_LIMIT
    assert decode_metadata(0, metadata) == set(range(1, accepted + 1))


@pytest.mark.parametrize("metadata", [None, "", "other", "replayed:x", "replayed:1,,2"])
def test_metadata_not_ours_names_nothing_or_what_it_can(metadata: str | None) -> None:
    assert decode_metadata(5, metadata) <= {6, 7}


# ---- a run over stand-ins -------------------------------------------------------------------


class Msg:
    def __init__(self, partition: int, offset: int, headers: list | None = None) -> None:
        self._p, self._o, self._h = partition, offset, headers

    def partition(self) -> int:
        return self._p

    def offset(self) -> int:
        return self._o

    def headers(self) -> list | None:
        return self._h

    def key(self) -> bytes:
        return f"t-{self._o}".encode()

    def value(self) -> bytes:
        return b"{}"

    def timestamp(self) -> tuple[int, int]:
        return (1, 0)

    def error(self) -> None:
        return None


class FakeConsumer:
    """One partition whose log grows while it is read: a replayed record failing again."""

    def __init__(self, log: list[Msg], grows: Callable[[int], Msg | None]) -> None:
        self.log, self.grows, self.assigned, self.paused = log, grows, [], []

    def assign(self, parts: list) -> None:
        self.assigned = [(tp.partition, tp.offset) for tp in parts]
        self.position = parts[0].offset if parts else 0

    def poll(self, _timeout: float) -> Msg | None:
        extra = self.grows(len(self.log))
        if extra is not None:
            self.log.append(extra)
        if self.position >= len(self.log):
            return None
        self.position += 1
        return self.log[self.position - 1]

    def pause(self, parts: list) -> None:
        self.paused += [tp.partition for tp in parts]


class FakeProducer:
    def __init__(self, fail: set[int] = frozenset()) -> None:
        self.sent: list[tuple[str, bytes, list]] = []
        self.fail, self.waiting = fail, []

    def produce(self, topic: str, key: bytes, value: bytes, headers: list, on_delivery: Any):
        self.sent.append((topic, key, headers))
        self.waiting.append((key, on_delivery))

    def poll(self, _timeout: float) -> int:
        return 0

    def flush(self, _timeout: float) -> int:
        for key, callback in self.waiting:
            callback("broker said no" if int(key.split(b"-")[1]) in self.fail else None, None)
        self.waiting = []
        return 0


def test_a_run_reads_only_up_to_the_end_it_took_at_its_start() -> None:
    log = [Msg(0, o, list(dead("infer").items())) for o in range(3)]
    # each poll, the DLQ grows: what this run sends back fails again at once
    consumer = FakeConsumer(log, lambda n: Msg(0, n, list(dead("infer").items())))
    ledgers = {0: Ledger(start=0, end=3)}
    read = [m.offset() for m in _records(consumer, "p.tickets.dlq", ledgers, idle_s=5)]
    assert read == [0, 1, 2] and ledgers[0].read_to_end
    assert consumer.paused == [0]


def test_a_run_reports_each_outcome_and_commits_only_past_handled_records() -> None:
    log = [
        Msg(0, 0, list(dead("infer").items())),
        Msg(0, 1, list(dead("translate").items())),
        Msg(0, 2, list(dead("infer", count=b"-1").items())),
        Msg(0, 3, list(dead("validate").items())),  # its delivery fails
        Msg(0, 4, list(dead("review").items())),
    ]
    ledgers = {0: Ledger(start=0, end=5)}
    producer = FakeProducer(fail={3})
    run = _Run(ROUTES, Filters(), ledgers, producer, False, False, rate=0)
    run.all(_records(FakeConsumer(log, lambda _n: None), "p.tickets.dlq", ledgers, idle_s=5))
    run.finish()
    outcomes = [(i.offset, i.outcome) for i in run.report.items]
    assert outcomes == [
        (0, "replayed"),
        (1, "refused"),
        (2, "parked"),
        (3, "not delivered"),
        (4, "replayed"),
    ]
    assert [t for t, _k, _h in producer.sent] == [
        "p.tickets.step.infer",
        "p.tickets.dlq.parked",
        "p.tickets.in",
        "p.tickets.review.decisions",
    ]
    assert run.report.reasons("refused") == {"step 'translate' is in no workflow definition": 1}
    assert ledgers[0].commit() == (3, "replayed:1")


def test_a_dry_run_sends_nothing_and_a_filtered_one_leaves_the_rest() -> None:
    log = [Msg(0, 0, list(dead("infer").items())), Msg(0, 1, list(dead("clean").items()))]
    ledgers = {0: Ledger(start=0, end=2)}
    producer = FakeProducer()
    run = _Run(ROUTES, Filters(step="clean"), ledgers, producer, True, False, rate=0)
    run.all(_records(FakeConsumer(log, lambda _n: None), "p.tickets.dlq", ledgers, idle_s=5))
    assert [(i.offset, i.outcome) for i in run.report.items] == [(1, "would replay")]
    assert run.report.skipped == 1 and producer.sent == []
