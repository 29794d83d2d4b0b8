"""Everything the steps write besides results: envelopes to the next step, decision-path
entries, the audit trail of a dead-lettered ticket, and dead letters. All go through one
producer, whose deliveries the commit barrier awaits before input offsets are committed.

A ticket's audit is written once, when it leaves the pipeline (`AuditTrail`): its steps'
entries travel with it in the envelope's path, each with its end time and model version,
so a record per step would only repeat them. The router writes a finished ticket's trail in
the result's transaction; `audit_dead_letter` writes a dead-lettered one's.

Each decision-path entry closes the ticket's span of that step (streams/tracing.py), and the
ticket's next record carries that span as its `traceparent`, so the next step continues it.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from typing import Any

from agents import metrics
from agents.decoding import header, traceparent
from agents.handoff import Handoff
from schemas.tickets import AuditOutcome, AuditTrail, DecisionStep, Envelope, ErrorClass, StepStatus
from schemas.workflow import Step
from streams.bundles import chunks, pack
from streams.codecs import encode
from streams.headers import (
    REPLAY_COUNT,
    DeadLetterContext,
    child_traceparent,
    new_traceparent,
    replay_count,
)
from streams.partitioning import partition_for
from streams.producer import AsyncProducer, Record
from streams.topics import Topics
from streams.tracing import configure, step_spans

log = logging.getLogger(__name__)


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


# a bundle stays well under the broker's default 1 MB record limit
BUNDLE_MAX_BYTES = 256 * 1024


def now_ms() -> float:
    """Epoch milliseconds, as a decision-path entry's `at_ms`."""
    return round(time.time() * 1000, 3)


class Emitter:
    def __init__(
        self,
        producer: AsyncProducer,
        topics: Topics,
        max_replays: int,
        partitions: Callable[[str], int | None] | None = None,
        handoff: Handoff | None = None,
    ) -> None:
        """`partitions(topic)`: the topic's partition count, None where unknown (its
        envelopes then go one record each); without it, no bundles are written.
        `handoff`: where envelopes bound for a partition this worker reads are kept, so
        that its reader takes them without parsing them again (agents/handoff.py)."""
        self.producer = producer
        self.topics = topics
        self.max_replays = max_replays
        self._partitions = partitions
        self.handoff = handoff
        # here, not in the worker's main: the one object every worker process builds once;
        # without an OTLP endpoint nothing is installed and spans cost one check
        configure("ticketflow-worker")

    def send(self, topic: str, env: Envelope) -> None:
        self.send_many([(topic, env)])

    def send_many(self, outgoing: Sequence[tuple[str, Envelope]]) -> None:
        """Each (topic, envelope) to its topic, in one hand-off to the producer."""
        if outgoing:
            self.producer.produce_many(
                (topic, env.ticket.ticket_id.encode(), encode(env), self.trace_headers(env), None)
                for topic, env in outgoing
            )

    def send_to_steps(self, outgoing: Sequence[tuple[str, Envelope]]) -> None:
        """A batch's envelopes to their next steps' topics: those bound for one partition
        of one topic as one bundle (streams/bundles.py), the partition their keys would
        pick. One record each where a bundle would hold one, where the topic's partitions
        are unknown here, and with tracing on (a span travels in its record's headers)."""
        if self._partitions is None or step_spans.on:
            self.send_many(outgoing)
            return
        unknown: list[tuple[str, Envelope]] = []
        groups: dict[tuple[str, int], list[tuple[bytes, Envelope]]] = defaultdict(list)
        for topic, env in outgoing:
            n = self._partitions(topic)
            if not n:
                unknown.append((topic, env))
                continue
            key = env.ticket.ticket_id.encode()
            groups[topic, partition_for(key, n)].append((key, env))
        records: list[Record] = []
        bundled = 0
        for (topic, partition), group in groups.items():
            parts = [(key, encode(env)) for key, env in group]
            if self.handoff is not None and self.handoff.reads(topic, partition):
                for (_, value), (_, env) in zip(parts, group, strict=True):
                    self.handoff.keep(value, env)
            if len(parts) == 1:
                key, value = parts[0]
                env = group[0][1]
                records.append((topic, key, value, self.trace_headers(env), partition))
                continue
            bundled += len(parts)
            for run in chunks(parts, BUNDLE_MAX_BYTES):
                records.append((topic, None, pack(run), [], partition))
        self.send_many(unknown)
        self.producer.produce_many(records)
        metrics.BUNDLED.inc(bundled)

    def trace_headers(self, env: Envelope) -> list[tuple[str, bytes]]:
        parent = step_spans.traceparent(env) or child_traceparent(env.trace_id)
        return [("traceparent", parent.encode())]

    def record(
        self, env: Envelope, step: Step, status: StepStatus, t0: float, detail: str | None = None
    ) -> DecisionStep:
        """Add the step's entry to the ticket's decision path (its audit, once it leaves)."""
        seconds = time.perf_counter() - t0
        metrics.step_seconds(step.name).observe(seconds)
        pred = env.context.prediction
        # built by us from validated parts: no need to validate again (model_construct)
        entry = DecisionStep.model_construct(
            step=step.name,
            status=status,
            attempt=env.attempt,
            latency_ms=round(seconds * 1000, 3),
            detail=detail,
            at_ms=now_ms(),
            model_version=pred.model_version if pred else None,
        )
        env.path.append(entry)
        self.closed(env, step, entry)
        return entry

    @staticmethod
    def closed(env: Envelope, step: Step, entry: DecisionStep) -> None:
        """Close the ticket's span of `step` (a no-op with tracing off)."""
        status = entry.status.value if isinstance(entry.status, StepStatus) else str(entry.status)
        step_spans.finish(env, step.name, status, entry.latency_ms)

    @staticmethod
    def audit_trail(env: Envelope, outcome: AuditOutcome, route: str | None = None) -> bytes:
        """The ticket's one audit record: its whole decision path so far."""
        pred = env.context.prediction
        trail = AuditTrail.model_construct(
            ticket_id=env.ticket.ticket_id,
            trace_id=env.trace_id,
            workflow=env.workflow,
            workflow_version=env.workflow_version,
            input_sha256=env.input_sha256,
            outcome=outcome,
            route=route,
            model_version=pred.model_version if pred else None,
            steps=env.path,
            at=utcnow(),
        )
        return encode(trail)

    def audit_dead_letter(self, env: Envelope) -> None:
        """A ticket dead-lettered by a step leaves the pipeline here: its trail goes now."""
        value = self.audit_trail(env, "dead_lettered")
        self.producer.produce(self.topics.audit, env.ticket.ticket_id.encode(), value)

    def dead_letter(
        self,
        event: Any,
        step: str,
        error_class: ErrorClass,
        reason: str,
        attempts: int,
        trace_id: str | None = None,
    ) -> None:
        """The record exactly as the step received it, its context in x-dlq-* headers.

        A record that failed again after its replays, or whose replay count is forged, is
        parked instead of looping.
        """
        msg = event.message
        parent = traceparent(msg.headers)
        replays = replay_count(header(msg.headers, REPLAY_COUNT))
        parked = replays is None or replays >= self.max_replays
        ctx = DeadLetterContext(
            error_class=error_class.value,
            reason=reason[:500],
            step=step,
            attempts=attempts,
            origin_topic=msg.topic,
            origin_partition=msg.partition,
            origin_offset=msg.offset,
            first_failed_at=utcnow(),
            exception=reason,
            traceparent=parent or (child_traceparent(trace_id) if trace_id else new_traceparent()),
        )
        topic = self.topics.dlq_parked if parked else self.topics.dlq
        self.producer.produce(topic, msg.key, msg.value, ctx.headers(replays or 0))
        metrics.DLQ.labels(step, error_class.value).inc()
        log.warning(
            "dead-lettered %s[%d]@%d at %s%s: %s",
            msg.topic,
            msg.partition,
            msg.offset,
            step,
            " (parked)" if parked else "",
            error_class.value,
        )
