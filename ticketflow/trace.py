"""`ticketflow trace TICKET_ID`: one ticket's path as a waterfall, from `tickets.audit` alone.

A ticket's audit is one `AuditTrail`, written when it leaves the pipeline, keyed by
ticket_id: every step's entry (step, outcome, attempt, latency_ms, at, model_version), read
here as one `AuditRecord` per step. The producers partition keys as the Java
client does (murmur2, streams/producer.py), so the ticket's records are all on one partition
of the audit topic, computed here: only that partition is read, from the offset of
`--since` when given, to its end. No tracing backend is needed; the trace id printed is
the one a backend (docs/tracing.md) would show.

A step's bar runs from `at - latency_ms` to `at`; the dots (a grey line in the PNG) before
it are the hop from the previous step: Kafka, or a retry's wait.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Annotated, TypeVar

import typer
from aiokafka.partitioner import murmur2
from confluent_kafka import Consumer, TopicPartition
from pydantic import ValidationError

from schemas.tickets import AuditRecord, AuditTrail, TicketResult
from streams.kafka_config import confluent_config
from streams.settings import Settings, get_settings
from streams.topics import Topics
from streams.watermarks import settled, watermarks
from ticketflow.kafka_io import consumer

WIDTH = 80  # the text view fits an 80-column terminal
_LABEL = 14  # "infer #2" and the like
_COLORS = {"ok": "#4c9a2a", "degraded": "#e69f00", "retrying": "#f0e442", "failed": "#d55e00"}


def partition_of(key: bytes, partitions: int) -> int:
    """The partition the producers' partitioner (murmur2, as Java's) gives `key`."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


@dataclass(frozen=True)
class Bar:
    label: str
    outcome: str
    start_ms: float  # from the ticket's first step
    latency_ms: float


@dataclass(frozen=True)
class Waterfall:
    ticket_id: str
    trace_id: str
    workflow: str
    model_version: str | None
    total_ms: float
    bars: list[Bar]


def waterfall(records: Sequence[AuditRecord]) -> Waterfall:
    """The bars of a ticket's audit records (one per record, in time order)."""
    if not records:
        raise ValueError("no audit records")
    ordered = sorted(records, key=lambda r: r.at - timedelta(milliseconds=r.latency_ms))
    t0 = ordered[0].at - timedelta(milliseconds=ordered[0].latency_ms)
    end = max(r.at for r in ordered)
    bars = [
        Bar(
            label=_clean(r.step if r.attempt == 1 else f"{r.step} #{r.attempt}"),
            outcome=r.outcome.value,
            start_ms=(r.at - t0).total_seconds() * 1000 - r.latency_ms,
            latency_ms=r.latency_ms,
        )
        for r in ordered
    ]
    versions = [r.model_version for r in ordered if r.model_version]
    last = ordered[-1]
    return Waterfall(
        ticket_id=last.ticket_id,
        trace_id=_clean(last.trace_id),
        workflow=_clean(f"{last.workflow} v{last.workflow_version}"),
        model_version=_clean(versions[-1]) if versions else None,
        total_ms=(end - t0).total_seconds() * 1000,
        bars=bars,
    )


def _clean(text: str) -> str:
    # anyone who may write to the audit topic chooses these strings: no control character
    # reaches the terminal, and no "$" starts matplotlib's math mode in the PNG
    return "".join(c if c.isprintable() and c != "$" else "?" for c in text)


def render_text(w: Waterfall, width: int = WIDTH) -> str:
    """One row per step: label, outcome, latency, and a bar on the ticket's time axis."""
    head = f"{'step':<{_LABEL}} {'outcome':<9} {'ms':>9} "
    track = width - len(head) - 2  # the bar's columns, between two '|'
    scale = track / w.total_ms if w.total_ms > 0 else 0.0
    lines = [
        _fit(f"ticket {w.ticket_id}  {w.workflow}  model {w.model_version or '-'}", width),
        _fit(f"trace {w.trace_id}  total {w.total_ms:.1f} ms", width),
        head + "|" + _axis(track, w.total_ms) + "|",
    ]
    waited_from = 0  # the previous step's end: the hop to this step is drawn as dots
    for bar in w.bars:
        begin = min(int(bar.start_ms * scale), track - 1)
        length = max(1, min(round(bar.latency_ms * scale), track - begin))
        hop = max(0, begin - waited_from)
        cells = " " * (begin - hop) + "·" * hop + "█" * length + " " * (track - begin - length)
        waited_from = max(waited_from, begin + length)
        label = bar.label[:_LABEL]
        lines.append(f"{label:<{_LABEL}} {bar.outcome[:9]:<9} {bar.latency_ms:>9.1f} |{cells}|")
    return "\n".join(lines)


def _axis(track: int, total_ms: float) -> str:
    right = f"{total_ms:.0f} ms"
    return ("0" + right.rjust(track - 1))[:track]


def _fit(line: str, width: int) -> str:
    return line if len(line) <= width else line[: width - 1] + "…"


def render_png(w: Waterfall, path: Path) -> Path:
    """The waterfall as a PNG at `path` (matplotlib, no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = len(w.bars)
    fig, ax = plt.subplots(figsize=(9, 1.2 + 0.45 * rows), dpi=110)
    waited_from = 0.0
    for i, bar in enumerate(w.bars):
        if bar.start_ms > waited_from:  # the hop from the previous step (Kafka, a retry's wait)
            ax.barh(i, bar.start_ms - waited_from, left=waited_from, height=0.15, color="#cccccc")
        waited_from = max(waited_from, bar.start_ms + bar.latency_ms)
        color = _COLORS.get(bar.outcome, "#888888")
        ax.barh(i, max(bar.latency_ms, w.total_ms / 500), left=bar.start_ms, color=color)
        ax.text(
            bar.start_ms + bar.latency_ms,
            i,
            f" {bar.latency_ms:.1f} ms {bar.outcome}",
            va="center",
            fontsize=8,
        )
    ax.set_yticks(range(rows), [b.label for b in w.bars])
    ax.invert_yaxis()
    ax.set_xlim(0, w.total_ms * 1.25 or 1)
    ax.set_xlabel("ms since the ticket's first step")
    ax.set_title(
        f"ticket {w.ticket_id} · {w.workflow} · model {w.model_version or '-'} · "
        f"{w.total_ms:.1f} ms\ntrace {w.trace_id}",
        fontsize=9,
    )
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def result_line(result: TicketResult, width: int = WIDTH) -> str:
    """The ticket's result on one line: where it went, as what, how sure, and how fast."""
    how = "degraded" if result.degraded else f"{result.confidence:.2f}"
    line = (
        f"result: {result.route}, {result.category.value} {how}, model "
        f"{result.model_version or '-'}, {result.latency_ms:.1f} ms end to end"
    )
    return _fit(_clean(line), width)


# ---- reading one ticket's records ------------------------------------------------------------

M = TypeVar("M", AuditTrail, TicketResult)


@dataclass
class Scan:
    records: list[AuditRecord]
    topic: str
    partition: int
    read: int  # records read on the partition, the ticket's and others'
    seconds: float
    results: list[TicketResult] = field(default_factory=list)


def read_audit(
    settings: Settings,
    ticket_id: str,
    since: datetime | None = None,
    idle_s: float = 2.0,
    results: bool = False,
) -> Scan:
    """The ticket's audit records (and with `results`, its results on `tickets.out.*`):
    its partition only, from `since` (else the start) to the end it had when read."""
    started = time.perf_counter()
    topics = Topics(settings.topic_prefix)
    key = ticket_id.encode()
    # a fetch waits up to fetch.wait.max.ms for data at the end of a partition, and holds up
    # the requests behind it on the connection: short, as each partition is read to its end
    c = consumer(confluent_config(settings), **{"fetch.wait.max.ms": 10})
    try:
        trails, partition, read = _read_keyed(c, topics.audit, key, since, AuditTrail, idle_s)
        records = [r for trail in trails for r in trail.records()]
        found: list[TicketResult] = []
        if results:
            outs = sorted(
                t for t in c.list_topics(timeout=10).topics if t.startswith(topics.out(""))
            )
            for topic in outs:
                found += _read_keyed(c, topic, key, since, TicketResult, idle_s)[0]
    finally:
        c.close()
    return Scan(records, topics.audit, partition, read, time.perf_counter() - started, found)


def _read_keyed(
    c: Consumer, topic: str, key: bytes, since: datetime | None, model: type[M], idle_s: float
) -> tuple[list[M], int, int]:
    """(the records keyed `key` on `topic`, its partition, records read there)."""
    meta = c.list_topics(topic, timeout=10).topics.get(topic)
    if meta is None or meta.error is not None or not meta.partitions:
        return [], -1, 0
    tp = TopicPartition(topic, partition_of(key, len(meta.partitions)))
    low, end = watermarks(c, tp)
    start = low if since is None else _offset_at(c, tp, since, end)
    if start >= end:
        return [], tp.partition, 0
    tp.offset = start
    c.assign([tp])
    try:
        records, read = _scan(c, tp, key, end, model, idle_s)
    finally:
        c.unassign()
    return records, tp.partition, read


def _offset_at(c: Consumer, tp: TopicPartition, since: datetime, end: int) -> int:
    if since.tzinfo is None:  # the records' times are UTC, and so is a bare --since
        since = since.replace(tzinfo=timezone.utc)
    probe = TopicPartition(tp.topic, tp.partition, int(since.timestamp() * 1000))
    [found] = settled(lambda wait: c.offsets_for_times([probe], timeout=wait))
    return found.offset if found.offset >= 0 else end  # nothing since then: read nothing


def _scan(
    c: Consumer, tp: TopicPartition, key: bytes, end: int, model: type[M], idle_s: float
) -> tuple[list[M], int]:
    """Read until the end the partition had: its last record seen, or the position there
    (past a transaction's closing marker, which is no message); `idle_s` without a record
    ends it too."""
    records: list[M] = []
    read, last, done = 0, time.monotonic(), False
    while not done and time.monotonic() - last < idle_s:
        # a batch short of 500 returns only at the timeout: keep it short
        batch = c.consume(500, timeout=0.05)
        for msg in batch:
            if msg.error():
                continue
            read += 1
            done = done or msg.offset() >= end - 1
            if msg.key() == key:
                try:
                    records.append(model.model_validate_json(msg.value()))
                except ValidationError:
                    continue  # not a record of ours: skipped, never shown
        if batch:
            last = time.monotonic()
        done = done or c.position([tp])[0].offset >= end
    return records, read


# ---- the command --------------------------------------------------------------------------------

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def default_png(settings: Settings, ticket_id: str) -> Path:
    return Path(settings.state_dir) / "traces" / f"trace-{_UNSAFE.sub('_', ticket_id)}.png"


def command(
    ticket_id: Annotated[str, typer.Argument(help="the ticket's id (its key on every topic)")],
    since: Annotated[
        datetime | None,
        typer.Option(help="read the audit topic from this time (UTC) on: faster on a long topic"),
    ] = None,
    png: Annotated[
        Path | None,
        typer.Option(help="where to write the PNG; default <state dir>/traces/trace-<id>.png"),
    ] = None,
    no_png: Annotated[bool, typer.Option("--no-png", help="the text view only")] = False,
) -> None:
    """Draw a ticket's path through the workflow as a waterfall, from the audit topic, and
    its result from tickets.out.*."""
    settings = get_settings()
    scan = read_audit(settings, ticket_id, since, results=True)
    where = f"{scan.topic} partition {scan.partition}"
    if not scan.records:
        typer.echo(f"no audit records for that ticket on {where}", err=True)
        raise typer.Exit(1)
    w = waterfall(scan.records)
    typer.echo(render_text(w))
    for result in scan.results:
        typer.echo(result_line(result))
    typer.echo(f"read {scan.read} records of {where} in {scan.seconds:.2f} s")
    if not no_png:
        path = render_png(w, png or default_png(settings, ticket_id))
        typer.echo(f"png: {path}")
