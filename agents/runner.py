"""Runs one step on a batch of envelopes and applies each outcome, in one place.

A handler returns, per envelope, None or the exception it failed with; `outcome_of`
turns that into the closed `StepOutcome`, and `apply` does what the outcome says: the
ticket goes on, is retried through a delay tier, is degraded, or is dead-lettered.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import defaultdict
from datetime import timedelta
from typing import Any

from agents import metrics
from agents.decoding import traceparent
from agents.emitter import Emitter, utcnow
from agents.outcome import DEGRADABLE, DeadLetter, Degraded, Ok, Retry, StepOutcome, outcome_of
from agents.state import States, new_state
from agents.steps.cascade import cascade_detail
from agents.steps.handlers import Handler, degrade, remaining_ms
from agents.steps.rules import audit_detail
from agents.topology import Topology
from inference_gateway.tracing import caller_spans
from schemas.tickets import Envelope, ErrorClass, StepStatus
from schemas.workflow import Step
from streams.admin import RETRY_TIERS_MS
from streams.topics import Topics
from streams.tracing import step_spans

log = logging.getLogger(__name__)
Item = tuple[Any, Envelope]  # an envelope and the event that carried it


def fresh_state(env: Envelope) -> dict:
    """The state `env` implies; its `progress` orders its moves (agents.state.allowed)."""
    state = new_state(
        env.ticket.ticket_id, env.arrival, env.trace_id, env.workflow, env.workflow_version
    )
    state["progress"] = len(env.path)
    return state


def _detail(step: Step, env: Envelope) -> str | None:
    """What a step that went well says in its decision-path entry and the audit."""
    if step.type == "rule_engine":  # the decision and its reason (the intent head's score)
        return audit_detail(env.context.rule)
    if step.cascade is not None:
        return cascade_detail(env, step.cascade)
    return None


def _carried(event: Any) -> str | None:
    """The `traceparent` of the record that carried an envelope here: its sender's span."""
    return traceparent(getattr(getattr(event, "message", None), "headers", None))


class StepRunner:
    def __init__(
        self,
        topology: Topology,
        handlers: dict[str, Handler],
        emitter: Emitter,
        states: States,  # the table at home, records sent home in a pool
        topics: Topics,
    ) -> None:
        self.topology = topology
        self.handlers = handlers
        self.emitter = emitter
        self.states = states
        self.topics = topics

    async def run(self, step: Step, items: list[Item], keyed: bool) -> list[Item]:
        """Run `step` on a batch; the items that go on to their next step.

        `keyed`: the batch came through a ticket_id-keyed topic, so the ticket's state lives
        on its partition and may be written.
        """
        t0 = time.perf_counter()
        # tickets of several workflows and versions may meet on one topic: each group shares
        # one configuration of the step (Topology.variant), so one handler call serves it
        groups: dict[int, list[Item]] = defaultdict(list)
        for event, env in items:
            if self._past_deadline(env, step) and not self._on_deadline(event, env, step, keyed):
                continue
            groups[self.topology.variant(env, step.name)].append((event, env))
        done = await asyncio.gather(*(self._run_group(step, g, t0, keyed) for g in groups.values()))
        return [item for group in done for item in group]

    async def _run_group(self, step: Step, its: list[Item], t0: float, keyed: bool) -> list[Item]:
        own = self.topology.step_of(its[0][1], step.name)
        envs = [env for _, env in its]
        step_spans.start(own.name, ((env, _carried(event)) for event, env in its))
        # the gateway call of the infer step joins the traces of the tickets it carries
        with caller_spans(step_spans.contexts(envs)):
            results = await self._handle(own, envs)
        going_on = []
        for (event, env), result in zip(its, results, strict=True):
            outcome = outcome_of(result, env, own.type)
            if isinstance(result, BaseException) and not isinstance(outcome, Retry):
                log.info(
                    "step %s: %s for %s", own.name, type(result).__name__, env.ticket.ticket_id
                )
            if self.apply(own, event, env, outcome, t0, keyed):
                going_on.append((event, env))
        return going_on

    async def _handle(self, step: Step, envs: list[Envelope]) -> list[BaseException | None]:
        try:
            return await self.handlers[step.type].run_batch(envs, step)
        except Exception as exc:  # a handler bug: each envelope fails alone, none is lost
            log.exception("step %s failed for a batch of %d", step.name, len(envs))
            return [exc] * len(envs)

    def apply(
        self, step: Step, event: Any, env: Envelope, outcome: StepOutcome, t0: float, keyed: bool
    ) -> bool:
        """Act on one outcome; True when the ticket goes on to its next step."""
        self.states.at(event)
        match outcome:
            case Ok():
                self.emitter.record(env, step, StepStatus.ok, t0, detail=_detail(step, env))
                return True
            case Degraded():
                self.emitter.record(env, step, StepStatus.degraded, t0)
                return True
            case Retry(error) if keyed:
                return self._retry_or_degrade(event, env, step, error, t0)
            case Retry(error):  # before the first hop: no state to wait in
                self.dead_letter(event, env, step.name, ErrorClass.INTERNAL, error.reason, keyed)
                return False
            case DeadLetter(error_class, reason):
                self.dead_letter(event, env, step.name, error_class, reason, keyed)
                return False

    def dead_letter(
        self,
        event: Any,
        env: Envelope,
        step: str,
        error_class: ErrorClass,
        reason: str,
        keyed: bool,
    ) -> None:
        self.emitter.dead_letter(event, step, error_class, reason, env.attempt, env.trace_id)
        self.emitter.audit_dead_letter(env)
        step_spans.fail(env, error_class.value)
        if keyed:
            self.states.move(event, fresh_state(env), "dead_lettered", step, env.attempt)

    def _past_deadline(self, env: Envelope, step: Step) -> bool:
        """Past the deadline before a step that would wait on a dependency.

        Cheap local steps (rules, route) always run: they are what completes the ticket.
        """
        if env.context.degraded or step.type not in DEGRADABLE:
            return False
        return remaining_ms(env, self.topology.deadline_ms(env)) <= 0

    def _on_deadline(self, event: Any, env: Envelope, step: Step, keyed: bool) -> bool:
        """Degrade (True: the step still runs) or dead-letter (False), as the version says."""
        definition = self.topology.definition_of(env)
        reason = (
            f"{ErrorClass.WORKFLOW_DEADLINE.value}: deadline of "
            f"{definition.deadline_ms} ms passed before {step.name}"
        )
        if definition.on_deadline == "dead_letter":
            self.dead_letter(event, env, step.name, ErrorClass.WORKFLOW_DEADLINE, reason, keyed)
            return False
        degrade(env, reason)
        env.context.deadline_passed = True
        return True

    def _retry_or_degrade(self, event: Any, env: Envelope, step: Step, exc: Any, t0: float) -> bool:
        """Send the envelope to a retry tier (False), or degrade it and go on (True)."""
        policy = step.policy_for(exc.code)
        if env.context.deadline_passed:  # no time for another attempt: degraded already
            self.emitter.record(
                env, step, StepStatus.degraded, t0, detail=f"{exc.code}: {exc.reason}"
            )
            return True
        if policy is None or env.attempt >= policy.max_attempts:
            degrade(
                env,
                f"{ErrorClass.RETRIES_EXHAUSTED.value}: {exc.code} after "
                f"{env.attempt} attempt(s): {exc.reason}",
            )
            self.emitter.record(env, step, StepStatus.degraded, t0)
            return True
        self.emitter.record(env, step, StepStatus.retrying, t0, detail=f"{exc.code}: {exc.reason}")
        delay: float = policy.delay_ms(env.attempt + 1)
        delay *= 1 + random.uniform(-policy.jitter, policy.jitter)
        tier = min((t for t in RETRY_TIERS_MS if t >= delay), default=RETRY_TIERS_MS[-1])
        env.attempt += 1
        env.not_before = utcnow() + timedelta(milliseconds=delay)
        metrics.RETRIES.labels(step.name).inc()
        self.states.move(event, fresh_state(env), "waiting_retry", step.name, env.attempt)
        self.emitter.send(self.topics.retry(tier), env)
        return False
