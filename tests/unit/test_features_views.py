"""Feature views as data: validation, signatures, the default view, reading state back."""

from __future__ import annotations

import re
from pathlib import Path

import orjson
import pytest
import yaml
from pydantic import ValidationError

from feature_jobs.store import ViewEncoder, ViewKeys, materialize, slots
from feature_jobs.views import VIEWS, VIEWS_FILE, ViewsFileError, load_views
from feature_jobs.writer import parse_ticket
from schemas.features import FeatureView

BASE = {
    "name": "v",
    "entity": "user_id",
    "source_topic": "tickets.in",
    "ttl_seconds": 300,
    "features": [{"name": "n", "type": "int", "default": 0, "aggregation": "count"}],
}


def view(**over) -> FeatureView:
    return FeatureView.model_validate({**BASE, **over})


def test_the_default_view_has_the_issue_features_and_a_ttl():
    v = VIEWS["user_ticket_stats"]
    assert v.ttl_seconds == 300 and v.entity == "user_id" and v.source_topic == "tickets.in"
    by_name = {f.name: f for f in v.features}
    assert by_name["tickets_1h"].window_seconds == 3600
    assert by_name["tickets_7d"].window_seconds == 7 * 86400
    assert by_name["refund_mentions_30d"].aggregation == "count_matching"
    assert by_name["mean_text_len_7d"].aggregation == "mean"
    assert by_name["channels"].type == "list[str]"
    assert by_name["last_ticket_at"].type == "timestamp"
    # the refund wording is the rules step's
    pattern = re.compile(by_name["refund_mentions_30d"].match, re.IGNORECASE)
    assert pattern.search("I want a REFUND") and pattern.search("申请退款")
    assert pattern.search("how do I return this jacket")
    assert not pattern.search("my password does not work")


def test_a_view_without_ttl_is_refused(tmp_path: Path):
    doc = yaml.safe_load(VIEWS_FILE.read_text())
    del doc["views"][0]["ttl_seconds"]
    path = tmp_path / "views.yaml"
    path.write_text(yaml.safe_dump(doc, allow_unicode=True))
    with pytest.raises(ViewsFileError, match="ttl_seconds"):
        load_views(path)
    with pytest.raises(ValidationError, match="ttl_seconds"):
        FeatureView.model_validate({k: v for k, v in BASE.items() if k != "ttl_seconds"})
    with pytest.raises(ValidationError):
        view(ttl_seconds=0)


@pytest.mark.parametrize(
    ("feature", "message"),
    [
        ({"aggregation": "count", "type": "float"}, "count gives"),
        ({"aggregation": "mean", "type": "float"}, "needs a `field`"),
        ({"aggregation": "count_matching", "type": "int", "field": "text"}, "`match`"),
        (
            {"aggregation": "count_matching", "type": "int", "field": "text", "match": "("},
            "bad `match`",
        ),
        (
            {"aggregation": "count", "type": "int", "window_seconds": 100, "bucket_seconds": 30},
            "whole",
        ),
        ({"aggregation": "count", "type": "int", "bucket_seconds": 30}, "needs `window_seconds`"),
        (
            {"aggregation": "count", "type": "int", "window_seconds": 86400, "bucket_seconds": 1},
            "buckets per entity",
        ),
    ],
)
def test_bad_feature_definitions_are_refused(feature, message):
    with pytest.raises(ValidationError, match=message):
        view(features=[{"name": "f", "default": 0, **feature}])


def test_signature_is_canonical_and_tracks_every_change():
    a = view()
    assert (
        a.signature() == FeatureView.model_validate(dict(reversed(list(BASE.items())))).signature()
    )
    changed = [
        view(ttl_seconds=301),
        view(grace_seconds=60),
        view(features=[{"name": "n", "type": "int", "default": 1, "aggregation": "count"}]),
        view(name="w"),
    ]
    sigs = {a.signature(), *(c.signature() for c in changed)}
    assert len(sigs) == 1 + len(changed)
    assert len(a.signature()) == 64


def test_keys_carry_the_signature_and_a_hash_tag():
    v = VIEWS["user_ticket_stats"]
    k = ViewKeys.of(v, "p")
    assert k.state("u1") == f"p:user_ticket_stats:{v.signature()[:16]}:{{u1}}"
    assert k.ids("u1").endswith("{u1}:ids")
    assert k.pointer == "p:user_ticket_stats:__signature__"
    assert k.built.endswith(":__built__") and v.signature()[:16] in k.built


def test_ring_sizes_cover_window_and_grace():
    v = VIEWS["user_ticket_stats"]
    by_name = {f.name: f for f in v.features}
    assert slots(by_name["tickets_1h"], v.grace_seconds) == 60 + 10 + 1
    assert slots(by_name["tickets_7d"], v.grace_seconds) == 168 + 1 + 1


def test_encoder_builds_one_script_call_per_event():
    v = VIEWS["user_ticket_stats"]
    enc = ViewEncoder(v, "p")
    rec = parse_ticket(
        orjson.dumps(
            {
                "ticket_id": "t1",
                "text": "please refund me",
                "user_id": "u1",
                "channel": "chat",
                "created_at": "2026-01-01T00:00:00Z",
            }
        )
    )
    ts = enc.event_ms(rec)
    assert ts == 1767225600000
    args = enc.args(rec, "u1", "t1", ts, ts)
    assert args[:3] == [enc.keys.state("u1"), enc.keys.ids("u1"), "t1"]
    ops = args[8:]
    assert len(ops) % 4 == 0
    kinds = [ops[i] for i in range(0, len(ops), 4)]
    assert kinds == ["c", "c", "c", "m", "d", "l"]  # the refund mention is counted


def test_materialize_reads_windows_as_of_a_time():
    v = view(
        grace_seconds=0,
        features=[
            {
                "name": "n1h",
                "type": "int",
                "default": 0,
                "aggregation": "count",
                "window_seconds": 3600,
                "bucket_seconds": 60,
            },
            {
                "name": "len",
                "type": "float",
                "default": 0.0,
                "aggregation": "mean",
                "window_seconds": 3600,
                "bucket_seconds": 60,
                "field": "text",
                "transform": "length",
            },
            {
                "name": "ch",
                "type": "list[str]",
                "default": [],
                "aggregation": "distinct",
                "field": "channel",
                "window_seconds": 600,
            },
            {
                "name": "last",
                "type": "timestamp",
                "default": None,
                "aggregation": "last",
                "field": "created_at",
            },
        ],
    )
    now = 1_000_000 * 60_000  # a bucket boundary
    b = now // 60_000
    raw = {
        b"_wm": str(now).encode(),
        b"0|1": f"{b}:3".encode(),  # this minute
        b"0|2": f"{b - 59}:2".encode(),  # 59 minutes ago: in the hour
        b"0|3": f"{b - 60}:5".encode(),  # 60 minutes ago: out
        b"1|1": f"{b}:30:2".encode(),
        b"1|3": f"{b - 60}:1000:1".encode(),
        b"2=chat": str(now - 1000).encode(),
        b"2=email": str(now - 700_000).encode(),  # older than 10 minutes
        b"3": f'{now}:"2026-01-01T00:00:00+00:00"'.encode(),
    }
    got = materialize(v, raw, now)
    assert got == {"n1h": 5, "len": 15.0, "ch": ["chat"], "last": "2026-01-01T00:00:00+00:00"}
    assert materialize(v, {}, now) == {"n1h": 0, "len": 0.0, "ch": [], "last": None}


def test_match_lookahead_keeps_matches_identical():
    from feature_jobs.store import compile_match

    pattern = VIEWS["user_ticket_stats"].features[2].match
    fast, plain = compile_match(pattern), re.compile(pattern, re.IGNORECASE)
    assert fast.pattern != plain.pattern  # the look-ahead is in front
    words = ["refund", "return", "it", "the", "money", "back", "send", "them", "退款", "退货"]
    words += ["x", "my", "want", "to", "charge", "policy", "window", "label", "reimburse"]
    words += ["ing", "a", "an", "REFUND", "ſend", "Return"]
    rng = __import__("random").Random(1)
    texts = [" ".join(rng.choice(words) for _ in range(rng.randint(1, 8))) for _ in range(5000)]
    assert any(plain.search(t) for t in texts) and not all(plain.search(t) for t in texts)
    assert all(bool(fast.search(t)) == bool(plain.search(t)) for t in texts)
    # patterns whose first character is not known stay as they are
    for p in ("a*b", "[^x]y", "foo|.bar", "(?i)abc"):
        assert compile_match(p).pattern == p
