"""The gateway's HTTP API on aiohttp (docs/architecture.md, "Inference gateway API").

    POST /v1/models/{model}/predict   PredictRequest -> PredictResponse, or an error body
    GET  /healthz                     the process is alive
    GET  /readyz                      Triton is ready and a real test inference passed
    GET  /metrics                     Prometheus text format

Errors are `{"error": {"code", "message", "retryable"}}` with the code's HTTP status. On
SIGTERM the gateway drains: new predicts get 503 MODEL_UNAVAILABLE (retryable, so callers
go elsewhere or retry), admitted ones finish, then it exits.

Security (docs/inference.md, "Security"): with a token set, every route but the probes and
/metrics needs `Authorization: Bearer <token>` (401 otherwise); a body over
`max_body_bytes` is refused with 413 from its Content-Length, unread; more than
`max_concurrent_requests` predicts at once get 503 with Retry-After at once; parsing and
normalising a large request run in a thread, so the loop keeps answering; error bodies
never repeat the caller's input nor Triton's words.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import logging
import signal
import sys
from typing import Any

import orjson
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

from inference_gateway import metrics, tracing
from inference_gateway.cache import build_tables as cache_tables
from inference_gateway.config import GatewayConfig
from inference_gateway.errors import ErrorCode, GatewayError, register_secret
from inference_gateway.parsing import parse_predict, parse_predict_sliced
from inference_gateway.routing import Router
from inference_gateway.routing_watch import RoutingWatcher, routing_topic
from inference_gateway.service import InferenceBackend, InferenceService
from inference_gateway.triton import TritonClient

log = logging.getLogger(__name__)

SERVICE = web.AppKey("service", InferenceService)


class _RequestLimit:
    """Predicts being read, parsed or served; past `limit`, the next is refused at once."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.active = 0


LIMIT = web.AppKey("request_limit", _RequestLimit)

# bodies up to this size are parsed on the loop (~0.1 ms): a thread hand-off costs more;
# up to _ONE_CALL_BODY_BYTES in a thread in one call (~1 ms of GIL), beyond that in pieces
_INLINE_BODY_BYTES = 64 * 1024
_ONE_CALL_BODY_BYTES = 1024 * 1024
# answered without a token, so orchestrators and Prometheus need no secret; they carry no
# ticket data (docs/inference.md, "Security")
OPEN_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})
RETRY_AFTER_S = 1


def create_app(
    config: GatewayConfig,
    backend: InferenceBackend | None = None,
    router: Router | None = None,
) -> web.Application:
    """The aiohttp application; `backend` defaults to a `TritonClient` at `config.triton_url`."""
    service = InferenceService(backend or TritonClient(config.triton_url), config, router)
    middlewares = []
    if config.token is not None:
        register_secret(config.token.get_secret_value())
        middlewares.append(_bearer_auth(config.token.get_secret_value()))
    app = web.Application(client_max_size=config.max_body_bytes, middlewares=middlewares)
    app[SERVICE] = service
    app[LIMIT] = _RequestLimit(config.max_concurrent_requests)
    app.router.add_post("/v1/models/{model}/predict", predict)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", prometheus_metrics)
    app.on_startup.append(_build_text_tables)
    app.on_cleanup.append(_close_service)
    return app


async def _build_text_tables(app: web.Application) -> None:
    # ~0.2 s of Unicode tables, built before serving rather than in the first request
    await asyncio.to_thread(cache_tables)


async def _close_service(app: web.Application) -> None:
    await app[SERVICE].close()


def json_response(
    payload: Any, status: int = 200, headers: dict[str, str] | None = None
) -> web.Response:
    return web.Response(
        body=orjson.dumps(payload), status=status, content_type="application/json", headers=headers
    )


def error_response(
    error: GatewayError, status: int | None = None, headers: dict[str, str] | None = None
) -> web.Response:
    return json_response(error.to_body(), status=status or error.http_status, headers=headers)


def _bearer_auth(token: str) -> Any:
    expected = token.encode("utf-8")

    @web.middleware
    async def bearer_auth(request: web.Request, handler: Any) -> web.StreamResponse:
        header = request.headers.get("Authorization")
        if request.path in OPEN_PATHS or _authorized(header, expected):
            return await handler(request)
        # the body is never read: an unauthenticated caller costs no parsing
        body = {
            "error": {
                "code": "UNAUTHORIZED",
                "message": "missing or invalid bearer token",
                "retryable": False,
            }
        }
        headers = {"WWW-Authenticate": 'Bearer realm="ticketflow-gateway"'}
        return json_response(body, status=401, headers=headers)

    return bearer_auth


def _authorized(header: str | None, expected: bytes) -> bool:
    scheme, _, credentials = (header or "").strip().partition(" ")
    given = credentials.strip().encode("utf-8", "replace")
    # compare_digest's time depends only on the lengths, never on where the bytes differ
    return scheme.lower() == "bearer" and hmac.compare_digest(given, expected)


async def predict(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    limit = request.app[LIMIT]
    model = request.match_info["model"]
    # only known names become label values: a caller must not grow the metric without bound
    label = model if model in service.router.models else "unknown"
    if limit.active >= limit.limit:
        metrics.REQUESTS.labels(label, "concurrency_limit").inc()
        error = GatewayError(
            ErrorCode.MODEL_UNAVAILABLE,
            f"the gateway is serving its limit of {limit.limit} requests; retry shortly",
        )
        return error_response(error, headers={"Retry-After": str(RETRY_AFTER_S)})
    limit.active += 1
    try:
        with tracing.server_span(request.headers, label) as span:
            response = await _predict(request, service, model, label)
            if span is not None and response.status != 200:
                tracing.failed(span, str(response.status))
            return response
    finally:
        limit.active -= 1


async def _predict(
    request: web.Request, service: InferenceService, model: str, label: str
) -> web.Response:
    try:
        chunks = await _read_body(request, service.config.max_body_bytes)
        size = sum(map(len, chunks))
        if size <= _INLINE_BODY_BYTES:
            parsed = parse_predict(b"".join(chunks))
        elif size <= _ONE_CALL_BODY_BYTES:
            parsed = await asyncio.to_thread(lambda: parse_predict(b"".join(chunks)))
        else:
            parsed = await asyncio.to_thread(parse_predict_sliced, chunks)
        payload = await service.predict(model, parsed)
    except BodyTooLarge as error:
        metrics.REQUESTS.labels(label, error.code.value).inc()
        return error_response(error, status=413)
    except GatewayError as error:
        metrics.REQUESTS.labels(label, error.code.value).inc()
        return error_response(error)
    except Exception:
        # the traceback is for the operator; the caller gets a fixed sentence
        log.exception("predict for %s failed", label)
        metrics.REQUESTS.labels(label, ErrorCode.INTERNAL.value).inc()
        return error_response(GatewayError(ErrorCode.INTERNAL, "unexpected gateway error"))
    metrics.REQUESTS.labels(label, "ok").inc()
    return json_response(payload)


class BodyTooLarge(GatewayError):
    def __init__(self, limit: int) -> None:
        super().__init__(
            ErrorCode.INVALID_INPUT,
            f"request body larger than {limit} bytes (the largest legal batch); "
            "send fewer inputs per request",
        )


async def _read_body(request: web.Request, limit: int) -> list[bytes]:
    """The body as the chunks it came in: joining (or aiohttp's `read()`, which grows one
    bytearray) copies tens of MB while holding the loop; the parser takes the pieces."""
    # refused from its declared length, before a byte of it is read or buffered
    if request.content_length is not None and request.content_length > limit:
        raise BodyTooLarge(limit)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.content.iter_any():
        size += len(chunk)
        if size > limit:  # a chunked body, or one longer than it said
            raise BodyTooLarge(limit)
        chunks.append(chunk)
    return chunks


async def healthz(request: web.Request) -> web.Response:
    return json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    ready, report = await request.app[SERVICE].readiness()
    return json_response(report, status=200 if ready else 503)


async def prometheus_metrics(request: web.Request) -> web.Response:
    return web.Response(
        body=generate_latest(REGISTRY), headers={"Content-Type": CONTENT_TYPE_LATEST}
    )


class GatewayServer:
    """The app bound to `config.host`:`config.port` (0 picks a free port), with a drain on stop."""

    def __init__(
        self,
        config: GatewayConfig,
        backend: InferenceBackend | None = None,
        router: Router | None = None,
    ) -> None:
        self.config = config
        self.app = create_app(config, backend, router)
        self._runner = web.AppRunner(self.app, handle_signals=False, access_log=None)
        self.port: int | None = None
        self.watcher: RoutingWatcher | None = None
        if config.kafka_bootstrap:
            self.watcher = RoutingWatcher(
                self.service.router,
                config.kafka_bootstrap,
                routing_topic(config.topic_prefix),
            )
            watcher = self.watcher
            self.service.routing_status = lambda: dataclasses.asdict(watcher.status)

    @property
    def service(self) -> InferenceService:
        return self.app[SERVICE]

    @property
    def url(self) -> str:
        return f"http://{self.config.host}:{self.port}"

    async def start(self) -> None:
        if self.watcher is not None:
            # read config.routing to its end (bounded) so the first requests follow it
            caught_up = await asyncio.to_thread(self.watcher.start)
            if not caught_up:
                log.warning(
                    "routing: %s not read within %.0f s (Kafka at %s); serving with the "
                    "configs at hand (for now: all to each default version)",
                    self.watcher.topic,
                    self.watcher.initial_timeout_s,
                    self.watcher.bootstrap,
                )
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.config.host, self.config.port, reuse_address=True)
        await site.start()
        self.port = self._runner.addresses[0][1]
        log.info("gateway listening on %s, Triton at %s", self.url, self.config.triton_url)

    async def stop(self) -> None:
        """Drain (503 to new predicts, admitted ones finish), then close everything."""
        await self.service.drain(self.config.shutdown_grace_s)
        await self._runner.cleanup()
        if self.watcher is not None:
            await asyncio.to_thread(self.watcher.stop)

    async def __aenter__(self) -> GatewayServer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()


# how long the loop may wait for the GIL while a thread parses or normalises a large
# request (CPython's default is 5 ms: /healthz then took ~6 ms p50 during such a request)
GIL_SWITCH_INTERVAL_S = 0.001


def tune_interpreter() -> None:
    """Process-wide settings for a gateway process (not for processes that embed one)."""
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)


async def serve(config: GatewayConfig, backend: InferenceBackend | None = None) -> None:
    """Run until SIGTERM or SIGINT, then drain and return."""
    tune_interpreter()
    tracing.configure("ticketflow-gateway")  # only with an OTLP endpoint (docs/tracing.md)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with GatewayServer(config, backend):
        await stop.wait()
        log.info("signal received: draining")
    log.info("gateway stopped")


def run(host: str | None = None, port: int | None = None, **overrides: Any) -> None:
    """Serve with settings from the environment; arguments that are not None win."""
    asyncio.run(serve(GatewayConfig.from_env(host=host, port=port, **overrides)))
