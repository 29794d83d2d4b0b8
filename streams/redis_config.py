"""The one place a Redis client is built (docs/architecture.md, "Security (contract for settings)").

Credentials and TLS travel in `TICKETFLOW_REDIS_URL` (`rediss://user:pass@host:port/db`) and
the CA in `TICKETFLOW_REDIS_CA_FILE`. Every client of the project (the feature job, reader and
drift checks, ingest's stores and result index, the benchmarks, the stack's health check) is
built here, so a scheme, a user, a password or a CA is honoured by all of them or by none.

The URL holds the password, so it is passed around as a `SecretStr` inside a `RedisTarget`
whose repr shows the URL without it; `redacted()` is what may go in a log line.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

from pydantic import SecretStr

if TYPE_CHECKING:
    import redis
    import redis.asyncio as aioredis

SCHEMES = ("redis", "rediss", "unix")


@dataclass(frozen=True)
class RedisTarget:
    """A Redis URL (secret: it may hold a password) and the CA that signed its certificate."""

    url: SecretStr
    ca_file: Path | None = None

    def __post_init__(self) -> None:
        if isinstance(self.url, str):  # callers (tests, benchmarks) may hand a plain URL
            object.__setattr__(self, "url", SecretStr(self.url))
        scheme = urlsplit(self.url.get_secret_value()).scheme
        if scheme not in SCHEMES:
            raise ValueError(f"Redis URL scheme {scheme!r}: expected one of {', '.join(SCHEMES)}")
        if self.ca_file is not None and scheme != "rediss":
            # a CA with a plain URL would connect in clear text while the operator meant TLS
            raise ValueError(
                "TICKETFLOW_REDIS_CA_FILE is set but TICKETFLOW_REDIS_URL is not rediss://"
            )

    def __repr__(self) -> str:
        return f"RedisTarget({redacted(self.url)!r}, ca_file={self.ca_file!r})"

    __str__ = __repr__

    @property
    def tls(self) -> bool:
        return urlsplit(self.url.get_secret_value()).scheme == "rediss"

    def with_db(self, db: int) -> RedisTarget:
        """The same server and credentials, another database (benchmarks use their own)."""
        u = urlsplit(self.url.get_secret_value())
        url = urlunsplit((u.scheme, u.netloc, f"/{db}", u.query, ""))
        return replace(self, url=SecretStr(url))


Target = RedisTarget | SecretStr | str


def target(value: Target, ca_file: Path | str | None = None) -> RedisTarget:
    if isinstance(value, RedisTarget):
        return value if ca_file is None else replace(value, ca_file=Path(ca_file))
    return RedisTarget(
        value if isinstance(value, SecretStr) else SecretStr(value),
        None if ca_file is None else Path(ca_file),
    )


def redacted(url: SecretStr | str) -> str:
    """The URL with its password replaced: what may be logged or shown."""
    raw = url.get_secret_value() if isinstance(url, SecretStr) else url
    u = urlsplit(raw)
    if u.password is None:
        return raw
    host = u.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = f"{u.username or ''}:***@{host}" + (f":{u.port}" if u.port else "")
    return urlunsplit((u.scheme, netloc, u.path, u.query, u.fragment))


def tls_context(ca_file: Path | str | None) -> ssl.SSLContext:
    """Verify the server's certificate and name, against `ca_file` or the system's store."""
    return ssl.create_default_context(cafile=None if ca_file is None else str(ca_file))


def connection_kwargs(value: Target, **overrides: Any) -> dict[str, Any]:
    """redis-py's connection arguments for the target (host, credentials, db, TLS), as
    `from_url` would make them, plus the CA and `overrides` (timeouts, retry)."""
    from redis.connection import parse_url

    t = target(value)
    kwargs: dict[str, Any] = dict(parse_url(t.url.get_secret_value()))
    kwargs.pop("connection_class", None)
    if t.tls:
        kwargs.setdefault("ssl_cert_reqs", "required")
        if t.ca_file is not None:
            kwargs["ssl_ca_certs"] = str(t.ca_file)
    kwargs.update(overrides)
    return kwargs


def async_client(value: Target, **overrides: Any) -> aioredis.Redis:
    """A redis.asyncio client for the target (`overrides`: socket_timeout, retry, ...)."""
    import redis.asyncio as aioredis

    t = target(value)
    return aioredis.Redis.from_url(t.url.get_secret_value(), **_ssl_extras(t), **overrides)


def sync_client(value: Target, **overrides: Any) -> redis.Redis:
    """A blocking redis-py client for the target."""
    import redis

    t = target(value)
    return redis.Redis.from_url(t.url.get_secret_value(), **_ssl_extras(t), **overrides)


def _ssl_extras(t: RedisTarget) -> dict[str, Any]:
    # only for rediss://: a plain Connection refuses ssl_* arguments
    if not t.tls:
        return {}
    extras: dict[str, Any] = {"ssl_cert_reqs": "required"}
    if t.ca_file is not None:
        extras["ssl_ca_certs"] = str(t.ca_file)
    return extras


@dataclass(frozen=True)
class Endpoint:
    """What a hand-written RESP connection needs (feature_jobs/resp.py, ingest/redis_mux.py)."""

    host: str
    port: int
    db: int
    username: str | None
    password: SecretStr | None
    ssl: ssl.SSLContext | None = field(default=None, compare=False)


def endpoint(value: Target) -> Endpoint:
    t = target(value)
    kw = connection_kwargs(t)
    if "path" in kw:
        raise ValueError("a unix socket URL has no host and port")
    password = kw.get("password")
    return Endpoint(
        host=kw.get("host") or "127.0.0.1",
        port=int(kw.get("port") or 6379),
        db=int(kw.get("db") or 0),
        username=kw.get("username") or None,
        password=None if password is None else SecretStr(password),
        ssl=tls_context(t.ca_file) if t.tls else None,
    )
