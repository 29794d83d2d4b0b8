"""The workflow engine: wires one Faust agent per step of a definition.

Each step consumes `tickets.step.<step>` (the first consumes `tickets.in`) a batch at a
time and hands each envelope to its next step: in the same agent when the two are fused,
else through the next step's topic. The pieces, each in its own module:

- `agents.topology`: the versions, their steps, what follows what;
- `agents.runner`: runs a step and applies its closed outcome (ok, degraded, retry, dead
  letter);
- `agents.router`: the router's transactions and completion ledger (exactly one result);
- `agents.emitter`: envelopes, audit records, dead letters;
- `agents.review_agent`: reviewers' decisions;
- `agents.batches`: a failing batch is retried (infrastructure) or split to find the one
  record at fault (anything else);
- `streams.commit`: the order of a commit.

Guarantees: every step's outputs are on the broker before its input offsets are
committed (at-least-once), so a crash can repeat a step but never skip one; the router
makes results exactly once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict, deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import faust

from agents import metrics
from agents.audit import audit_digest
from agents.batches import process_isolated
from agents.decoding import read_envelope, read_ticket, retry_wait_s, trace_id, traceparent
from agents.emitter import Emitter, utcnow
from agents.errors import BadRecord
from agents.handoff import Handoff
from agents.hops import HopClock
from agents.parts import carrier, open_bundles
from agents.remote_state import RemoteStates, StateInbox
from agents.review_agent import ReviewAgent
from agents.router import Router
from agents.runner import Item, StepRunner, fresh_state
from agents.state import States, TicketStates
from agents.step_selection import StepSet, step_set
from agents.steps.handlers import (
    FeatureLookupStep,
    Handler,
    InferenceStep,
    ProcessorStep,
    RuleEngineStep,
)
from agents.steps.parallel import ParallelStep
from agents.topology import Topology
from feature_jobs.reader import OnlineFeatureReader
from inference_gateway.client import GatewayClient
from schemas.selection import WorkflowSelector
from schemas.tickets import Envelope, ErrorClass, StepStatus
from schemas.workflow import Step, WorkflowDefinition
from streams import faust_adapter
from streams.admin import RETRY_TIERS_MS
from streams.commit import CommitBarrier
from streams.headers import new_trace_id
from streams.kafka_config import confluent_config
from streams.producer import AsyncProducer
from streams.settings import Settings
from streams.tables import WriteBehindTable
from streams.take import take_ready
from streams.topics import Topics
from streams.tracing import step_spans

log = logging.getLogger(__name__)

# A step takes what its topic has, up to this many, as soon as it arrives (streams/take.py):
# one batch costs one gateway call and one await of the producer, not one per ticket.
BATCH_MAX = 256


@dataclass
class Dependencies:
    gateway: GatewayClient
    features: OnlineFeatureReader


def _raw_topic(app: faust.App, name: str) -> faust.TopicT:
    return app.topic(
        name, key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw"
    )


class WorkflowEngine:
    def __init__(
        self,
        app: faust.App,
        definition: WorkflowDefinition,
        settings: Settings,
        deps: Dependencies,
        earlier: Sequence[WorkflowDefinition] = (),
        steps: StepSet | None = None,
        selector: WorkflowSelector | None = None,
    ) -> None:
        """`definition`: the default workflow; `earlier`: every other definition in flight
        (agents.definition.Workflows.others()); `selector`: how a new ticket picks one."""
        self.app = app
        self.settings = settings
        self.topology = Topology(definition, earlier, selector)
        self.steps = steps or step_set("", self.topology)  # agents/step_selection.py
        self.topics = Topics(settings.topic_prefix)
        self.producer = AsyncProducer(confluent_config(settings))
        # the table at home; a pool keeps no state and sends its moves home as records
        self.state: WriteBehindTable | RemoteStates
        self.states: States
        if self.steps.home:
            self.state = self._table()
            # a table write goes to the partition of the event that carried the ticket
            self.states = TicketStates(
                self.state, lambda item: faust_adapter.set_current_event(carrier(item))
            )
        else:
            self.state = self.states = RemoteStates(self.producer, self.topics)
        self.handoff = Handoff()
        self.emitter = Emitter(
            self.producer,
            self.topics,
            settings.max_replays,
            lambda topic: faust_adapter.topic_partitions(app, topic),
            self.handoff,
        )
        # keyed: a reader of tickets.audit cannot confirm a guess of a ticket's text
        self.audit_digest = audit_digest(settings)
        self.hops = HopClock(
            {self.topics.step(s.name): s.name for s in self.topology.later_steps()}
        )
        inference = InferenceStep(deps.gateway, self.topology.deadline_ms)
        self.breaker = inference.breaker
        handlers: dict[str, Handler] = {
            "processor": ProcessorStep(),
            "feature_lookup": FeatureLookupStep(deps.features),
            "inference_call": inference,
            "rule_engine": RuleEngineStep(),
        }
        handlers["parallel"] = ParallelStep(dict(handlers), self.emitter.record)
        self.runner = StepRunner(self.topology, handlers, self.emitter, self.states, self.topics)
        self.router = Router(
            confluent_config(settings),
            f"{app.conf.id}-{self.topology.router.name}",
            self.topics,
            self.topology,
            self.states,
            self.emitter,
            self._owns,
        )
        self.barrier = CommitBarrier(self.router, self.producer, self.state, self._broken)

    @property
    def table(self) -> WriteBehindTable:
        """The state table, which only a home worker keeps (a pool's state is RemoteStates)."""
        assert isinstance(self.state, WriteBehindTable), "only a home worker keeps the state table"
        return self.state

    @property
    def definition(self) -> WorkflowDefinition:
        return self.topology.definition

    def later_steps(self) -> list[Step]:
        return self.topology.later_steps()

    def _table(self) -> WriteBehindTable:
        table = faust_adapter.add_table(
            self.app,
            WriteBehindTable,
            name="ticket_state",
            default=None,
            partitions=self.settings.partitions,
        )
        table.write_through(self.producer)
        return table

    # ---- wiring -------------------------------------------------------------------------

    def build(self) -> None:
        faust_adapter.check_version()
        first = self.topology.first
        if self.steps.runs(first.name):
            self._agent(self.topics.tickets_in, first, self._validate_batch, bundled=False)
        for step in self.topology.later_steps():
            if self.steps.runs(step.name):
                self._agent(self.topics.step(step.name), step, self._step_batch, bundled=True)
        if self.steps.home:
            self._build_home()
        # mode types a handler as (sender, *args, signal=...); Faust sends (app, partitions)
        self.app.on_partitions_revoked.connect(
            self._on_revoked  # type: ignore[arg-type]  # mode's stub demands *args
        )
        self.app.on_partitions_assigned.connect(
            self._on_assigned  # type: ignore[arg-type]  # mode's stub demands *args
        )
        faust_adapter.install_commit(self.app, self.barrier.commit)
        faust_adapter.observe_fetches(self.app, self.hops.fetched)

    def _build_home(self) -> None:
        """What only the table's owner runs: retry tiers, decisions, the pools' moves."""
        assert isinstance(self.states, TicketStates)
        for delay in RETRY_TIERS_MS:
            self._each(self.topics.retry(delay), f"retry-{delay}", self._retry_tier(delay))
        review = ReviewAgent(self.states, self.emitter, self.topics)
        self._each(self.topics.review_decisions, "review", review.handle)
        inbox = StateInbox(self.states, self.topology, self.emitter)
        self._each(self.topics.state, "state", inbox.handle)

    def _agent(self, topic: str, step: Step, handle: Any, bundled: bool) -> None:
        """`bundled`: the topic is a step's, where a record may be a bundle of envelopes
        (streams/bundles.py); its parts are handled, and isolated, one by one."""
        what = f"step {step.name}"

        async def batch(events: Sequence[Any]) -> None:
            await handle(step, events)

        def poisoned(event: Any, exc: BaseException) -> None:
            self.emitter.dead_letter(event, step.name, ErrorClass.INTERNAL, _why(exc), 1)

        async def run(stream: faust.StreamT) -> None:
            async for events in take_ready(stream, BATCH_MAX):
                step_spans.refresh()
                items = open_bundles(events) if bundled else events
                await process_isolated(what, batch, items, poisoned)

        agent = self.app.agent(
            _raw_topic(self.app, topic), name=f"step-{step.name}", concurrency=step.concurrency
        )
        agent(run)

    def _each(self, topic: str, name: str, handle: Any) -> None:
        """An agent that handles one record at a time, isolated as the steps' batches are."""

        async def one(events: Sequence[Any]) -> None:
            for event in events:
                result = handle(event)
                if asyncio.iscoroutine(result):
                    await result

        def poisoned(event: Any, exc: BaseException) -> None:
            self.emitter.dead_letter(event, name, ErrorClass.INTERNAL, _why(exc), 1)

        async def run(stream: faust.StreamT) -> None:
            async for event in stream.events():
                step_spans.refresh()
                await process_isolated(name, one, [event], poisoned)

        self.app.agent(_raw_topic(self.app, topic), name=name)(run)

    def close(self) -> None:
        self.state.flush_changelog()
        self.producer.close()
        self.router.close()

    def _owns(self, partition: int) -> bool:
        return any(
            tp.topic == self.router.topic and tp.partition == partition
            for tp in faust_adapter.assignment(self.app)
        )

    async def _on_assigned(self, app: faust.App, assigned: set, **_: Any) -> None:
        self.handoff.reading((tp.topic, tp.partition) for tp in faust_adapter.assignment(app))
        self.router.on_assigned({tp.partition for tp in assigned if tp.topic == self.router.topic})

    async def _on_revoked(self, app: faust.App, revoked: set, **_: Any) -> None:
        self.handoff.reading(())
        await self.router.on_revoked(
            {tp.partition for tp in revoked if tp.topic == self.router.topic}
        )
        # best effort: the next owner of a partition restores its newest state
        self.state.flush_changelog()

    async def _broken(self, exc: BaseException) -> None:
        log.critical("the worker stops: outputs lost by the producer must be redone (%r)", exc)
        metrics.COMMITS_HELD.inc()
        await self.app.crash(exc)

    # ---- the validator step -------------------------------------------------------------

    async def _validate_batch(self, step: Step, events: Sequence[Any]) -> None:
        valid = []
        for event in events:
            t0 = time.perf_counter()
            msg = event.message
            try:
                ticket = read_ticket(
                    msg.value, msg.key, msg.headers, self.settings.max_record_bytes
                )
            except BadRecord as exc:
                self.emitter.dead_letter(event, step.name, exc.error_class, exc.reason, 1)
                continue
            # the ticket's workflow, for good: its envelope names it at every later step
            choice = self.topology.choose(ticket)
            definition = choice.definition
            env = Envelope(
                ticket=ticket,
                workflow=definition.name,
                workflow_version=definition.version,
                step=step.name,
                attempt=1,
                trace_id=trace_id(msg.headers) or new_trace_id(),
                arrival=f"{msg.partition}:{msg.offset}",
                input_sha256=self.audit_digest(ticket.text),
                started_at=utcnow(),
            )
            if step_spans.on:
                step_spans.adopt(env, traceparent(msg.headers))
            self.emitter.record(env, step, StepStatus.ok, t0, detail=choice.reason)
            valid.append((event, env))
        # still on the partition the producer chose: no state until the first hop
        await self._run_from(step, valid, keyed=False, done=True)

    # ---- the steps after it ---------------------------------------------------------------

    async def _step_batch(self, step: Step, events: Sequence[Any]) -> None:
        self.hops.delivered(step.name, events)
        admitted = []
        taken = self.handoff.taken
        for event in events:
            env = self._read(event, step)
            if env is not None and self._admit(event, env):
                if step_spans.on:
                    step_spans.adopt(env, traceparent(event.message.headers))
                admitted.append((event, env))
        if self.handoff.taken > taken:
            metrics.HANDED.inc(self.handoff.taken - taken)
        await self._run_from(step, admitted, keyed=True)

    def _read(self, event: Any, step: Step) -> Envelope | None:
        msg = event.message
        try:
            env = read_envelope(
                msg.value,
                self.topology.later_names,
                self.topology.version_numbers,
                key=msg.key,
                step=step.name,
                written=self.handoff.take(msg.value),
            )
        except BadRecord as exc:  # not ours: a hand-written record on our topic
            self.emitter.dead_letter(event, step.name, exc.error_class, exc.reason, 1)
            return None
        if not self.topology.knows_workflow(env):  # its definition was removed too soon
            reason = (
                f"envelope of workflow {env.workflow[:64]!r} v{env.workflow_version}, "
                "which this worker does not load"
            )
            self.emitter.dead_letter(event, step.name, ErrorClass.INTERNAL, reason, 1)
            return None
        return env

    def _admit(self, event: Any, env: Envelope) -> bool:
        """A second publish of a ticket_id is recorded and dropped."""
        tid = env.ticket.ticket_id
        if self.states.admit(
            event, tid, env.arrival, env.trace_id, env.workflow, env.workflow_version
        ):
            return True
        metrics.DUPLICATES.inc()
        log.info("duplicate ticket %s (arrival %s) dropped", tid, env.arrival)
        return False

    async def _run_from(
        self, step: Step, items: list[Item], keyed: bool, done: bool = False
    ) -> None:
        """Run `step` (unless `done`), then every fused step after it, as a loop; hand what
        leaves the fused group to the next step's topic. The router ends a workflow."""
        work: deque[tuple[Step, list[Item], bool]] = deque([(step, items, done)])
        while work:
            current, its, ran = work.popleft()
            if current.type == "router":
                await self.router.route(current, its)
                continue
            going_on = its if ran else await self.runner.run(current, its, keyed)
            fused: dict[str, list[Item]] = defaultdict(list)
            outgoing: list[tuple[str, Envelope]] = []
            for event, env in going_on:
                hop = self.topology.hop(env, current.name)
                env.step, env.attempt, env.not_before = hop.step.name, 1, None
                if hop.fused:
                    fused[hop.step.name].append((event, env))
                    continue
                if keyed:
                    self.states.move(event, fresh_state(env), "running", hop.step.name)
                outgoing.append((self.topics.step(hop.step.name), env))
            self.emitter.send_to_steps(outgoing)  # one record per partition and next step
            for name, group in fused.items():
                work.append((self.topology.step_of(group[0][1], name), group, False))

    # ---- retry tiers ----------------------------------------------------------------------

    def _retry_tier(self, delay_ms: int) -> Any:
        """Hold each envelope until it is due, then hand it back to its step.

        Every record of a tier waits the same delay, so the head of a partition is always
        the first due: sleeping on it never delays a record behind it.
        """

        async def forward(event: Any) -> None:
            msg = event.message
            try:
                env = read_envelope(
                    msg.value,
                    self.topology.later_names,
                    self.topology.version_numbers,
                    key=msg.key,
                )
            except BadRecord as exc:
                self.emitter.dead_letter(event, "retry", exc.error_class, exc.reason, 1)
                return
            wait = retry_wait_s(env, delay_ms, utcnow())
            if wait > 0:
                await asyncio.sleep(wait)
            if step_spans.on:
                step_spans.adopt(env, traceparent(msg.headers))
            self.emitter.send(self.topics.step(env.step), env)

        return forward


def _why(exc: BaseException) -> str:
    # the type only: an exception's message may quote the record
    return f"{type(exc).__name__} while processing the record"
