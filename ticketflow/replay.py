"""`ticketflow dlq replay`: send dead letters back to a topic the workers consume.

Where each dead letter goes is decided by `decide` from its headers alone (docs/workflow.md,
"Replaying dead letters"): a validation failure back to `tickets.in`, a failure of a step of
the workflow definition (the current one or an archived version) to that step's topic, one
of the retry agent to the retry tier it came from, one of the review agent to
`tickets.review.decisions`. Anything else is refused, reported and left on the DLQ. A record
whose `x-replay-count` is spent or forged goes to `tickets.dlq.parked` instead.

One run reads each partition up to the end offset it had when the run started, so what
fails again during the run is left for the next one. The run's group offset moves only over
records that were delivered, parked or refused; a record that did not match the filters,
or was not delivered, holds the offset back, and the records after it that this run did
handle are named in the commit's metadata so that the next run skips them.
"""

from __future__ import annotations

import time
from bisect import bisect_right
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

from confluent_kafka import (
    Consumer,
    KafkaError,
    Message,
    Producer,
    TopicPartition,
)
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from agents.definition import load_workflows
from streams.admin import RETRY_TIERS_MS
from streams.headers import DLQ_PREFIX, REPLAY_COUNT, replay_count
from streams.kafka_config import confluent_config
from streams.producer import BASE_CONFIG
from streams.settings import Settings
from streams.topics import Topics
from streams.watermarks import settled, watermarks

GROUP = "ticketflow-dlq-replay"
PARKED_REASON = "x-replay-parked-reason"
REVIEW_STEP = "review"
RETRY_STEP = "retry"
# Kafka refuses commit metadata over offset.metadata.max.bytes (4096 by default)
METADATA_LIMIT = 1024
METADATA_TAG = "replayed:"

RawHeaders = Mapping[str, bytes | None]
Action = Literal["replay", "park", "refuse"]


@dataclass(frozen=True)
class Filters:
    error_class: str | None = None
    step: str | None = None
    since: datetime | None = None
    until: datetime | None = None

    def match(self, headers: RawHeaders, timestamp_ms: int) -> bool:
        if self.error_class and _text(headers.get("x-dlq-error-class")) != self.error_class:
            return False
        if self.step and _text(headers.get("x-dlq-step")) != self.step:
            return False
        if self.since and timestamp_ms < self.since.timestamp() * 1000:
            return False
        return not (self.until and timestamp_ms > self.until.timestamp() * 1000)


@dataclass(frozen=True)
class Routes:
    """What the workers consume, as far as a dead letter's way back is concerned."""

    topics: Topics
    entry_steps: frozenset[str]  # validators: their records come from tickets.in
    later_steps: frozenset[str]  # each has its own tickets.step.<step>
    retry_topics: frozenset[str]
    max_replays: int

    @classmethod
    def of(cls, settings: Settings) -> Routes:
        # every workflow the workers run (the selector's folder) and their earlier versions
        workflows = load_workflows(settings.workflow_file, settings.workflow_selector_file)
        versions = list(workflows.definitions)
        topics = Topics(settings.topic_prefix)
        return cls(
            topics=topics,
            entry_steps=frozenset(d.steps[0].name for d in versions),
            later_steps=frozenset(s.name for d in versions for s in d.steps[1:]),
            retry_topics=frozenset(topics.retry(d) for d in RETRY_TIERS_MS),
            max_replays=settings.max_replays,
        )


@dataclass(frozen=True)
class Decision:
    action: Action
    topic: str | None  # where the record goes; None when refused
    reason: str
    count: int | None = None  # the replay count it goes back with


def decide(headers: RawHeaders, routes: Routes) -> Decision:
    """Where a dead letter goes back to, from its headers: replayed, parked or refused.

    The count is looked at first: a record with no replays left may not re-enter the
    pipeline anywhere, whatever its step says.
    """
    raw_count = headers.get(REPLAY_COUNT)
    count = replay_count(raw_count)
    parked = routes.topics.dlq_parked
    if count is None:
        # a forged header may be long: the reason goes into a header and the report
        return Decision("park", parked, f"forged {REPLAY_COUNT} {raw_count[:32]!r}")
    if count >= routes.max_replays:
        return Decision(
            "park", parked, f"replayed {count} times (max_replays {routes.max_replays})"
        )
    step = _text(headers.get("x-dlq-step"))
    target = _target(step, _text(headers.get("x-dlq-origin-topic")), routes)
    if isinstance(target, Refusal):
        return Decision("refuse", None, target.reason)
    return Decision("replay", target, f"step {step}", count + 1)


@dataclass(frozen=True)
class Refusal:
    reason: str


def _target(step: str | None, origin: str | None, routes: Routes) -> str | Refusal:
    topics = routes.topics
    if step is None:
        return Refusal("no x-dlq-step header")
    if step == RETRY_STEP:
        if origin in routes.retry_topics:
            return origin
        return Refusal(f"retry dead letter from {origin!r}, not a retry tier topic")
    if step == REVIEW_STEP:
        return topics.review_decisions
    if step in routes.entry_steps:
        return topics.tickets_in
    if step in routes.later_steps:
        return topics.step(step)
    return Refusal(f"step {step!r} is in no workflow definition")


def _text(value: bytes | None) -> str | None:
    return None if value is None else value.decode("utf-8", "replace")


def header_map(headers: Iterable[tuple[str, bytes | None]] | None) -> dict[str, bytes | None]:
    # the last of a repeated header wins, as the workers read them (dict of the list)
    return dict(headers or [])


def replayed_headers(
    headers: Iterable[tuple[str, bytes | None]] | None, decision: Decision
) -> list[tuple[str, bytes | None]]:
    """The headers a record leaves with: back in the pipeline, its dead-letter context and
    its new count; parked, all of them as they were (a forged count too) and the reason."""
    if decision.action == "park":
        return [*(headers or []), (PARKED_REASON, decision.reason.encode())]
    kept = [
        (k, v)
        for k, v in headers or []
        if k != REPLAY_COUNT and (k == "traceparent" or k.startswith(DLQ_PREFIX))
    ]
    return [*kept, (REPLAY_COUNT, str(decision.count).encode())]


# ---- which offsets a run may commit ---------------------------------------------------------


@dataclass
class Ledger:
    """One partition of the DLQ in one run: what was read and handled, and so the offset
    (and metadata) that may be committed without passing over an unhandled record."""

    start: int  # the first offset this run reads
    end: int  # the partition's end when the run started: later records wait for the next run
    committed: int = -1  # the group's offset when the run started (-1: none)
    earlier: frozenset[int] = frozenset()  # handled past `committed` by an earlier run
    accepted: list[int] = field(default_factory=list)  # to replay, park or refuse, in order
    handled: set[int] = field(default_factory=set)  # accepted, and refused or delivered
    hole: int | None = None  # the first offset this run leaves unhandled
    last_read: int | None = None
    read_to_end: bool = False

    def __post_init__(self) -> None:
        self.read_to_end = self.start >= self.end

    def was_handled_before(self, offset: int) -> bool:
        return offset < self.committed or offset in self.earlier

    def read(self, offset: int) -> None:
        self.last_read = offset

    def leave(self, offset: int) -> None:
        """A record this run does not handle: the commit stops before it."""
        if not self.was_handled_before(offset):
            self.hole = offset if self.hole is None else min(self.hole, offset)

    def accept(self, offset: int) -> None:
        self.accepted.append(offset)

    def handle(self, offset: int) -> None:
        self.handled.add(offset)

    def may_accept(self, offset: int) -> bool:
        """False once the offsets handled past the hole would not fit the commit's metadata:
        the rest of the partition then waits for a later run, and nothing is replayed twice."""
        if self.hole is None or offset < self.hole:
            return True
        past = len(self.accepted) - bisect_right(self.accepted, self.hole) + 1
        past += sum(1 for o in self.earlier if o > self.hole)
        width = len(str(self.end - self.hole)) + 1
        return len(METADATA_TAG) + past * width <= METADATA_LIMIT

    def commit(self) -> tuple[int, str] | None:
        """The offset and metadata to commit once the producer is done, or None if this run
        moved nothing. An accepted record without its delivery is a hole."""
        for offset in self.accepted:
            if offset not in self.handled:
                self.leave(offset)
        if self.hole is not None:
            offset = self.hole
        elif self.read_to_end:
            offset = self.end
        else:
            offset = self.start if self.last_read is None else self.last_read + 1
        offset = max(offset, self.committed)
        past = sorted(o for o in self.handled | self.earlier if o > offset)
        while len(_encode(offset, past)) > METADATA_LIMIT:  # only after failed deliveries
            past.pop()
        if offset == self.committed and set(past) == set(self.earlier):
            return None
        return offset, _encode(offset, past)


def _encode(commit: int, past: list[int]) -> str:
    return METADATA_TAG + ",".join(str(o - commit) for o in past) if past else ""


def decode_metadata(commit: int, metadata: str | None) -> frozenset[int]:
    """Offsets an earlier run handled past its commit; anything unreadable names none."""
    if not metadata or not metadata.startswith(METADATA_TAG):
        return frozenset()
    try:
        return frozenset(commit + int(d) for d in metadata[len(METADATA_TAG) :].split(",") if d)
    except ValueError:
        return frozenset()


# ---- the run --------------------------------------------------------------------------------


@dataclass
class Item:
    partition: int
    offset: int
    key: bytes | None
    decision: Decision
    delivered: bool | None = None  # None: refused, a dry run, or no answer from the broker

    @property
    def outcome(self) -> str:
        if self.decision.action == "refuse":
            return "refused"
        if self.delivered is False:
            return "not delivered"
        if self.delivered is None:
            return f"would {self.decision.action}"
        return "replayed" if self.decision.action == "replay" else "parked"


@dataclass
class Report:
    items: list[Item] = field(default_factory=list)
    skipped: int = 0  # not matching the filters: left for a later run
    already: int = 0  # handled by an earlier run past its commit
    deferred: int = 0  # left for a later run: too many handled past a hole to note them all
    unread: list[int] = field(default_factory=list)  # partitions not read to their end

    def count(self, outcome: str) -> int:
        return sum(1 for i in self.items if i.outcome == outcome)

    def reasons(self, outcome: str) -> dict[str, int]:
        out: dict[str, int] = {}
        for i in self.items:
            if i.outcome == outcome:
                out[i.decision.reason] = out.get(i.decision.reason, 0) + 1
        return out


def replay(
    settings: Settings,
    filters: Filters,
    dry_run: bool = False,
    rate: float = 500.0,
    from_beginning: bool = False,
    idle_s: float = 10.0,
) -> Report:
    """Replay the matching dead letters on the DLQ now (at most `rate` a second)."""
    routes = Routes.of(settings)
    consumer = Consumer(
        confluent_config(
            settings,
            {
                "group.id": f"{settings.topic_prefix}{GROUP}",
                "enable.auto.commit": False,
                "enable.partition.eof": True,
                "isolation.level": "read_committed",
            },
        )
    )
    producer = Producer(confluent_config(settings, BASE_CONFIG))
    try:
        ledgers = _ledgers(consumer, routes.topics.dlq, from_beginning)
        run = _Run(routes, filters, ledgers, producer, dry_run, from_beginning, rate)
        try:
            run.all(_records(consumer, routes.topics.dlq, ledgers, idle_s))
        finally:  # an interrupted run still commits what it handled: it is not sent twice
            if not dry_run:
                run.finish()
                _commit(consumer, routes.topics.dlq, ledgers)
        run.report.unread = sorted(p for p, led in ledgers.items() if not led.read_to_end)
        return run.report
    finally:
        consumer.close()


def _ledgers(consumer: Consumer, topic: str, from_beginning: bool) -> dict[int, Ledger]:
    """One ledger per partition, its end taken now: what lands later waits for a later run."""
    meta = consumer.list_topics(topic, timeout=10).topics.get(topic)
    if meta is None or meta.error is not None:
        return {}
    parts = [TopicPartition(topic, p) for p in sorted(meta.partitions)]
    asked = settled(lambda wait: consumer.committed(parts, timeout=wait))
    committed = {tp.partition: tp for tp in asked}
    ledgers = {}
    for tp in parts:
        low, high = watermarks(consumer, tp)
        mine = committed[tp.partition]
        offset = mine.offset if mine.offset >= 0 else -1
        start = low if from_beginning else max(offset, low)
        ledgers[tp.partition] = Ledger(
            start=start,
            end=high,
            committed=offset,
            earlier=decode_metadata(offset, mine.metadata),
        )
    return ledgers


def _records(
    consumer: Consumer, topic: str, ledgers: dict[int, Ledger], idle_s: float
) -> Iterator[Message]:
    """The records below each partition's end, then stop (or after `idle_s` of silence)."""
    todo = {p: led for p, led in ledgers.items() if not led.read_to_end}
    consumer.assign([TopicPartition(topic, p, led.start) for p, led in todo.items()])
    heard_at = time.monotonic()
    while any(not led.read_to_end for led in todo.values()):
        if time.monotonic() - heard_at > idle_s:
            return
        msg = consumer.poll(0.2)
        if msg is None:
            continue
        err = msg.error()
        if err is None:
            if msg.offset() < todo[msg.partition()].end:
                yield msg
            next_offset = msg.offset() + 1
        elif err.code() == KafkaError._PARTITION_EOF:
            next_offset = msg.offset()
        elif err.fatal():
            raise RuntimeError(f"reading {topic}: {err}")
        else:
            continue  # a broker that went away: librdkafka reconnects, idle_s bounds the wait
        heard_at = time.monotonic()
        if next_offset >= todo[msg.partition()].end:
            todo[msg.partition()].read_to_end = True
            consumer.pause([TopicPartition(topic, msg.partition())])


class _Run:
    """What a run does with each record it reads, and its report."""

    def __init__(
        self,
        routes: Routes,
        filters: Filters,
        ledgers: dict[int, Ledger],
        producer: Producer,
        dry_run: bool,
        from_beginning: bool,
        rate: float,
    ) -> None:
        self.routes, self.filters, self.ledgers = routes, filters, ledgers
        self.producer, self.dry_run, self.from_beginning = producer, dry_run, from_beginning
        self.pause_s = 1 / rate if rate > 0 else 0.0
        self.report = Report()
        self.stopped: set[int] = set()  # partitions whose holes filled the commit metadata

    def all(self, records: Iterable[Message]) -> None:
        total = sum(max(0, led.end - led.start) for led in self.ledgers.values())
        columns = (TextColumn("replaying"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        with Progress(*columns, transient=True) as bar:
            task = bar.add_task("dlq", total=total)
            for msg in records:
                self.one(msg)
                bar.advance(task)

    def one(self, msg: Message) -> None:
        p, offset = msg.partition(), msg.offset()
        led = self.ledgers[p]
        led.read(offset)
        if not self.from_beginning and led.was_handled_before(offset):
            self.report.already += 1
            return
        headers = header_map(msg.headers())
        if not self.filters.match(headers, msg.timestamp()[1]):
            self.report.skipped += 1
            led.leave(offset)
            return
        if p in self.stopped or not led.may_accept(offset):
            self.stopped.add(p)
            self.report.deferred += 1
            led.leave(offset)
            return
        item = Item(p, offset, msg.key(), decide(headers, self.routes))
        self.report.items.append(item)
        if not self.dry_run:
            led.accept(offset)
            self._send(msg, item)

    def _send(self, msg: Message, item: Item) -> None:
        if item.decision.action == "refuse":
            self.ledgers[item.partition].handle(item.offset)
            return
        self.producer.produce(
            item.decision.topic,
            key=msg.key(),
            value=msg.value(),
            headers=replayed_headers(msg.headers(), item.decision),
            on_delivery=self._on_delivery(item),
        )
        self.producer.poll(0)
        time.sleep(self.pause_s)

    def _on_delivery(self, item: Item) -> Callable[[KafkaError | None, Message], None]:
        def done(err: KafkaError | None, _msg: Message) -> None:
            item.delivered = err is None
            if err is None:
                self.ledgers[item.partition].handle(item.offset)

        return done

    def finish(self, timeout_s: float = 30.0) -> None:
        """Wait for the broker's answers; an unanswered record counts as not delivered."""
        self.producer.flush(timeout_s)
        for item in self.report.items:
            if item.decision.action != "refuse" and item.delivered is None:
                item.delivered = False


def _commit(consumer: Consumer, topic: str, ledgers: dict[int, Ledger]) -> None:
    offsets = []
    for p, led in ledgers.items():
        moved = led.commit()
        if moved is not None:
            offsets.append(TopicPartition(topic, p, moved[0], metadata=moved[1]))
    if offsets:
        consumer.commit(offsets=offsets, asynchronous=False)
