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

# gateway-only integer knobs, beyond the shared contract names: env var -> field
_TUNING_ENV = {
    "TICKETFLOW_GATEWAY_MAX_BATCH_SIZE": "max_batch_size",
    "TICKETFLOW_GATEWAY_MAX_QUEUE_DELAY_US": "max_queue_delay_us",
    "TICKETFLOW_GATEWAY_MAX_QUEUE_SIZE": "max_queue_size",
    "TICKETFLOW_GATEWAY_MAX_INFLIGHT_BATCHES": "max_inflight_batches",
    "TICKETFLOW_GATEWAY_DEFAULT_TIMEOUT_MS": "default_timeout_ms",
}


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
        for var, name in _TUNING_ENV.items():
            if var in env:
                values[name] = int(env[var])
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)

    def with_(self, **changes: Any) -> GatewayConfig:
        return replace(self, **changes)
