"""The HTTP layer on a fake service: the order of the checks, problems, idempotency, fields.

Redis and Kafka are faked here; tests/integration/test_ingest.py runs the real ones.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
from aiohttp.test_utils import TestClient, TestServer

from ingest.http_fields import Bucket, parse_traceparent
from ingest.idempotency import Claim, StoredResponse
from ingest.keys import KeyRecord
from ingest.limits import Verdict
from ingest.problems import PROBLEM_JSON, ProblemError
from ingest.server import create_app
from ingest.service import Outcome, kafka_unavailable, redis_unavailable
from ingest.settings import IngestSettings
from ingest.tickets import Accepted, Rejected, Submission

SUBMITTER = "tfk_" + "s" * 43
READER = "tfk_" + "r" * 43
KEYS = {
    SUBMITTER: KeyRecord("k1", "submitter", frozenset({"submit"}), "now"),
    READER: KeyRecord("k2", "reader", frozenset({"read"}), "now"),
}
SETTINGS = IngestSettings(_env_file=None, body_limit_bytes=4096, batch_max=3)
TICKET = {"ticket_id": "t-1", "text": "hello", "created_at": "2026-12-01T00:00:00Z"}


class FakeIdempotency:
    def __init__(self) -> None:
        self.slots: dict[str, tuple[str, StoredResponse | None]] = {}

    def key(self, api_key_id: str, idem: str) -> str:
        return f"{api_key_id}:{idem}"

    async def acquire(self, slot: str, fp: str) -> Claim:
        if slot not in self.slots:
            self.slots[slot] = (fp, None)
            return Claim("new")
        stored_fp, stored = self.slots[slot]
        if stored_fp != fp:
            return Claim("mismatch")
        return Claim("inflight") if stored is None else Claim("done", stored)

    async def complete(self, slot: str, fp: str, response: StoredResponse) -> None:
        self.slots[slot] = (fp, response)

    async def release(self, slot: str, fp: str) -> None:
        self.slots.pop(slot, None)


class FakeService:
    def __init__(self) -> None:
        self.settings = SETTINGS
        self.idempotency = FakeIdempotency()
        self.tokens = 10.0
        self.kafka_up = True
        self.redis_up = True
        self.submitted: list[Submission] = []
        self.hold: asyncio.Event | None = None
        self.entered = asyncio.Event()

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def authenticate(self, token: str | None) -> KeyRecord | None:
        if not self.redis_up:
            raise redis_unavailable()
        return KEYS.get(token or "")

    async def take(self, ip: str, key: KeyRecord | None) -> Verdict:
        allowed = self.tokens >= 1
        self.tokens -= 1 if allowed else 0
        buckets = (Bucket("key", 1, 10, max(self.tokens, 0)),) if key else ()
        return Verdict(allowed, (*buckets, Bucket("ip", 1, 10, max(self.tokens, 0))))

    async def submit(self, key: KeyRecord, sub: Submission, trace: str | None) -> Outcome:
        self.submitted.append(sub)
        if self.hold is not None:
            self.entered.set()
            await self.hold.wait()
        out = Outcome(sub.batch, "00-" + "a" * 32 + "-" + "b" * 16 + "-01")
        for item in sub.items:
            if isinstance(item, Rejected):
                out.rejected.append((item.index, item.problem))
            elif self.kafka_up:
                assert isinstance(item, Accepted)
                out.accepted.append(
                    {
                        "index": item.index,
                        "ticket_id": item.ticket_id,
                        "status_url": f"/v1/tickets/{item.ticket_id}",
                    }
                )
            else:
                out.rejected.append((item.index, kafka_unavailable("")))
                out.undelivered += 1
        return out


@pytest.fixture
def service() -> FakeService:
    return FakeService()


@pytest.fixture
async def http(service: FakeService) -> AsyncIterator[TestClient]:
    async with TestClient(TestServer(create_app(SETTINGS, service))) as client:  # type: ignore[arg-type]
        yield client


def auth(token: str = SUBMITTER, **headers: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}", **headers}


async def problem(response: Any, status: int, kind: str) -> dict:
    assert response.status == status, await response.text()
    assert response.content_type == PROBLEM_JSON
    body = await response.json(content_type=None)
    assert body["type"].endswith(":" + kind) and body["status"] == status
    return body


async def test_one_ticket_is_accepted(http: TestClient) -> None:
    r = await http.post("/v1/tickets", json=TICKET, headers=auth(traceparent="junk"))
    assert r.status == 202
    body = await r.json()
    assert body == {
        "accepted": [{"index": 0, "ticket_id": "t-1", "status_url": "/v1/tickets/t-1"}],
        "rejected": [],
    }
    assert parse_traceparent(r.headers["traceparent"]) is not None
    assert r.headers["RateLimit"] == '"key";r=9;t=1, "ip";r=9;t=1'
    assert r.headers["RateLimit-Policy"] == '"key";q=10;w=10, "ip";q=10;w=10'


async def test_a_batch_with_a_bad_ticket_is_207(http: TestClient) -> None:
    bad = {**TICKET, "ticket_id": "no spaces allowed"}
    r = await http.post("/v1/tickets", json={"tickets": [TICKET, bad]}, headers=auth())
    assert r.status == 207
    body = await r.json()
    assert [a["index"] for a in body["accepted"]] == [0]
    [rejected] = body["rejected"]
    assert rejected["index"] == 1
    assert rejected["problem"]["errors"][0]["pointer"] == "/tickets/1/ticket_id"
    assert "no spaces allowed" not in await r.text()


async def test_one_bad_ticket_is_its_problem(http: TestClient) -> None:
    r = await http.post("/v1/tickets", json={**TICKET, "text": ""}, headers=auth())
    body = await problem(r, 400, "invalid-ticket")
    assert body["errors"] == [
        {"pointer": "/text", "detail": "String should have at least 1 character"}
    ]


async def test_kafka_down_is_503_with_retry_after(http: TestClient, service: FakeService) -> None:
    service.kafka_up = False
    r = await http.post("/v1/tickets", json=TICKET, headers=auth())
    await problem(r, 503, "kafka-unavailable")
    assert r.headers["Retry-After"] == "5"
    r = await http.post("/v1/tickets", json={"tickets": [TICKET, TICKET]}, headers=auth())
    await problem(r, 503, "kafka-unavailable")


async def test_redis_down_fails_closed(http: TestClient, service: FakeService) -> None:
    service.redis_up = False
    r = await http.post("/v1/tickets", json=TICKET, headers=auth())
    await problem(r, 503, "redis-unavailable")
    assert r.headers["Retry-After"]


async def test_no_key_unknown_key_wrong_scope(http: TestClient) -> None:
    r = await http.post("/v1/tickets", json=TICKET)
    await problem(r, 401, "unauthorized")
    assert r.headers["WWW-Authenticate"] == 'Bearer realm="ticketflow-ingest"'
    assert r.headers["RateLimit"] == '"ip";r=9;t=1'  # only the address's bucket
    r = await http.post("/v1/tickets", json=TICKET, headers=auth("tfk_" + "x" * 43))
    await problem(r, 401, "unauthorized")
    assert 'error="invalid_token"' in r.headers["WWW-Authenticate"]
    r = await http.post("/v1/tickets", json=TICKET, headers=auth(READER))
    await problem(r, 403, "forbidden")
    assert 'scope="submit"' in r.headers["WWW-Authenticate"]


async def test_over_quota_is_429_with_fields(http: TestClient, service: FakeService) -> None:
    service.tokens = 0.5
    r = await http.post("/v1/tickets", json=TICKET, headers=auth())
    await problem(r, 429, "rate-limited")
    assert r.headers["Retry-After"] == "1"
    assert r.headers["RateLimit"] == '"key";r=0;t=10, "ip";r=0;t=10'
    assert "RateLimit-Policy" in r.headers


async def test_the_size_is_checked_before_the_body_is_read(
    http: TestClient, service: FakeService
) -> None:
    big = b'{"text": "' + b"a" * 5000 + b'"}'
    r = await http.post(
        "/v1/tickets", data=big, headers=auth(**{"Content-Type": "application/json"})
    )
    await problem(r, 413, "body-too-large")

    async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: the cap while reading
        for _ in range(10):
            yield b" " * 1000

    r = await http.post(
        "/v1/tickets", data=chunks(), headers=auth(**{"Content-Type": "application/json"})
    )
    await problem(r, 413, "body-too-large")
    assert not service.submitted


@pytest.mark.parametrize(
    ("ctype", "data", "kind"),
    [
        ("text/plain", orjson.dumps(TICKET), "unsupported-media-type"),
        ("application/json; charset=latin-1", orjson.dumps(TICKET), "unsupported-media-type"),
        ("application/json", b"{not json", "not-json"),
    ],
)
async def test_415(http: TestClient, ctype: str, data: bytes, kind: str) -> None:
    r = await http.post("/v1/tickets", data=data, headers=auth(**{"Content-Type": ctype}))
    body = await problem(r, 415, kind)
    assert "not json" not in orjson.dumps(body).decode()


async def test_idempotency_replay_mismatch_and_in_flight(
    http: TestClient, service: FakeService
) -> None:
    headers = auth(**{"Idempotency-Key": '"order-1"'})
    first = await http.post("/v1/tickets", json=TICKET, headers=headers)
    assert first.status == 202 and "Idempotent-Replayed" not in first.headers
    again = await http.post("/v1/tickets", json=TICKET, headers=headers)
    assert again.status == 202 and again.headers["Idempotent-Replayed"] == "true"
    assert await again.read() == await first.read()
    assert again.headers["traceparent"] == first.headers["traceparent"]
    assert len(service.submitted) == 1
    other = await http.post("/v1/tickets", json={**TICKET, "text": "other"}, headers=headers)
    await problem(other, 422, "idempotency-key-reused")

    service.hold = asyncio.Event()
    slow_headers = auth(**{"Idempotency-Key": "order-2"})
    slow = asyncio.create_task(http.post("/v1/tickets", json=TICKET, headers=slow_headers))
    await service.entered.wait()
    r = await http.post("/v1/tickets", json=TICKET, headers=slow_headers)
    await problem(r, 409, "idempotency-key-in-flight")
    service.hold.set()
    assert (await slow).status == 202


async def test_a_failed_request_frees_its_idempotency_key(
    http: TestClient, service: FakeService
) -> None:
    headers = auth(**{"Idempotency-Key": "k"})
    service.kafka_up = False
    assert (await http.post("/v1/tickets", json=TICKET, headers=headers)).status == 503
    service.kafka_up = True
    assert (await http.post("/v1/tickets", json=TICKET, headers=headers)).status == 202


async def test_a_malformed_idempotency_key_is_400(http: TestClient) -> None:
    r = await http.post("/v1/tickets", json=TICKET, headers=auth(**{"Idempotency-Key": 'a"b'}))
    await problem(r, 400, "invalid-request")


async def test_unknown_paths_and_methods_are_problems(http: TestClient) -> None:
    await problem(await http.get("/nowhere"), 404, "not-found")
    r = await http.put("/v1/tickets", json=TICKET)
    await problem(r, 405, "method-not-allowed")
    assert "POST" in r.headers["Allow"]


async def test_the_document_and_the_probes(http: TestClient) -> None:
    doc = await (await http.get("/openapi.json")).json()
    assert doc["openapi"].startswith("3.1")
    assert (await http.get("/healthz")).status == 200
    text = await (await http.get("/metrics")).text()
    assert 'ingest_requests_total{method="GET",route="/healthz",status="200"}' in text


async def test_problem_error_carries_its_headers() -> None:
    error = redis_unavailable()
    assert isinstance(error, ProblemError)
    assert error.problem.response().headers["Retry-After"] == "2"


async def test_a_refused_request_closes_instead_of_reading_its_body(http: TestClient) -> None:
    r = await http.post(
        "/v1/tickets", data=b"x" * 3000, headers={"Content-Type": "application/json"}
    )
    await problem(r, 401, "unauthorized")
    assert r.headers["Connection"].lower() == "close"
    ok = await http.post("/v1/tickets", json=TICKET, headers=auth())
    assert ok.status == 202 and ok.headers.get("Connection", "").lower() != "close"


async def test_a_trickled_body_is_408(service: FakeService) -> None:
    service.settings = SETTINGS.model_copy(update={"body_timeout_s": 0.2})
    app = create_app(service.settings, service)  # type: ignore[arg-type]
    async with TestClient(TestServer(app)) as client:

        async def trickle() -> AsyncIterator[bytes]:
            yield b'{"ticket_id": '
            await asyncio.sleep(1)
            yield b'"t-1"}'

        r = await client.post(
            "/v1/tickets", data=trickle(), headers=auth(**{"Content-Type": "application/json"})
        )
        await problem(r, 408, "body-timeout")
    assert not service.submitted
