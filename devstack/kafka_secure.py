"""The secured local broker (`ticketflow stack up --secure`): SASL_SSL with SCRAM-SHA-512,
TLS from a CA made here, Kafka's StandardAuthorizer with no access unless an ACL grants it.

It is a stack part of its own (`kafka-secure`), beside the plain broker: its own ports
(9094, controller 9095; TICKETFLOW_KAFKA_SECURE_PORT / _SECURE_CONTROLLER_PORT), its own
configuration and data in `<state>/kafka-secure/`, the same jars. Secrets are made once, at
the first start, in `<state>/kafka-secure/secrets/` (a 0700 folder, 0600 files): the CA and
the broker's key, one password per principal, and one `<user>.env` per principal naming the
password *file*. Nothing here prints or logs a password.

Principals (docs/security.md has the table): `admin` (super user: the stack's own checks,
topic creation, ACLs), `worker` (workers and the feature job), `ingest`, `ops` (the command
line: DLQ, routing config, reviews). SCRAM users are created when the storage is formatted
(the StorageTool's --add-scram), so the broker never runs a moment without them; ACLs go in
through the Admin API once the broker is up, for the settings' topic prefix (`grant` does it
again for another prefix, as the integration tests do).

KRaft's controller listener cannot use SCRAM (its credentials live in the metadata it
serves), so it stays PLAINTEXT on loopback and its principal, User:ANONYMOUS, is a super
user, as Kafka's documentation requires for a PLAINTEXT controller listener.
"""

from __future__ import annotations

import logging
import os
import secrets
from pathlib import Path

from streams.kafka_config import confluent_config
from streams.settings import Settings

from . import certs, kafka
from .process import StackError, log_path

NAME = "kafka-secure"
DEFAULT_TIMEOUT_S = kafka.DEFAULT_TIMEOUT_S
STOP_TIMEOUT_S = kafka.STOP_TIMEOUT_S

PORT = int(os.environ.get("TICKETFLOW_KAFKA_SECURE_PORT", "9094"))
CONTROLLER_PORT = int(os.environ.get("TICKETFLOW_KAFKA_SECURE_CONTROLLER_PORT", "9095"))
MECHANISM = "SCRAM-SHA-512"
ADMIN = "admin"
USERS = (ADMIN, "worker", "ingest", "ops")

log = logging.getLogger("devstack")


# --- settings and paths ----------------------------------------------------------------------


def secrets_dir(settings: Settings) -> Path:
    return Path(settings.state_dir) / "kafka-secure" / "secrets"


def password_file(settings: Settings, user: str) -> Path:
    return secrets_dir(settings) / f"{user}.password"


def ca_file(settings: Settings) -> Path:
    return secrets_dir(settings) / "ca.pem"


def env_file(settings: Settings, user: str) -> Path:
    return secrets_dir(settings) / f"{user}.env"


def secure_settings(settings: Settings, user: str = ADMIN) -> Settings:
    """`settings` pointed at the secured broker, as `user` (admin by default)."""
    host = settings.kafka_host_port[0]
    return settings.model_copy(
        update={
            "kafka_bootstrap": f"{host}:{PORT}",
            "kafka_controller_port": CONTROLLER_PORT,
            "kafka_security_protocol": "SASL_SSL",
            "kafka_sasl_mechanism": MECHANISM,
            "kafka_username": user,
            "kafka_password": None,
            "kafka_password_file": password_file(settings, user),
            "kafka_ca_file": ca_file(settings),
        }
    )


def client_env(settings: Settings, user: str) -> dict[str, str]:
    """The TICKETFLOW_KAFKA_* variables of a client of the secured broker, as `user`."""
    s = secure_settings(settings, user)
    return {
        "TICKETFLOW_KAFKA_BOOTSTRAP": s.kafka_bootstrap,
        "TICKETFLOW_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
        "TICKETFLOW_KAFKA_SASL_MECHANISM": MECHANISM,
        "TICKETFLOW_KAFKA_USERNAME": user,
        "TICKETFLOW_KAFKA_PASSWORD_FILE": str(password_file(settings, user)),
        "TICKETFLOW_KAFKA_CA_FILE": str(ca_file(settings)),
    }


# --- secrets ---------------------------------------------------------------------------------


def ensure_secrets(settings: Settings) -> Path:
    """Make what is missing: the passwords, the CA, the broker's certificate and keystore."""
    root = secrets_dir(settings)
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(0o700)
    for user in (*USERS, "keystore"):
        path = password_file(settings, user)
        if not path.exists():
            # hex: no character a JAAS string or a properties file would need escaped
            kafka.write_private(path, secrets.token_hex(24) + "\n")
    if not (root / "ca.pem").exists() or not (root / "ca.key").exists():
        # a new CA invalidates the broker's certificate: both are made again
        (root / "broker.p12").unlink(missing_ok=True)
        certs.make_ca(root, "ticketflow local CA")
    if not (root / "broker.p12").exists():
        certs.sign_server(
            root, "broker", "ticketflow-kafka", settings.kafka_host_port[0],
            "serverAuth,clientAuth",
        )  # fmt: skip
        # PKCS12: Java reads it natively; a PEM keystore file would need an encrypted key
        certs.openssl(
            "pkcs12", "-export", "-in", "broker.pem", "-inkey", "broker.key",
            "-certfile", "ca.pem", "-name", "broker", "-out", "broker.p12",
            "-passout", f"file:{password_file(settings, 'keystore')}", cwd=root,
        )  # fmt: skip
        (root / "broker.p12").chmod(0o600)
        for leftover in ("broker.csr", "broker.ext", "broker.key"):
            (root / leftover).unlink(missing_ok=True)
    for user in USERS:
        env = client_env(settings, user)
        kafka.write_private(env_file(settings, user), "".join(f"{k}={v}\n" for k, v in env.items()))
    return root


def _password(settings: Settings, user: str) -> str:
    return password_file(settings, user).read_text().strip()


# --- broker configuration --------------------------------------------------------------------


def secure_properties(s: Settings, props: dict[str, str]) -> dict[str, str]:
    """The plain broker's properties with the SASL_SSL listener, TLS and the authorizer.

    `s` is already the secured settings (`secure_settings`)."""
    host, port = s.kafka_host_port
    controller = f"127.0.0.1:{s.kafka_controller_port}"
    admin_password = _password(s, ADMIN)
    jaas = (
        "org.apache.kafka.common.security.scram.ScramLoginModule required "
        f'username="{ADMIN}" password="{admin_password}";'
    )
    props = dict(props)
    props.update(
        {
            "listeners": f"SASL_SSL://{host}:{port},CONTROLLER://{controller}",
            "advertised.listeners": f"SASL_SSL://{host}:{port}",
            "inter.broker.listener.name": "SASL_SSL",
            "listener.security.protocol.map": "SASL_SSL:SASL_SSL,CONTROLLER:PLAINTEXT",
            "sasl.enabled.mechanisms": MECHANISM,
            "sasl.mechanism.inter.broker.protocol": MECHANISM,
            "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config": jaas,
            "ssl.keystore.type": "PKCS12",
            "ssl.keystore.location": str(secrets_dir(s) / "broker.p12"),
            "ssl.keystore.password": _password(s, "keystore"),
            # the broker's own inter-broker client checks the certificate like any client
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(ca_file(s)),
            "ssl.endpoint.identification.algorithm": "https",
            "ssl.client.auth": "none",
            "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "allow.everyone.if.no.acl.found": "false",
            # ANONYMOUS: the PLAINTEXT controller listener's principal (loopback only)
            "super.users": f"User:{ADMIN};User:ANONYMOUS",
            # a client that fails authentication is answered after a pause, not at once
            "connection.failed.authentication.delay.ms": "100",
        }
    )
    return props


def scram_format_args(s: Settings) -> list[str]:
    """`--add-scram` for every user: SCRAM credentials written into the first metadata."""
    args: list[str] = []
    for user in USERS:
        args += ["--add-scram", f"{MECHANISM}=[name={user},password={_password(s, user)}]"]
    return args


# --- ACLs ------------------------------------------------------------------------------------


def acl_bindings(prefix: str) -> list[object]:
    """Least privilege for the three service principals, for topics under `prefix`."""
    from confluent_kafka.admin import (
        AclBinding,
        AclOperation,
        AclPermissionType,
        ResourcePatternType,
        ResourceType,
    )

    op = AclOperation
    lit, pre = ResourcePatternType.LITERAL, ResourcePatternType.PREFIXED

    def allow(user: str, rtype: ResourceType, name: str, pattern, ops) -> list[AclBinding]:
        return [
            AclBinding(rtype, name, pattern, f"User:{user}", "*", o, AclPermissionType.ALLOW)
            for o in ops
        ]

    topic, group, txn, cluster = (
        ResourceType.TOPIC,
        ResourceType.GROUP,
        ResourceType.TRANSACTIONAL_ID,
        ResourceType.BROKER,
    )
    rw = (op.READ, op.WRITE, op.DESCRIBE)
    own = (op.READ, op.WRITE, op.CREATE, op.DESCRIBE, op.DESCRIBE_CONFIGS)
    p = prefix
    out: list[AclBinding] = []
    # worker: every pipeline topic, Faust's own (changelogs: `<prefix>ticketflow-…`), their
    # groups and the router's transactional ids (`<prefix>ticketflow-route-<n>`)
    for name in (f"{p}tickets.", f"{p}ticketflow", f"{p}features."):
        out += allow("worker", topic, name, pre, own)
    out += allow("worker", topic, f"{p}config.routing", lit, (op.READ, op.DESCRIBE))
    out += allow("worker", group, f"{p}ticketflow", pre, (op.READ, op.DESCRIBE))
    out += allow("worker", txn, f"{p}ticketflow", pre, (op.WRITE, op.DESCRIBE))
    out += allow("worker", cluster, "kafka-cluster", lit, (op.IDEMPOTENT_WRITE,))
    # ingest: writes tickets.in and nothing else; reads the results it indexes
    out += allow("ingest", topic, f"{p}tickets.in", lit, (op.WRITE, op.DESCRIBE))
    for name in (f"{p}tickets.out.", f"{p}tickets.dlq"):
        out += allow("ingest", topic, name, pre, (op.READ, op.DESCRIBE))
    out += allow("ingest", group, f"{p}ticketflow-ingest-index", lit, (op.READ, op.DESCRIBE))
    out += allow("ingest", cluster, "kafka-cluster", lit, (op.IDEMPOTENT_WRITE,))
    # ops: dead letters, routing config, reviews; replay writes back to the failed step
    for name in (f"{p}tickets.dlq", f"{p}config.routing", f"{p}tickets.review.decisions"):
        out += allow("ops", topic, name, pre if name.endswith("dlq") else lit, rw)
    out += allow("ops", topic, f"{p}tickets.out.", pre, (op.READ, op.DESCRIBE))
    # `ticketflow review stats|spot-checks` read the spot-check copies and the outcomes
    out += allow("ops", topic, f"{p}tickets.review.", pre, (op.READ, op.DESCRIBE))
    out += allow("ops", topic, f"{p}tickets.step.", pre, (op.WRITE, op.DESCRIBE))
    out += allow("ops", topic, f"{p}tickets.in", lit, (op.WRITE, op.DESCRIBE))
    for name in (f"{p}ticketflow-dlq-replay", "ticketflow-cli-", "ticketflow-config-cli"):
        out += allow("ops", group, name, pre, (op.READ, op.DESCRIBE))
    out += allow("ops", cluster, "kafka-cluster", lit, (op.IDEMPOTENT_WRITE,))
    return out


def grant(settings: Settings, prefix: str | None = None, timeout_s: float = 30) -> int:
    """Create the ACLs for `prefix` (default: the settings' topic prefix), as admin; returns
    how many bindings were asked for (creating an existing one is a no-op)."""
    from confluent_kafka.admin import AdminClient

    s = secure_settings(settings)
    bindings = acl_bindings(settings.topic_prefix if prefix is None else prefix)
    admin = AdminClient(confluent_config(s, {"log_level": 0}))
    for future in admin.create_acls(bindings, request_timeout=timeout_s).values():
        future.result()
    return len(bindings)


# --- part interface (devstack) -------------------------------------------------------


def host(settings: Settings) -> str:
    return kafka.host(secure_settings(settings))


def ports(settings: Settings) -> tuple[int, ...]:
    return PORT, CONTROLLER_PORT


def prepare(settings: Settings) -> None:
    s = secure_settings(settings)
    formatted = (kafka.data_dir(s) / "meta.properties").exists()
    if formatted and not all(password_file(settings, u).exists() for u in USERS):
        raise StackError(
            f"the secured broker's storage exists but its secrets in {secrets_dir(settings)} "
            f"do not: remove {kafka.kafka_dir(s)} to start it afresh"
        )
    ensure_secrets(settings)
    kafka.ensure_libs(s)
    write_config(s)
    kafka.ensure_formatted(s, scram_format_args(s))


def write_config(s: Settings) -> None:
    """Write the secured broker's properties: the plain broker's, locked down."""
    kafka.write_config(s, secure_properties(s, kafka.server_properties(s)))


def command(settings: Settings) -> tuple[list[str], dict[str, str] | None]:
    return kafka.command(secure_settings(settings))


def log_file(settings: Settings) -> Path:
    return log_path(settings, NAME)


def healthy(settings: Settings, timeout_s: float = 3.0) -> bool:
    if not password_file(settings, ADMIN).exists():
        return False
    return kafka.healthy(secure_settings(settings), timeout_s)


def create_topics(settings: Settings, prefix: str | None = None) -> None:
    """The default workflow's topics under `prefix`, made as admin: the service principals
    may not create the ones they only read or write (config.routing, tickets.in)."""
    from agents.definition import load_definition
    from streams.admin import ensure_topics, pipeline_topics
    from streams.topics import Topics

    s = secure_settings(settings)
    if prefix is not None:
        s = s.model_copy(update={"topic_prefix": prefix})
    definition = load_definition(s.workflow_file)
    steps = [step.name for step in definition.steps]
    ensure_topics(s, pipeline_topics(Topics(s.topic_prefix), steps, definition.routes))


def after_start(settings: Settings, timeout_s: float) -> None:
    kafka.verify_transactions(secure_settings(settings), timeout_s=max(60.0, timeout_s))
    n = grant(settings)
    create_topics(settings)
    log.info(
        "%s: SASL_SSL on %s, %d ACL bindings for prefix %r; credentials (values not shown) "
        "in %s: <user>.env for admin, worker, ingest, ops",
        NAME,
        secure_settings(settings).kafka_bootstrap,
        n,
        settings.topic_prefix,
        secrets_dir(settings),
    )
