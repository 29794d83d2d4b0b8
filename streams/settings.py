"""The settings of every service but the gateway: one typed model, `Settings`, read from
`TICKETFLOW_*` environment variables (or `.env`), with the data layer's and the access layer's
own knobs as nested groups (`settings.features`: TICKETFLOW_FEATURES_*, `settings.ingest`:
TICKETFLOW_INGEST_*), each under the variable names it always had. docs/settings.md lists
every variable; tests/unit/test_settings_doc.py keeps that list complete.

The names and defaults are a contract (docs/architecture.md, "Settings and default
ports"). Secrets are
`SecretStr`: a repr, a log line or a traceback shows '**********'. Nothing is cached: a
service builds its `Settings()` once at start and passes it down.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal
from urllib.parse import urlparse

from pydantic import AliasChoices, Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from streams.redis_config import RedisTarget

REPO_ROOT = Path(__file__).resolve().parent.parent


# ---- the data layer: TICKETFLOW_FEATURES_* --------------------------------------------------
# Kafka, Redis and the topic prefix are the shared ones of `Settings`; these are the knobs only the
# feature jobs, the reader and the drift checks have.


class FeatureSettings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="TICKETFLOW_FEATURES_", env_file=".env", extra="ignore", env_ignore_empty=True
    )

    # every key the data layer writes starts with this (a test or a second deployment on
    # the same Redis takes another)
    key_prefix: str = "tf:fv"
    # the feature job's Faust web port (/metrics, /ready); the workflow worker has 6066
    web_port: int = 6067
    # events per Redis pipeline, and the longest wait to fill one
    batch_size: int = Field(500, ge=1, le=10_000)
    batch_within_s: float = Field(0.05, gt=0)
    # the reader's in-process cache
    cache_ttl_s: float = Field(2.0, ge=0)
    # drift checks: how often, over how many entities, and the least sample worth judging
    drift_period_s: float = Field(300.0, gt=0)
    drift_sample_size: int = Field(500, ge=1)
    drift_min_sample: int = Field(50, ge=1)
    drift_enabled: bool = True
    # the feature views' YAML; unset: feature_jobs/views.yaml (tests name another one)
    views_file: Path | None = None


# ---- the access layer: TICKETFLOW_INGEST_* ---------------------------------------------------
# The shared contract names (docs/architecture.md, "Settings and default ports") are read
# under their own names too, so one environment configures every service, and ingest's own
# name wins.


# the largest batch docs/architecture.md allows
MAX_BATCH = 500


def _shared(name: str) -> AliasChoices:
    # ingest's own name wins over the shared one, so ingest can point elsewhere alone
    return AliasChoices(f"TICKETFLOW_INGEST_{name}", f"TICKETFLOW_{name}")


class IngestSettings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="TICKETFLOW_INGEST_",
        env_file=".env",
        extra="ignore",
        populate_by_name=True,
        env_ignore_empty=True,
    )

    # where clients find ingest (docs/architecture.md); the bind address and port default to its own
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
    # the CA of a rediss:// URL (docs/architecture.md, "Security"); unset: the system's trust store
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


class Settings(BaseSettings):
    # an empty variable is an unset one, as in a shell or a compose file: `FOO=` must not
    # turn an optional path into the current directory
    model_config = SettingsConfigDict(
        env_prefix="TICKETFLOW_", env_file=".env", extra="ignore", env_ignore_empty=True
    )

    kafka_bootstrap: str = "127.0.0.1:9092"
    topic_prefix: str = ""
    partitions: int = Field(4, ge=1, le=256)
    # credentials and TLS go in the URL (rediss://user:pass@host:port/db), so it is a secret:
    # a repr, a log line or a traceback shows '**********'; streams/redis_config.py reads it
    redis_url: SecretStr = SecretStr("redis://127.0.0.1:6379/0")
    # the CA that signed Redis's certificate (rediss:// only); unset: the system's trust store
    redis_ca_file: Path | None = None
    triton_grpc: str = "127.0.0.1:8001"
    triton_http_port: int = 8000
    triton_metrics_port: int = 8002
    # the local stack's Prometheus (devstack/prometheus.py; docs/operations.md)
    prometheus_port: int = Field(9090, ge=1, le=65535)
    gateway_url: str = "http://127.0.0.1:8088"
    state_dir: Path = REPO_ROOT / ".stack"
    # the Faust worker's web port (table views, /metrics); 0 picks a free one
    worker_web_port: int = 6066
    # where the worker's web server listens: loopback here, 0.0.0.0 in a container
    web_bind: str = "127.0.0.1"
    max_record_bytes: int = 64 * 1024
    # the key of the audit records' digest of a ticket's text (HMAC-SHA256, agents/audit.py);
    # unset, and without a key file, a key is generated once in <state_dir>/secrets/audit.key
    audit_key: SecretStr | None = None
    audit_key_file: Path | None = None
    # a dead letter that fails again after this many replays goes to tickets.dlq.parked
    max_replays: int = Field(3, ge=1, le=100)
    # how often the steps commit their input offsets (after their outputs are delivered):
    # it bounds the work a crashed worker redoes, not the latency of a ticket
    commit_interval_s: float = Field(1.0, gt=0, le=10)
    # a stable name per worker (a StatefulSet pod's name) makes it a static member of its
    # consumer group: restarted under the same name it takes its partitions straight back
    # instead of waiting out the session timeout; unset or empty, membership is dynamic
    worker_id: str | None = Field(None, pattern=r"^[A-Za-z0-9._-]{0,128}$")
    # the steps this worker runs, comma-separated (`ticketflow worker --steps`); empty: every
    # step. Without the state-keeping steps it is a pool: a consumer group of its own and no
    # state table (agents/step_selection.py; docs/workflow.md, "Scaling steps on their own")
    worker_steps: str = ""
    workflow_file: Path = REPO_ROOT / "agents" / "workflows" / "ticket_classify.yaml"
    # which workflow each new ticket takes (schemas/selection.py): unset, `selector.yaml`
    # beside the workflow file when there is one; with a selector every definition of its
    # folder is loaded (docs/workflow.md, "Choosing a workflow per ticket, and spot checks")
    workflow_selector_file: Path | None = None
    # the nested groups, read from their own TICKETFLOW_FEATURES_* / TICKETFLOW_INGEST_* names
    features: FeatureSettings = Field(default_factory=lambda: FeatureSettings())
    ingest: IngestSettings = Field(default_factory=lambda: IngestSettings())
    # Kafka controller port of the local single-node KRaft stack
    kafka_controller_port: int = 9093

    # ---- Kafka security (docs/architecture.md "Security"; docs/security.md) ---------------
    # streams/kafka_config.py is the one place that turns these into client configurations
    kafka_security_protocol: Literal["PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    kafka_sasl_mechanism: Literal["SCRAM-SHA-512"] = "SCRAM-SHA-512"
    kafka_username: str | None = None
    # SecretStr: a repr, a log line or a traceback shows '**********'
    kafka_password: SecretStr | None = None
    # read when no password is given (a mounted Kubernetes secret, the stack's 0600 files)
    kafka_password_file: Path | None = None
    # the CA that signed the brokers' certificates; unset: the system's trust store
    kafka_ca_file: Path | None = None

    @model_validator(mode="after")
    def _kafka_security_complete(self) -> Settings:
        # refused here, not at the first connection, where librdkafka only retries forever
        if self.kafka_security_protocol == "SASL_SSL":
            if not self.kafka_username:
                raise ValueError(
                    "TICKETFLOW_KAFKA_SECURITY_PROTOCOL=SASL_SSL needs TICKETFLOW_KAFKA_USERNAME"
                )
            if self.kafka_password is None and self.kafka_password_file is None:
                raise ValueError(
                    "TICKETFLOW_KAFKA_SECURITY_PROTOCOL=SASL_SSL needs TICKETFLOW_KAFKA_PASSWORD "
                    "or TICKETFLOW_KAFKA_PASSWORD_FILE"
                )
        return self

    # ---- end of Kafka security ----------------------------------------------------------------

    @property
    def kafka_host_port(self) -> tuple[str, int]:
        host, _, port = self.kafka_bootstrap.split(",")[0].rpartition(":")
        return host or "127.0.0.1", int(port)

    @model_validator(mode="after")
    def _redis_target_valid(self) -> Settings:
        self.redis  # noqa: B018 -- a bad scheme, or a CA without TLS, refused at start-up
        return self

    @property
    def redis(self) -> RedisTarget:
        """What every Redis client is built from (streams/redis_config.py)."""
        return RedisTarget(self.redis_url, self.redis_ca_file)

    @property
    def redis_host_port(self) -> tuple[str, int]:
        url = urlparse(self.redis_url.get_secret_value())
        return url.hostname or "127.0.0.1", url.port or 6379

    @property
    def triton_grpc_host_port(self) -> tuple[str, int]:
        host, _, port = self.triton_grpc.rpartition(":")
        return host or "127.0.0.1", int(port)

    @property
    def gateway_host_port(self) -> tuple[str, int]:
        url = urlparse(self.gateway_url)
        return url.hostname or "127.0.0.1", url.port or 8088


def get_settings() -> Settings:
    """A fresh `Settings()`: kept for the command line's callers; no hidden cache."""
    return Settings()
