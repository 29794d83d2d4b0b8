"""The secured local Redis (`ticketflow stack up --secure`): TLS only, ACL users, no `default`.

A stack part of its own (`redis-secure`) beside the plain Redis: a second redis-server with
`tls-port` (6380; TICKETFLOW_REDIS_SECURE_PORT) and `port 0`, so nothing is served in clear
text, its data in `<state>/redis-secure/`. Secrets are made once, at the first start, in
`<state>/redis-secure/secrets/` (a 0700 folder, 0600 files): a CA and the server's key and
certificate (openssl), one password per user, and one `<user>.env` per user holding the
`TICKETFLOW_REDIS_URL` (rediss://user:password@host:port/0) and `TICKETFLOW_REDIS_CA_FILE`
a client of that user needs. The ACL file holds SHA-256 hashes of the passwords, never the
passwords; nothing here prints or logs one.

Users, least privilege on the key patterns ticketflow uses (the settings' prefixes, read
when the ACL file is written at each start):

| user | keys | commands |
| --- | --- | --- |
| `worker` | `tf:fv*` read only | connection, read (the `features` step's reader) |
| `features` | `tf:fv*` | connection, read, write, keyspace, scripting; nothing dangerous |
| `ingest` | `ticketflow:ingest:*` | the same, and TIME (the rate-limit script's clock) |
| `admin` | all | all: the stack's health check and operators |
| `default` | | off: a client without credentials is refused |
"""

from __future__ import annotations

import hashlib
import logging
import os
import secrets
from pathlib import Path

from streams.redis_config import RedisTarget, sync_client
from streams.settings import Settings

from . import certs, kafka, redis_server
from .process import log_path

NAME = "redis-secure"
DEFAULT_TIMEOUT_S = redis_server.DEFAULT_TIMEOUT_S
STOP_TIMEOUT_S = redis_server.STOP_TIMEOUT_S
DEFAULT_PORT = 6380
ADMIN = "admin"
USERS = ("worker", "features", "ingest", ADMIN)
# what a service may run; -@dangerous after the categories takes back what they would give
# too much of (KEYS, FLUSHDB, CONFIG, DEBUG, CLIENT KILL, ...)
_APP = "-@all +@connection +@read +@write +@keyspace +@scripting -@dangerous"

log = logging.getLogger("devstack")


# --- settings and paths ----------------------------------------------------------------------


def port() -> int:
    return int(os.environ.get("TICKETFLOW_REDIS_SECURE_PORT", DEFAULT_PORT))


def root_dir(settings: Settings) -> Path:
    return Path(settings.state_dir) / "redis-secure"


def secrets_dir(settings: Settings) -> Path:
    return root_dir(settings) / "secrets"


def ca_file(settings: Settings) -> Path:
    return secrets_dir(settings) / "ca.pem"


def password_file(settings: Settings, user: str) -> Path:
    return secrets_dir(settings) / f"{user}.password"


def env_file(settings: Settings, user: str) -> Path:
    return secrets_dir(settings) / f"{user}.env"


def host(settings: Settings) -> str:
    return settings.redis_host_port[0]


def ports(settings: Settings) -> tuple[int, ...]:
    return (port(),)


def url(settings: Settings, user: str, password: str | None = None, db: int = 0) -> str:
    """The rediss:// URL of `user` (with its password unless one is given: a test's wrong one)."""
    if password is None:
        password = password_file(settings, user).read_text().strip()
    netloc = f"{user}:{password}@" if user else ""
    return f"rediss://{netloc}{host(settings)}:{port()}/{db}"


def target(settings: Settings, user: str, db: int = 0) -> RedisTarget:
    return RedisTarget(url(settings, user, db=db), ca_file(settings))


def client_env(settings: Settings, user: str) -> dict[str, str]:
    """The TICKETFLOW_REDIS_* variables of a client of the secured Redis, as `user`."""
    return {
        "TICKETFLOW_REDIS_URL": url(settings, user),
        "TICKETFLOW_REDIS_CA_FILE": str(ca_file(settings)),
    }


def acl_rules(settings: Settings) -> dict[str, str]:
    """Each user's ACL rules, without its password."""
    from feature_jobs.settings import FeatureSettings
    from ingest.settings import IngestSettings

    features = FeatureSettings().key_prefix
    ingest = IngestSettings().redis_prefix
    return {
        "default": "off resetkeys resetchannels -@all",
        "worker": f"resetkeys resetchannels %R~{features}* -@all +@connection +@read -@dangerous",
        "features": f"resetkeys resetchannels ~{features}* {_APP}",
        "ingest": f"resetkeys resetchannels ~{ingest}* {_APP} +time",
        ADMIN: "resetkeys resetchannels ~* &* +@all",
    }


# --- secrets ---------------------------------------------------------------------------------


def ensure_secrets(settings: Settings) -> Path:
    """Make what is missing: the passwords, the CA, the server's key and certificate."""
    root = secrets_dir(settings)
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(0o700)
    for user in USERS:
        if not password_file(settings, user).exists():
            # hex: nothing a URL would need escaped
            kafka.write_private(password_file(settings, user), secrets.token_hex(24) + "\n")
    if not (root / "ca.pem").exists() or not (root / "ca.key").exists():
        (root / "server.pem").unlink(missing_ok=True)  # signed by the CA being replaced
        certs.make_ca(root, "ticketflow local Redis CA")
    if not (root / "server.pem").exists():
        certs.sign_server(root, "server", "ticketflow-redis", host(settings), "serverAuth")
    for user in USERS:
        env = "".join(f"{k}={v}\n" for k, v in client_env(settings, user).items())
        kafka.write_private(env_file(settings, user), env)
    return root


def write_acl(settings: Settings) -> Path:
    """The ACL file, from the rules and the passwords' SHA-256 (never the passwords)."""
    lines = []
    for user, rules in acl_rules(settings).items():
        if user == "default":
            lines.append(f"user default {rules}")
            continue
        password = password_file(settings, user).read_text().strip()
        digest = hashlib.sha256(password.encode()).hexdigest()
        lines.append(f"user {user} on #{digest} {rules}")
    path = secrets_dir(settings) / "users.acl"
    kafka.write_private(path, "\n".join(lines) + "\n")
    return path


# --- the part --------------------------------------------------------------------------------


def server_args(settings: Settings, binary: str = "redis-server") -> list[str]:
    root, sec = root_dir(settings), secrets_dir(settings)
    return [
        binary,
        "--bind", host(settings),
        "--port", "0",  # no clear-text listener at all
        "--tls-port", str(port()),
        "--tls-cert-file", str(sec / "server.pem"),
        "--tls-key-file", str(sec / "server.key"),
        "--tls-ca-cert-file", str(sec / "ca.pem"),
        # clients prove who they are with their ACL password, not a certificate
        "--tls-auth-clients", "no",
        "--aclfile", str(sec / "users.acl"),
        "--dir", str(root / "data"),
        "--daemonize", "no",
        "--supervised", "no",
        "--logfile", "",
        "--save", "",
        "--appendonly", "yes",
        "--appendfsync", "everysec",
        "--protected-mode", "yes",
    ]  # fmt: skip


def prepare(settings: Settings) -> None:
    (root_dir(settings) / "data").mkdir(parents=True, exist_ok=True)
    ensure_secrets(settings)
    write_acl(settings)


def command(settings: Settings) -> tuple[list[str], dict[str, str] | None]:
    return server_args(settings, redis_server.ensure_redis_server(settings)), None


def log_file(settings: Settings) -> Path:
    return log_path(settings, NAME)


def healthy(settings: Settings, timeout_s: float = 1.0) -> bool:
    """True when the server answers PING over TLS to the admin user."""
    import redis

    if not password_file(settings, ADMIN).exists() or not ca_file(settings).exists():
        return False
    try:
        client = sync_client(
            target(settings, ADMIN), socket_timeout=timeout_s, socket_connect_timeout=timeout_s
        )
        return bool(client.ping())
    except (redis.RedisError, OSError):
        return False


def after_start(settings: Settings, timeout_s: float) -> None:
    return None
