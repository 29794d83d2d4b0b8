"""streams/kafka_config.py: one Settings, three client kinds, and the password in no repr."""

from __future__ import annotations

import logging
import ssl
import subprocess
from pathlib import Path

import faust
import pytest
from pydantic import ValidationError

from inference_gateway.routing_watch import kafka_security
from streams.kafka_config import (
    MASK,
    KafkaSecurityError,
    aiokafka_kwargs,
    confluent_config,
    describe,
    faust_credentials,
)
from streams.settings import Settings

SECRET = "s3cr3t-Pa55-word"


@pytest.fixture(scope="module")
def ca_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("ca") / "ca.pem"
    key = path.with_name("ca.key")
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=test-ca", "-keyout", str(key), "-out", str(path)],
        check=True, capture_output=True,
    )  # fmt: skip
    return path


def secure(ca: Path | None = None, **over: object) -> Settings:
    values: dict[str, object] = {
        "kafka_bootstrap": "127.0.0.1:9094",
        "kafka_security_protocol": "SASL_SSL",
        "kafka_username": "workers",
        "kafka_password": SECRET,
        "kafka_ca_file": ca,
    }
    values.update(over)
    return Settings(**values)


def test_plaintext_is_the_default_and_adds_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("SECURITY_PROTOCOL", "USERNAME", "PASSWORD", "PASSWORD_FILE", "CA_FILE"):
        monkeypatch.delenv(f"TICKETFLOW_KAFKA_{name}", raising=False)
    s = Settings(kafka_bootstrap="h:1")
    assert s.kafka_security_protocol == "PLAINTEXT"
    assert dict(confluent_config(s)) == {"bootstrap.servers": "h:1"}
    assert dict(aiokafka_kwargs(s)) == {"bootstrap_servers": "h:1"}
    assert faust_credentials(s) is None
    assert kafka_security({}) == {}


def test_confluent_config(ca_file: Path) -> None:
    config = confluent_config(secure(ca_file), {"group.id": "g", "linger.ms": 5})
    assert dict(config) == {
        "bootstrap.servers": "127.0.0.1:9094",
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "workers",
        "sasl.password": SECRET,
        "ssl.ca.location": str(ca_file),
        "group.id": "g",
        "linger.ms": 5,
    }


def test_confluent_config_is_accepted_by_librdkafka(ca_file: Path) -> None:
    from confluent_kafka import Producer

    Producer(confluent_config(secure(ca_file), {"log_level": 0})).flush(0)


def test_aiokafka_kwargs(ca_file: Path) -> None:
    kwargs = aiokafka_kwargs(secure(ca_file))
    assert kwargs["security_protocol"] == "SASL_SSL"
    assert kwargs["sasl_mechanism"] == "SCRAM-SHA-512"
    assert kwargs["sasl_plain_username"] == "workers"
    assert kwargs["sasl_plain_password"] == SECRET
    context = kwargs["ssl_context"]
    assert isinstance(context, ssl.SSLContext)
    assert context.check_hostname and context.verify_mode == ssl.CERT_REQUIRED


def test_faust_credentials_reach_aiokafka_as_ours(ca_file: Path) -> None:
    from faust.transport.drivers.aiokafka import credentials_to_aiokafka_auth

    s = secure(ca_file)
    creds = faust_credentials(s)
    assert isinstance(creds, faust.SASLCredentials)
    auth = credentials_to_aiokafka_auth(creds)
    ours = aiokafka_kwargs(s)
    for key in ("security_protocol", "sasl_mechanism", "sasl_plain_username"):
        assert auth[key] == ours[key]
    assert auth["sasl_plain_password"] == SECRET
    assert isinstance(auth["ssl_context"], ssl.SSLContext)


def test_faust_app_takes_the_credentials(ca_file: Path) -> None:
    from streams.app import create_app

    app = create_app(secure(ca_file), app_id="t-kafka-config")
    assert isinstance(app.conf.broker_credentials, faust.SASLCredentials)


def test_password_file(tmp_path: Path) -> None:
    path = tmp_path / "pw"
    path.write_text(SECRET + "\n")
    path.chmod(0o600)
    s = secure(kafka_password=None, kafka_password_file=path)
    assert confluent_config(s)["sasl.password"] == SECRET
    env = {
        "TICKETFLOW_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
        "TICKETFLOW_KAFKA_USERNAME": "ops",
        "TICKETFLOW_KAFKA_PASSWORD_FILE": str(path),
    }
    assert kafka_security(env)["sasl.password"] == SECRET
    assert kafka_security(env)["sasl.username"] == "ops"


def test_unreadable_password_file_names_the_path_not_a_secret(tmp_path: Path) -> None:
    s = secure(kafka_password=None, kafka_password_file=tmp_path / "missing")
    with pytest.raises(KafkaSecurityError, match="missing"):
        confluent_config(s)


def test_settings_from_environment(monkeypatch: pytest.MonkeyPatch, ca_file: Path) -> None:
    monkeypatch.setenv("TICKETFLOW_KAFKA_SECURITY_PROTOCOL", "SASL_SSL")
    monkeypatch.setenv("TICKETFLOW_KAFKA_SASL_MECHANISM", "SCRAM-SHA-512")
    monkeypatch.setenv("TICKETFLOW_KAFKA_USERNAME", "ingest")
    monkeypatch.setenv("TICKETFLOW_KAFKA_PASSWORD", SECRET)
    monkeypatch.setenv("TICKETFLOW_KAFKA_CA_FILE", str(ca_file))
    s = Settings()
    assert s.kafka_username == "ingest"
    assert confluent_config(s)["sasl.password"] == SECRET


@pytest.mark.parametrize(
    "over",
    [{"kafka_username": None}, {"kafka_password": None}, {"kafka_sasl_mechanism": "PLAIN"}],
)
def test_incomplete_security_is_refused(over: dict) -> None:
    with pytest.raises(ValidationError):
        secure(**over)


def test_unknown_protocol_is_refused() -> None:
    with pytest.raises(ValidationError):
        Settings(kafka_security_protocol="SASL_PLAINTEXT")


def test_no_repr_shows_the_password(ca_file: Path, caplog: pytest.LogCaptureFixture) -> None:
    s = secure(ca_file)
    shown = [
        repr(s),
        str(s),
        repr(s.kafka_password),
        str(s.model_dump()),
        repr(confluent_config(s)),
        str(confluent_config(s, {"group.id": "g"})),
        f"{confluent_config(s)}",
        repr(aiokafka_kwargs(s)),
        str(aiokafka_kwargs(s)),
        repr(faust_credentials(s)),
        str(faust_credentials(s)),
        describe(s),
    ]
    with caplog.at_level(logging.INFO):
        logging.getLogger("t").info("config %s %r", confluent_config(s), aiokafka_kwargs(s))
    shown.append(caplog.text)
    for text in shown:
        assert SECRET not in text, text
    assert MASK in repr(confluent_config(s))
    assert "workers" in describe(s)


def test_validation_error_does_not_echo_the_password() -> None:
    with pytest.raises(ValidationError) as info:
        secure(kafka_username=None)
    assert SECRET not in str(info.value)


ROOT = Path(__file__).resolve().parents[2]
# the one builder, the plain-string convenience of the command line's helpers, and the
# gateway (which may not import streams, and adds kafka_security() itself)
BUILDERS = {"streams/kafka_config.py", "ticketflow/kafka_io.py"}


def test_every_client_is_built_through_kafka_config() -> None:
    """A client made from a bare bootstrap would connect without the security settings."""
    bare = []
    for package in (
        "agents",
        "streams",
        "ticketflow",
        "feature_jobs",
        "ingest",
        "inference_gateway",
        "evaluation",
        "training",
    ):
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            lines = path.read_text().splitlines()
            for i, line in enumerate(lines):
                if '"bootstrap.servers"' not in line and "bootstrap_servers=" not in line:
                    continue
                if rel in BUILDERS:
                    continue
                if rel.startswith("inference_gateway/") and "kafka_security()" in "".join(
                    lines[i : i + 2]
                ):
                    continue
                bare.append(f"{rel}:{i + 1}: {line.strip()}")
    assert not bare, "Kafka clients built without streams/kafka_config.py:\n" + "\n".join(bare)
