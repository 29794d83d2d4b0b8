"""Gateway settings: `GatewaySettings` reads the `TICKETFLOW_*` environment (pydantic-settings),
`GatewayConfig` is what the gateway runs with (built from those, or from constructor arguments
in tests and the benchmark, which must not pick up the environment by accident).

The gateway may import only `schemas`, so it reads the shared contract names itself
(docs/architecture.md, "Settings and default ports", "Security") instead of importing
`streams.settings`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Annotated, Any
from urllib.parse import urlparse

from pydantic import BaseModel, BeforeValidator, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from schemas.gateway import PredictInput, PredictRequest

DEFAULT_TRITON_GRPC = "127.0.0.1:8001"
DEFAULT_GATEWAY_URL = "http://127.0.0.1:8088"
DEFAULT_KAFKA_BOOTSTRAP = "127.0.0.1:9092"
TOKEN_ENV = "TICKETFLOW_GATEWAY_TOKEN"


def _max_length(model: type[BaseModel], name: str) -> int:
    for meta in model.model_fields[name].metadata:
        if getattr(meta, "max_length", None) is not None:
            return int(meta.max_length)
    raise LookupError(f"{model.__name__}.{name} has no max_length")


MAX_INPUTS = _max_length(PredictRequest, "inputs")
MAX_TEXT_CHARS = _max_length(PredictInput, "text")
MAX_ID_CHARS = _max_length(PredictInput, "id")
# Bytes one character may take in a legal body: `\uXXXX`, what json.dumps (ensure_ascii, the
# default of Python's json and of aiohttp's `json=`) writes for any non-ASCII BMP character;
# raw UTF-8 takes at most 4. A text made wholly of escaped astral characters (12 bytes each)
# at full length and full batch is the one legal request this does not cover.
_BYTES_PER_CHAR = 6
# `features` is free-form in the schema and unused by the models; the workflow sends a few
# numbers. This is what a batch may carry per input beyond its id and text.
FEATURES_BYTES_PER_INPUT = 4096
# `{"id":"","text":"","features":{}},` plus whitespace a pretty-printer may add
_INPUT_SYNTAX_BYTES = 128
# `{"inputs":[...],"version":"vNN","timeout_ms":60000}` with room for whitespace
_ENVELOPE_BYTES = 1024


def largest_legal_body() -> int:
    """Bytes of the largest request the schema accepts: MAX_INPUTS inputs, each a full-length
    id and text written with escapes, plus the features allowance and JSON syntax."""
    per_input = (
        (MAX_TEXT_CHARS + MAX_ID_CHARS) * _BYTES_PER_CHAR
        + FEATURES_BYTES_PER_INPUT
        + _INPUT_SYNTAX_BYTES
    )
    return MAX_INPUTS * per_input + _ENVELOPE_BYTES


_FALSE = ("0", "false", "no", "off", "")


def _flag(value: Any) -> Any:
    # the rule the hand-written table had (anything but these words is on), kept so that an
    # existing deployment's "yes"/"Y"/"" mean what they meant
    if isinstance(value, str):
        return value.strip().lower() not in _FALSE
    return value


Flag = Annotated[bool, BeforeValidator(_flag)]


def _empty_is_none(value: Any) -> Any:
    # `TICKETFLOW_GATEWAY_TOKEN=` (compose with an unset variable) means "off", not "the
    # empty token", which every caller without a token would match
    if isinstance(value, str) and not value.strip():
        return None
    return value


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
    # largest request body; bigger is refused with 413 from its Content-Length, unread
    max_body_bytes: int = field(default_factory=largest_legal_body)
    # None = no authentication; else every route but /healthz, /readyz, /metrics needs
    # `Authorization: Bearer <token>`
    token: SecretStr | None = field(default=None, repr=False)
    # predict requests being read, parsed or served at once; one more is answered 503 at
    # once. Bounds memory too: each may hold up to max_body_bytes.
    max_concurrent_requests: int = 256

    def __post_init__(self) -> None:
        for name in (
            "max_batch_size",
            "max_queue_size",
            "max_inflight_batches",
            "max_body_bytes",
            "max_concurrent_requests",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_queue_delay_us < 0:
            raise ValueError(f"max_queue_delay_us must be >= 0, got {self.max_queue_delay_us}")
        if self.cache_size < 0 or self.cache_ttl_s < 0:
            raise ValueError("cache_size and cache_ttl_s must be >= 0")
        if isinstance(self.token, str):
            object.__setattr__(self, "token", SecretStr(self.token))
        if self.token is not None and not self.token.get_secret_value():
            raise ValueError("token must not be empty (leave it unset to turn authentication off)")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> GatewayConfig:
        """Settings from the environment (`env`, else os.environ and `.env`); `overrides`
        that are not None win (CLI flags)."""
        settings = GatewaySettings() if env is None else GatewaySettings.from_mapping(env)
        values = settings.gateway_config_values()
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)

    def with_(self, **changes: Any) -> GatewayConfig:
        return replace(self, **changes)


def _default(name: str) -> Any:
    for f in fields(GatewayConfig):
        if f.name == name:
            return f.default_factory() if callable(f.default_factory) else f.default
    raise LookupError(name)


class GatewaySettings(BaseSettings):
    """The gateway's `TICKETFLOW_*` variables, under the names they had before (prefix +
    field name, upper case). `repr` and logs show the token as `**********`."""

    model_config = SettingsConfigDict(env_prefix="TICKETFLOW_", env_file=".env", extra="ignore")

    # shared contract names (docs/architecture.md)
    triton_grpc: str = DEFAULT_TRITON_GRPC
    gateway_url: str = DEFAULT_GATEWAY_URL  # where the gateway listens: its host and port
    kafka_bootstrap: str = DEFAULT_KAFKA_BOOTSTRAP
    topic_prefix: str = ""
    gateway_token: Annotated[SecretStr | None, BeforeValidator(_empty_is_none)] = None
    # the gateway's own knobs
    gateway_routing_watch: Flag = True
    gateway_max_batch_size: int = _default("max_batch_size")
    gateway_max_queue_delay_us: int = _default("max_queue_delay_us")
    gateway_max_queue_size: int = _default("max_queue_size")
    gateway_max_inflight_batches: int = _default("max_inflight_batches")
    gateway_default_timeout_ms: int = _default("default_timeout_ms")
    gateway_adaptive_delay: Flag = _default("adaptive_delay")
    gateway_admission: Flag = _default("admission")
    gateway_cache_size: int = _default("cache_size")
    gateway_cache_ttl_s: float = _default("cache_ttl_s")
    gateway_dedupe: Flag = _default("dedupe")
    gateway_max_body_bytes: int = _default("max_body_bytes")
    gateway_max_concurrent_requests: int = _default("max_concurrent_requests")

    @classmethod
    def from_mapping(cls, env: Mapping[str, str]) -> GatewaySettings:
        """Settings from `env` alone (no os.environ, no `.env`): for tests and tools."""
        prefix = cls.model_config["env_prefix"].lower()
        values = {
            key.lower().removeprefix(prefix): value
            for key, value in env.items()
            if key.lower().startswith(prefix)
        }
        return cls.model_validate({k: v for k, v in values.items() if k in cls.model_fields})

    def gateway_config_values(self) -> dict[str, Any]:
        url = urlparse(self.gateway_url)
        values: dict[str, Any] = {
            "triton_url": self.triton_grpc,
            "host": url.hostname or "127.0.0.1",
            "port": url.port or 8088,
            "kafka_bootstrap": self.kafka_bootstrap if self.gateway_routing_watch else None,
            "topic_prefix": self.topic_prefix,
            "token": self.gateway_token,
        }
        for name in type(self).model_fields:
            short = name.removeprefix("gateway_")
            if name.startswith("gateway_") and short not in ("url", "token", "routing_watch"):
                values[short] = getattr(self, name)
        return values


class _TokenSettings(BaseSettings):
    # the client reads only this: a worker must not fail on a gateway knob it does not use
    model_config = SettingsConfigDict(env_prefix="TICKETFLOW_", env_file=".env", extra="ignore")

    gateway_token: Annotated[SecretStr | None, BeforeValidator(_empty_is_none)] = None


def gateway_token(env: Mapping[str, str] | None = None) -> SecretStr | None:
    """TICKETFLOW_GATEWAY_TOKEN (from `env`, else os.environ and `.env`), for the client."""
    if env is not None:
        return _TokenSettings.model_validate({"gateway_token": env.get(TOKEN_ENV)}).gateway_token
    return _TokenSettings().gateway_token
