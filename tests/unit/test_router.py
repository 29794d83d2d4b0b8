"""The router with fakes: one transaction carries a result and its ledger entry, a ticket
in the ledger is skipped, a failed transaction keeps its results for the next one, and a
fenced partition is left to its new owner."""

import asyncio
import time
import typing
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

import pytest
from confluent_kafka import KafkaError, KafkaException

from agents import router as router_module
from agents.definition import load_definition
from agents.router import Router
from agents.topology import Topology
from schemas.tickets import Envelope, Ticket
from streams.settings import Settings
from streams.topics import Topics

DEFINITION = load_definition(Settings().workflow_file)
TOPICS = Topics("p.")


class FakeTxn:
    instances: typing.ClassVar[list] = []
    fail_next = 0
    error: KafkaException = KafkaException("transaction failed")

    def __init__(self, bootstrap, transactional_id):
        self.id = transactional_id
        self.commits: list[list] = []
        self.closed = False
        FakeTxn.instances.append(self)

    async def init(self):
        pass

    async def commit(self, records):
        if FakeTxn.fail_next:
            FakeTxn.fail_next -= 1
            raise FakeTxn.error
        self.commits.append(records)

    def close(self):
        self.closed = True


class FakeLedger:
    def __init__(self, bootstrap, topic):
        self.done: dict[int, set] = {}
        self.on_broker: set = set()

    def loaded(self, p):
        return p in self.done

    async def load(self, p):
        self.done[p] = set(self.on_broker)

    def forget(self, p):
        self.done.pop(p, None)

    def has(self, p, tid):
        return tid in self.done[p]

    def add(self, p, tid):
        self.done[p].add(tid)
        self.on_broker.add(tid)


class FakeEmitter:
    def __init__(self):
        self.audited = 0

    @staticmethod
    def trace_headers(env):
        return []

    def audit_trail(self, env, outcome, route=None):
        self.audited += 1
        return f"{env.ticket.ticket_id}:{outcome}".encode()

    def closed(self, env, step, entry):
        pass


class FakeStates:
    def __init__(self):
        self.moves = []

    def move(self, event, fresh, status, step, attempt=1, **fields):
        self.moves.append((fresh["ticket_id"], status))


def make(monkeypatch, owns=lambda p: True):
    monkeypatch.setattr(router_module, "TransactionalProducer", FakeTxn)
    monkeypatch.setattr(router_module, "CompletionLedger", FakeLedger)
    monkeypatch.setattr(router_module, "RETRY_PAUSE_S", 0.0)
    FakeTxn.instances, FakeTxn.fail_next = [], 0
    FakeTxn.error = KafkaException("transaction failed")
    states = FakeStates()
    kafka = {"bootstrap.servers": "b"}
    r = Router(kafka, "app-route", TOPICS, Topology(DEFINITION), states, FakeEmitter(), owns)
    return r, states


def item(tid: str, partition: int = 0):
    now = datetime.now(timezone.utc)
    env = Envelope(
        ticket=Ticket(ticket_id=tid, text="where is my parcel", created_at=now),
        workflow=DEFINITION.name,
        workflow_version=DEFINITION.version,
        step="route",
        trace_id="a" * 32,
        arrival="0:1",
        started_at=now - timedelta(milliseconds=5),
    )
    return SimpleNamespace(message=SimpleNamespace(partition=partition)), env


def route(r, items):
    async def go():
        await r.route(DEFINITION.step("route"), items)
        await r.drain()

    asyncio.run(go())


def test_result_and_ledger_entry_commit_together_once(monkeypatch):
    r, states = make(monkeypatch)
    route(r, [item("a"), item("b")])
    route(r, [item("a")])  # a redelivery after its result: skipped
    records = [rec for txn in FakeTxn.instances for c in txn.commits for rec in c]
    outs = [rec for rec in records if rec[0].startswith("p.tickets.out.")]
    ledger = [rec for rec in records if rec[0] == TOPICS.completed]
    assert sorted(rec[1] for rec in outs) == [b"a", b"b"]
    assert sorted(rec[1] for rec in ledger) == [b"a", b"b"]
    assert all(rec[4] == 0 for rec in ledger)  # the ledger partition is the input's
    # each ticket's one audit trail commits in the same transaction as its result
    trails = [rec for rec in records if rec[0] == TOPICS.audit]
    assert sorted(rec[2] for rec in trails) == [b"a:awaiting_review", b"b:awaiting_review"]
    assert FakeTxn.instances[0].id == "app-route-0"
    assert sorted(t for t, _ in states.moves) == ["a", "b"]


def test_a_failed_transaction_keeps_its_results_for_a_new_producer(monkeypatch):
    r, _ = make(monkeypatch)
    FakeTxn.fail_next = 1
    route(r, [item("a")])
    assert FakeTxn.instances[0].closed
    committed = [rec[1] for t in FakeTxn.instances for c in t.commits for rec in c]
    assert committed.count(b"a") == 3  # its result, its ledger entry and its audit, once


def test_a_fenced_partition_is_left_to_its_new_owner(monkeypatch):
    r, states = make(monkeypatch, owns=lambda p: False)
    FakeTxn.fail_next = 1
    route(r, [item("a")])
    assert states.moves == [] and all(not t.commits for t in FakeTxn.instances)


FENCED = KafkaException(KafkaError(KafkaError._FENCED))


def fenced_once(monkeypatch, hold_s: float, error: KafkaException = FENCED):
    """A router whose first commit is fenced while its partition stays assigned."""
    r, states = make(monkeypatch)
    monkeypatch.setattr(router_module, "FENCED_HOLD_S", hold_s)
    FakeTxn.fail_next, FakeTxn.error = 1, error
    return r, states


async def route_into_the_hold(r) -> None:
    """Route ticket "a"; its commit is fenced and the partition held by the return."""
    await r.route(DEFINITION.step("route"), [item("a")])
    await asyncio.sleep(0.1)


@pytest.mark.parametrize("code", sorted(router_module.FENCING))
def test_a_partition_fenced_while_assigned_is_held_before_it_is_taken_back(monkeypatch, code):
    # two workers that both believe they own it must not fence each other every second
    r, states = fenced_once(monkeypatch, 0.3, KafkaException(KafkaError(code)))
    t0 = time.monotonic()
    route(r, [item("a")])
    assert time.monotonic() - t0 >= 0.3
    assert len(FakeTxn.instances) == 2 and FakeTxn.instances[0].closed
    assert [len(t.commits) for t in FakeTxn.instances] == [0, 1]
    assert [t for t, _ in states.moves] == ["a"]


def test_a_failure_that_is_not_fencing_is_retried_without_the_hold(monkeypatch):
    r, _ = make(monkeypatch)
    monkeypatch.setattr(router_module, "FENCED_HOLD_S", 30.0)
    FakeTxn.fail_next = 1
    t0 = time.monotonic()
    route(r, [item("a")])
    assert time.monotonic() - t0 < 5 and [len(t.commits) for t in FakeTxn.instances] == [0, 1]


def test_tickets_arriving_during_the_hold_wait_for_it_and_fence_nobody(monkeypatch):
    r, states = fenced_once(monkeypatch, 0.3)

    async def go():
        await route_into_the_hold(r)
        await r.route(DEFINITION.step("route"), [item("b")])
        assert len(FakeTxn.instances) == 1, "a ticket in the hold made a new producer"
        await r.drain()

    asyncio.run(go())
    assert len(FakeTxn.instances) == 2
    assert sorted(
        rec[1] for rec in FakeTxn.instances[1].commits[0] if rec[0] == TOPICS.completed
    ) == [b"a", b"b"]
    assert sorted(t for t, _ in states.moves) == ["a", "b"]


def test_a_revocation_during_the_hold_ends_it_and_leaves_the_partition(monkeypatch):
    r, states = fenced_once(monkeypatch, 30.0)

    async def go():
        await route_into_the_hold(r)
        await asyncio.wait_for(r.on_revoked({0}), 5)
        await asyncio.wait_for(r.drain(), 5)

    asyncio.run(go())
    assert len(FakeTxn.instances) == 1 and not FakeTxn.instances[0].commits
    assert states.moves == []
