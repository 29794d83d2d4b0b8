"""Settings shared by every service, read from `TICKETFLOW_*` environment variables (or `.env`).

The names and defaults are a contract (DESIGN.md, "Settings and default ports").
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Literal
from urllib.parse import urlparse

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from streams.redis_config import RedisTarget

REPO_ROOT = Path(__file__).resolve().parent.parent


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TICKETFLOW_", env_file=".env", extra="ignore")

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
    # state table (agents/pools.py; docs/workflow.md, "Scaling steps on their own")
    worker_steps: str = ""
    workflow_file: Path = REPO_ROOT / "agents" / "workflows" / "ticket_classify.yaml"
    # Kafka controller port of the local single-node KRaft stack
    kafka_controller_port: int = 9093

    # ---- Kafka security (DESIGN.md "Security"; docs/security.md) -----------------------------
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


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
