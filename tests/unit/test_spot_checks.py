"""Spot checks: the sample rule, the copy in the router's transaction, a reviewer's verdict
that makes no second result, and the agreement per model version."""

import asyncio
import json
import typing
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

import orjson
import pytest
from typer.testing import CliRunner

from agents import metrics
from agents import router as router_module
from agents.definition import DefinitionError, parse_definition
from agents.emitter import Emitter
from agents.review import ReviewRefused, check_decidable
from agents.review_agent import ReviewAgent
from agents.router import Router
from agents.spot_check import PENDING
from agents.state import TicketStates, new_state, transition
from agents.steps.rules import RuleInput, apply_rules, sampled
from agents.topology import Topology
from schemas.review import ReviewOutcome
from schemas.tickets import Category, Context, Envelope, Prediction, Ticket, TicketResult
from streams.topics import Topics
from ticketflow import review_cli
from ticketflow.review_stats import agreement

TOPICS = Topics("p.")
NOW = datetime.now(timezone.utc)
RULES = ["refund_check", "score_threshold", "sample"]


def ids_sampled(share: float, n: int = 4000) -> list[str]:
    return [f"t-{i}" for i in range(n) if sampled(f"t-{i}", share)]


def test_the_sample_is_the_configured_share_and_the_same_on_every_replay():
    assert 0.04 < len(ids_sampled(0.05)) / 4000 < 0.06
    assert ids_sampled(0.05) == ids_sampled(0.05)  # by ticket_id, nothing random
    assert set(ids_sampled(0.05)) <= set(ids_sampled(0.2))  # a larger share keeps these
    assert ids_sampled(0.0) == [] and len(ids_sampled(1.0)) == 4000


def context(confidence: float = 0.9, degraded: bool = False) -> Context:
    pred = Prediction(
        category=Category.shipping, confidence=confidence, model_name="m", model_version="2"
    )
    return Context(prediction=pred, degraded=degraded)


def decide(tid: str, ctx: Context, text: str = "where is my parcel", share: float = 0.05):
    return apply_rules(RULES, RuleInput(text, ctx, 0.5, ticket_id=tid, sample_share=share))


def test_the_sample_rule_marks_automatic_decisions_only():
    hit, miss = ids_sampled(0.05)[0], next(i for i in map(str, range(99)) if not sampled(i, 0.05))
    marked = decide(hit, context())
    assert (marked.route, marked.category, marked.fired) == (
        "auto_classify",
        "shipping",
        ["sample"],
    )
    assert decide(miss, context()).fired == []  # auto_classify, unsampled
    assert decide(hit, context(confidence=0.2)).route == "manual_review"  # a person decides
    assert decide(hit, context(), text="I want a refund").route == "after_sales"
    assert decide(hit, context(degraded=True)).fired == ["degraded"]


def rule_step(rules, share=0.05) -> dict:
    return {
        "name": "sc",
        "version": 1,
        "steps": [
            {"name": "validate", "type": "validator"},
            {"name": "rules", "type": "rule_engine", "rules": rules, "sample_share": share},
            {"name": "route", "type": "router", "routes": ["auto_classify", "manual_review"]},
        ],
    }


def test_the_definition_wants_sample_last_and_a_share_only_with_it():
    parse_definition(rule_step(RULES))
    with pytest.raises(DefinitionError, match="must be the last rule"):
        parse_definition(rule_step(["sample", "score_threshold"]))
    with pytest.raises(DefinitionError, match="sample_share: set, but"):
        parse_definition(rule_step(["score_threshold"]))
    with pytest.raises(DefinitionError, match="sample_share"):
        parse_definition(rule_step(RULES, share=1.5))


# ---- the router ------------------------------------------------------------------------------

DEFINITION = parse_definition(rule_step(RULES))


class FakeTxn:
    instances: typing.ClassVar[list] = []

    def __init__(self, kafka, transactional_id):
        self.commits: list[list] = []
        FakeTxn.instances.append(self)

    async def init(self):
        pass

    async def commit(self, records):
        self.commits.append(records)

    def close(self):
        pass


class FakeLedger:
    def __init__(self, kafka, topic):
        self.done: dict[int, set] = {}

    def loaded(self, p):
        return p in self.done

    async def load(self, p):
        self.done[p] = set()

    def forget(self, p):
        self.done.pop(p, None)

    def has(self, p, tid):
        return tid in self.done[p]

    def add(self, p, tid):
        self.done[p].add(tid)


class FakeEmitter:
    @staticmethod
    def trace_headers(env):
        return []

    @staticmethod
    def audit_trail(env, outcome, route=None):
        return b"{}"

    def closed(self, env, step, entry):
        pass


class States:
    def __init__(self):
        self.moves = []

    def move(self, event, fresh, status, step, attempt=1, **fields):
        self.moves.append((fresh["ticket_id"], status, fields))


def routed(monkeypatch, envs):
    monkeypatch.setattr(router_module, "TransactionalProducer", FakeTxn)
    monkeypatch.setattr(router_module, "CompletionLedger", FakeLedger)
    FakeTxn.instances = []
    states = States()
    r = Router({}, "app-route", TOPICS, Topology(DEFINITION), states, FakeEmitter(), lambda p: 1)
    items = [(SimpleNamespace(message=SimpleNamespace(partition=0)), env) for env in envs]

    async def go():
        await r.route(DEFINITION.step("route"), items)
        await r.drain()

    asyncio.run(go())
    return [rec for t in FakeTxn.instances for c in t.commits for rec in c], states


def envelope(tid: str) -> Envelope:
    env = Envelope(
        ticket=Ticket(ticket_id=tid, text="where is my parcel", created_at=NOW),
        workflow="sc",
        workflow_version=1,
        step="route",
        trace_id="a" * 32,
        arrival="0:1",
        started_at=NOW - timedelta(milliseconds=5),
        context=context(),
    )
    env.context.rule = decide(tid, env.context)
    return env


def test_a_spot_check_commits_its_copy_with_the_one_result(monkeypatch):
    hit = ids_sampled(0.05)[0]
    records, states = routed(monkeypatch, [envelope(hit), envelope("plain-1")])
    outs = [r for r in records if r[0].startswith("p.tickets.out.")]
    assert not sampled("plain-1", 0.05)
    assert sorted((r[0], r[1]) for r in outs) == sorted(
        [("p.tickets.out.auto_classify", hit.encode()), ("p.tickets.out.auto_classify", b"plain-1")]
    )  # not held back, and one result each
    copies = [r for r in records if r[0] == TOPICS.review_spot_checks]
    assert [r[1] for r in copies] == [hit.encode()]
    assert orjson.loads(copies[0][2])["result"]["route"] == "auto_classify"
    moves = {tid: (status, fields) for tid, status, fields in states.moves}
    assert moves[hit][0] == "completed" and moves[hit][1]["spot_check"] == PENDING
    assert "spot_check" not in moves["plain-1"][1]


# ---- the reviewer's decision -----------------------------------------------------------------


class Producer:
    def __init__(self):
        self.sent = []

    def produce(self, topic, key, value, headers=None, partition=None):
        self.sent.append((topic, key, value))


def result(tid: str, route: str, category: str = "shipping", version: str | None = "2"):
    return TicketResult(
        ticket_id=tid,
        route=route,
        category=category,
        confidence=0.9,
        model_name="m",
        model_version=version,
        decision_path=[],
        latency_ms=5.0,
        completed_at=NOW - timedelta(seconds=3),
        workflow="sc",
        workflow_version=1,
    ).model_dump(mode="json")


def spot_checked(tid: str) -> dict:
    state = transition(new_state(tid, "0:1", "a" * 32, "sc", 1), "completed", "route")
    return {
        **state,
        "route": "auto_classify",
        "spot_check": PENDING,
        "result": result(tid, "auto_classify"),
    }


def awaiting(tid: str) -> dict:
    state = transition(new_state(tid, "0:1", "a" * 32, "sc", 1), "awaiting_review", "route")
    return {**state, "route": "manual_review", "result": result(tid, "manual_review")}


def decision(tid: str, category: str) -> SimpleNamespace:
    value = orjson.dumps({"ticket_id": tid, "category": category, "reviewer": "ana"})
    return SimpleNamespace(message=SimpleNamespace(key=tid.encode(), value=value))


def agent():
    producer, table = Producer(), {}
    states = TicketStates(table, lambda event: None)
    return ReviewAgent(states, Emitter(producer, TOPICS, 3), TOPICS), table, producer


def counted(kind: str, verdict: str) -> float:
    return metrics.REVIEW_AGREEMENT.labels("2", kind, verdict)._value.get()


def test_a_spot_check_decision_makes_no_second_result_but_an_agreement():
    review, table, producer = agent()
    table["s-1"], table["s-2"] = spot_checked("s-1"), spot_checked("s-2")
    agree, disagree = counted("spot_check", "agree"), counted("spot_check", "disagree")
    review.handle(decision("s-1", "shipping"))
    review.handle(decision("s-2", "billing"))
    review.handle(decision("s-1", "billing"))  # decided already: refused
    assert [t for t, _, _ in producer.sent] == [TOPICS.review_outcomes] * 2  # no TicketResult
    outcomes = [ReviewOutcome.model_validate_json(v) for _, _, v in producer.sent]
    assert [(o.ticket_id, o.kind, o.agreed) for o in outcomes] == [
        ("s-1", "spot_check", True),
        ("s-2", "spot_check", False),
    ]
    assert counted("spot_check", "agree") == agree + 1
    assert counted("spot_check", "disagree") == disagree + 1
    assert table["s-1"]["status"] == "completed" and table["s-1"]["route"] == "auto_classify"
    assert table["s-1"]["spot_check"] == "decided"
    with pytest.raises(ReviewRefused, match="already decided"):
        check_decidable("s-1", table["s-1"])


def test_a_manual_review_completes_the_ticket_and_is_measured_too():
    review, table, producer = agent()
    table["m-1"] = awaiting("m-1")
    assert check_decidable("m-1", table["m-1"]) == "manual"
    review.handle(decision("m-1", "billing"))
    topics = [t for t, _, _ in producer.sent]
    assert topics == [TOPICS.out("reviewed"), TOPICS.review_outcomes]
    outcome = ReviewOutcome.model_validate_json(producer.sent[1][2])
    assert (outcome.kind, outcome.proposed, outcome.decided) == ("manual", "shipping", "billing")
    assert table["m-1"]["status"] == "completed" and table["m-1"]["route"] == "reviewed"


def test_a_completed_ticket_without_a_spot_check_is_not_decidable():
    state = transition(new_state("c-1", "0:1", "a" * 32, "sc", 1), "completed", "route")
    with pytest.raises(ReviewRefused, match="not awaiting review"):
        check_decidable("c-1", state)


# ---- review stats ----------------------------------------------------------------------------


def outcome(tid, kind, agreed, version="2") -> ReviewOutcome:
    return ReviewOutcome(
        ticket_id=tid,
        kind=kind,
        proposed="billing",
        decided="billing" if agreed else "general",
        agreed=agreed,
        model_version=version,
    )


OUTCOMES = [
    outcome("a", "spot_check", True),
    outcome("b", "spot_check", False),
    outcome("b", "spot_check", False),  # a redelivered outcome counts once
    outcome("c", "manual", True),
    outcome("d", "manual", True, version="10"),
    outcome("e", "manual", False, version=None),
]


def test_agreement_per_model_version_and_kind():
    stats = agreement(OUTCOMES)
    rows = [(r.model_version, r.kind, r.decisions, r.agreed) for r in stats.rows]
    assert rows == [
        ("2", "spot_check", 2, 1),
        ("2", "manual", 1, 1),
        ("2", None, 3, 2),
        ("10", "manual", 1, 1),
        ("10", None, 1, 1),
    ]
    assert stats.rows[0].rate == 0.5 and stats.without_model == 1


def test_review_stats_fits_an_80_column_terminal(monkeypatch):
    monkeypatch.setattr(review_cli, "_outcomes", lambda s, idle: OUTCOMES)
    monkeypatch.setattr(review_cli, "console", review_cli.Console(width=80))
    run = CliRunner().invoke(review_cli.review_app, ["stats"], env={"COLUMNS": "80"})
    assert run.exit_code == 0, run.output
    lines = run.output.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert any("spot check" in line and "50.0%" in line for line in lines)
    assert "1 decision(s) on tickets no model answered" in run.output
    run = CliRunner().invoke(review_cli.review_app, ["stats", "--json"])
    first = json.loads(run.output.splitlines()[0])
    assert first == {
        "model_version": "2",
        "kind": "spot_check",
        "decisions": 2,
        "agreed": 1,
        "agreement": 0.5,
    }
