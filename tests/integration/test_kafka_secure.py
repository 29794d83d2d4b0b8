"""Kafka secured end to end (`ticketflow stack up --secure`, docs/security.md).

The secured broker (SASL_SSL, SCRAM-SHA-512, ACLs) runs beside the session's plain one; this
module works on a topic prefix of its own, granted to the principals the way `stack up
--secure` grants the configured prefix, with its topics made by the admin as an operator
would. Redis, Triton and the gateway are the session's.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import orjson
import pytest
from confluent_kafka import KafkaError, Producer, TopicPartition

import devstack as stack
from devstack import app_processes, kafka_secure
from streams.admin import delete_prefixed
from streams.kafka_config import confluent_config
from streams.settings import Settings
from streams.topics import Topics
from streams.watermarks import watermarks
from tests.integration.kafka_helpers import ROUTES, body, tickets
from ticketflow import kafka_io

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def secure(live_stack: Settings) -> Iterator[dict[str, Settings]]:
    """Settings per principal (admin, worker, ingest, ops) on the secured broker."""
    started = not kafka_secure.healthy(live_stack)
    stack.start_part(live_stack, "kafka-secure")
    prefix = f"{live_stack.topic_prefix}sec{uuid.uuid4().hex[:4]}."
    base = live_stack.model_copy(update={"topic_prefix": prefix})
    users = {u: kafka_secure.secure_settings(base, u) for u in kafka_secure.USERS}
    kafka_secure.grant(base, prefix)
    kafka_secure.create_topics(base, prefix)
    yield users
    try:
        delete_prefixed(users["admin"], prefix, prefix)
    finally:
        if started:
            stack.stop_part(live_stack, "kafka-secure")


def _deliver(config: dict, topic: str, n: int = 1, timeout_s: float = 4.0) -> list[KafkaError]:
    """Produce `n` records with `config`; the errors of their delivery reports (none: all in)."""
    errors: list[KafkaError] = []
    p = Producer({**config, "message.timeout.ms": int(timeout_s * 1000), "log_level": 0})

    def report(err, _msg) -> None:
        if err is not None:
            errors.append(err)

    for i in range(n):
        p.produce(topic, key=f"k{i}".encode(), value=b"{}", on_delivery=report)
    left = p.flush(timeout_s + 5)
    assert left == 0, f"{left} record(s) without a delivery report"
    return errors


def _records_in(admin: Settings, topic: str) -> int:
    c = kafka_io.consumer(confluent_config(admin, {"log_level": 0}))
    try:
        meta = c.list_topics(topic, timeout=10).topics[topic]
        return sum(
            high - low
            for low, high in (watermarks(c, TopicPartition(topic, p)) for p in meta.partitions)
        )
    finally:
        c.close()


def test_unauthenticated_clients_are_refused_and_write_nothing(secure):
    admin, ingest = secure["admin"], secure["ingest"]
    topic = Topics(admin.topic_prefix).tickets_in
    plain = {"bootstrap.servers": admin.kafka_bootstrap}
    no_sasl = {**plain, "security.protocol": "SSL", "ssl.ca.location": str(admin.kafka_ca_file)}
    wrong = {**confluent_config(ingest), "sasl.password": "not-the-password"}
    # three ways in without a valid identity: no TLS, TLS without SASL, a wrong password
    for config in (plain, no_sasl, wrong):
        client_errors: list[KafkaError] = []
        errors = _deliver({**config, "error_cb": client_errors.append}, topic, n=3, timeout_s=3)
        assert len(errors) == 3, config.get("security.protocol", "PLAINTEXT")
        if config is wrong:  # told why, not merely timed out
            codes = {e.code() for e in client_errors}
            assert KafkaError._AUTHENTICATION in codes, client_errors
    assert _records_in(admin, topic) == 0


def test_ingest_may_write_tickets_in_and_not_a_step_topic(secure):
    ingest, admin = secure["ingest"], secure["admin"]
    topics = Topics(ingest.topic_prefix)
    step = topics.step("clean")
    errors = _deliver(confluent_config(ingest), step, n=2)
    assert [e.code() for e in errors] == [KafkaError.TOPIC_AUTHORIZATION_FAILED] * 2
    assert _records_in(admin, step) == 0
    # its own topic, same connection settings: the refusal above is the ACL's
    before = _records_in(admin, topics.tickets_in)
    assert _deliver(confluent_config(ingest, {"enable.idempotence": True}), topics.tickets_in) == []
    assert _records_in(admin, topics.tickets_in) == before + 1


def test_the_pipeline_runs_end_to_end_on_the_secured_broker(secure, gateway):
    worker_s = secure["worker"].model_copy(update={"worker_web_port": app_processes.free_port()})
    env = {
        **kafka_secure.client_env(worker_s, "worker"),
        "TICKETFLOW_TOPIC_PREFIX": worker_s.topic_prefix,
        "TICKETFLOW_WORKER_WEB_PORT": str(worker_s.worker_web_port),
    }
    worker = app_processes.start_worker(
        worker_s, env=env, log_name=f"worker-secure-{uuid.uuid4().hex[:6]}"
    )
    try:
        topics = Topics(worker_s.topic_prefix)
        batch = tickets(30, "sec", seed=13)
        # published by ingest's principal, read back by ops': neither is the worker's
        producer = kafka_io.producer(confluent_config(secure["ingest"]))
        for t in batch:
            producer.produce(topics.tickets_in, key=t["ticket_id"].encode(), value=body(t))
        assert producer.flush(30) == 0
        want = {t["ticket_id"] for t in batch}
        seen: list[str] = []
        consumer = kafka_io.consumer(confluent_config(secure["ops"]))
        consumer.subscribe([topics.out(r) for r in ROUTES])
        deadline, settle = time.monotonic() + 75, None
        try:
            while time.monotonic() < deadline:
                msg = consumer.poll(0.5)
                if msg is not None and not msg.error():
                    seen.append(orjson.loads(msg.value())["ticket_id"])
                if settle is None and want <= set(seen):
                    settle = time.monotonic() + 3  # a duplicate would show up meanwhile
                if settle is not None and time.monotonic() > settle:
                    break
        finally:
            consumer.close()
        assert set(seen) == want, f"missing {sorted(want - set(seen))[:5]}; see {worker.log_path}"
        assert len(seen) == len(want), "a ticket produced two results"
    finally:
        worker.stop()
