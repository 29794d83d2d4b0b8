"""The workflow engine: one Faust agent per step of a definition, state in a changelog table.

Each step consumes `tickets.step.<step>` (the first consumes `tickets.in`), runs its handler
and forwards the envelope to the next step's topic. Failures become retries through the
delay tiers, degradation to `manual_review`, or dead letters, never a crashed worker.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import random
import time
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

import faust
from pydantic import ValidationError

from agents import metrics
from agents.errors import BadRecord, RetryableError
from agents.state import TERMINAL, new_state, record_duplicate, transition
from agents.steps.handlers import (
    FeatureLookupStep,
    Handler,
    InferenceStep,
    ProcessorStep,
    RuleEngineStep,
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
    StepStatus,
    TicketResult,
)
from schemas.workflow import Step, WorkflowDefinition
from streams.admin import RETRY_TIERS_MS
from streams.codecs import decode, encode
from streams.headers import DeadLetterContext, child_traceparent, new_traceparent, trace_id_of
from streams.settings import Settings
from streams.topics import Topics

log = logging.getLogger(__name__)

# How many envelopes a step works on at once. Order within a partition is not needed
# between tickets (each ticket is in one place at a time), and I/O-bound steps need
# many calls in flight for the gateway to form batches.
CONCURRENCY = {"inference_call": 64, "feature_lookup": 16}
# steps skipped (degrading the ticket) once the workflow deadline has passed
DEADLINE_GUARDED = frozenset({"inference_call"})


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


class WorkflowEngine:
    def __init__(
        self, app: faust.App, definition: WorkflowDefinition, settings: Settings, deps: Dependencies
    ) -> None:
        self.app = app
        self.definition = definition
        self.settings = settings
        self.topics = Topics(settings.topic_prefix)
        self.deps = deps
        self.state = app.Table(
            "ticket_state", default=None, partitions=settings.partitions
        )
        self.handlers: dict[str, Handler] = {
            "processor": ProcessorStep(),
            "feature_lookup": FeatureLookupStep(deps.features),
            "inference_call": InferenceStep(deps.gateway, definition.deadline_ms),
            "rule_engine": RuleEngineStep(),
        }
        self._step_topics = {
            s.name: _raw_topic(app, self.topics.step(s.name)) for s in definition.steps[1:]
        }
        self._index = {s.name: i for i, s in enumerate(definition.steps)}
        self._dlq = _raw_topic(app, self.topics.dlq)
        self._audit = _raw_topic(app, self.topics.audit)
        self._out = {r: _raw_topic(app, self.topics.out(r)) for r in definition.routes}

    # ---- wiring -------------------------------------------------------------------------

    def build(self) -> None:
        first = self.definition.steps[0]
        self._agent(_raw_topic(self.app, self.topics.tickets_in), first, self._on_raw, 1)
        for step in self.definition.steps[1:]:
            concurrency = CONCURRENCY.get(step.type, 1)
            self._agent(self._step_topics[step.name], step, self._on_envelope, concurrency)
        for delay in RETRY_TIERS_MS:
            topic = _raw_topic(self.app, self.topics.retry(delay))
            self.app.agent(topic, name=f"retry-{delay}")(self._retry_tier)

    def _agent(self, topic: faust.TopicT, step: Step, fn: Any, concurrency: int) -> None:
        async def run(stream: faust.StreamT) -> None:
            async for event in stream.events():
                await fn(step, event)

        self.app.agent(topic, name=f"step-{step.name}", concurrency=concurrency)(run)

    # ---- the validator step -------------------------------------------------------------

    async def _on_raw(self, step: Step, event: faust.EventT) -> None:
        t0 = time.perf_counter()
        msg = event.message
        try:
            ticket = parse_ticket(event.value, self.settings.max_record_bytes)
        except BadRecord as exc:
            await self._dead_letter(event, step.name, exc.error_class, exc.reason, attempts=1)
            return
        headers = dict(event.headers or {})
        parent = headers.get("traceparent")
        trace_id = trace_id_of(parent.decode() if isinstance(parent, bytes) else parent)
        env = Envelope(
            ticket=ticket,
            workflow=self.definition.name,
            workflow_version=self.definition.version,
            step=step.name,
            attempt=1,
            trace_id=trace_id or trace_id_of(new_traceparent()) or "",
            arrival=f"{msg.partition}:{msg.offset}",
            started_at=_utcnow(),
        )
        latency = self._observe(step.name, t0)
        env.path.append(DecisionStep(step=step.name, status=StepStatus.ok, latency_ms=latency))
        await self._forward(env, step)

    # ---- every later step ---------------------------------------------------------------

    async def _on_envelope(self, step: Step, event: faust.EventT) -> None:
        try:
            env = decode(Envelope, event.value)
        except ValidationError as exc:  # not ours: a hand-written record on an internal topic
            await self._dead_letter(
                event, step.name, ErrorClass.INTERNAL, f"bad envelope: {exc}", 1
            )
            return
        if not self._admit(env, step):
            return
        t0 = time.perf_counter()
        self._set_state(env, "running", step.name)
        if self._past_deadline(env, step) and not await self._on_deadline(env, step, event):
            return
        try:
            if step.type == "router":
                await self._complete(env, step, t0)
                return
            await self.handlers[step.type](env, step)
        except BadRecord as exc:
            await self._dead_letter(event, step.name, exc.error_class, exc.reason, env.attempt, env)
            return
        except RetryableError as exc:
            await self._retry_or_degrade(env, step, exc, t0)
            return
        except Exception as exc:  # a bug must not crash the worker or lose the ticket
            log.exception("step %s failed for %s", step.name, env.ticket.ticket_id)
            await self._dead_letter(
                event, step.name, ErrorClass.INTERNAL, repr(exc), env.attempt, env
            )
            return
        status = (
            StepStatus.degraded
            if env.context.degraded and step.type == "inference_call"
            else StepStatus.ok
        )
        self._record(env, step, status, t0)
        await self._forward(env, step)

    def _admit(self, env: Envelope, step: Step) -> bool:
        """Idempotency: drop a second publish of a ticket_id and anything after completion."""
        tid = env.ticket.ticket_id
        state = self.state.get(tid)
        if state is None:
            self.state[tid] = new_state(
                tid, env.arrival, env.trace_id, env.workflow, env.workflow_version
            )
            return True
        if state["arrival"] != env.arrival:
            metrics.DUPLICATES.inc()
            self.state[tid] = record_duplicate(state, env.arrival)
            log.info("duplicate ticket %s (arrival %s) dropped", tid, env.arrival)
            return False
        # the same arrival again: a redelivery after a restart; only the end is guarded,
        # since redoing an earlier step is harmless and its output may not have survived
        return not (state["status"] in TERMINAL and step.type == "router")

    def _past_deadline(self, env: Envelope, step: Step) -> bool:
        """Past the deadline before a step that would wait on a dependency.

        Cheap local steps (rules, route) always run: they are what completes the ticket.
        """
        if env.context.degraded or step.type not in DEADLINE_GUARDED:
            return False
        return remaining_ms(env, self.definition.deadline_ms) <= 0

    async def _on_deadline(self, env: Envelope, step: Step, event: faust.EventT) -> bool:
        if self.definition.on_deadline == "dead_letter":
            await self._dead_letter(
                event,
                step.name,
                ErrorClass.WORKFLOW_DEADLINE,
                "workflow deadline passed",
                env.attempt,
                env,
            )
            return False
        env.context.degraded = True
        env.context.degraded_reason = (
            f"{ErrorClass.WORKFLOW_DEADLINE.value}: deadline of "
            f"{self.definition.deadline_ms} ms passed before {step.name}"
        )
        return True

    async def _retry_or_degrade(
        self, env: Envelope, step: Step, exc: RetryableError, t0: float
    ) -> None:
        policy = step.retry
        if policy is None or env.attempt >= policy.max_attempts:
            env.context.degraded = True
            env.context.degraded_reason = (
                f"{ErrorClass.RETRIES_EXHAUSTED.value}: {exc.code} after {env.attempt} "
                f"attempt(s): {exc.reason}"
            )
            self._record(env, step, StepStatus.degraded, t0)
            await self._forward(env, step)
            return
        self._record(env, step, StepStatus.retrying, t0, detail=f"{exc.code}: {exc.reason}")
        delay = policy.delay_ms(env.attempt + 1)
        delay = delay * (1 + random.uniform(-policy.jitter, policy.jitter))
        tier = min((t for t in RETRY_TIERS_MS if t >= delay), default=RETRY_TIERS_MS[-1])
        env.attempt += 1
        env.not_before = _utcnow() + timedelta(milliseconds=delay)
        metrics.RETRIES.labels(step.name).inc()
        self._set_state(env, "waiting_retry", step.name)
        await self._send(_raw_topic(self.app, self.topics.retry(tier)), env)

    async def _retry_tier(self, stream: faust.StreamT) -> None:
        """Hold each envelope until it is due, then hand it back to its step.

        Every record of a tier waits the same delay, so the head of a partition is always
        the first due: sleeping on it never delays a record behind it.
        """
        async for event in stream.events():
            try:
                env = decode(Envelope, event.value)
            except ValidationError as exc:
                await self._dead_letter(event, "retry", ErrorClass.INTERNAL, str(exc), 1)
                continue
            if env.not_before is not None:
                wait = (env.not_before - _utcnow()).total_seconds()
                if wait > 0:
                    await asyncio.sleep(wait)
            await self._send(self._step_topics[env.step], env)

    async def _complete(self, env: Envelope, step: Step, t0: float) -> None:
        rule = env.context.rule
        route = rule.route if rule and rule.route in step.routes else "manual_review"
        self._record(env, step, StepStatus.ok, t0)
        pred = env.context.prediction
        result = TicketResult(
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
        await self._out[route].send(
            key=env.ticket.ticket_id.encode(),
            value=encode(result),
            headers=self._trace_headers(env),
        )
        status = "degraded" if env.context.degraded else "completed"
        self._set_state(env, status, step.name, route=route)
        metrics.TICKETS.labels(route).inc()
        metrics.WORKFLOW_DURATION.observe(result.latency_ms / 1000)

    # ---- helpers ------------------------------------------------------------------------

    async def _forward(self, env: Envelope, step: Step) -> None:
        nxt = self.definition.next_step(step.name)
        if nxt is None:  # only a router ends a workflow; validation makes this unreachable
            raise RuntimeError(f"step {step.name} has no successor")
        env.step, env.attempt, env.not_before = nxt.name, 1, None
        await self._send(self._step_topics[nxt.name], env)

    async def _send(self, topic: faust.TopicT, env: Envelope) -> None:
        await topic.send(
            key=env.ticket.ticket_id.encode(), value=encode(env), headers=self._trace_headers(env)
        )

    def _trace_headers(self, env: Envelope) -> list[tuple[str, bytes]]:
        return [("traceparent", child_traceparent(env.trace_id).encode())]

    def _observe(self, step: str, t0: float) -> float:
        seconds = time.perf_counter() - t0
        metrics.STEP_DURATION.labels(step).observe(seconds)
        return round(seconds * 1000, 3)

    def _record(
        self, env: Envelope, step: Step, status: StepStatus, t0: float, detail: str | None = None
    ) -> None:
        latency = self._observe(step.name, t0)
        env.path.append(
            DecisionStep(
                step=step.name,
                status=status,
                attempt=env.attempt,
                latency_ms=latency,
                detail=detail,
            )
        )
        pred = env.context.prediction
        audit = AuditRecord(
            ticket_id=env.ticket.ticket_id,
            trace_id=env.trace_id,
            workflow=env.workflow,
            workflow_version=env.workflow_version,
            step=step.name,
            outcome=status,
            attempt=env.attempt,
            latency_ms=latency,
            input_sha256=hashlib.sha256(env.ticket.text.encode()).hexdigest(),
            model_version=pred.model_version if pred else None,
            detail=detail,
        )
        self._audit.send_soon(key=env.ticket.ticket_id.encode(), value=encode(audit))

    def _set_state(self, env: Envelope, status: str, step: str, route: str | None = None) -> None:
        tid = env.ticket.ticket_id
        state = self.state.get(tid) or new_state(
            tid, env.arrival, env.trace_id, env.workflow, env.workflow_version
        )
        new = transition(state, status, step, env.attempt)
        if route is not None:
            new["route"] = route
        self.state[tid] = new

    async def _dead_letter(
        self,
        event: faust.EventT,
        step: str,
        error_class: ErrorClass,
        reason: str,
        attempts: int,
        env: Envelope | None = None,
    ) -> None:
        msg = event.message
        headers = dict(event.headers or {})
        parent = headers.get("traceparent")
        parent = parent.decode() if isinstance(parent, bytes) else parent
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
        await self._dlq.send(key=event.key, value=event.value, headers=ctx.headers())
        metrics.DLQ.labels(step, error_class.value).inc()
        log.warning(
            "dead-lettered %s/%s@%s at %s: %s %s",
            msg.topic,
            msg.partition,
            msg.offset,
            step,
            error_class.value,
            reason[:200],
        )
        if env is not None:
            self._set_state(env, "dead_lettered", step)
