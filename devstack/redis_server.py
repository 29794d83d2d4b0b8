"""A local `redis-server` on the host and port of `redis_url`, data in `<state>/redis`.

Persistence is an append-only file (no RDB snapshots) so that what the feature jobs wrote survives
`stack down`/`up` together with the Kafka data it was derived from.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from pathlib import Path

from streams.settings import Settings

from .process import StackError, log_path, log_tail, logs_dir

NAME = "redis"
DEFAULT_TIMEOUT_S = 20.0
STOP_TIMEOUT_S = 15.0
APT_INSTALL = "apt-get update && apt-get install -y redis-server"

log = logging.getLogger("devstack")


def redis_dir(settings: Settings) -> Path:
    return Path(settings.state_dir) / "redis"


def host(settings: Settings) -> str:
    return settings.redis_host_port[0]


def ports(settings: Settings) -> tuple[int, ...]:
    return (settings.redis_host_port[1],)


def find_redis_server() -> str | None:
    found = shutil.which("redis-server")
    if found:
        return found
    for candidate in (
        "/usr/bin/redis-server",
        "/usr/sbin/redis-server",
        "/usr/local/bin/redis-server",
    ):
        if os.access(candidate, os.X_OK):
            return candidate
    return None


def ensure_redis_server(settings: Settings) -> str:
    """The redis-server binary; installed with apt-get (as root on Debian) when missing."""
    found = find_redis_server()
    if found:
        return found
    if shutil.which("apt-get") is None or os.geteuid() != 0:
        raise StackError(f"redis-server is not installed; install it with `{APT_INSTALL}`")
    apt_log = logs_dir(settings) / "apt-redis.log"
    apt_log.parent.mkdir(parents=True, exist_ok=True)
    log.info("redis: installing redis-server with apt-get (log: %s)", apt_log)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    with apt_log.open("ab") as fh:
        for cmd in (["apt-get", "update"], ["apt-get", "install", "-y", "redis-server"]):
            rc = subprocess.run(
                cmd, stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT, env=env
            ).returncode
            if rc != 0:
                raise StackError(
                    f"`{' '.join(cmd)}` failed (rc={rc}); see {apt_log}:\n" + log_tail(apt_log, 10)
                )
    found = find_redis_server()
    if found is None:
        raise StackError(f"redis-server is still missing after apt-get; see {apt_log}")
    return found


def server_args(settings: Settings, binary: str = "redis-server") -> list[str]:
    host, port = settings.redis_host_port
    return [
        binary,
        "--bind",
        host,
        "--port",
        str(port),
        "--dir",
        str(redis_dir(settings)),
        "--daemonize",
        "no",  # we detach it ourselves and keep its pid
        "--supervised",
        "no",
        "--logfile",
        "",  # stdout, which goes to <state>/logs/redis.log
        "--save",
        "",
        "--appendonly",
        "yes",
        "--appendfsync",
        "everysec",
        "--protected-mode",
        "yes",
    ]


def prepare(settings: Settings) -> None:
    redis_dir(settings).mkdir(parents=True, exist_ok=True)


def command(settings: Settings) -> tuple[list[str], dict[str, str] | None]:
    return server_args(settings, ensure_redis_server(settings)), None


def log_file(settings: Settings) -> Path:
    return log_path(settings, NAME)


def healthy(settings: Settings, timeout_s: float = 1.0) -> bool:
    """True when the server answers PING (not while it is still loading its data)."""
    import redis

    from streams.redis_config import sync_client

    client = sync_client(settings.redis, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False
    finally:
        client.close()


def after_start(settings: Settings, timeout_s: float) -> None:
    return None
