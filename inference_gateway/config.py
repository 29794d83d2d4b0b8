"""Gateway settings: constructor arguments, or `TICKETFLOW_*` environment variables.

The gateway may import only `schemas`, so it reads the shared contract names itself
(DESIGN.md, "Settings and default ports") instead of importing `streams.settings`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import urlparse

DEFAULT_TRITON_GRPC = "127.0.0.1:8001"
DEFAULT_GATEWAY_URL = "http://127.0.0.1:8088"
DEFAULT_KAFKA_BOOTSTRAP = "127.0.0.1:9092"

# gateway-only knobs, beyond the shared contract names: env var -> (field, type)
_TUNING_ENV: dict[str, tuple[str, type]] = {
    "TICKETFLOW_GATEWAY_MAX_BATCH_SIZE": ("max_batch_size", int),
    "TICKETFLOW_GATEWAY_MAX_QUEUE_DELAY_US": ("max_queue_delay_us", int),
    "TICKETFLOW_GATEWAY_MAX_QUEUE_SIZE": ("max_queue_size", int),
    "TICKETFLOW_GATEWAY_MAX_INFLIGHT_BATCHES": ("max_inflight_batches", int),
    "TICKETFLOW_GATEWAY_DEFAULT_TIMEOUT_MS": ("default_timeout_ms", int),
    "TICKETFLOW_GATEWAY_ADAPTIVE_DELAY": ("adaptive_delay", bool),
    "TICKETFLOW_GATEWAY_ADMISSION": ("admission", bool),
    "TICKETFLOW_GATEWAY_CACHE_SIZE": ("cache_size", int),
    "TICKETFLOW_GATEWAY_CACHE_TTL_S": ("cache_ttl_s", float),
    "TICKETFLOW_GATEWAY_DEDUPE": ("dedupe", bool),
}
_FALSE = ("0", "false", "no", "off", "")


def _parse(value: str, kind: type) -> object:
    if kind is bool:
        return value.strip().lower() not in _FALSE
    return kind(value)


@dataclass(frozen=True)
class GatewayConfig:
    triton_url: str = DEFAULT_TRITON_GRPC
    host: str = "127.0.0.1"
    port: int = 8088
    # keep <= the Triton model's max_batch_size (64 for ticket_classifier)
    max_batch_size: int = 32
    max_queue_delay_us: int = 2000
    max_queue_size: int = 1024
    max_inflight_batches: int = 2
    # used when a request carries no timeout_ms
    default_timeout_ms: int = 1000
    # size the batch wait from the measured batch cost (see batcher.py) instead of always
    # waiting up to max_queue_delay_us
    adaptive_delay: bool = False
    # refuse at once a request whose deadline the queue cannot meet (see batcher.py)
    admission: bool = True
    # response cache: entries (0 = off) and their lifetime; identical inputs in flight share
    # one computation (dedupe)
    cache_size: int = 10_000
    cache_ttl_s: float = 300.0
    dedupe: bool = True
    # the routing config's topic: None = no watcher (tests, the bench); from_env sets it
    kafka_bootstrap: str | None = None
    topic_prefix: str = ""
    # a passed /readyz probe is trusted this long, so probes don't load Triton
    ready_cache_s: float = 5.0
    # on SIGTERM: how long admitted requests may take to finish
    shutdown_grace_s: float = 30.0
    # largest request body; 1024 inputs of 20,000 characters fit
    max_body_bytes: int = 128 * 1024 * 1024

    def __post_init__(self) -> None:
        for name in ("max_batch_size", "max_queue_size", "max_inflight_batches"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_queue_delay_us < 0:
            raise ValueError(f"max_queue_delay_us must be >= 0, got {self.max_queue_delay_us}")
        if self.cache_size < 0 or self.cache_ttl_s < 0:
            raise ValueError("cache_size and cache_ttl_s must be >= 0")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> GatewayConfig:
        """Settings from the environment; `overrides` that are not None win (CLI flags)."""
        env = os.environ if env is None else env
        url = urlparse(env.get("TICKETFLOW_GATEWAY_URL", DEFAULT_GATEWAY_URL))
        values: dict[str, Any] = {
            "triton_url": env.get("TICKETFLOW_TRITON_GRPC", DEFAULT_TRITON_GRPC),
            "host": url.hostname or "127.0.0.1",
            "port": url.port or 8088,
        }
        if env.get("TICKETFLOW_GATEWAY_ROUTING_WATCH", "1").strip().lower() not in _FALSE:
            values["kafka_bootstrap"] = env.get(
                "TICKETFLOW_KAFKA_BOOTSTRAP", DEFAULT_KAFKA_BOOTSTRAP
            )
        values["topic_prefix"] = env.get("TICKETFLOW_TOPIC_PREFIX", "")
        for var, (name, kind) in _TUNING_ENV.items():
            if var in env:
                values[name] = _parse(env[var], kind)
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)

    def with_(self, **changes: Any) -> GatewayConfig:
        return replace(self, **changes)
