"""The secured broker's configuration (devstack/kafka_secure.py), without starting it."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from confluent_kafka.admin import AclOperation, ResourcePatternType, ResourceType

from devstack import kafka, kafka_secure
from streams.kafka_config import confluent_config
from streams.settings import Settings


@pytest.fixture(scope="module")
def settings(tmp_path_factory: pytest.TempPathFactory) -> Settings:
    s = Settings(state_dir=tmp_path_factory.mktemp("state"), topic_prefix="p.")
    kafka_secure.ensure_secrets(s)
    return s


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_secrets_are_private_and_the_ca_is_not(settings: Settings) -> None:
    root = kafka_secure.secrets_dir(settings)
    assert _mode(root) == 0o700
    for user in kafka_secure.USERS:
        assert _mode(kafka_secure.password_file(settings, user)) == 0o600
        assert _mode(kafka_secure.env_file(settings, user)) == 0o600
    assert _mode(root / "ca.key") == 0o600 and _mode(root / "broker.p12") == 0o600
    assert _mode(root / "ca.pem") == 0o644
    passwords = {kafka_secure.password_file(settings, u).read_text() for u in kafka_secure.USERS}
    assert len(passwords) == len(kafka_secure.USERS)


def test_env_file_names_the_password_file_not_the_password(settings: Settings) -> None:
    text = kafka_secure.env_file(settings, "worker").read_text()
    password = kafka_secure.password_file(settings, "worker").read_text().strip()
    assert password not in text
    assert "TICKETFLOW_KAFKA_PASSWORD_FILE=" in text and "TICKETFLOW_KAFKA_USERNAME=worker" in text


def test_secure_settings_are_a_working_client_config(settings: Settings) -> None:
    s = kafka_secure.secure_settings(settings, "ops")
    config = confluent_config(s)
    assert config["bootstrap.servers"].endswith(f":{kafka_secure.PORT}")
    assert config["sasl.username"] == "ops" and config["security.protocol"] == "SASL_SSL"
    assert (
        config["sasl.password"] == kafka_secure.password_file(settings, "ops").read_text().strip()
    )
    assert kafka.kafka_dir(s) != kafka.kafka_dir(settings)  # its own folder...
    assert kafka.libs_dir(s) == kafka.libs_dir(settings)  # ...and the same jars


def test_broker_properties(settings: Settings) -> None:
    s = kafka_secure.secure_settings(settings)
    props = kafka_secure.secure_properties(s, kafka.server_properties(s))
    assert props["listeners"] == "SASL_SSL://127.0.0.1:9094,CONTROLLER://127.0.0.1:9095"
    assert props["listener.security.protocol.map"] == "SASL_SSL:SASL_SSL,CONTROLLER:PLAINTEXT"
    assert props["authorizer.class.name"].endswith("metadata.authorizer.StandardAuthorizer")
    assert props["allow.everyone.if.no.acl.found"] == "false"
    assert set(props["super.users"].split(";")) == {"User:admin", "User:ANONYMOUS"}
    assert props["sasl.enabled.mechanisms"] == "SCRAM-SHA-512"
    assert "PLAINTEXT://" not in props["listeners"]


def test_written_config_is_private(settings: Settings) -> None:
    s = kafka_secure.secure_settings(settings)
    kafka_secure.write_config(s)
    assert _mode(kafka.properties_path(s)) == 0o600
    assert "StandardAuthorizer" in kafka.properties_path(s).read_text()


def test_scram_users_at_format_time(settings: Settings) -> None:
    args = kafka_secure.scram_format_args(kafka_secure.secure_settings(settings))
    assert args[::2] == ["--add-scram"] * len(kafka_secure.USERS)
    for user, arg in zip(kafka_secure.USERS, args[1::2], strict=True):
        assert arg.startswith(f"SCRAM-SHA-512=[name={user},password=")


def _grants(principal: str) -> set[tuple]:
    return {
        (b.restype, b.name, b.resource_pattern_type, b.operation)
        for b in kafka_secure.acl_bindings("p.")
        if b.principal == f"User:{principal}"
    }


def test_ingest_writes_tickets_in_only() -> None:
    writes = {
        (name, pattern)
        for rtype, name, pattern, op in _grants("ingest")
        if rtype == ResourceType.TOPIC and op == AclOperation.WRITE
    }
    assert writes == {("p.tickets.in", ResourcePatternType.LITERAL)}


def test_worker_and_ops_grants() -> None:
    worker = _grants("worker")
    assert (
        ResourceType.TOPIC,
        "p.tickets.",
        ResourcePatternType.PREFIXED,
        AclOperation.WRITE,
    ) in worker
    assert (
        ResourceType.TRANSACTIONAL_ID,
        "p.ticketflow",
        ResourcePatternType.PREFIXED,
        AclOperation.WRITE,
    ) in worker
    assert (
        ResourceType.GROUP,
        "p.ticketflow",
        ResourcePatternType.PREFIXED,
        AclOperation.READ,
    ) in worker
    assert (
        ResourceType.BROKER,
        "kafka-cluster",
        ResourcePatternType.LITERAL,
        AclOperation.IDEMPOTENT_WRITE,
    ) in worker
    assert not any(op == AclOperation.WRITE and n == "p.config.routing" for _, n, _, op in worker)
    ops = _grants("ops")
    assert (
        ResourceType.TOPIC,
        "p.config.routing",
        ResourcePatternType.LITERAL,
        AclOperation.WRITE,
    ) in ops
    assert (
        ResourceType.TOPIC,
        "p.tickets.dlq",
        ResourcePatternType.PREFIXED,
        AclOperation.READ,
    ) in ops
    assert not any(op == AclOperation.CREATE for *_, op in ops)
    assert not _grants("admin")  # a super user: no ACL needed
