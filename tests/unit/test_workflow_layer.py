"""The workflow layer's pieces with fakes: topology, outcomes and the one place that
applies them."""

import asyncio
import itertools
import time
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

from agents.definition import load_definition
from agents.errors import BadRecord, RetryableError
from agents.outcome import DeadLetter, Degraded, Ok, Retry, outcome_of
from agents.runner import StepRunner
from agents.topology import Topology
from schemas.tickets import Envelope, ErrorClass, StepStatus, Ticket
from streams.settings import Settings
from streams.topics import Topics

DEFINITION = load_definition(Settings().workflow_file)


def envelope(step: str = "infer", attempt: int = 1) -> Envelope:
    now = datetime.now(timezone.utc)
    return Envelope(
        ticket=Ticket(ticket_id="t-1", text="invoice wrong", created_at=now),
        workflow=DEFINITION.name,
        workflow_version=DEFINITION.version,
        step=step,
        attempt=attempt,
        trace_id="a" * 32,
        arrival="0:1",
        started_at=now - timedelta(milliseconds=5),
    )


class FakeEmitter:
    def __init__(self) -> None:
        self.recorded: list[tuple] = []
        self.sent: list[tuple] = []
        self.dead: list[tuple] = []
        self.trails: list[str] = []

    def audit_dead_letter(self, env):
        self.trails.append(env.ticket.ticket_id)

    def record(self, env, step, status, t0, detail=None):
        self.recorded.append((step.name, status))

    def send(self, topic, env):
        self.sent.append((topic, env.attempt))

    def dead_letter(self, event, step, error_class, reason, attempts, trace_id=None):
        self.dead.append((step, error_class))


class FakeStates:
    def __init__(self) -> None:
        self.moves: list[tuple] = []

    def at(self, event):
        pass

    def move(self, event, fresh, status, step, attempt=1, **fields):
        self.moves.append((status, step))


def runner() -> tuple[StepRunner, FakeEmitter, FakeStates]:
    emitter, states = FakeEmitter(), FakeStates()
    topology = Topology(DEFINITION)
    return StepRunner(topology, {}, emitter, states, Topics("p.")), emitter, states


def test_topology_hops_follow_the_definition():
    topology = Topology(DEFINITION)
    names = [s.name for s in DEFINITION.steps]
    env = envelope()
    for here, there in itertools.pairwise(names):
        hop = topology.hop(env, here)
        assert hop.step.name == there and not hop.fused
    assert topology.router.type == "router"
    assert topology.first.name == names[0]
    assert topology.knows(envelope("infer")) and not topology.knows(envelope(names[0]))


def test_a_handler_result_maps_onto_one_closed_outcome():
    env = envelope()
    assert outcome_of(None, env, "inference_call") == Ok()
    env.context.degraded = True
    assert outcome_of(None, env, "inference_call") == Degraded()
    assert outcome_of(None, env, "rule_engine") == Ok()
    err = RetryableError("busy", "OVERLOADED")
    assert outcome_of(err, env, "inference_call") == Retry(err)
    bad = BadRecord(ErrorClass.INFERENCE_INVALID_INPUT, "too long")
    assert outcome_of(bad, env, "inference_call") == DeadLetter(
        ErrorClass.INFERENCE_INVALID_INPUT, "too long"
    )
    # an unexpected exception: INTERNAL, and its message (which may quote input) is not kept
    out = outcome_of(ValueError("secret text"), env, "inference_call")
    assert isinstance(out, DeadLetter) and out.error_class is ErrorClass.INTERNAL
    assert "secret" not in out.reason


def test_a_retry_goes_to_a_tier_until_attempts_run_out_then_degrades():
    r, emitter, states = runner()
    step = DEFINITION.step("infer")
    env = envelope()
    goes_on = r.apply(
        step,
        None,
        env,
        Retry(RetryableError("busy", "OVERLOADED")),
        time.perf_counter(),
        keyed=True,
    )
    assert not goes_on and emitter.sent[0][0].startswith("p.tickets.retry.")
    assert env.attempt == 2 and states.moves == [("waiting_retry", "infer")]
    last = envelope(attempt=step.retry.max_attempts)
    goes_on = r.apply(
        step,
        None,
        last,
        Retry(RetryableError("busy", "OVERLOADED")),
        time.perf_counter(),
        keyed=True,
    )
    assert goes_on and last.context.degraded
    assert last.context.degraded_reason.startswith("RETRIES_EXHAUSTED")
    assert emitter.recorded[-1] == ("infer", StepStatus.degraded)


def test_a_dead_letter_writes_the_state_only_on_a_keyed_topic():
    r, emitter, states = runner()
    step = DEFINITION.step("clean")
    outcome = DeadLetter(ErrorClass.INTERNAL, "x")
    assert not r.apply(step, None, envelope("clean"), outcome, 0.0, keyed=False)
    assert states.moves == [] and emitter.dead == [("clean", ErrorClass.INTERNAL)]
    assert not r.apply(step, None, envelope("clean"), outcome, 0.0, keyed=True)
    assert states.moves == [("dead_lettered", "clean")]
    # the ticket leaves the pipeline: its one audit trail goes with each dead letter
    assert emitter.trails == ["t-1", "t-1"]


def test_ok_and_degraded_go_on_and_are_recorded():
    r, emitter, _ = runner()
    step = DEFINITION.step("rules")
    assert r.apply(step, None, envelope("rules"), Ok(), 0.0, keyed=True)
    assert r.apply(step, None, envelope("rules"), Degraded(), 0.0, keyed=True)
    assert emitter.recorded == [("rules", StepStatus.ok), ("rules", StepStatus.degraded)]


def test_a_handler_that_raises_fails_each_ticket_alone():
    class Broken:
        async def run_batch(self, envs, step):
            raise RuntimeError("bug")

    emitter, states = FakeEmitter(), FakeStates()
    r = StepRunner(Topology(DEFINITION), {"rule_engine": Broken()}, emitter, states, Topics())

    items = [(SimpleNamespace(), envelope("rules")) for _ in range(3)]
    going_on = asyncio.run(r.run(DEFINITION.step("rules"), items, keyed=True))
    assert going_on == [] and len(emitter.dead) == 3
