"""The router: exactly one `TicketResult` per ticket.

Each input partition of the router has its own transactional producer (Kafka Streams'
EOS-v1 model): a result and its entry in the `tickets.completed` ledger commit in one
transaction, a ticket already in the ledger is skipped, and whoever owns a partition
next fences the last owner's producer. The router goes on taking tickets while a
partition's transaction commits, so the next transaction carries everything that arrived
meanwhile. The commit barrier waits for `drain()`, so an input offset is never committed
before its result.

A producer fenced while its worker still holds the partition (two workers each believing
they own it while the group settles) is not replaced at once: the partition is held for
`FENCED_HOLD_S`, longer than a session timeout, and only then fenced back if it is still
assigned. Replacing it at once let two such workers abort each other's transactions in
turn, with nothing committed (docs/chaos.md, findings of 4 December); held, the newer
owner commits meanwhile, and the ledger reloaded after the hold skips what it committed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaError, KafkaException

from agents import metrics
from agents.completion import CompletionLedger
from agents.emitter import Emitter, now_ms, utcnow
from agents.spot_check import copy_records, state_fields
from agents.state import States, new_state
from agents.topology import Topology
from schemas.tickets import (
    AuditOutcome,
    Category,
    DecisionStep,
    Envelope,
    StepStatus,
    TicketResult,
)
from schemas.workflow import Step
from streams.codecs import encode
from streams.kafka_errors import kafka_error
from streams.producer import Record, TransactionalProducer
from streams.topics import Topics

log = logging.getLogger(__name__)

REVIEW_ROUTE = "manual_review"
RETRY_PAUSE_S = 1.0
# a fenced partition still assigned waits this long before fencing back: past the group's
# session timeout (6 s, streams/app.py), by when a worker that lost it has been told so
FENCED_HOLD_S = 10.0
FENCING = frozenset(
    {KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH}
)


@dataclass
class Pending:
    event: Any
    env: Envelope
    result: TicketResult


class Router:
    def __init__(
        self,
        kafka: Mapping[str, Any],
        transactional_prefix: str,
        topics: Topics,
        topology: Topology,
        states: States,
        emitter: Emitter,
        owns: Callable[[int], bool],
    ) -> None:
        self._kafka = kafka
        self._prefix = transactional_prefix
        self.topics = topics
        self.topology = topology
        self.states = states
        self.emitter = emitter
        self._owns = owns
        self.ledger = CompletionLedger(kafka, topics.completed)
        self._txn: dict[int, TransactionalProducer] = {}
        self._locks: dict[int, asyncio.Lock] = defaultdict(asyncio.Lock)
        # results waiting for their partition's next transaction, and the task committing
        self._queued: dict[int, dict[str, Pending]] = defaultdict(dict)
        self._committing: dict[int, asyncio.Future] = {}
        self._warming: set[asyncio.Future] = set()
        # partition -> monotonic time until which a fenced partition is not fenced back
        self._held_until: dict[int, float] = {}
        # set while a partition is being revoked: its commit loop stops instead of retrying
        self._revoking: dict[int, asyncio.Event] = defaultdict(asyncio.Event)
        self.topic = topics.step(topology.router.name)

    async def route(self, step: Step, items: list[tuple[Any, Envelope]]) -> None:
        """Queue each new result for its partition's next transaction.

        A fused router sees tickets from an earlier step's topic: the same key and
        partition count, so the same partition, which Faust assigns with the route topic's.
        """
        t0 = time.perf_counter()
        for event, env in items:
            partition = event.message.partition
            if not self._holding(partition):  # held: the commit after the hold loads it
                await self._owned(partition)
            tid = env.ticket.ticket_id
            if tid in self._queued[partition] or self._in_ledger(partition, tid):
                log.info("ticket %s already has its result; redelivery skipped", tid)
                continue
            own = self.topology.step_of(env, step.name)
            self._queued[partition][tid] = Pending(event, env, self._result(env, own, t0))
            if partition not in self._committing:
                self._committing[partition] = asyncio.ensure_future(self._commit_loop(partition))

    async def drain(self) -> None:
        """Until every queued result is committed (the barrier's first phase)."""
        while self._committing:
            await asyncio.gather(*list(self._committing.values()), return_exceptions=True)

    async def _commit_loop(self, partition: int) -> None:
        try:
            while self._queued[partition]:
                batch = self._queued.pop(partition)
                try:
                    await self._commit(partition, list(batch.values()))
                except Exception:  # never drop acknowledged inputs: keep them for a retry
                    log.exception("route partition %d: commit failed; retrying", partition)
                    metrics.INFRA_RETRIES.labels("router").inc()
                    self._reset(partition)
                    for tid, item in batch.items():
                        self._queued[partition].setdefault(tid, item)
                    await self._pause(partition)
        finally:
            self._committing.pop(partition, None)

    async def _pause(self, partition: int) -> None:
        """Before a retry: RETRY_PAUSE_S, or to the end of a fenced partition's hold; cut
        short once the partition is no longer assigned (the next try then gives it up)."""
        until = max(time.monotonic() + RETRY_PAUSE_S, self._held_until.get(partition, 0.0))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._revoking[partition].wait(), until - time.monotonic())

    def _mine(self, partition: int) -> bool:
        return not self._revoking[partition].is_set() and self._owns(partition)

    def _holding(self, partition: int) -> bool:
        return time.monotonic() < self._held_until.get(partition, 0.0)

    def _in_ledger(self, partition: int, ticket_id: str) -> bool:
        return self.ledger.loaded(partition) and self.ledger.has(partition, ticket_id)

    async def _commit(self, partition: int, items: list[Pending]) -> None:
        if not self._mine(partition):  # revoked: its new owner redoes these inputs
            log.info("route partition %d is no longer ours; its new owner redoes it", partition)
            return
        producer = await self._owned(partition)
        items = [i for i in items if not self.ledger.has(partition, i.result.ticket_id)]
        if not items:
            return
        records: list[Record] = []
        for item in items:
            tid = item.result.ticket_id.encode()
            route = item.result.route
            headers = self.emitter.trace_headers(item.env)
            records.append((self.topics.out(route), tid, encode(item.result), headers, None))
            records.append((self.topics.completed, tid, route.encode(), [], partition))
            # the ticket's one audit record, exactly once with its result
            trail = self.emitter.audit_trail(item.env, _outcome(item.result), route)
            records.append((self.topics.audit, tid, trail, [], None))
            # a sampled automatic decision: its copy for reviewers commits with it
            records.extend(copy_records(self.topics, item.env, item.result, headers))
        try:
            await producer.commit(records)
        except KafkaException as exc:
            self._reset(partition)
            if not self._mine(partition):  # fenced: the new owner redoes these inputs
                log.warning("route partition %d lost (%s); its new owner redoes it", partition, exc)
                return
            if _fenced(exc):  # still assigned here too: let the other owner commit first
                self._held_until[partition] = time.monotonic() + FENCED_HOLD_S
                log.warning(
                    "route partition %d: fenced while assigned; held %.0f s before taking it back",
                    partition,
                    FENCED_HOLD_S,
                )
            raise  # still ours: retried on a new producer (after the hold, if fenced)
        for item in items:
            self.ledger.add(partition, item.result.ticket_id)
        for item in items:
            try:
                self._completed(item)
            except Exception as exc:  # the result is committed; only its status is stale
                log.warning("ticket %s: state not updated (%r)", item.result.ticket_id, exc)

    def _completed(self, item: Pending) -> None:
        env, result, router = item.env, item.result, self.topology.router.name
        fresh = new_state(
            env.ticket.ticket_id, env.arrival, env.trace_id, env.workflow, env.workflow_version
        )
        if _outcome(result) == "awaiting_review":  # a person decides next (agents/review.py)
            self.states.move(
                item.event,
                fresh,
                "awaiting_review",
                router,
                env.attempt,
                route=result.route,
                result=result.model_dump(mode="json"),
            )
        else:
            status = _outcome(result)
            extra = state_fields(env, result)  # a spot check keeps its result for the review
            self.states.move(
                item.event, fresh, status, router, env.attempt, route=result.route, **extra
            )
        metrics.TICKETS.labels(result.route).inc()
        metrics.WORKFLOW_DURATION.observe(result.latency_ms / 1000)
        self.emitter.closed(env, self.topology.step_of(env, router), env.path[-1])

    def _reset(self, partition: int) -> None:
        producer = self._txn.pop(partition, None)
        if producer is not None:
            producer.close()
        self.ledger.forget(partition)

    async def _owned(self, partition: int) -> TransactionalProducer:
        """This worker's producer for `partition`, fencing any earlier owner, ledger loaded."""
        async with self._locks[partition]:
            producer = self._txn.get(partition)
            if producer is None:
                producer = TransactionalProducer(self._kafka, f"{self._prefix}-{partition}")
                await producer.init()  # aborts and fences whatever the last owner left open
                self._txn[partition] = producer
                self.ledger.forget(partition)
            if not self.ledger.loaded(partition):
                await self.ledger.load(partition)
            return producer

    def on_assigned(self, partitions: set[int]) -> None:
        """Fence the last owner and load the ledger now, not when the first ticket waits."""
        for partition in partitions:
            self._revoking[partition].clear()
            self._held_until.pop(partition, None)  # the group's word: ours, fence at once
            task = asyncio.ensure_future(self._owned(partition))
            self._warming.add(task)
            task.add_done_callback(self._warmed)

    def _warmed(self, task: asyncio.Future) -> None:
        self._warming.discard(task)
        if not task.cancelled() and task.exception() is not None:  # retried on first use
            log.warning("route partition warm-up failed: %r", task.exception())

    async def on_revoked(self, partitions: set[int]) -> None:
        """Let open transactions finish, then let the partitions go: the next owner fences
        this worker's producers and redoes whatever was not committed."""
        for partition in partitions:  # a commit loop held or pausing stops now
            self._revoking[partition].set()
        for partition in partitions:
            self._held_until.pop(partition, None)
            committing = self._committing.get(partition)
            if committing is not None:
                await asyncio.wait([committing], timeout=30)
            self._reset(partition)

    def close(self) -> None:
        for producer in self._txn.values():
            producer.close()

    def _result(self, env: Envelope, step: Step, t0: float) -> TicketResult:
        rule = env.context.rule
        route = rule.route if rule and rule.route in step.routes else REVIEW_ROUTE
        latency = round((time.perf_counter() - t0) * 1000, 3)
        env.path.append(
            DecisionStep(
                step=step.name,
                status=StepStatus.ok,
                attempt=env.attempt,
                latency_ms=latency,
                detail=route,
                at_ms=now_ms(),
                model_version=env.context.prediction.model_version
                if env.context.prediction
                else None,
            )
        )
        metrics.step_seconds(step.name).observe(latency / 1000)
        pred = env.context.prediction
        return TicketResult(
            ticket_id=env.ticket.ticket_id,
            route=route,
            category=rule.category if rule else Category.general,
            confidence=pred.confidence if pred else 0.0,
            model_name=pred.model_name if pred else None,
            model_version=pred.model_version if pred else None,
            degraded=env.context.degraded,
            degraded_reason=env.context.degraded_reason,
            features=env.context.features,
            decision_path=env.path,
            latency_ms=(time.time() - env.started_at.timestamp()) * 1000,
            completed_at=utcnow(),
            trace_id=env.trace_id,
            workflow=env.workflow,
            workflow_version=env.workflow_version,
        )


def _outcome(result: TicketResult) -> AuditOutcome:
    """The ticket's status once its result is committed."""
    if result.route == REVIEW_ROUTE:
        return "awaiting_review"
    return "degraded" if result.degraded else "completed"


def _fenced(exc: KafkaException) -> bool:
    err = kafka_error(exc)
    return err is not None and err.code() in FENCING
