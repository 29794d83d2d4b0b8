"""Ingest's HTTP fields: traceparent, Idempotency-Key, RateLimit, Bearer, the client's address."""

from __future__ import annotations

import pytest

from ingest.http_fields import (
    Bucket,
    bearer_token,
    child_traceparent,
    client_ip,
    parse_idempotency_key,
    parse_traceparent,
    ratelimit,
    ratelimit_fields,
    ratelimit_policy,
    retry_after,
    trace_id,
)

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
VALID = f"00-{TRACE}-00f067aa0ba902b7-01"


# ---- traceparent --------------------------------------------------------------------------------


def test_a_valid_traceparent_is_read() -> None:
    assert parse_traceparent(VALID) == (TRACE, "01")
    assert parse_traceparent(f"  {VALID} ") == (TRACE, "01")


@pytest.mark.parametrize(
    "value",
    [
        None,
        "",
        "garbage",
        VALID.upper(),  # the spec's hex is lowercase
        f"00-{'0' * 32}-00f067aa0ba902b7-01",  # all-zero trace id
        f"00-{TRACE}-{'0' * 16}-01",  # all-zero parent id
        f"ff-{TRACE}-00f067aa0ba902b7-01",  # version ff is forbidden
        VALID + "-extra",  # version 00 has exactly four fields
        VALID[:-1],
        f"00-{TRACE}x-00f067aa0ba902b7-01",
    ],
)
def test_an_invalid_traceparent_is_refused(value: str | None) -> None:
    assert parse_traceparent(value) is None


def test_a_later_version_is_read_by_its_first_four_fields() -> None:
    assert parse_traceparent(f"01-{TRACE}-00f067aa0ba902b7-01-future") == (TRACE, "01")


def test_ingest_continues_the_callers_trace_with_its_own_span() -> None:
    child = child_traceparent(f"00-{TRACE}-00f067aa0ba902b7-00")
    parsed = parse_traceparent(child)
    assert parsed == (TRACE, "00")  # same trace, the caller's sampling decision kept
    assert child.split("-")[2] != "00f067aa0ba902b7"
    assert trace_id(child) == TRACE


def test_an_invalid_traceparent_starts_a_new_trace() -> None:
    a, b = child_traceparent("nonsense"), child_traceparent(None)
    assert parse_traceparent(a) is not None and parse_traceparent(b) is not None
    assert trace_id(a) != trace_id(b)


# ---- Idempotency-Key ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "key"),
    [
        ('"8e03978e-40d5-43e8-bc93-6894a57f9324"', "8e03978e-40d5-43e8-bc93-6894a57f9324"),
        ("8e03978e-40d5", "8e03978e-40d5"),  # a bare token, as many clients send
        ("a" * 255, "a" * 255),
    ],
)
def test_idempotency_keys_are_read(value: str, key: str) -> None:
    assert parse_idempotency_key(value) == key


@pytest.mark.parametrize(
    "value", ['""', "", "a" * 256, 'a"b', "a\\b", "é", "a\tb", '"', "a b", '"a b"']
)
def test_bad_idempotency_keys_are_refused(value: str) -> None:
    assert parse_idempotency_key(value) is None


# ---- RateLimit ---------------------------------------------------------------------------------


def test_bucket_figures() -> None:
    b = Bucket("key", rate=10, burst=100, tokens=40.5)
    assert b.remaining == 40
    assert b.window_s == 10  # 100 tokens at 10/s
    assert b.reset_s == 6  # 59.5 tokens to go at 10/s, rounded up
    assert b.retry_after_s() == 1  # has a token: at least 1 s all the same


def test_an_empty_bucket_says_when_a_token_is_back() -> None:
    b = Bucket("ip", rate=0.5, burst=3, tokens=0.2)
    assert b.remaining == 0
    assert b.retry_after_s() == 2  # 0.8 token at 0.5/s = 1.6 s
    assert retry_after([Bucket("key", 100, 100, 50), b]) == 2  # only the empty one counts


def test_a_slow_bucket_has_a_window_of_at_least_a_second() -> None:
    assert Bucket("key", rate=1000, burst=10, tokens=10).window_s == 1


def test_ratelimit_fields_follow_the_draft() -> None:
    buckets = [Bucket("key", 10, 20, 19), Bucket("ip", 40, 80, 0.5)]
    assert ratelimit_policy(buckets) == '"key";q=20;w=2, "ip";q=80;w=2'
    assert ratelimit(buckets) == '"key";r=19;t=1, "ip";r=0;t=2'
    assert set(ratelimit_fields(buckets)) == {"RateLimit", "RateLimit-Policy"}
    assert ratelimit_fields([]) == {}


# ---- Authorization and the client -------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "token"),
    [
        ("Bearer tfk_abc", "tfk_abc"),
        ("bearer tfk_abc", "tfk_abc"),
        ("Bearer  tfk_a-b_c.d~e+f/g==", "tfk_a-b_c.d~e+f/g=="),
        ("Basic dXNlcjpwYXNz", None),
        ("Bearer", None),
        ("Bearer a b", None),
        ("Bearer " + "a" * 600, None),
        (None, None),
    ],
)
def test_bearer_tokens(value: str | None, token: str | None) -> None:
    assert bearer_token(value) == token


def test_the_client_is_the_peer_unless_proxies_are_trusted() -> None:
    assert client_ip("10.0.0.1", "1.2.3.4", 0) == "10.0.0.1"
    # one trusted proxy: the entry it appended is the client; earlier ones are forgeable
    assert client_ip("10.0.0.1", "6.6.6.6, 1.2.3.4", 1) == "1.2.3.4"
    assert client_ip("10.0.0.1", "1.2.3.4, 10.0.0.2", 2) == "1.2.3.4"
    assert client_ip("10.0.0.1", "1.2.3.4", 2) == "10.0.0.1"  # fewer hops than proxies
    assert client_ip(None, None, 0) == "unknown"
