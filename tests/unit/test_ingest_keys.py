"""API keys: tokens, their hashes, scopes, the local cache; secrets out of every repr."""

from __future__ import annotations

import time

import pytest

from ingest.idempotency import StoredResponse, fingerprint
from ingest.keys import (
    TOKEN_RE,
    KeyCache,
    KeyRecord,
    KeyStoreError,
    digest,
    new_token,
    parse_scopes,
)
from ingest.settings import IngestSettings


def test_tokens_are_random_and_of_their_own_shape() -> None:
    a, b = new_token(), new_token()
    assert a != b
    assert TOKEN_RE.match(a) and TOKEN_RE.match(b)


def test_only_the_hash_is_kept_and_it_is_stable() -> None:
    token = new_token()
    assert digest(token) == digest(token)
    assert len(digest(token)) == 64 and token not in digest(token)
    assert digest(token) != digest(new_token())


def test_scopes() -> None:
    assert parse_scopes("submit, read") == {"submit", "read"}
    for bad in ("", "write", "submit,root"):
        with pytest.raises(KeyStoreError):
            parse_scopes(bad)


def test_admin_allows_everything_and_the_others_only_themselves() -> None:
    reader = KeyRecord("id1", "r", frozenset({"read"}), "now")
    admin = KeyRecord("id2", "a", frozenset({"admin"}), "now")
    assert reader.allows("read") and not reader.allows("submit")
    assert admin.allows("submit") and admin.allows("read")
    assert "hash" not in str(reader.public()) and set(reader.public()) == {
        "id",
        "name",
        "scopes",
        "created_at",
    }


def test_the_cache_forgets_after_its_fresh_time() -> None:
    cache = KeyCache(fresh_s=0.05)
    record = KeyRecord("id", "n", frozenset({"submit"}), "now")
    cache.put("d", record)
    assert cache.get("d").record == record
    time.sleep(0.06)
    assert cache.get("d") is None
    assert cache.get("d", max_age_s=10).record == record  # still there for fail-open


def test_the_cache_is_bounded() -> None:
    cache = KeyCache(fresh_s=60, max_entries=3)
    for i in range(10):
        cache.put(str(i), None)
    assert cache.get("0") is None and cache.get("9") is not None


def test_no_secret_in_the_settings_repr(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TICKETFLOW_REDIS_URL", "redis://ingest:hunter2@redis:6379/0")
    s = IngestSettings()
    assert "hunter2" not in repr(s) and "hunter2" not in str(s.model_dump())
    assert s.redis_url.get_secret_value().endswith("@redis:6379/0")


def test_settings_names_and_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("PORT", "HOST", "URL", "REDIS_URL", "LIMITS_FAIL_OPEN", "AUTH_FAIL_OPEN"):
        monkeypatch.delenv(f"TICKETFLOW_INGEST_{name}", raising=False)
    monkeypatch.delenv("TICKETFLOW_REDIS_URL", raising=False)
    s = IngestSettings(_env_file=None)
    assert (s.host, s.port, s.batch_max, s.idempotency_ttl_s) == ("127.0.0.1", 8090, 500, 86400)
    assert not s.auth_fail_open and not s.limits_fail_open
    monkeypatch.setenv("TICKETFLOW_INGEST_PORT", "9999")
    monkeypatch.setenv("TICKETFLOW_INGEST_LIMITS_FAIL_OPEN", "true")
    monkeypatch.setenv("TICKETFLOW_INGEST_REDIS_URL", "redis://other:1/0")
    monkeypatch.setenv("TICKETFLOW_REDIS_URL", "redis://shared:1/0")
    s = IngestSettings(_env_file=None)
    assert s.port == 9999 and s.limits_fail_open
    assert s.redis_url.get_secret_value() == "redis://other:1/0"  # ingest's own name wins


def test_fingerprints_tell_payloads_apart() -> None:
    fp = fingerprint("POST", "/v1/tickets", b'{"a":1}')
    assert fp == fingerprint("post", "/v1/tickets", b'{"a":1}')
    assert fp != fingerprint("POST", "/v1/tickets", b'{"a": 1}')
    assert fp != fingerprint("POST", "/v1/ticketsx", b'{"a":1}')
    # length-prefixed parts: moving a byte from the path to the body changes the hash
    assert fingerprint("POST", "/a", b"b") != fingerprint("POST", "/", b"ab")


def test_a_stored_response_round_trips() -> None:
    r = StoredResponse(207, "application/json", '{"ü":1}'.encode(), {"traceparent": "x"})
    assert StoredResponse.loads(r.dumps()) == r


def test_the_bind_address_follows_ingest_url_unless_set(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("TICKETFLOW_INGEST_HOST", "TICKETFLOW_INGEST_PORT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TICKETFLOW_INGEST_URL", "http://0.0.0.0:9000")
    s = IngestSettings(_env_file=None)
    assert (s.host, s.port) == ("0.0.0.0", 9000)
    monkeypatch.setenv("TICKETFLOW_INGEST_PORT", "9100")
    assert IngestSettings(_env_file=None).port == 9100
