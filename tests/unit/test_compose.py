import shutil
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def test_compose_file_passes_the_compose_specification_schema():
    exe = shutil.which("check-jsonschema") or str(Path(sys.executable).parent / "check-jsonschema")
    proc = subprocess.run(
        [exe, "--builtin-schema", "vendor.compose-spec", str(ROOT / "docker-compose.yml")],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_compose_has_every_service_and_triton_reserves_a_gpu():
    spec = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = spec["services"]
    assert {"kafka", "redis", "triton", "gateway", "worker", "prometheus"} <= set(services)
    devices = services["triton"]["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["capabilities"] == ["gpu"]


def _spec() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def test_ingest_serves_8090_as_its_own_kafka_principal():
    spec = _spec()
    ingest = spec["services"]["ingest"]
    assert ingest["command"] == ["ticketflow", "ingest"]
    assert "8090:8090" in ingest["ports"]
    env = ingest["environment"]
    assert env["TICKETFLOW_INGEST_PORT"] == "8090"
    assert env["TICKETFLOW_INGEST_HOST"] == "0.0.0.0"  # inside its container, for the port
    assert env["TICKETFLOW_KAFKA_USERNAME"] == "ingest"
    assert env["TICKETFLOW_KAFKA_PASSWORD_FILE"] == "/run/secrets/kafka_ingest_password"
    assert {"kafka_ingest_password", "kafka_ca"} <= set(ingest["secrets"])
    assert "readyz" in " ".join(ingest["healthcheck"]["test"])
    assert ingest["depends_on"]["kafka-users"] == {"condition": "service_completed_successfully"}


def test_kafka_has_a_sasl_ssl_listener_that_every_service_uses():
    spec = _spec()
    services = spec["services"]
    kafka = services["kafka"]["environment"]
    assert "SASL_SSL://:9094" in kafka["KAFKA_LISTENERS"]
    assert "SASL_SSL://kafka:9094" in kafka["KAFKA_ADVERTISED_LISTENERS"]
    assert "SASL_SSL:SASL_SSL" in kafka["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"]
    assert kafka["KAFKA_SASL_ENABLED_MECHANISMS"] == "SCRAM-SHA-512"
    assert kafka["KAFKA_SSL_KEYSTORE_LOCATION"] == "/run/secrets/kafka_broker"
    assert "kafka_broker" in services["kafka"]["secrets"]
    assert "9092" not in " ".join(services["kafka"].get("ports", []))  # plaintext stays inside
    for name in ("worker", "features", "ingest", "gateway"):
        env = services[name]["environment"]
        assert env["TICKETFLOW_KAFKA_BOOTSTRAP"] == "kafka:9094", name
        assert env["TICKETFLOW_KAFKA_SECURITY_PROTOCOL"] == "SASL_SSL", name
        assert env["TICKETFLOW_KAFKA_CA_FILE"] == "/run/secrets/kafka_ca", name
        assert "TICKETFLOW_KAFKA_PASSWORD" not in env, name  # only the file, from a secret
        secret = env["TICKETFLOW_KAFKA_PASSWORD_FILE"].removeprefix("/run/secrets/")
        assert secret in services[name]["secrets"], name
    users = services["kafka-users"]
    assert "kafka-configs.sh" in users["command"][0] and "SCRAM-SHA-512" in users["command"][0]


def test_secrets_are_files_and_the_gateway_token_comes_from_one():
    spec = _spec()
    secrets = spec["secrets"]
    for name in ("kafka_ca", "kafka_broker", "kafka_worker_password", "kafka_ingest_password",
                 "kafka_admin_password", "gateway_token", "audit_key"):  # fmt: skip
        assert secrets[name]["file"].startswith("./deploy/secrets/"), name
    used = {s for svc in spec["services"].values() for s in svc.get("secrets", [])}
    assert used <= set(secrets)
    assert "deploy/secrets/" in (ROOT / ".gitignore").read_text().splitlines()
    for name in ("gateway", "worker"):
        svc = spec["services"][name]
        assert "gateway_token" in svc["secrets"]
        assert "TICKETFLOW_GATEWAY_TOKEN" not in svc["environment"]
        assert "/run/secrets/gateway_token" in " ".join(svc["entrypoint"])
    assert spec["services"]["worker"]["environment"]["TICKETFLOW_AUDIT_KEY_FILE"] == (
        "/run/secrets/audit_key"
    )
    assert "audit_key" in spec["services"]["worker"]["secrets"]
