"""The router with fakes: one transaction carries a result and its ledger entry, a ticket
in the ledger is skipped, a failed transaction keeps its results for the next one, and a
fenced partition is left to its new owner."""

import asyncio
import typing
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

from confluent_kafka import KafkaException

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
            raise KafkaException("transaction failed")
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

    def audit(self, env, step, entry):
        self.audited += 1


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
    assert FakeTxn.instances[0].id == "app-route-0"
    assert sorted(t for t, _ in states.moves) == ["a", "b"]


def test_a_failed_transaction_keeps_its_results_for_a_new_producer(monkeypatch):
    r, _ = make(monkeypatch)
    FakeTxn.fail_next = 1
    route(r, [item("a")])
    assert FakeTxn.instances[0].closed
    committed = [rec[1] for t in FakeTxn.instances for c in t.commits for rec in c]
    assert committed.count(b"a") == 2  # its result and its ledger entry, once


def test_a_fenced_partition_is_left_to_its_new_owner(monkeypatch):
    r, states = make(monkeypatch, owns=lambda p: False)
    FakeTxn.fail_next = 1
    route(r, [item("a")])
    assert states.moves == [] and all(not t.commits for t in FakeTxn.instances)
