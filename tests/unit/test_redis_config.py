"""streams/redis_config.py: every Redis client is built from one reading of the URL and CA."""

from __future__ import annotations

import ssl

import pytest
import redis
import redis.asyncio as aioredis

from ingest.redis_mux import MuxRedis
from ingest.settings import IngestSettings
from streams.redis_config import (
    RedisTarget,
    async_client,
    connection_kwargs,
    endpoint,
    redacted,
    sync_client,
)
from streams.settings import Settings

SECRET = "s3cr3t-pw"
URL = f"rediss://features:{SECRET}@cache.example:6390/3"


def test_the_password_never_shows_in_a_repr(monkeypatch):
    monkeypatch.setenv("TICKETFLOW_REDIS_URL", URL)
    s = Settings()
    assert SECRET not in repr(s) and SECRET not in str(s)
    assert SECRET not in repr(s.redis) and SECRET not in str(s.redis)
    assert SECRET not in repr(IngestSettings())
    assert redacted(URL) == "rediss://features:***@cache.example:6390/3"
    assert s.redis_host_port == ("cache.example", 6390)


def test_scheme_user_password_db_and_ca_are_honoured(tmp_path):
    ca = tmp_path / "ca.pem"
    kw = connection_kwargs(RedisTarget(URL, ca))
    assert (kw["host"], kw["port"], kw["db"]) == ("cache.example", 6390, 3)
    assert (kw["username"], kw["password"]) == ("features", SECRET)
    assert kw["ssl_ca_certs"] == str(ca) and kw["ssl_cert_reqs"] == "required"

    a = async_client(RedisTarget(URL, ca))
    assert a.connection_pool.connection_class is aioredis.SSLConnection
    assert a.connection_pool.connection_kwargs["ssl_ca_certs"] == str(ca)
    assert a.connection_pool.connection_kwargs["password"] == SECRET
    s = sync_client(URL)
    assert s.connection_pool.connection_class is redis.SSLConnection
    plain = sync_client("redis://127.0.0.1:6379/0")
    assert plain.connection_pool.connection_class is redis.Connection


def test_raw_connections_get_the_same_reading():
    e = endpoint(URL)
    assert (e.host, e.port, e.db, e.username) == ("cache.example", 6390, 3, "features")
    assert e.password is not None and e.password.get_secret_value() == SECRET
    assert isinstance(e.ssl, ssl.SSLContext) and e.ssl.verify_mode == ssl.CERT_REQUIRED
    assert e.ssl.check_hostname
    mux = MuxRedis(URL, 1.0)
    assert mux._ssl is not None and mux.db == 3
    assert endpoint("redis://127.0.0.1:6379/0").ssl is None


def test_a_ca_without_tls_and_an_unknown_scheme_are_refused(monkeypatch):
    with pytest.raises(ValueError, match="not rediss"):
        RedisTarget("redis://127.0.0.1:6379/0", "/etc/ca.pem")
    with pytest.raises(ValueError, match="scheme"):
        RedisTarget("http://127.0.0.1:6379/0")
    monkeypatch.setenv("TICKETFLOW_REDIS_CA_FILE", "/etc/ca.pem")
    with pytest.raises(ValueError, match="not rediss"):
        Settings()


def test_another_db_keeps_server_and_credentials():
    t = RedisTarget(URL).with_db(15)
    assert t.url.get_secret_value() == f"rediss://features:{SECRET}@cache.example:6390/15"


def test_an_empty_ca_variable_is_unset(monkeypatch) -> None:
    from streams.settings import Settings

    monkeypatch.setenv("TICKETFLOW_REDIS_CA_FILE", "")
    monkeypatch.setenv("TICKETFLOW_REDIS_URL", "redis://127.0.0.1:6379/0")
    assert Settings().redis_ca_file is None
    assert Settings().ingest.redis_ca_file is None
