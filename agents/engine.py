"""The workflow engine: one Faust agent per step of a definition, state in a changelog table.

Each step consumes `tickets.step.<step>` (the first consumes `tickets.in`) a batch at a
time, runs its handler and forwards each envelope to the next step's topic. Failures
become retries through the delay tiers, degradation to `manual_review`, or dead letters,
never a crashed worker.

Guarantees. Every step acknowledges its inputs only after its outputs are on the broker
(at-least-once), so a crash can repeat a step but never skip one. The last step makes it
exactly once: results and their ledger entries commit in one transaction per partition,
and a ticket already in the ledger is skipped (agents/completion.py).
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import logging
import random
import time
import weakref
from collections import defaultdict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

import faust
from confluent_kafka import KafkaException
from faust.streams import _current_event
from pydantic import ValidationError

from agents import metrics
from agents.completion import CompletionLedger
from agents.errors import BadRecord, RetryableError
from agents.review import REVIEWED_ROUTE, ReviewRefused, check_decidable, reviewed_result
from agents.state import TERMINAL, new_state, record_duplicate, transition
from agents.steps.handlers import (
    FeatureLookupStep,
    Handler,
    InferenceStep,
    ProcessorStep,
    RuleEngineStep,
    degrade,
    remaining_ms,
)
from agents.steps.validate import parse_ticket
from feature_jobs.reader import OnlineFeatureReader
from inference_gateway.client import GatewayClient
from schemas.tickets import (
    AuditRecord,
    Category,
    DecisionStep,
    Envelope,
    ErrorClass,
    ReviewDecision,
    StepStatus,
    TicketResult,
)
from schemas.workflow import Step, WorkflowDefinition
from streams.admin import RETRY_TIERS_MS
from streams.codecs import decode, encode
from streams.headers import (
    REPLAY_COUNT,
    DeadLetterContext,
    child_traceparent,
    new_trace_id,
    new_traceparent,
    trace_id_of,
)
from streams.producer import AsyncProducer, TransactionalProducer
from streams.settings import Settings
from streams.tables import WriteBehindTable
from streams.topics import Topics

log = logging.getLogger(__name__)

# A step takes what its topic has, up to this many, waiting at most this long for more:
# one batch costs one gateway call and one await of the producer, not one per ticket.
BATCH_MAX = 256
BATCH_WITHIN_S = 0.01
# steps skipped (degrading the ticket) once the workflow deadline has passed
DEADLINE_GUARDED = frozenset({"inference_call"})
REVIEW_ROUTE = "manual_review"
RETRY_BATCH_MAX_S = 5.0  # the longest wait between attempts at a failed batch
Item = tuple[faust.EventT, Envelope]  # an envelope and the event that carried it


@dataclass
class Dependencies:
    gateway: GatewayClient
    features: OnlineFeatureReader


def _utcnow() -> datetime:
    return datetime.now(timezone.utc)


def _raw_topic(app: faust.App, name: str) -> faust.TopicT:
    return app.topic(
        name, key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw"
    )


def _as_current(event: faust.EventT) -> None:
    # A table write goes to the changelog partition of the *current* event. In a batch the
    # stream's current event is the last one taken, so point it at the ticket's own event.
    _current_event.set(weakref.ref(event))


async def until_done(what: str, handle: Callable[..., Awaitable[None]], *args: Any) -> None:
    """Run `handle(*args)` until it returns, retrying with backoff when it raises.

    Faust acknowledges a `take_events` batch once the agent asks for the next one, even when
    the handler raised: a batch must never be given up. Per-ticket failures are settled
    inside the handler (retries, dead letters); what reaches here is infrastructure (a
    fence, a ledger read timing out), and redoing the batch is safe: steps repeat
    harmlessly and the router skips tickets already in its ledger.
    """
    for attempt in itertools.count(1):
        try:
            await handle(*args)
            return
        except Exception:
            log.exception("%s: batch failed (attempt %d); retrying it", what, attempt)
            await asyncio.sleep(min(RETRY_BATCH_MAX_S, 0.1 * 2**attempt))


def _header(event: faust.EventT, name: str) -> str | None:
    value = dict(event.headers or {}).get(name)
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


class WorkflowEngine:
    def __init__(
        self,
        app: faust.App,
        definition: WorkflowDefinition,
        settings: Settings,
        deps: Dependencies,
        earlier: Sequence[WorkflowDefinition] = (),
    ) -> None:
        self.app = app
        self.definition = definition  # new tickets start on this version
        # tickets in flight finish on the version they started with
        self.versions = {d.version: d for d in [*earlier, definition]}
        self.settings = settings
        self.topics = Topics(settings.topic_prefix)
        self.deps = deps
        self.producer = AsyncProducer(settings.kafka_bootstrap)
        self.state = app.tables.add(
            WriteBehindTable(
                app,
                name="ticket_state",
                default=None,
                beacon=app.tables.beacon,
                partitions=settings.partitions,
            )
        )
        self.state.write_through(self.producer)
        inference = InferenceStep(deps.gateway, self._deadline_ms)
        self.breaker = inference.breaker
        self.handlers: dict[str, Handler] = {
            "processor": ProcessorStep(),
            "feature_lookup": FeatureLookupStep(deps.features),
            "inference_call": inference,
            "rule_engine": RuleEngineStep(),
        }
        self.ledger = CompletionLedger(settings.kafka_bootstrap, self.topics.completed)
        self._txn: dict[int, TransactionalProducer] = {}
        self._ledger_locks: dict[int, asyncio.Lock] = defaultdict(asyncio.Lock)
        # results waiting for their partition's next transaction, and the task committing
        self._queued: dict[int, dict[str, tuple]] = defaultdict(dict)
        self._committing: dict[int, asyncio.Future] = {}
        self._warming: set[asyncio.Future] = set()
        self._router = next(s for s in definition.steps if s.type == "router")
        self._route_topic = self.topics.step(self._router.name)

    # ---- wiring -------------------------------------------------------------------------

    def build(self) -> None:
        first = self.definition.steps[0]
        self._agent(self.topics.tickets_in, first, self._validate_batch)
        for step in self.later_steps():
            handle = self._route_batch if step.type == "router" else self._step_batch
            self._agent(self.topics.step(step.name), step, handle)
        for delay in RETRY_TIERS_MS:
            topic = _raw_topic(self.app, self.topics.retry(delay))
            self.app.agent(topic, name=f"retry-{delay}")(self._retry_tier)
        decisions = _raw_topic(self.app, self.topics.review_decisions)
        self.app.agent(decisions, name="review")(self._review)
        self.app.on_partitions_revoked.connect(self._on_revoked)
        self.app.on_partitions_assigned.connect(self._on_assigned)
        self._commit_waits_for_outputs()

    def later_steps(self) -> list[Step]:
        """Every step after validation, of every version in flight (the newest config)."""
        steps: dict[str, Step] = {}
        for version in sorted(self.versions):
            steps.update({s.name: s for s in self.versions[version].steps[1:]})
        return list(steps.values())

    def _definition_of(self, env: Envelope) -> WorkflowDefinition:
        return self.versions.get(env.workflow_version, self.definition)

    def _deadline_ms(self, env: Envelope) -> int:
        return self._definition_of(env).deadline_ms

    def _step_of(self, env: Envelope, name: str) -> Step:
        """The step as the ticket's own version defines it."""
        try:
            return self._definition_of(env).step(name)
        except KeyError:  # a step the ticket's version lacks: run the newest one
            return next(s for s in self.later_steps() if s.name == name)

    def _commit_waits_for_outputs(self) -> None:
        """At-least-once: Faust flushes its producer before it commits offsets; make that
        flush wait for our producer's deliveries too, so a committed input always has its
        outputs on the broker. Steps then never block on delivery between batches."""
        faust_producer = self.app.producer
        faust_flush = faust_producer.flush

        async def flush() -> None:
            await faust_flush()
            await self._drain()

        faust_producer.flush = flush  # type: ignore[method-assign]

    def _agent(self, topic: str, step: Step, handle: Any) -> None:
        async def run(stream: faust.StreamT) -> None:
            async for events in stream.take_events(BATCH_MAX, within=BATCH_WITHIN_S):
                await until_done(f"step {step.name}", handle, step, events)

        agent = self.app.agent(
            _raw_topic(self.app, topic), name=f"step-{step.name}", concurrency=step.concurrency
        )
        agent(run)

    def close(self) -> None:
        self.state.flush_changelog()
        self.producer.close()
        for producer in self._txn.values():
            producer.close()

    def _owns(self, partition: int) -> bool:
        return any(
            tp.topic == self._route_topic and tp.partition == partition
            for tp in self.app.consumer.assignment()
        )

    async def _on_assigned(self, app: faust.App, assigned: set, **_: Any) -> None:
        """Fence the last owner and load the ledger now, not when the first ticket waits."""
        for tp in assigned:
            if tp.topic == self._route_topic:
                task = asyncio.ensure_future(self._owned(tp.partition))
                self._warming.add(task)
                task.add_done_callback(self._warmed)

    def _warmed(self, task: asyncio.Future) -> None:
        self._warming.discard(task)
        if not task.cancelled() and task.exception() is not None:  # retried on first use
            log.warning("route partition warm-up failed: %r", task.exception())

    async def _on_revoked(self, app: faust.App, revoked: set, **_: Any) -> None:
        for tp in revoked:
            if tp.topic == self._route_topic:  # the next owner fences this producer: let it go
                committing = self._committing.get(tp.partition)
                if committing is not None:  # let an open transaction finish first
                    await asyncio.wait([committing], timeout=30)
                self.ledger.forget(tp.partition)
                producer = self._txn.pop(tp.partition, None)
                if producer is not None:
                    producer.close()

    # ---- the validator step -------------------------------------------------------------

    async def _validate_batch(self, step: Step, events: Sequence[faust.EventT]) -> None:
        valid = []
        for event in events:
            t0 = time.perf_counter()
            try:
                ticket = parse_ticket(event.value, self.settings.max_record_bytes)
            except BadRecord as exc:
                self._dead_letter(event, step.name, exc.error_class, exc.reason, 1)
                continue
            msg = event.message
            env = Envelope(
                ticket=ticket,
                workflow=self.definition.name,
                workflow_version=self.definition.version,
                step=step.name,
                attempt=1,
                trace_id=trace_id_of(_header(event, "traceparent")) or new_trace_id(),
                arrival=f"{msg.partition}:{msg.offset}",
                input_sha256=hashlib.sha256(ticket.text.encode()).hexdigest(),
                started_at=_utcnow(),
            )
            self._record(env, step, StepStatus.ok, t0)
            valid.append((event, env))
        # still on the partition the producer chose: no state until the first hop
        await self._continue(step, valid, keyed=False)

    # ---- the steps in between -----------------------------------------------------------

    async def _step_batch(self, step: Step, events: Sequence[faust.EventT]) -> None:
        await self._run_step(step, self._admit_all(step, events), keyed=True)

    async def _run_step(self, step: Step, items: list[Item], keyed: bool) -> None:
        """Run `step` on a batch, then hand the envelopes that went on to what follows.

        `keyed`: the batch came through a ticket_id-keyed topic, so the ticket's state
        lives on its partition and may be written.
        """
        t0 = time.perf_counter()
        by_version: dict[int, list[Item]] = defaultdict(list)
        for event, env in items:
            if self._past_deadline(env, step) and not self._on_deadline(event, env, step, keyed):
                continue
            by_version[env.workflow_version].append((event, env))
        going_on = []
        for its in by_version.values():
            own = self._step_of(its[0][1], step.name)
            outcomes = await self._run_handler(own, [env for _, env in its])
            for (event, env), outcome in zip(its, outcomes, strict=True):
                if self._settle(own, event, env, outcome, t0, keyed):
                    going_on.append((event, env))
        await self._continue(step, going_on, keyed)

    async def _continue(self, step: Step, items: list[Item], keyed: bool) -> None:
        """Each envelope to its next step: in this agent when fused with `step`, else
        through the next step's topic."""
        fused: dict[str, list[Item]] = defaultdict(list)
        for event, env in items:
            definition = self._definition_of(env)
            nxt = definition.next_step(step.name, env.context)
            if nxt is None:  # only a router ends a workflow; validation makes this unreachable
                raise RuntimeError(f"step {step.name} has no successor")
            env.step, env.attempt, env.not_before = nxt.name, 1, None
            if definition.fused(step.name, nxt.name):
                fused[nxt.name].append((event, env))
                continue
            if keyed:
                _as_current(event)
                self._set_state(env, "running", nxt.name)
            self._send(self.topics.step(nxt.name), env)
        for name, its in fused.items():
            nxt = self._step_of(its[0][1], name)
            if nxt.type == "router":
                await self._route_items(nxt, its)
            else:
                await self._run_step(nxt, its, keyed)

    def _on_deadline(self, event: faust.EventT, env: Envelope, step: Step, keyed: bool) -> bool:
        """Degrade (True: the step still runs) or dead-letter (False), as the version says."""
        definition = self._definition_of(env)
        reason = (
            f"{ErrorClass.WORKFLOW_DEADLINE.value}: deadline of "
            f"{definition.deadline_ms} ms passed before {step.name}"
        )
        if definition.on_deadline == "dead_letter":
            self._dead_letter(
                event,
                step.name,
                ErrorClass.WORKFLOW_DEADLINE,
                reason,
                env.attempt,
                env if keyed else None,
            )
            return False
        degrade(env, reason)
        env.context.deadline_passed = True
        return True

    def _admit_all(self, step: Step, events: Sequence[faust.EventT]) -> list[Item]:
        admitted = []
        for event in events:
            try:
                env = decode(Envelope, event.value)
            except ValidationError as exc:  # not ours: a hand-written record on our topic
                self._dead_letter(event, step.name, ErrorClass.INTERNAL, f"bad envelope: {exc}", 1)
                continue
            _as_current(event)
            if self._admit(env):
                admitted.append((event, env))
        return admitted

    def _admit(self, env: Envelope) -> bool:
        """Idempotency: a second publish of a ticket_id is recorded and dropped.

        The same arrival seen again is a redelivery after a restart: it goes on, since
        redoing a step is harmless and its earlier output may not have survived; the
        ledger keeps its result single.
        """
        tid = env.ticket.ticket_id
        state = self.state.get(tid)
        if state is None:
            self.state[tid] = new_state(
                tid, env.arrival, env.trace_id, env.workflow, env.workflow_version
            )
            return True
        if state["arrival"] == env.arrival:
            return True
        metrics.DUPLICATES.inc()
        self.state[tid] = record_duplicate(state, env.arrival)
        log.info("duplicate ticket %s (arrival %s) dropped", tid, env.arrival)
        return False

    async def _run_handler(self, step: Step, envs: list[Envelope]) -> list:
        if not envs:
            return []
        try:
            return await self.handlers[step.type].run_batch(envs, step)
        except Exception as exc:  # a bug must not crash the worker or lose the batch
            log.exception("step %s failed for a batch of %d", step.name, len(envs))
            return [exc] * len(envs)

    def _settle(
        self,
        step: Step,
        event: faust.EventT,
        env: Envelope,
        outcome: BaseException | None,
        t0: float,
        keyed: bool,
    ) -> bool:
        """Record a step's outcome; True when the ticket goes on to its next step."""
        _as_current(event)
        if outcome is None:
            degraded = env.context.degraded and step.type in DEADLINE_GUARDED
            self._record(env, step, StepStatus.degraded if degraded else StepStatus.ok, t0)
            return True
        if isinstance(outcome, RetryableError) and keyed:
            return self._retry_or_degrade(env, step, outcome, t0)
        if isinstance(outcome, BadRecord):
            error_class, reason = outcome.error_class, outcome.reason
        else:
            log.error("step %s: %r for %s", step.name, outcome, env.ticket.ticket_id)
            error_class, reason = ErrorClass.INTERNAL, repr(outcome)
        dead = env if keyed else None
        self._dead_letter(event, step.name, error_class, reason, env.attempt, dead)
        return False

    def _past_deadline(self, env: Envelope, step: Step) -> bool:
        """Past the deadline before a step that would wait on a dependency.

        Cheap local steps (rules, route) always run: they are what completes the ticket.
        """
        if env.context.degraded or step.type not in DEADLINE_GUARDED:
            return False
        return remaining_ms(env, self._deadline_ms(env)) <= 0

    def _retry_or_degrade(self, env: Envelope, step: Step, exc: RetryableError, t0: float) -> bool:
        """Send the envelope to a retry tier (False), or degrade it and go on (True)."""
        policy = step.policy_for(exc.code)
        if env.context.deadline_passed:  # no time for another attempt: degraded already
            self._record(env, step, StepStatus.degraded, t0, detail=f"{exc.code}: {exc.reason}")
            return True
        if policy is None or env.attempt >= policy.max_attempts:
            degrade(
                env,
                f"{ErrorClass.RETRIES_EXHAUSTED.value}: {exc.code} after "
                f"{env.attempt} attempt(s): {exc.reason}",
            )
            self._record(env, step, StepStatus.degraded, t0)
            return True
        self._record(env, step, StepStatus.retrying, t0, detail=f"{exc.code}: {exc.reason}")
        delay = policy.delay_ms(env.attempt + 1)
        delay *= 1 + random.uniform(-policy.jitter, policy.jitter)
        tier = min((t for t in RETRY_TIERS_MS if t >= delay), default=RETRY_TIERS_MS[-1])
        env.attempt += 1
        env.not_before = _utcnow() + timedelta(milliseconds=delay)
        metrics.RETRIES.labels(step.name).inc()
        self._set_state(env, "waiting_retry", step.name)
        self._send(self.topics.retry(tier), env)
        return False

    async def _retry_tier(self, stream: faust.StreamT) -> None:
        """Hold each envelope until it is due, then hand it back to its step.

        Every record of a tier waits the same delay, so the head of a partition is always
        the first due: sleeping on it never delays a record behind it.
        """
        async for event in stream.events():
            try:
                env = decode(Envelope, event.value)
            except ValidationError as exc:
                self._dead_letter(event, "retry", ErrorClass.INTERNAL, str(exc), 1)
            else:
                wait = (env.not_before - _utcnow()).total_seconds() if env.not_before else 0
                if wait > 0:
                    await asyncio.sleep(wait)
                self._send(self.topics.step(env.step), env)

    # ---- human review -------------------------------------------------------------------

    async def _review(self, stream: faust.StreamT) -> None:
        async for event in stream.events():
            try:
                decision = decode(ReviewDecision, event.value)
            except ValidationError as exc:
                self._dead_letter(event, "review", ErrorClass.SCHEMA_VALIDATION, str(exc), 1)
                continue
            state = self.state.get(decision.ticket_id)
            try:
                check_decidable(decision.ticket_id, state)
                result = reviewed_result(state, decision)
            except ReviewRefused as exc:
                log.warning("review decision refused: %s", exc)
                metrics.REVIEWS.labels("refused").inc()
                continue
            self.producer.produce(
                self.topics.out(REVIEWED_ROUTE),
                event.key,
                encode(result),
                [("traceparent", child_traceparent(state["trace_id"]).encode())],
            )
            new = transition(state, "completed", "review")
            new["route"] = REVIEWED_ROUTE
            new["result"] = result.model_dump(mode="json")
            self.state[decision.ticket_id] = new
            metrics.REVIEWS.labels("completed").inc()
            metrics.TICKETS.labels(REVIEWED_ROUTE).inc()

    # ---- the router: exactly one result per ticket --------------------------------------

    async def _route_batch(self, step: Step, events: Sequence[faust.EventT]) -> None:
        """Queue each new result for its partition's next transaction.

        The agent goes on taking tickets while a transaction commits, so the next one
        carries everything that arrived meanwhile: the cost of a commit is paid per batch,
        not per ticket. Faust's offset commit waits for the queue (`_drain`), so an input
        is never acknowledged before its result is committed.
        """
        await self._route_items(step, self._admit_all(step, events))

    async def _route_items(self, step: Step, items: list[Item]) -> None:
        # a fused router sees tickets from an earlier step's topic: the same key and
        # partition count, so the same partition, which Faust assigns with the route topic's
        t0 = time.perf_counter()
        for event, env in items:
            partition = event.message.partition
            await self._owned(partition)
            tid = env.ticket.ticket_id
            if self.ledger.has(partition, tid) or tid in self._queued[partition]:
                log.info("ticket %s already has its result; redelivery skipped", tid)
                continue
            self._queued[partition][tid] = (
                event,
                env,
                self._result(env, self._step_of(env, step.name), t0),
            )
            if partition not in self._committing:
                self._committing[partition] = asyncio.ensure_future(
                    self._commit_partition(step, partition)
                )

    async def _commit_partition(self, step: Step, partition: int) -> None:
        try:
            while self._queued[partition]:
                batch = self._queued.pop(partition)
                try:
                    await self._commit_results(step, partition, list(batch.values()))
                except Exception:  # never drop acknowledged inputs: keep them for a retry
                    log.exception("route partition %d: commit failed; retrying", partition)
                    self._txn.pop(partition, None)
                    self.ledger.forget(partition)
                    for tid, item in batch.items():
                        self._queued[partition].setdefault(tid, item)
                    await asyncio.sleep(1.0)
        finally:
            self._committing.pop(partition, None)

    async def _commit_results(
        self, step: Step, partition: int, items: list[tuple[faust.EventT, Envelope, TicketResult]]
    ) -> None:
        await self._owned(partition)
        items = [i for i in items if not self.ledger.has(partition, i[2].ticket_id)]
        if not items:
            return
        records = []
        for _event, env, result in items:
            tid = env.ticket.ticket_id.encode()
            records.append(
                (self.topics.out(result.route), tid, encode(result), self._trace_headers(env), None)
            )
            records.append((self.topics.completed, tid, result.route.encode(), [], partition))
        producer = await self._owned(partition)
        try:
            await producer.commit(records)
        except KafkaException as exc:
            self._txn.pop(partition, None)
            self.ledger.forget(partition)
            if not self._owns(partition):  # fenced: the new owner redoes these inputs
                log.warning("route partition %d lost (%s); its new owner redoes it", partition, exc)
                return
            # still ours (a rebalance gave it straight back): these inputs are already
            # acknowledged, so their results must not be dropped; retry on a new producer
            log.warning("route partition %d: transaction failed (%s); retrying", partition, exc)
            await asyncio.sleep(0.5)
            for item in items:
                self._queued[partition].setdefault(item[2].ticket_id, item)
            return
        for event, env, result in items:
            self.ledger.add(partition, result.ticket_id)
            _as_current(event)
            if result.route == REVIEW_ROUTE:  # a person decides next (agents/review.py)
                self._set_state(
                    env,
                    "awaiting_review",
                    step.name,
                    route=result.route,
                    result=result.model_dump(mode="json"),
                )
            else:
                status = "degraded" if result.degraded else "completed"
                self._set_state(env, status, step.name, route=result.route)
            metrics.TICKETS.labels(result.route).inc()
            metrics.WORKFLOW_DURATION.observe(result.latency_ms / 1000)
            self._audit(env, step, env.path[-1])

    async def _drain(self) -> None:
        """Until every queued result is committed (called before offsets are committed)."""
        while self._committing:
            await asyncio.gather(*list(self._committing.values()), return_exceptions=True)
        # the state these inputs wrote, before their offsets; Faust flushes here on a
        # revocation too, so the next owner of a partition restores its newest state
        self.state.flush_changelog()
        await self.producer.drain()

    async def _owned(self, partition: int) -> TransactionalProducer:
        """This worker's producer for `partition`, fencing any earlier owner, ledger loaded."""
        async with self._ledger_locks[partition]:
            producer = self._txn.get(partition)
            if producer is None:
                producer = TransactionalProducer(
                    self.settings.kafka_bootstrap,
                    f"{self.app.conf.id}-{self._router.name}-{partition}",
                )
                await producer.init()  # aborts and fences whatever the last owner left open
                self._txn[partition] = producer
                self.ledger.forget(partition)
            if not self.ledger.loaded(partition):
                await self.ledger.load(partition)
            return producer

    def _result(self, env: Envelope, step: Step, t0: float) -> TicketResult:
        rule = env.context.rule
        route = rule.route if rule and rule.route in step.routes else "manual_review"
        latency = round((time.perf_counter() - t0) * 1000, 3)
        env.path.append(
            DecisionStep(
                step=step.name,
                status=StepStatus.ok,
                attempt=env.attempt,
                latency_ms=latency,
                detail=route,
            )
        )
        metrics.STEP_DURATION.labels(step.name).observe(latency / 1000)
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
            completed_at=_utcnow(),
            trace_id=env.trace_id,
            workflow=env.workflow,
            workflow_version=env.workflow_version,
        )

    # ---- outputs ------------------------------------------------------------------------

    def _send(self, topic: str, env: Envelope) -> None:
        self.producer.produce(
            topic, env.ticket.ticket_id.encode(), encode(env), self._trace_headers(env)
        )

    def _trace_headers(self, env: Envelope) -> list[tuple[str, bytes]]:
        return [("traceparent", child_traceparent(env.trace_id).encode())]

    def _record(
        self,
        env: Envelope,
        step: Step,
        status: StepStatus,
        t0: float,
        detail: str | None = None,
    ) -> None:
        seconds = time.perf_counter() - t0
        metrics.STEP_DURATION.labels(step.name).observe(seconds)
        # built by us from validated parts: no need to validate again (model_construct)
        entry = DecisionStep.model_construct(
            step=step.name,
            status=status,
            attempt=env.attempt,
            latency_ms=round(seconds * 1000, 3),
            detail=detail,
        )
        env.path.append(entry)
        self._audit(env, step, entry)

    def _audit(self, env: Envelope, step: Step, entry: DecisionStep) -> None:
        pred = env.context.prediction
        audit = AuditRecord.model_construct(
            ticket_id=env.ticket.ticket_id,
            trace_id=env.trace_id,
            workflow=env.workflow,
            workflow_version=env.workflow_version,
            step=step.name,
            outcome=entry.status,
            attempt=entry.attempt,
            latency_ms=entry.latency_ms,
            input_sha256=env.input_sha256,
            model_version=pred.model_version if pred else None,
            detail=entry.detail,
            # explicit: model_construct would inspect the default factory's signature per call
            at=_utcnow(),
        )
        self.producer.produce(self.topics.audit, env.ticket.ticket_id.encode(), encode(audit))

    def _set_state(
        self,
        env: Envelope,
        status: str,
        step: str,
        route: str | None = None,
        result: dict | None = None,
    ) -> None:
        tid = env.ticket.ticket_id
        state = self.state.get(tid) or new_state(
            tid, env.arrival, env.trace_id, env.workflow, env.workflow_version
        )
        if state["status"] in TERMINAL and status not in TERMINAL:
            return  # a redelivery after completion must not move the ticket back
        new = transition(state, status, step, env.attempt)
        if route is not None:
            new["route"] = route
        if result is not None:
            new["result"] = result
        self.state[tid] = new

    def _dead_letter(
        self,
        event: faust.EventT,
        step: str,
        error_class: ErrorClass,
        reason: str,
        attempts: int,
        env: Envelope | None = None,
    ) -> None:
        msg = event.message
        parent = _header(event, "traceparent")
        ctx = DeadLetterContext(
            error_class=error_class.value,
            reason=reason[:500],
            step=step,
            attempts=attempts,
            origin_topic=msg.topic,
            origin_partition=msg.partition,
            origin_offset=msg.offset,
            first_failed_at=_utcnow(),
            exception=reason,
            traceparent=parent or (child_traceparent(env.trace_id) if env else new_traceparent()),
        )
        replays = int(_header(event, REPLAY_COUNT) or 0)
        # a record that failed again after its replays is parked instead of looping
        topic = self.topics.dlq_parked if replays >= self.settings.max_replays else self.topics.dlq
        self.producer.produce(topic, event.key, event.value, ctx.headers(replays))
        metrics.DLQ.labels(step, error_class.value).inc()
        log.warning(
            "dead-lettered %s[%d]@%d at %s: %s %s",
            msg.topic,
            msg.partition,
            msg.offset,
            step,
            error_class.value,
            reason[:200],
        )
        if env is not None:
            _as_current(event)
            self._set_state(env, "dead_lettered", step)
