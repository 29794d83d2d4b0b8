"""`ticketflow ingest` against the real Kafka and Redis of the local stack.

One ingest process serves the module, on a topic prefix and a Redis prefix of its own: the
session's worker must neither turn the tickets posted here into results nor see the
results and dead letters this module publishes. Its worker view (the live state of a
ticket) is a small fake here, and results are published as the worker's router would
publish them; the workflow's own acceptance of what
ingest writes is tests/unit/test_ingest_tickets.py's property test against `validate`.
Kafka and Redis outages are made with a closed port and a proxy this test closes.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
import redis as redis_sync
from aiohttp.test_utils import TestServer
from confluent_kafka import Producer

from devstack import app_processes
from ingest.http_fields import parse_traceparent
from ingest.idempotency import IdempotencyStore, fingerprint
from ingest.keys import TOKEN_RE, KeyStore
from ingest.limits import Limit, Limits, LimitStore
from ingest.server import create_app
from ingest.service import redis_client
from ingest.settings import IngestSettings
from schemas.tickets import TicketResult
from streams.admin import ensure_topics
from streams.settings import Settings
from streams.topics import Topics
from ticketflow import kafka_io

pytestmark = pytest.mark.integration

RUN = uuid.uuid4().hex[:6]
REDIS_PREFIX = f"it{RUN}:ingest:"
BODY_LIMIT = 256 * 1024
CANARY = "QZXJCANARY"
REPO = Path(__file__).resolve().parents[2]


def ticket(tid: str, **extra: Any) -> dict[str, Any]:
    return {
        "ticket_id": tid,
        "text": "my parcel has not arrived",
        "created_at": datetime.now(timezone.utc).isoformat(),
        **extra,
    }


# ---- fixtures -----------------------------------------------------------------------------------


class FakeWorkerView:
    """The worker's `/ticket/{id}` table view, answering for the tickets it is told of."""

    def __init__(self) -> None:
        self.states: dict[str, dict] = {}
        view = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                state = view.states.get(self.path.rsplit("/", 1)[-1])
                body = orjson.dumps(state or {"error": "unknown ticket"})
                self.send_response(200 if state else 404)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None: ...

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()


@pytest.fixture(scope="module")
def ingest_stack(live_stack: Settings) -> Settings:
    return live_stack.model_copy(update={"topic_prefix": f"{live_stack.topic_prefix}ingest{RUN}."})


@pytest.fixture(scope="module")
def worker_view() -> Iterator[FakeWorkerView]:
    view = FakeWorkerView()
    yield view
    view.close()


@pytest.fixture(scope="module")
def env(ingest_stack: Settings, worker_view: FakeWorkerView) -> dict[str, str]:
    return {
        "TICKETFLOW_TOPIC_PREFIX": ingest_stack.topic_prefix,
        "TICKETFLOW_INGEST_PORT": str(app_processes.free_port()),
        "TICKETFLOW_INGEST_REDIS_PREFIX": REDIS_PREFIX,
        "TICKETFLOW_INGEST_BODY_LIMIT_BYTES": str(BODY_LIMIT),
        "TICKETFLOW_INGEST_WORKER_URL": worker_view.url,
    }


@pytest.fixture(scope="module")
def ingest_url(ingest_stack: Settings, env: dict[str, str]) -> Iterator[str]:
    # the result topics exist before ingest subscribes, as they do beside a running worker
    topics = Topics(ingest_stack.topic_prefix)
    names = [topics.tickets_in, topics.dlq, *(topics.out(r) for r in ROUTES)]
    ensure_topics(ingest_stack, {n: {} for n in names})
    url = f"http://127.0.0.1:{env['TICKETFLOW_INGEST_PORT']}"
    service = app_processes.start("ingest", ["ingest"], ingest_stack, env, log_name=f"ingest-{RUN}")
    app_processes.wait_until(lambda: app_processes.http_ok(url + "/readyz"), service, 60, "ready")
    yield url
    service.stop()
    # the keys, limits, buckets and index entries of this run, from the shared Redis
    client = redis_sync.Redis.from_url(ingest_stack.redis_url.get_secret_value())
    for name in client.scan_iter(match=REDIS_PREFIX + "*", count=1000):
        client.delete(name)
    client.close()


ROUTES = ("auto_classify", "manual_review", "after_sales")


def ingest_settings(**overrides: Any) -> IngestSettings:
    base = {"redis_prefix": REDIS_PREFIX, "body_limit_bytes": BODY_LIMIT}
    return IngestSettings(**{**base, **overrides})


@pytest.fixture
async def redis() -> AsyncIterator[Any]:
    client = redis_client(ingest_settings(redis_timeout_s=5))
    yield client
    await client.aclose()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def new_key(redis: Any, scopes: str = "submit,read", rate: float = 1000) -> tuple[str, str]:
    """A fresh key (its token and id), with a generous bucket of its own."""
    token, record = await KeyStore(redis, REDIS_PREFIX).create(f"k{uuid.uuid4().hex[:8]}", scopes)
    await limits(redis).set_own("key", record.id, Limit(rate=rate, burst=int(rate)))
    return token, record.id


def limits(redis: Any) -> LimitStore:
    default = Limit(rate=1000, burst=1000)
    return LimitStore(redis, REDIS_PREFIX, Limits(key=default, ip=default))


def bearer(token: str, **headers: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}", **headers}


def records_of(settings: Settings, keys: set[str]) -> list[kafka_io.Record]:
    topic = Topics(settings.topic_prefix).tickets_in
    return [
        r
        for r in kafka_io.read_topic(settings.kafka_bootstrap, topic, idle_s=1.0)
        if (r.key or b"").decode() in keys
    ]


async def problem(response: aiohttp.ClientResponse, status: int, kind: str) -> dict:
    text = await response.text()
    assert response.status == status, text
    assert response.content_type == "application/problem+json"
    body = json.loads(text)
    assert body["type"] == f"urn:ticketflow:problem:{kind}" and body["status"] == status
    return body


# ---- submitting ---------------------------------------------------------------------------------


async def test_202_only_with_the_record_on_the_topic(
    ingest_url: str, ingest_stack: Settings, redis: Any, http: aiohttp.ClientSession
) -> None:
    token, _ = await new_key(redis)
    tid = f"one-{RUN}"
    caller = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    body = ticket(tid, channel="web", extra_field="travels on")
    r = await http.post(
        f"{ingest_url}/v1/tickets", json=body, headers=bearer(token, traceparent=caller)
    )
    assert r.status == 202, await r.text()
    answer = await r.json()
    assert answer == {
        "accepted": [{"index": 0, "ticket_id": tid, "status_url": f"/v1/tickets/{tid}"}],
        "rejected": [],
    }
    # the broker acknowledged before the answer: the record is there to read now
    [record] = records_of(ingest_stack, {tid})
    assert orjson.loads(record.value) == body
    sent = record.headers["traceparent"]
    assert parse_traceparent(sent) == ("4bf92f3577b34da6a3ce929d0e0e4736", "01")
    assert sent != caller and sent == r.headers["traceparent"]  # ingest's own span
    assert "RateLimit" in r.headers and "RateLimit-Policy" in r.headers


async def test_a_batch_with_one_bad_ticket(
    ingest_url: str, ingest_stack: Settings, redis: Any, http: aiohttp.ClientSession
) -> None:
    token, _ = await new_key(redis)
    ids = [f"batch-{RUN}-{i}" for i in range(3)]
    bad = ticket(ids[1], channel="fax", text="")
    r = await http.post(
        f"{ingest_url}/v1/tickets",
        json={"tickets": [ticket(ids[0]), bad, ticket(ids[2])]},
        headers=bearer(token),
    )
    assert r.status == 207, await r.text()
    answer = await r.json()
    assert [a["ticket_id"] for a in answer["accepted"]] == [ids[0], ids[2]]
    [rejected] = answer["rejected"]
    assert rejected["index"] == 1 and rejected["problem"]["status"] == 400
    assert {e["pointer"] for e in rejected["problem"]["errors"]} == {
        "/tickets/1/channel",
        "/tickets/1/text",
    }
    assert sorted(r.key.decode() for r in records_of(ingest_stack, set(ids))) == [ids[0], ids[2]]


async def test_idempotency_replay_conflict_and_in_flight(
    ingest_url: str, ingest_stack: Settings, redis: Any, http: aiohttp.ClientSession
) -> None:
    token, key_id = await new_key(redis)
    url = f"{ingest_url}/v1/tickets"
    tid = f"idem-{RUN}"
    raw = orjson.dumps(ticket(tid))
    headers = bearer(token, **{"Idempotency-Key": f'"{RUN}-1"', "Content-Type": "application/json"})
    first = await http.post(url, data=raw, headers=headers)
    assert first.status == 202
    again = await http.post(url, data=raw, headers=headers)
    assert again.status == 202 and again.headers["Idempotent-Replayed"] == "true"
    assert await again.read() == await first.read()
    assert len(records_of(ingest_stack, {tid})) == 1  # the replay produced nothing

    other = orjson.dumps(ticket(tid, text="another payload"))
    await problem(await http.post(url, data=other, headers=headers), 422, "idempotency-key-reused")

    # another client's key of the same name is another slot
    token2, _ = await new_key(redis)
    headers2 = {**headers, **bearer(token2)}
    r = await http.post(url, data=orjson.dumps(ticket(f"idem2-{RUN}")), headers=headers2)
    assert r.status == 202

    # the same request still in flight (here: held by "another instance")
    store = IdempotencyStore(redis, REDIS_PREFIX, 60, 30)
    slot = store.key(key_id, f"{RUN}-2")
    raw3 = orjson.dumps(ticket(f"idem3-{RUN}"))
    fp = fingerprint("POST", "/v1/tickets", raw3)
    assert (await store.acquire(slot, fp)).outcome == "new"
    headers3 = {**headers, "Idempotency-Key": f"{RUN}-2"}
    await problem(
        await http.post(url, data=raw3, headers=headers3), 409, "idempotency-key-in-flight"
    )
    await store.release(slot, fp)
    assert (await http.post(url, data=raw3, headers=headers3)).status == 202


async def test_401_and_403(ingest_url: str, redis: Any, http: aiohttp.ClientSession) -> None:
    url = f"{ingest_url}/v1/tickets"
    body = ticket(f"auth-{RUN}")
    r = await http.post(url, json=body)
    await problem(r, 401, "unauthorized")
    assert r.headers["WWW-Authenticate"].startswith("Bearer")
    r = await http.post(url, json=body, headers=bearer("tfk_" + "A" * 43))
    await problem(r, 401, "unauthorized")
    assert 'error="invalid_token"' in r.headers["WWW-Authenticate"]
    reader, _ = await new_key(redis, "read")
    r = await http.post(url, json=body, headers=bearer(reader))
    await problem(r, 403, "forbidden")
    submitter, _ = await new_key(redis, "submit")
    r = await http.get(f"{url}/anything", headers=bearer(submitter))
    await problem(r, 403, "forbidden")
    assert 'scope="read"' in r.headers["WWW-Authenticate"]


async def test_429_per_key_and_per_ip_with_fields(
    ingest_url: str, env: dict[str, str], redis: Any, http: aiohttp.ClientSession
) -> None:
    url = f"{ingest_url}/v1/tickets"
    token, key_id = await new_key(redis)
    await limits(redis).set_own("key", key_id, Limit(rate=0.5, burst=2))
    codes = [
        (await http.post(url, json=ticket(f"rl-{RUN}-{i}"), headers=bearer(token))).status
        for i in range(2)
    ]
    assert codes == [202, 202]
    r = await http.post(url, json=ticket(f"rl-{RUN}-2"), headers=bearer(token))
    await problem(r, 429, "rate-limited")
    assert int(r.headers["Retry-After"]) in (1, 2)
    assert r.headers["RateLimit"].startswith('"key";r=0;t=')
    assert r.headers["RateLimit-Policy"].startswith('"key";q=2;w=4')

    # changed at runtime, through the command line: applies from the next request
    name = next(k.name for k in await KeyStore(redis, REDIS_PREFIX).list() if k.id == key_id)
    await cli(env, "limits", "set", "--name", name, "--rate", "100", "--burst", "100")
    r = await http.post(url, json=ticket(f"rl-{RUN}-3"), headers=bearer(token))
    assert r.status == 202
    assert '"key";q=100;w=1' in r.headers["RateLimit-Policy"]

    # the address's own bucket, whatever the key
    store = limits(redis)
    await store.set_own("ip", "127.0.0.1", Limit(rate=0.2, burst=1))
    try:
        other, _ = await new_key(redis)
        statuses = []
        for i in range(2):
            r = await http.post(url, json=ticket(f"ip-{RUN}-{i}"), headers=bearer(other))
            statuses.append(r.status)
        assert statuses == [202, 429]
        assert '"ip";r=0' in r.headers["RateLimit"] and r.headers["Retry-After"]
    finally:
        await store.set_own("ip", "127.0.0.1", None)
        # the bucket this emptied refills at the default rate, 400/s: the next test's first
        # few requests, a few ms later, would find it short of tokens
        await redis.delete(store.bucket_key("ip", "127.0.0.1"))


async def test_413_415_400_never_echo_the_input(
    ingest_url: str, redis: Any, http: aiohttp.ClientSession
) -> None:
    token, _ = await new_key(redis)
    url = f"{ingest_url}/v1/tickets"
    json_type = {"Content-Type": "application/json"}
    huge = b'{"ticket_id": "' + CANARY.encode() * (BODY_LIMIT // 8) + b'"}'
    r = await http.post(url, data=huge, headers=bearer(token, **json_type))
    assert CANARY not in (await problem(r, 413, "body-too-large")).get("detail", "")

    async def stream() -> AsyncIterator[bytes]:  # chunked: no Content-Length to go by
        for _ in range(BODY_LIMIT // 4096 + 2):
            yield CANARY.encode() * 400

    r = await http.post(url, data=stream(), headers=bearer(token, **json_type))
    await problem(r, 413, "body-too-large")

    r = await http.post(url, data=CANARY, headers=bearer(token, **{"Content-Type": "text/plain"}))
    await problem(r, 415, "unsupported-media-type")
    r = await http.post(url, data=f'{{"{CANARY}', headers=bearer(token, **json_type))
    assert CANARY not in json.dumps(await problem(r, 415, "not-json"))

    bad = {
        "ticket_id": CANARY + " !",
        "text": CANARY * 3000,
        "created_at": CANARY,
        "channel": CANARY,
        "metadata": {CANARY: 5},
    }
    r = await http.post(url, json=bad, headers=bearer(token))
    body = await problem(r, 400, "invalid-ticket")
    assert CANARY not in json.dumps(body)
    assert {e["pointer"] for e in body["errors"]} == {
        "/ticket_id",
        "/text",
        "/created_at",
        "/channel",
        "/metadata",
    }


async def cli(env: dict[str, str], *args: str) -> str:
    """`ticketflow ARGS` with ingest's environment; its standard output."""
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "ticketflow.cli", *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout


async def test_revocation_takes_effect_within_seconds(
    ingest_url: str, env: dict[str, str], http: aiohttp.ClientSession
) -> None:
    name = f"rev-{RUN}"
    created = await cli(env, "keys", "create", "--name", name, "--scopes", "submit")
    token = created.strip().splitlines()[-1]
    assert TOKEN_RE.match(token)  # alone on the last line
    listed = await cli(env, "keys", "list", "--json")
    assert name in listed and token not in listed
    url = f"{ingest_url}/v1/tickets"
    assert (await http.post(url, json=ticket(f"rev-{RUN}"), headers=bearer(token))).status == 202

    await cli(env, "keys", "revoke", name)
    revoked_at = time.monotonic()
    while True:
        r = await http.post(url, json=ticket(f"rev-{RUN}-x"), headers=bearer(token))
        if r.status == 401:
            break
        assert r.status == 202
        assert time.monotonic() - revoked_at < 5, "still accepted 5 s after the revocation"
        await asyncio.sleep(0.2)
    # the default key cache is 2 s: every instance refuses the key by then
    assert time.monotonic() - revoked_at < 3.5
    assert name not in await cli(env, "keys", "list", "--json")


# ---- reading ------------------------------------------------------------------------------------


def publish(
    settings: Settings, topic: str, key: str, value: bytes, headers: list | None = None
) -> None:
    p = Producer({"bootstrap.servers": settings.kafka_bootstrap})
    p.produce(topic, key=key.encode(), value=value, headers=headers or [])
    assert p.flush(10) == 0


def result_of(tid: str, route: str, degraded: bool = False) -> bytes:
    return (
        TicketResult(
            ticket_id=tid,
            route=route,
            category="shipping",
            confidence=0.93,
            model_name="ticket_classifier",
            model_version="v1",
            degraded=degraded,
            decision_path=[{"step": "route", "status": "ok", "latency_ms": 1.0}],
            latency_ms=42.0,
            completed_at=datetime.now(timezone.utc),
        )
        .model_dump_json()
        .encode()
    )


async def status_until(
    http: aiohttp.ClientSession, url: str, token: str, want: str, timeout_s: float = 30
) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        r = await http.get(url, headers=bearer(token))
        body = await r.json(content_type=None)
        if (r.status == 200 and body["status"] == want) or time.monotonic() > deadline:
            return body
        await asyncio.sleep(0.3)


async def test_state_then_result(
    ingest_url: str,
    ingest_stack: Settings,
    worker_view: FakeWorkerView,
    redis: Any,
    http: aiohttp.ClientSession,
) -> None:
    token, _ = await new_key(redis)
    topics = Topics(ingest_stack.topic_prefix)
    ids = {k: f"st-{k}-{RUN}" for k in ("done", "review", "dead", "live")}
    r = await http.post(
        f"{ingest_url}/v1/tickets",
        json={"tickets": [ticket(t) for t in ids.values()]},
        headers=bearer(token),
    )
    assert r.status == 202
    base = f"{ingest_url}/v1/tickets/"

    first = await (await http.get(base + ids["live"], headers=bearer(token))).json()
    assert first["status"] == "accepted" and first["result"] is None and first["trace_id"]
    worker_view.states[ids["live"]] = {"status": "running", "step": "infer"}
    live = await (await http.get(base + ids["live"], headers=bearer(token))).json()
    assert (live["status"], live["step"]) == ("running", "infer")

    publish(
        ingest_stack,
        topics.out("auto_classify"),
        ids["done"],
        result_of(ids["done"], "auto_classify"),
    )
    publish(
        ingest_stack,
        topics.out("manual_review"),
        ids["review"],
        result_of(ids["review"], "manual_review", degraded=True),
    )
    publish(
        ingest_stack,
        topics.dlq,
        ids["dead"],
        b"whatever",
        [("x-dlq-error-class", b"SCHEMA_VALIDATION")],
    )
    done = await status_until(http, base + ids["done"], token, "completed")
    assert done["status"] == "completed" and done["route"] == "auto_classify"
    assert done["result"]["ticket_id"] == ids["done"]
    assert done["result"]["model_version"] == "v1"
    review = await status_until(http, base + ids["review"], token, "awaiting_review")
    assert review["status"] == "awaiting_review"
    dead = await status_until(http, base + ids["dead"], token, "dead_lettered")
    assert (dead["status"], dead["error_class"]) == ("dead_lettered", "SCHEMA_VALIDATION")

    # a late dead letter does not move a completed ticket back
    publish(ingest_stack, topics.dlq, ids["done"], b"x", [("x-dlq-error-class", b"INTERNAL")])
    await asyncio.sleep(2)
    again = await (await http.get(base + ids["done"], headers=bearer(token))).json()
    assert again["status"] == "completed"


async def test_tickets_are_their_submitters(
    ingest_url: str, redis: Any, http: aiohttp.ClientSession
) -> None:
    owner, _ = await new_key(redis)
    other, _ = await new_key(redis)
    admin, _ = await new_key(redis, "admin")
    tid = f"own-{RUN}"
    url = f"{ingest_url}/v1/tickets"
    assert (await http.post(url, json=ticket(tid), headers=bearer(owner))).status == 202
    # the same ticket_id from another key would be dropped by the workflow: refused here
    body = await problem(
        await http.post(url, json=ticket(tid), headers=bearer(other)), 409, "ticket-id-taken"
    )
    assert body["errors"] == [{"pointer": "/ticket_id", "detail": "taken"}]
    # the owner may send it again (a retry): the workflow keeps the first
    assert (await http.post(url, json=ticket(tid), headers=bearer(owner))).status == 202
    await problem(await http.get(f"{url}/{tid}", headers=bearer(other)), 404, "not-found")
    assert (await http.get(f"{url}/{tid}", headers=bearer(admin))).status == 200
    await problem(await http.get(f"{url}/no-such-{RUN}", headers=bearer(owner)), 404, "not-found")


# ---- outages ------------------------------------------------------------------------------------


async def test_kafka_unavailable_is_503(redis: Any, ingest_stack: Settings) -> None:
    """A producer pointed at a closed port: nothing is acknowledged, nothing is 202."""
    token, _ = await new_key(redis)
    settings = ingest_settings(
        kafka_bootstrap=f"127.0.0.1:{app_processes.free_port()}",
        produce_timeout_s=1.0,
        index_results=False,
        worker_url="off",
        topic_prefix=ingest_stack.topic_prefix,
    )
    async with TestServer(create_app(settings)) as server, aiohttp.ClientSession() as http:
        url = str(server.make_url("/v1/tickets"))
        start = time.monotonic()
        r = await http.post(url, json=ticket(f"down-{RUN}"), headers=bearer(token))
        await problem(r, 503, "kafka-unavailable")
        assert r.headers["Retry-After"] == "5"
        assert time.monotonic() - start < 5
        r = await http.post(
            url,
            json={"tickets": [ticket(f"down-{RUN}-{i}") for i in range(3)]},
            headers=bearer(token),
        )
        await problem(r, 503, "kafka-unavailable")
        ready = await http.get(str(server.make_url("/readyz")))
        assert ready.status == 503 and (await ready.json())["kafka"] is False
    # the refused tickets are not in the index: nobody was told they were accepted
    assert await redis.exists(f"{REDIS_PREFIX}ticket:down-{RUN}") == 0


class Proxy:
    """A TCP proxy to Redis that the test can cut, as an outage."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.port = 0
        self._server: asyncio.AbstractServer | None = None
        self._writers: list[asyncio.StreamWriter] = []

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self.target)
        self._writers += [writer, up_writer]

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    async def cut(self) -> None:
        assert self._server is not None
        self._server.close()
        for w in self._writers:
            w.close()
        await asyncio.sleep(0.1)


@pytest.mark.parametrize("fail_open", [False, True], ids=["closed", "open"])
async def test_redis_down(fail_open: bool, redis: Any, ingest_stack: Settings) -> None:
    token, _ = await new_key(redis)
    proxy = Proxy(ingest_stack.redis_host_port)
    await proxy.start()
    db = ingest_stack.redis_url.get_secret_value().rsplit("/", 1)[-1]
    settings = ingest_settings(
        redis_url=f"redis://127.0.0.1:{proxy.port}/{db}",
        key_cache_s=0.0,
        auth_fail_open=fail_open,
        limits_fail_open=fail_open,
        index_results=False,
        worker_url="off",
        topic_prefix=ingest_stack.topic_prefix,
    )
    async with TestServer(create_app(settings)) as server, aiohttp.ClientSession() as http:
        url = str(server.make_url("/v1/tickets"))
        r = await http.post(url, json=ticket(f"rd-{RUN}-{fail_open}-0"), headers=bearer(token))
        assert r.status == 202
        await proxy.cut()
        r = await http.post(url, json=ticket(f"rd-{RUN}-{fail_open}-1"), headers=bearer(token))
        if fail_open:  # a key known before the outage still works, with no quota
            assert r.status == 202, await r.text()
            assert "RateLimit" not in r.headers
            unknown = bearer("tfk_" + "B" * 43)
            await problem(
                await http.post(url, json=ticket("x"), headers=unknown), 503, "redis-unavailable"
            )
        else:  # no authentication without Redis
            await problem(r, 503, "redis-unavailable")
            assert r.headers["Retry-After"]
        # an idempotent request cannot be kept without Redis in either mode
        idem = bearer(token, **{"Idempotency-Key": "k"})
        await problem(
            await http.post(url, json=ticket("y"), headers=idem), 503, "redis-unavailable"
        )


# ---- the document -----------------------------------------------------------------------------


SCHEMATHESIS_CONFIG = """
[checks.positive_data_acceptance]
# valid data refused for the server's state, not its shape: a size limit the schema cannot
# state (a record's bytes), an Idempotency-Key the fuzzer reused with another payload
expected-statuses = ["2xx", "3xx", "401", "403", "404", "409", "413", "422", "429", "5xx"]
"""


async def test_schemathesis_finds_no_5xx_and_no_response_off_the_document(
    ingest_url: str, redis: Any, tmp_path: Path
) -> None:
    token, _ = await new_key(redis, "submit,read", rate=100_000)
    config = tmp_path / "schemathesis.toml"
    config.write_text(SCHEMATHESIS_CONFIG)
    command = [
        str(Path(sys.executable).parent / "schemathesis"),
        "--config-file",
        str(config),
        "run",
        f"{ingest_url}/openapi.json",
        "--checks",
        "all",
        "--max-examples",
        "50",
        "--header",
        f"Authorization: Bearer {token}",
        "--generation-database",
        "none",
        "--seed",
        "2026",
        "--workers",
        "1",
        "--no-color",
    ]
    done = await asyncio.to_thread(
        subprocess.run, command, capture_output=True, text=True, timeout=240, cwd=tmp_path
    )
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
