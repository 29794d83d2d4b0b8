"""Ingest's HTTP API on aiohttp (docs/architecture.md, "Access layer: HTTP ingest").

    POST /v1/tickets             a Ticket or {"tickets": [...]} -> 202 / 207, or a problem
    GET  /v1/tickets/{ticket_id} the ticket's state, and its result once done
    GET  /healthz /readyz /metrics /openapi.json

A request to /v1 is checked in this order, each step before the costlier next one:
the API key (401), one token from the key's and the client IP's buckets (429), the scope
(403), the media type (415), the body's size from Content-Length and then while reading
(413, before any parsing), the Idempotency-Key (409, 422, or the stored response), the
JSON (415) and each ticket (400); then the records are produced and the answer waits for
the broker. Every error is a problem+json (ingest.problems).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest
from pydantic import TypeAdapter, ValidationError
from redis.exceptions import RedisError

from ingest import metrics
from ingest.http_fields import (
    Bucket,
    bearer_token,
    client_ip,
    parse_idempotency_key,
    ratelimit_fields,
)
from ingest.idempotency import StoredResponse, fingerprint
from ingest.index import ticket_view
from ingest.keys import KeyRecord
from ingest.openapi import document
from ingest.problems import Problem, ProblemError
from ingest.service import (
    KAFKA_RETRY_AFTER_S,
    IngestService,
    Outcome,
    buckets_of,
    kafka_unavailable,
    limited,
    redis_unavailable,
)
from ingest.settings import IngestSettings
from ingest.tickets import Rejected, parse_submission
from schemas.tickets import TicketId
from streams.admin import ensure_topics
from streams.settings import Settings
from streams.topics import Topics

log = logging.getLogger(__name__)

SERVICE = web.AppKey("service", IngestService)
OPENAPI = web.AppKey("openapi", bytes)
BUCKETS = web.RequestKey("buckets", tuple)
REALM = 'Bearer realm="ticketflow-ingest"'
_TICKET_ID = TypeAdapter(TicketId)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def json_response(payload: Any, status: int = 200, headers: dict | None = None) -> web.Response:
    return web.Response(
        body=orjson.dumps(payload),
        status=status,
        content_type="application/json",
        headers=headers,
    )


# ---- middleware: problems, metrics, rate-limit fields -------------------------------------------


@web.middleware
async def observe(request: web.Request, handler: Handler) -> web.StreamResponse:
    start = time.perf_counter()
    resource = request.match_info.route.resource
    route = resource.canonical if resource is not None else "unmatched"
    try:
        response = await handler(request)
    except ProblemError as error:
        response = error.problem.response()
    except web.HTTPException as error:  # aiohttp's own: unknown path, wrong method
        response = _http_problem(error)
    except Exception:
        log.exception("%s %s failed", request.method, route)
        response = Problem(500, "internal").response()
    if not request.content.at_eof():
        # refused before its body was read (401, 413, 429, ...): close rather than let
        # aiohttp read the rest of a body that may be endless
        response.force_close()
    buckets: tuple[Bucket, ...] = request.get(BUCKETS, ())
    for name, value in ratelimit_fields(buckets).items():
        response.headers.setdefault(name, value)
    status = str(response.status)
    metrics.REQUESTS.labels(route, request.method, status).inc()
    metrics.REQUEST_SECONDS.labels(route, request.method).observe(time.perf_counter() - start)
    return response


def _http_problem(error: web.HTTPException) -> web.Response:
    kinds = {404: "not-found", 405: "method-not-allowed", 413: "body-too-large"}
    kind = kinds.get(error.status, "invalid-request" if error.status < 500 else "internal")
    headers = {"Allow": error.headers["Allow"]} if "Allow" in error.headers else {}
    return Problem(error.status, kind).response(headers)


# ---- the checks before a handler's work --------------------------------------------------------


async def admit(request: web.Request, scope: str) -> KeyRecord:
    """The caller's key, once it is known, within quota and allowed `scope`."""
    service = request.app[SERVICE]
    token = bearer_token(request.headers.get("Authorization"))
    key = await service.authenticate(token)
    ip = client_ip(
        request.remote, request.headers.get("X-Forwarded-For"), service.settings.trusted_proxies
    )
    verdict = await service.take(ip, key)
    request[BUCKETS] = buckets_of(verdict)
    if verdict is not None and not verdict.allowed:
        raise limited(verdict)
    if key is None:
        challenge = REALM + (', error="invalid_token"' if token else "")
        detail = "the API key is unknown or revoked" if token else "no Bearer API key"
        raise ProblemError(
            Problem(401, "unauthorized", detail, headers={"WWW-Authenticate": challenge})
        )
    if not key.allows(scope):
        challenge = f'{REALM}, error="insufficient_scope", scope="{scope}"'
        raise ProblemError(
            Problem(
                403,
                "forbidden",
                f"this needs the {scope} scope",
                headers={"WWW-Authenticate": challenge},
            )
        )
    return key


def check_media_type(request: web.Request) -> None:
    charset = request.charset
    if request.content_type != "application/json" or (charset and charset.lower() != "utf-8"):
        raise ProblemError(
            Problem(
                415,
                "unsupported-media-type",
                "send application/json (UTF-8)",
                headers={"Accept-Post": "application/json"},
            )
        )


async def read_body(request: web.Request, limit: int, timeout_s: float) -> bytes:
    """The body, refused (413) as soon as it is known to be over `limit` bytes, or (408)
    when it has not all arrived within `timeout_s`."""
    if request.content_length is not None and request.content_length > limit:
        raise _too_large(limit)
    try:
        return await asyncio.wait_for(_read(request, limit), timeout_s)
    except asyncio.TimeoutError:
        raise ProblemError(
            Problem(408, "body-timeout", f"the body took over {timeout_s:g} s")
        ) from None


async def _read(request: web.Request, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.content.iter_any():
        size += len(chunk)
        if size > limit:
            raise _too_large(limit)
        chunks.append(chunk)
    return b"".join(chunks)


def _too_large(limit: int) -> ProblemError:
    return ProblemError(Problem(413, "body-too-large", f"the body is over {limit} bytes"))


# ---- handlers ---------------------------------------------------------------------------------


async def submit(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    settings = service.settings
    key = await admit(request, "submit")
    check_media_type(request)
    body = await read_body(request, settings.body_limit_bytes, settings.body_timeout_s)
    raw_key = request.headers.get("Idempotency-Key")
    if raw_key is None:
        return await _submit(request, key, body)
    idem_key = parse_idempotency_key(raw_key)
    if idem_key is None:
        raise ProblemError(
            Problem(
                400,
                "invalid-request",
                "the Idempotency-Key is malformed",
                [{"pointer": "", "detail": "bad Idempotency-Key header"}],
            )
        )
    return await _idempotent(request, key, body, idem_key)


async def _idempotent(
    request: web.Request, key: KeyRecord, body: bytes, idem_key: str
) -> web.Response:
    store = request.app[SERVICE].idempotency
    slot = store.key(key.id, idem_key)
    fp = fingerprint(request.method, request.path, body)
    try:
        claim = await store.acquire(slot, fp)
    except RedisError:
        metrics.REDIS_FAILURES.labels("idempotency", "closed").inc()
        raise redis_unavailable() from None
    if claim.outcome == "mismatch":
        raise ProblemError(
            Problem(
                422, "idempotency-key-reused", "this Idempotency-Key was used with another payload"
            )
        )
    if claim.outcome == "inflight":
        raise ProblemError(
            Problem(
                409,
                "idempotency-key-in-flight",
                "the first request with this Idempotency-Key is not done",
            )
        )
    if claim.stored is not None:
        return _replay(claim.stored)
    try:
        response = await _submit(request, key, body)
    except ProblemError as error:
        response = error.problem.response()
    except BaseException:
        await _quietly(store.release(slot, fp))
        raise
    if response.status >= 500 or response.headers.get("Retry-After"):
        await _quietly(store.release(slot, fp))  # "try again" is not an answer to keep
    else:
        await _quietly(store.complete(slot, fp, _stored(response)))
    return response


def _stored(response: web.Response) -> StoredResponse:
    kept = {k: response.headers[k] for k in ("traceparent",) if k in response.headers}
    body = response.body  # bytes for every response ingest makes; a streamed one keeps none
    kept_body = bytes(body) if isinstance(body, (bytes, bytearray)) else b""
    return StoredResponse(response.status, response.content_type, kept_body, kept)


def _replay(stored: StoredResponse) -> web.Response:
    return web.Response(
        body=stored.body,
        status=stored.status,
        content_type=stored.content_type,
        headers={**stored.headers, "Idempotent-Replayed": "true"},
    )


async def _quietly(call: Awaitable[Any]) -> None:
    try:
        await call
    except Exception as exc:  # the in-flight mark expires on its own
        log.warning("idempotency store: %s", type(exc).__name__)


async def _submit(request: web.Request, key: KeyRecord, body: bytes) -> web.Response:
    service = request.app[SERVICE]
    s = service.settings
    sub = parse_submission(body, s.batch_max, s.max_record_bytes)
    if not sub.batch and isinstance(sub.items[0], Rejected):
        raise ProblemError(sub.items[0].problem)
    outcome = await service.submit(key, sub, request.headers.get("traceparent"))
    return _answer(outcome)


def _answer(out: Outcome) -> web.Response:
    headers = {"traceparent": out.traceparent}
    if out.accepted and not out.rejected:
        return json_response(out.body(), 202, headers)
    if not out.batch:  # one ticket, refused after parsing: its own problem is the answer
        return out.rejected[0][1].response(headers)
    if not out.accepted and out.undelivered == len(out.rejected):
        return kafka_unavailable().response(headers)
    if out.retryable:
        headers["Retry-After"] = str(KAFKA_RETRY_AFTER_S)
    return json_response(out.body(), 207, headers)


async def get_ticket(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    key = await admit(request, "read")
    ticket_id = request.match_info["ticket_id"]
    entry = None
    if _valid_ticket_id(ticket_id):
        entry = await service.lookup(ticket_id, key)
    if entry is None:
        raise ProblemError(Problem(404, "not-found", "no such ticket for this API key"))
    live = await service.live_state(ticket_id, entry)
    return json_response(ticket_view(ticket_id, entry, live))


def _valid_ticket_id(ticket_id: str) -> bool:
    try:
        _TICKET_ID.validate_python(ticket_id)
    except ValidationError:
        return False
    return True


async def healthz(request: web.Request) -> web.Response:
    return json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    report = await request.app[SERVICE].readiness()
    return json_response(report, 200 if report["ready"] else 503)


async def prometheus_metrics(request: web.Request) -> web.Response:
    return web.Response(
        body=generate_latest(REGISTRY), headers={"Content-Type": CONTENT_TYPE_LATEST}
    )


async def openapi(request: web.Request) -> web.Response:
    return web.Response(body=request.app[OPENAPI], content_type="application/json")


# ---- the app and the server --------------------------------------------------------------------


def create_app(settings: IngestSettings, service: IngestService | None = None) -> web.Application:
    app = web.Application(middlewares=[observe], client_max_size=settings.body_limit_bytes)
    app[SERVICE] = service or IngestService(settings)
    app[OPENAPI] = orjson.dumps(document(settings))
    app.router.add_post("/v1/tickets", submit)
    app.router.add_get("/v1/tickets/{ticket_id}", get_ticket)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", prometheus_metrics)
    app.router.add_get("/openapi.json", openapi)
    app.on_startup.append(_start_service)
    app.on_cleanup.append(_close_service)
    return app


async def _start_service(app: web.Application) -> None:
    await app[SERVICE].start()


async def _close_service(app: web.Application) -> None:
    await app[SERVICE].close()


def ensure_input_topic(settings: IngestSettings) -> None:
    """Create tickets.in with the deployment's partition count if it is missing.

    Best effort: a broker that is away now only means 503s until it is back, and a broker
    that lets ingest create nothing (least privilege) has the topic already.
    """
    shared = Settings().model_copy(update={"kafka_bootstrap": settings.kafka_bootstrap})
    try:
        ensure_topics(shared, {Topics(settings.topic_prefix).tickets_in: {}}, timeout_s=5)
    except Exception as exc:
        log.warning("could not check tickets.in (%s); producing anyway", type(exc).__name__)


class IngestServer:
    """The app bound to `settings.host`:`settings.port` (0 picks a free port)."""

    def __init__(self, settings: IngestSettings, service: IngestService | None = None) -> None:
        self.settings = settings
        self.app = create_app(settings, service)
        self._runner = web.AppRunner(self.app, handle_signals=False, access_log=None)
        self.port: int | None = None

    @property
    def service(self) -> IngestService:
        return self.app[SERVICE]

    @property
    def url(self) -> str:
        return f"http://{self.settings.host}:{self.port}"

    async def start(self) -> None:
        await asyncio.to_thread(ensure_input_topic, self.settings)
        await self._runner.setup()
        site = web.TCPSite(
            self._runner,
            self.settings.host,
            self.settings.port,
            reuse_address=True,
            shutdown_timeout=self.settings.produce_timeout_s + 5,
        )
        await site.start()
        self.port = self._runner.addresses[0][1]
        log.info("ingest listening on %s, topic %s", self.url, self.service.topics.tickets_in)

    async def stop(self) -> None:
        await self._runner.cleanup()

    async def __aenter__(self) -> IngestServer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()


async def serve(settings: IngestSettings) -> None:
    """Run until SIGTERM or SIGINT; requests in flight finish (their acks awaited)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with IngestServer(settings):
        await stop.wait()
        log.info("signal received: stopping")


def run(settings: IngestSettings) -> None:
    try:
        import uvloop
    except ImportError:
        asyncio.run(serve(settings))
        return
    uvloop.run(serve(settings))
