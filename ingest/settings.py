"""Ingest's settings: `TICKETFLOW_INGEST_*` environment variables (or `.env`).

The shared contract names (DESIGN.md, "Settings and default ports") are read under their
own names, so one environment configures every service; the Redis URL may carry a password
(`redis://user:pass@host`), so it is a `SecretStr` and never shows in a `repr` or a log.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlparse

from pydantic import AliasChoices, Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from streams.redis_config import RedisTarget

# the largest batch DESIGN.md allows
MAX_BATCH = 500


def _shared(name: str) -> AliasChoices:
    # ingest's own name wins over the shared one, so ingest can point elsewhere alone
    return AliasChoices(f"TICKETFLOW_INGEST_{name}", f"TICKETFLOW_{name}")


class IngestSettings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="TICKETFLOW_INGEST_", env_file=".env", extra="ignore", populate_by_name=True
    )

    # where clients find ingest (DESIGN.md); the bind address and port default to its own
    url: str = "http://127.0.0.1:8090"
    host: str = "127.0.0.1"
    port: int = Field(8090, ge=0, le=65535)
    # the base of the status URLs in answers (e.g. https://tickets.example.com behind a
    # proxy); empty: a path alone (a Host header is the caller's word, never echoed)
    public_url: str = ""

    kafka_bootstrap: str = Field("127.0.0.1:9092", validation_alias=_shared("KAFKA_BOOTSTRAP"))
    topic_prefix: str = Field("", validation_alias=_shared("TOPIC_PREFIX"))
    redis_url: SecretStr = Field(
        SecretStr("redis://127.0.0.1:6379/0"), validation_alias=_shared("REDIS_URL")
    )
    # the CA of a rediss:// URL (DESIGN.md, "Security"); unset: the system's trust store
    redis_ca_file: Path | None = Field(None, validation_alias=_shared("REDIS_CA_FILE"))
    # every Redis key ingest and `ticketflow keys|limits` use starts with this
    redis_prefix: str = "ticketflow:ingest:"

    # a body not received within this is refused (408): a client trickling it holds a
    # request open for no more than this
    body_timeout_s: float = Field(15.0, gt=0, le=300)
    # a request body above this is refused (413) before it is parsed: 500 tickets of ~8 KiB
    body_limit_bytes: int = Field(4 * 1024 * 1024, ge=1024, le=64 * 1024 * 1024)
    batch_max: int = Field(MAX_BATCH, ge=1, le=MAX_BATCH)
    # one ticket's record on tickets.in; the worker dead-letters anything larger, so ingest
    # refuses it up front (the same default as TICKETFLOW_MAX_RECORD_BYTES)
    max_record_bytes: int = Field(64 * 1024, ge=1024, validation_alias=_shared("MAX_RECORD_BYTES"))

    # how long an Idempotency-Key's response is kept for replay
    idempotency_ttl_s: int = Field(24 * 3600, ge=60)
    # how long an index entry (owner, state, result) of a submitted ticket is kept
    ticket_ttl_s: int = Field(7 * 24 * 3600, ge=60)

    # the broker's ack must come within this, else 503 (librdkafka's message.timeout.ms)
    produce_timeout_s: float = Field(5.0, gt=0, le=300)
    # how long a key looked up in Redis is trusted locally: bounds how late a revocation
    # takes effect on an instance that has the key cached
    key_cache_s: float = Field(2.0, ge=0, le=60)
    # Redis down: whether keys known within the last `stale_key_s` keep working (open) or
    # every request gets 503 (closed, the default: no authentication without Redis)
    auth_fail_open: bool = False
    stale_key_s: float = Field(300.0, ge=0)
    # Redis down: whether requests pass without rate limiting (open) or get 503 (closed)
    limits_fail_open: bool = False
    # Redis calls give up after this: an outage must fail requests fast, not hang them
    redis_timeout_s: float = Field(0.5, gt=0, le=30)

    # default token buckets, until `ticketflow limits set` stores others in Redis
    key_rate: float = Field(200.0, gt=0)
    key_burst: int = Field(400, ge=1)
    ip_rate: float = Field(400.0, gt=0)
    ip_burst: int = Field(800, ge=1)
    # proxies in front of ingest whose X-Forwarded-For entries are trusted (0: none, the
    # peer's address is the client's)
    trusted_proxies: int = Field(0, ge=0, le=10)

    # index the results of submitted tickets (tickets.out.*, tickets.dlq) into Redis
    index_results: bool = True
    # the worker's web server, asked for the live state of a ticket not yet done; empty:
    # http://127.0.0.1:<TICKETFLOW_WORKER_WEB_PORT>; "off": never asked
    worker_url: str = ""
    worker_web_port: int = Field(6066, validation_alias=_shared("WORKER_WEB_PORT"))

    @model_validator(mode="after")
    def _bind_from_url(self) -> IngestSettings:
        url = urlparse(self.url)
        if "host" not in self.model_fields_set and url.hostname:
            self.host = url.hostname
        if "port" not in self.model_fields_set and url.port:
            self.port = url.port
        return self

    @property
    def redis(self) -> RedisTarget:
        """What ingest's Redis clients are built from (streams/redis_config.py)."""
        return RedisTarget(self.redis_url, self.redis_ca_file)

    @property
    def live_state_url(self) -> str | None:
        if self.worker_url == "off":
            return None
        return self.worker_url.rstrip("/") or f"http://127.0.0.1:{self.worker_web_port}"
