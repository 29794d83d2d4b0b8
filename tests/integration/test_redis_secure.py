"""Redis secured end to end (`ticketflow stack up --secure`): TLS only, ACL users, `default` off.

The secured redis-server (the `redis-secure` stack part, devstack/redis_secure.py)
runs beside the session's plain one. Every client here is built by streams/redis_config.py
from a rediss:// URL and the stack's CA, as the services build theirs; keys live under this
run's own prefixes inside the patterns the ACL users are granted.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator

import orjson
import pytest
import redis

import devstack as stack
from devstack import redis_secure
from feature_jobs.reader import OnlineFeatureReader
from feature_jobs.store import MARK_BUILT_LUA, ViewKeys, marker_ttl_ms
from feature_jobs.views import VIEWS
from feature_jobs.writer import FeatureWriter
from ingest.index import TicketIndex
from ingest.keys import KeyStore, digest
from ingest.limits import Limit, Limits, LimitStore
from ingest.redis_mux import MuxRedis
from ingest.service import redis_client
from ingest.settings import IngestSettings
from streams.redis_config import RedisTarget, async_client, sync_client
from streams.settings import Settings

pytestmark = pytest.mark.integration

RUN = uuid.uuid4().hex[:6]
VIEW = VIEWS["user_ticket_stats"]
FEATURES = f"tf:fv:it{RUN}"
INGEST = f"ticketflow:ingest:it{RUN}:"


@pytest.fixture(scope="module")
def secure(live_stack: Settings) -> Iterator[Settings]:
    started = not redis_secure.healthy(live_stack)
    stack.start_part(live_stack, "redis-secure")
    yield live_stack
    admin = sync_client(redis_secure.target(live_stack, redis_secure.ADMIN))
    try:
        for pattern in (f"{FEATURES}*", f"{INGEST}*"):
            keys = list(admin.scan_iter(match=pattern, count=1000))
            if keys:
                admin.delete(*keys)
    finally:
        admin.close()
        if started:
            stack.stop_part(live_stack, "redis-secure")


def _host_port(settings: Settings) -> str:
    return f"{redis_secure.host(settings)}:{redis_secure.port()}"


def _refused(target: RedisTarget | str, *errors: type[BaseException]) -> BaseException:
    client = sync_client(target, socket_timeout=3, socket_connect_timeout=3, retry_on_timeout=False)
    try:
        with pytest.raises(errors) as caught:
            client.ping()
        return caught.value
    finally:
        client.close()


def test_a_client_without_a_password_is_refused(secure):
    ca = redis_secure.ca_file(secure)
    exc = _refused(RedisTarget(f"rediss://{_host_port(secure)}/0", ca), redis.AuthenticationError)
    assert "authenticated" in str(exc) or "NOAUTH" in str(exc)
    wrong = redis_secure.url(secure, "worker", password="not-the-password")
    _refused(RedisTarget(wrong, ca), redis.AuthenticationError)


def test_a_client_without_tls_is_refused(secure):
    plain = redis_secure.url(secure, "worker").replace("rediss://", "redis://", 1)
    _refused(plain, redis.ConnectionError, redis.TimeoutError)


def test_a_client_that_does_not_trust_the_ca_is_refused(secure):
    # the system's trust store does not know the stack's CA: no connection, not a blind one
    _refused(redis_secure.url(secure, "worker"), redis.ConnectionError)


def test_the_worker_user_reads_features_and_writes_nothing(secure):
    client = sync_client(redis_secure.target(secure, "worker"))
    try:
        assert client.ping()
        assert client.get(f"{FEATURES}:nothing") is None
        with pytest.raises(redis.exceptions.NoPermissionError):
            client.set(f"{FEATURES}:x", "1")
        with pytest.raises(redis.exceptions.NoPermissionError):
            client.get(f"{INGEST}keys")  # another service's keys
        with pytest.raises(redis.exceptions.NoPermissionError):
            client.execute_command("KEYS", "*")
    finally:
        client.close()


def test_the_feature_job_writes_and_the_reader_reads_through_rediss(secure):
    now_ms = int(time.time() * 1000)
    events = [
        {
            "ticket_id": f"s{RUN}-{i}",
            "text": "please refund me, the screen is broken" if i % 2 else "login fails",
            "user_id": f"u{RUN}",
            "channel": "email",
            "created_at": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now_ms / 1000 - 60 + i))
            + "Z",
        }
        for i in range(6)
    ]

    async def write() -> None:
        r = async_client(redis_secure.target(secure, "features"))
        try:
            writer = FeatureWriter(r, [VIEW], FEATURES)
            # the writer's own lean connection speaks TLS and AUTH too (feature_jobs/resp.py)
            assert writer._resp is not None and writer._resp._ssl is not None
            await writer.load_script()
            await writer.apply([orjson.dumps(e) for e in events])
            keys = ViewKeys.of(VIEW, FEATURES)
            await r.eval(
                MARK_BUILT_LUA, 2, keys.built, keys.pointer, keys.signature, marker_ttl_ms(VIEW)
            )
        finally:
            await r.aclose()

    async def read() -> dict:
        s = secure.model_copy(
            update={
                "redis_url": redis_secure.url(secure, "worker"),
                "redis_ca_file": redis_secure.ca_file(secure),
            }
        )
        reader = OnlineFeatureReader(s.redis, VIEWS, cache_ttl_s=0, key_prefix=FEATURES)
        try:
            return await reader.read(VIEW.name, f"u{RUN}", 2.0)
        finally:
            await reader.close()

    asyncio.run(write())
    values = asyncio.run(read())
    assert not any(v.is_fallback for v in values.values()), values
    counts = [v.value for v in values.values() if isinstance(v.value, int)]
    assert 6 in counts, values


def test_ingest_key_store_limits_and_index_work_through_rediss(secure, monkeypatch):
    for k, v in redis_secure.client_env(secure, "ingest").items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("TICKETFLOW_INGEST_REDIS_PREFIX", INGEST)
    settings = IngestSettings()
    assert settings.redis.tls and settings.redis_ca_file == redis_secure.ca_file(secure)
    password = redis_secure.password_file(secure, "ingest").read_text().strip()
    assert password not in repr(settings) and password not in repr(settings.redis)

    async def main() -> None:
        mux = MuxRedis(settings.redis, 2.0)  # the request path's pipelined connection
        cli = redis_client(settings)  # `ticketflow keys|limits`
        try:
            token, record = await KeyStore(cli, INGEST).create(f"k{RUN}", "submit,read")
            found = await KeyStore(mux, INGEST).lookup(digest(token))
            assert found is not None and found.id == record.id
            limits = LimitStore(
                mux, INGEST, Limits(key=Limit(rate=10, burst=20), ip=Limit(rate=10, burst=20))
            )
            verdict = await limits.take("127.0.0.1", record.id)
            assert verdict.allowed
            index = TicketIndex(mux, INGEST, 60)
            assert await index.claim([f"t{RUN}"], record.id, "00-trace") == [1]
            assert (await index.get(f"t{RUN}")) is not None
            assert await KeyStore(mux, INGEST).revoke(f"k{RUN}")
            assert await KeyStore(mux, INGEST).lookup(digest(token)) is None
        finally:
            await mux.aclose()
            await cli.aclose()

    asyncio.run(main())


def test_the_ingest_user_cannot_touch_feature_keys(secure):
    async def main() -> None:
        mux = MuxRedis(redis_secure.target(secure, "ingest"), 2.0)
        try:
            with pytest.raises(redis.exceptions.ResponseError, match="NOPERM"):
                await mux.execute("GET", f"{FEATURES}:x")
        finally:
            await mux.aclose()

    asyncio.run(main())
