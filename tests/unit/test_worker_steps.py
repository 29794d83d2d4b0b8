"""Workers that run some steps (`ticketflow worker --steps`): which step sets are refused,
and the state records a pool sends to the home worker, with the rules they are applied by."""

from __future__ import annotations

import copy
from datetime import datetime, timezone
from types import SimpleNamespace

import orjson
import pytest
import yaml
from typer.testing import CliRunner

from agents.definition import load_definition, parse_definition
from agents.engine import WorkflowEngine
from agents.errors import BadRecord
from agents.remote_state import RemoteStates, StateInbox, read_state_change
from agents.runner import fresh_state
from agents.state import TicketStates, new_state, transition
from agents.step_selection import (
    HOME_APP_ID,
    StepSetError,
    complement,
    every_step,
    kept_steps,
    parse_steps,
    step_set,
)
from agents.topology import Topology
from schemas.tickets import DecisionStep, Envelope, ErrorClass, StepStatus, Ticket
from streams.app import create_app
from streams.settings import Settings
from streams.topics import Topics
from ticketflow import cli

DEFAULT = Settings().workflow_file
DEFINITION = load_definition(DEFAULT)
TOPOLOGY = Topology(DEFINITION)
TOPICS = Topics("p.")
STEPS = ["validate", "clean", "features", "infer", "rules", "route"]


def definition_with(**changes) -> Topology:
    data = copy.deepcopy(yaml.safe_load(DEFAULT.read_text()))
    data.update(changes)
    return Topology(parse_definition(data))


# ---- step sets --------------------------------------------------------------------------


def test_no_steps_named_is_every_step_in_the_home_worker():
    for empty in ("", " , ", []):
        steps = step_set(empty, TOPOLOGY)
        assert steps.home and steps.app_id == HOME_APP_ID and steps.steps == set(STEPS)
    assert every_step(TOPOLOGY) == STEPS


def test_names_are_read_from_a_comma_separated_list():
    assert parse_steps(" infer, features,,") == ["infer", "features"]
    assert parse_steps(["infer", " rules "]) == ["infer", "rules"]


def test_a_pool_gets_a_consumer_group_named_after_its_steps_in_workflow_order():
    pool = step_set("infer,features", TOPOLOGY)
    assert not pool.home and pool.steps == {"features", "infer"}
    assert pool.app_id == "ticketflow-pool-features-infer"
    assert step_set("rules", TOPOLOGY).app_id == "ticketflow-pool-rules"
    # the validator keeps no state (nothing is keyed before its first hop): it may be pooled
    assert not step_set("validate", TOPOLOGY).home


def test_the_home_worker_is_any_set_with_every_state_keeping_step():
    assert set(kept_steps(TOPOLOGY)) == {"clean", "route"}
    home = step_set(complement(["infer"], TOPOLOGY), TOPOLOGY)
    assert home.home and home.app_id == HOME_APP_ID
    assert home.steps == {"validate", "clean", "features", "rules", "route"}
    assert step_set("route,clean", TOPOLOGY).home


@pytest.mark.parametrize("bad", ["inferr", "infer,retry", "review", "Infer"])
def test_unknown_steps_are_refused_naming_them_and_the_known_ones(bad):
    with pytest.raises(StepSetError, match="unknown step") as err:
        step_set(bad, TOPOLOGY)
    assert "validate, clean, features, infer, rules, route" in str(err.value)


def test_a_state_keeping_step_without_the_others_is_refused():
    with pytest.raises(StepSetError) as err:
        step_set("infer,route", TOPOLOGY)
    message = str(err.value)
    assert "route need(s) the ticket_state table" in message
    assert "Add clean to make this the home worker" in message
    with pytest.raises(StepSetError, match="leave clean out"):
        step_set("clean,features", TOPOLOGY)


def test_fused_steps_that_carry_a_kept_step_are_kept_too():
    # [features ... route] run in features' agent; a retry enters infer's agent, which runs
    # rules and route in memory: none of them can leave the home worker
    fused = definition_with(fuse=[STEPS[:2], STEPS[2:]])
    kept = kept_steps(fused)
    assert set(kept) == {"features", "infer", "rules", "route"}
    assert "fused before rules" in kept["infer"]
    with pytest.raises(StepSetError, match="infer need"):
        step_set("infer", fused)
    # clean runs in the validator's agent; its own topic only sees replays: poolable
    assert not step_set("clean", fused).home
    assert not step_set("infer", definition_with(fuse=[["rules", "route"]])).home
    with pytest.raises(StepSetError):
        step_set("rules", definition_with(fuse=[["rules", "route"]]))


def test_every_step_a_ticket_can_reach_first_after_validation_admits():
    data = copy.deepcopy(yaml.safe_load(DEFAULT.read_text()))
    data["steps"][0]["next"] = [
        {"when": {"field": "degraded", "op": "eq", "value": True}, "step": "features"},
        {"step": "clean"},
    ]
    topology = Topology(parse_definition(data))
    assert set(kept_steps(topology)) == {"clean", "features", "route"}


def test_the_setting_and_the_command_line_option_choose_the_steps(monkeypatch):
    monkeypatch.setenv("TICKETFLOW_WORKER_STEPS", "infer")
    assert step_set(Settings().worker_steps, TOPOLOGY).app_id == "ticketflow-pool-infer"
    result = CliRunner().invoke(cli.app, ["worker", "--steps", "infer,route"])
    assert result.exit_code == 2
    assert "worker refused" in result.output and "route" in result.output
    result = CliRunner().invoke(cli.app, ["worker", "--steps", "inferr"])
    assert result.exit_code == 2 and "unknown step" in result.output


@pytest.mark.parametrize(
    ("spec", "agents", "table"),
    [
        ("infer", {"step-infer"}, False),
        (
            "validate,clean,features,rules,route",
            {f"step-{s}" for s in STEPS if s != "infer"},
            True,
        ),
        ("", {f"step-{s}" for s in STEPS}, True),
    ],
)
def test_a_pool_runs_its_steps_only_and_keeps_no_table(spec, agents, table):
    settings = Settings(topic_prefix="ut.")
    steps = step_set(spec, TOPOLOGY)
    app = create_app(settings, app_id=steps.app_id)
    deps = SimpleNamespace(gateway=object(), features=object())
    engine = WorkflowEngine(app, DEFINITION, settings, deps, (), steps)
    try:
        engine.build()
        home = {"review", "state", *(f"retry-{d}" for d in (200, 400, 800, 1600, 3200))}
        assert set(app.agents) == agents | (home if table else set())
        assert bool(list(app.tables)) is table
        assert isinstance(engine.states, TicketStates) is table
    finally:
        engine.close()


# ---- the pool's state records -----------------------------------------------------------


class FakeProducer:
    def __init__(self) -> None:
        self.sent: list[tuple] = []

    def produce(self, topic, key, value, headers=None, partition=None):
        self.sent.append((topic, key, value))

    def produce_many(self, records):
        for topic, key, value, headers, partition in records:
            self.produce(topic, key, value, headers, partition)


class FakeEmitter:
    def __init__(self) -> None:
        self.dead: list[tuple] = []

    def dead_letter(self, event, step, error_class, reason, attempts, trace_id=None):
        self.dead.append((step, error_class, reason))


def envelope(entries: int, tid: str = "t-1", arrival: str = "0:1") -> Envelope:
    """An envelope whose decision path has `entries` entries (its progress)."""
    now = datetime.now(timezone.utc)
    env = Envelope(
        ticket=Ticket(ticket_id=tid, text="where is my parcel", created_at=now),
        workflow=DEFINITION.name,
        workflow_version=DEFINITION.version,
        step="infer",
        trace_id="a" * 32,
        arrival=arrival,
        started_at=now,
    )
    ok = StepStatus.ok
    env.path = [DecisionStep(step=s, status=ok, latency_ms=1.0) for s in STEPS[:entries]]
    return env


def event(key: bytes | None, value: object):
    message = SimpleNamespace(topic="p.tickets.state", partition=1, offset=7, key=key, value=value)
    return SimpleNamespace(message=message)


def pool_move(env: Envelope, status: str, step: str, attempt: int = 1) -> tuple[bytes, bytes]:
    producer = FakeProducer()
    RemoteStates(producer, TOPICS).move(None, fresh_state(env), status, step, attempt)
    ((topic, key, value),) = producer.sent
    assert topic == "p.tickets.state"
    return key, value


def home() -> tuple[dict, StateInbox, FakeEmitter]:
    table: dict = {}
    emitter = FakeEmitter()
    return table, StateInbox(TicketStates(table, lambda e: None), TOPOLOGY, emitter), emitter


def test_a_pool_keeps_no_state_and_sends_each_move_keyed_by_ticket_id():
    producer = FakeProducer()
    remote = RemoteStates(producer, TOPICS)
    assert remote.admit(None, "t-1", "0:1", "a" * 32, "w", 1) is True
    remote.at(object())
    env = envelope(4)
    remote.move(None, fresh_state(env), "waiting_retry", "infer", 2)
    assert remote.flush_changelog() == 0  # already on the producer, drained with outputs
    ((topic, key, value),) = producer.sent
    assert (topic, key) == ("p.tickets.state", b"t-1")
    change = read_state_change(value, key, TOPOLOGY.later_names, TOPOLOGY.version_numbers)
    assert (change.status, change.step, change.attempt, change.progress) == (
        "waiting_retry",
        "infer",
        2,
        4,
    )
    assert change.arrival == "0:1" and change.workflow_version == DEFINITION.version
    with pytest.raises(ValueError, match="no state fields"):
        remote.move(None, fresh_state(env), "completed", "route", route="auto_classify")


def test_the_home_worker_applies_a_pool_move_to_the_table():
    table, inbox, emitter = home()
    env = envelope(3)
    fresh = fresh_state(env)
    TicketStates(table, lambda e: None).move(None, fresh, "running", "infer")
    key, value = pool_move(envelope(4), "running", "rules")
    inbox.handle(event(key, value))
    state = table["t-1"]
    assert (state["status"], state["step"], state["progress"]) == ("running", "rules", 4)
    assert [h[:2] for h in state["history"]] == [["infer", "running"], ["rules", "running"]]
    assert not emitter.dead


def test_a_move_for_a_ticket_the_table_does_not_have_yet_creates_its_state():
    table, inbox, _ = home()
    inbox.handle(event(*pool_move(envelope(4, tid="t-9"), "waiting_retry", "infer", 2)))
    state = table["t-9"]
    assert state["status"] == "waiting_retry" and state["attempts"] == {"infer": 2}
    assert state["arrival"] == "0:1" and state["trace_id"] == "a" * 32


def test_a_late_move_never_takes_a_ticket_back():
    table, inbox, _ = home()
    states = TicketStates(table, lambda e: None)
    # the home worker ran rules (its move has progress 5) before the pool's move arrived
    states.move(None, fresh_state(envelope(5)), "running", "route")
    inbox.handle(event(*pool_move(envelope(4), "running", "rules")))
    assert (table["t-1"]["step"], table["t-1"]["progress"]) == ("route", 5)
    # settled by the router: no running status again, whatever the progress
    routed = transition(table["t-1"], "awaiting_review", "route")
    table["t-1"] = routed
    inbox.handle(event(*pool_move(envelope(6), "running", "rules")))
    assert table["t-1"]["status"] == "awaiting_review"
    table["t-1"] = transition(routed, "completed", "route")
    inbox.handle(event(*pool_move(envelope(6), "waiting_retry", "infer", 2)))
    # a terminal move older than the completion is stale too
    inbox.handle(event(*pool_move(envelope(3), "dead_lettered", "infer")))
    assert table["t-1"]["status"] == "completed"


def test_equal_progress_is_not_stale_a_dead_letter_follows_the_move_that_sent_it():
    table, inbox, _ = home()
    TicketStates(table, lambda e: None).move(None, fresh_state(envelope(3)), "running", "infer")
    inbox.handle(event(*pool_move(envelope(3), "dead_lettered", "infer")))
    assert table["t-1"]["status"] == "dead_lettered"


def test_a_move_of_another_arrival_of_the_ticket_id_is_ignored():
    table, inbox, _ = home()
    table["t-1"] = new_state("t-1", "0:1", "a" * 32, DEFINITION.name, 1)
    inbox.handle(event(*pool_move(envelope(4, arrival="3:99"), "running", "rules")))
    assert table["t-1"]["status"] == "received"


def test_a_redelivery_at_home_cannot_reopen_a_routed_ticket_either():
    table: dict = {}
    states = TicketStates(table, lambda e: None)
    states.move(None, fresh_state(envelope(5)), "running", "route")
    table["t-1"] = transition(table["t-1"], "awaiting_review", "route")
    states.move(None, fresh_state(envelope(5)), "running", "route")  # rules read again
    assert table["t-1"]["status"] == "awaiting_review"


def _valid() -> dict:
    return orjson.loads(pool_move(envelope(4), "running", "rules")[1])


@pytest.mark.parametrize(
    ("key", "value", "why"),
    [
        (b"t-1", b"\xff not json", "not a state change"),
        (b"t-1", None, "of type NoneType"),
        (b"t-1", b"[1, 2]", "not a state change"),
        (b"t-2", orjson.dumps(_valid()), "record key"),
        (None, orjson.dumps(_valid()), "record key"),
        (b"t-1", orjson.dumps({**_valid(), "step": "teleport"}), "unknown step"),
        (b"t-1", orjson.dumps({**_valid(), "workflow_version": 99}), "workflow version 99"),
        (b"t-1", orjson.dumps({**_valid(), "status": "completed"}), "status"),
        (b"t-1", orjson.dumps({**_valid(), "attempt": 9}), "attempt"),
        (b"t-1", orjson.dumps({**_valid(), "route": "x"}), "route"),
        (b"t-1", orjson.dumps({**_valid(), "ticket_id": "a b"}), "ticket_id"),
    ],
)
def test_a_record_that_is_no_state_change_is_dead_lettered_alone(key, value, why):
    with pytest.raises(BadRecord) as err:
        read_state_change(value, key, TOPOLOGY.later_names, TOPOLOGY.version_numbers)
    assert err.value.error_class is ErrorClass.INTERNAL and why in err.value.reason
    table, inbox, emitter = home()
    inbox.handle(event(key, value))
    assert table == {} and [d[:2] for d in emitter.dead] == [("state", ErrorClass.INTERNAL)]
