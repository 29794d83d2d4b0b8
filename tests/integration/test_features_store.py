"""The feature store on a real Redis: windows against an independent computation, TTLs,
idempotent replays, and a Redis that stops and comes back.

Every key lives under a prefix of this run, in Redis database 14 of the local stack; the
outage test runs a redis-server of its own on a free port.
"""

from __future__ import annotations

import asyncio
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import time
import uuid
from collections import defaultdict
from datetime import datetime, timezone
from pathlib import Path

import orjson
import pytest
import redis
import redis.asyncio as aioredis

from feature_jobs.reader import OnlineFeatureReader
from feature_jobs.store import MARK_BUILT_LUA, ViewKeys, marker_ttl_ms, materialize
from feature_jobs.views import VIEWS
from feature_jobs.writer import FeatureWriter
from schemas.features import FeatureView

pytestmark = pytest.mark.integration

RUN = uuid.uuid4().hex[:8]
REDIS_DB = 14
VIEW = VIEWS["user_ticket_stats"]
CHANNELS = ["email", "chat", "web", "phone", "api"]
WORDS = [
    "order",
    "account",
    "password",
    "invoice",
    "delivery",
    "broken",
    "screen",
    "login",
    "charge",
    "package",
]


def redis_url(port: int = 6379, db: int = REDIS_DB) -> str:
    return f"redis://127.0.0.1:{port}/{db}"


def iso(ts_ms: int) -> str:
    return datetime.fromtimestamp(ts_ms / 1000, timezone.utc).isoformat()


def ms(value: str) -> int:
    return int(datetime.fromisoformat(value).timestamp() * 1000)


# ---- a generated event stream and an independent computation over it -----------------------


def generate_stream(users: int, seed: int, now_ms: int, grace_s: int, tag: str) -> list[dict]:
    """Tickets of `users` users, interleaved, with old, late, too-late, duplicated, future
    and entity-less events; each user's own events in the order they arrive."""
    rng = random.Random(seed)
    grace = grace_s * 1000
    per_user: list[list[dict]] = []
    for u in range(users):
        user = f"{tag}u{u}"
        t = now_ms - rng.choice([12, 5, 2]) * 86_400_000  # some history days back
        seq: list[dict] = []
        sent: list[dict] = []
        for k in range(rng.randint(4, 30)):
            if k == 1:
                t = now_ms - rng.randint(2 * 3_600_000, 4 * 3_600_000)
            else:
                t += rng.randint(1_000, 15 * 60_000)
            t = min(t, now_ms - 1_000)
            roll = rng.random()
            if roll < 0.10 and sent:
                seq.append(dict(rng.choice(sent)))  # redelivered as it was
                continue
            ts = t
            if roll < 0.20:
                ts = t - rng.randint(1_000, int(grace * 0.9))  # late, within grace
            elif roll < 0.26:
                ts = t - grace - rng.randint(1_000, 3 * 3_600_000)  # too late
            elif roll < 0.28:
                ts = now_ms + grace + 60_000  # dated in the future
            text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 40)))
            if rng.random() < 0.2:
                text += rng.choice([" please refund me", " I want to return this", " 退款"])
            rec = {
                "ticket_id": f"{tag}t{u}-{k}",
                "text": text,
                "user_id": None if rng.random() < 0.02 else user,
                "channel": rng.choice(CHANNELS),
                "created_at": iso(ts),
            }
            seq.append(rec)
            sent.append(rec)
        per_user.append(seq)
    out: list[dict] = []
    cursors = [0] * users
    live = list(range(users))
    while live:
        u = rng.choice(live)
        out.append(per_user[u][cursors[u]])
        cursors[u] += 1
        if cursors[u] == len(per_user[u]):
            live.remove(u)
    return out


def oracle(view: FeatureView, records: list[dict], as_of_ms: int, now_ms: int) -> dict:
    """Feature values per entity straight from the definition of the semantics: an event
    counts unless its id was counted before, it is older than the newest counted event of
    its entity by more than the grace period, or it is dated beyond now + grace."""
    grace = view.grace_seconds * 1000
    accepted: dict[str, list[tuple[int, dict]]] = defaultdict(list)
    seen: dict[str, set[str]] = defaultdict(set)
    newest: dict[str, int] = {}
    for rec in records:
        entity = rec.get("user_id")
        if not entity:
            continue
        ts = ms(rec["created_at"])
        if ts > now_ms + grace:
            continue
        if entity in newest and ts < newest[entity] - grace:
            continue
        if rec["ticket_id"] in seen[entity]:
            continue
        seen[entity].add(rec["ticket_id"])
        accepted[entity].append((ts, rec))
        newest[entity] = max(newest.get(entity, ts), ts)
    entities = {r["user_id"] for r in records if r.get("user_id")}
    out = {}
    for e in entities:
        events = accepted.get(e, [])
        values = {}
        for f in view.features:

            def in_window(ts: int, f=f) -> bool:
                if f.window_seconds is None:
                    return True
                if not f.bucketed:
                    return ts >= as_of_ms - f.window_seconds * 1000
                b = f.bucket_s * 1000
                return ts // b > as_of_ms // b - f.window_seconds // f.bucket_s

            inside = [(ts, r) for ts, r in events if in_window(ts)]
            if f.aggregation == "count":
                values[f.name] = len(inside)
            elif f.aggregation == "count_matching":
                p = re.compile(f.match, re.IGNORECASE)
                values[f.name] = sum(bool(p.search(r[f.field])) for _, r in inside)
            elif f.aggregation == "mean":
                lens = [len(r[f.field]) for _, r in inside]
                values[f.name] = sum(lens) / len(lens) if lens else f.default
            elif f.aggregation == "distinct":
                values[f.name] = sorted({r[f.field] for _, r in inside if r[f.field]})
            else:
                last = max(inside, key=lambda x: x[0], default=None)
                values[f.name] = f.default if last is None else iso(last[0])
        out[e] = values
    return out


def assert_same(got: dict, want: dict) -> None:
    assert set(got) == set(want)
    for name, w in want.items():
        g = got[name]
        if isinstance(w, float):
            assert g == pytest.approx(w, rel=1e-9), name
        else:
            assert g == w, name


# ---- fixtures ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def shared_redis():
    client = redis.Redis.from_url(redis_url(), socket_connect_timeout=2)
    try:
        client.ping()
    except redis.RedisError:
        import devstack as stack
        from streams.settings import Settings

        stack.up(Settings())
    return client


@pytest.fixture
def prefix(shared_redis):
    p = f"itf{RUN}{uuid.uuid4().hex[:4]}:fv"
    yield p
    keys = list(shared_redis.scan_iter(match=f"{p}:*", count=1000))
    for i in range(0, len(keys), 500):
        shared_redis.delete(*keys[i : i + 500])


async def write_all(url: str, prefix: str, records: list[dict], batch: int = 200) -> dict:
    r = aioredis.from_url(url)
    try:
        writer = FeatureWriter(r, [VIEW], prefix)
        await writer.load_script()
        totals: dict[str, int] = defaultdict(int)
        raw = [orjson.dumps(x) for x in records]
        for i in range(0, len(raw), batch):
            out = await writer.apply(raw[i : i + batch])
            for k, v in out[VIEW.name].items():
                totals[k] += v
        keys = ViewKeys.of(VIEW, prefix)
        await r.eval(
            MARK_BUILT_LUA, 2, keys.built, keys.pointer, keys.signature, marker_ttl_ms(VIEW)
        )
        return dict(totals)
    finally:
        await r.aclose()


def snapshot(client: redis.Redis, prefix: str) -> dict[bytes, dict]:
    keys = ViewKeys.of(VIEW, prefix)
    return {
        k: client.hgetall(k)
        for k in client.scan_iter(match=keys.entity_pattern(), count=1000)
        if not k.endswith(b":ids")
    }


# ---- tests ------------------------------------------------------------------------------


def test_windows_match_an_independent_computation(shared_redis, prefix):
    now_ms = int(time.time() * 1000)
    records = generate_stream(120, seed=11, now_ms=now_ms, grace_s=VIEW.grace_seconds, tag="a")
    totals = asyncio.run(write_all(redis_url(), prefix, records))
    assert totals["late"] > 0 and totals["duplicate"] > 0 and totals["future"] > 0
    assert totals["no_entity"] > 0
    as_of = int(time.time() * 1000)
    want = oracle(VIEW, records, as_of, now_ms)
    keys = ViewKeys.of(VIEW, prefix)
    for entity, values in want.items():
        raw = shared_redis.hgetall(keys.state(entity))
        assert_same(materialize(VIEW, raw, as_of), values)
    # the counts of outcomes agree with the computation too
    applied = sum(1 for _ in records)  # every record reaches one outcome
    assert sum(totals.values()) == applied


def test_every_key_has_a_ttl_and_replays_change_nothing(shared_redis, prefix):
    now_ms = int(time.time() * 1000)
    records = generate_stream(60, seed=12, now_ms=now_ms, grace_s=VIEW.grace_seconds, tag="b")
    asyncio.run(write_all(redis_url(), prefix, records))
    keys = list(shared_redis.scan_iter(match=f"{prefix}:*", count=1000))
    assert len(keys) > 100
    no_ttl = [k for k in keys if shared_redis.pttl(k) < 0]
    assert not no_ttl, f"keys without a TTL: {no_ttl[:5]}"
    # an entity's state lives as long as its longest window can still see its newest event
    k = ViewKeys.of(VIEW, prefix).state("bu0")
    assert shared_redis.pttl(k) > 29 * 86_400_000
    before = snapshot(shared_redis, prefix)
    # replay everything, in another order and in other batch sizes: not one value moves
    shuffled = list(records)
    random.Random(3).shuffle(shuffled)
    again = asyncio.run(write_all(redis_url(), prefix, shuffled, batch=37))
    assert again.get("applied", 0) == 0
    assert snapshot(shared_redis, prefix) == before


# ---- Redis stopped and back: an own redis-server ------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class OwnRedis:
    def __init__(self, tmp: Path) -> None:
        self.port = free_port()
        self.dir = tmp
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        binary = shutil.which("redis-server") or "/usr/bin/redis-server"
        self.proc = subprocess.Popen(
            [
                binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--dir",
                str(self.dir),
                "--save",
                "",
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
                "--daemonize",
                "no",
                "--logfile",
                str(self.dir / "redis.log"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        client = redis.Redis(port=self.port, socket_connect_timeout=0.2)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                if client.ping():
                    return
            except redis.RedisError:
                time.sleep(0.05)
        raise RuntimeError("own redis-server did not start")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            self.proc.wait(10)

    def pause(self) -> None:
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.proc.send_signal(signal.SIGCONT)


@pytest.fixture
def own_redis(tmp_path):
    server = OwnRedis(tmp_path)
    server.start()
    yield server
    server.stop()


async def _read_all(reader, users, timeout_s=0.2):
    return await asyncio.gather(*(reader.read(VIEW.name, u, timeout_s) for u in users))


def test_redis_stopped_gives_flagged_fallbacks_and_coverage_recovers(own_redis):
    from agents.steps.handlers import FeatureLookupStep
    from schemas.tickets import Envelope, Ticket
    from schemas.workflow import Step

    url = f"redis://127.0.0.1:{own_redis.port}/0"
    now_ms = int(time.time() * 1000)
    records = generate_stream(20, seed=13, now_ms=now_ms, grace_s=VIEW.grace_seconds, tag="c")
    asyncio.run(write_all(url, "own:fv", records))
    users = sorted({r["user_id"] for r in records if r.get("user_id")})

    async def scenario():
        reader = OnlineFeatureReader(
            url, VIEWS, cache_ttl_s=0, key_prefix="own:fv", coverage_window_s=1, retry_after_s=0.1
        )
        step = FeatureLookupStep(reader)
        try:
            up = await _read_all(reader, users)
            assert all(not v.is_fallback for row in up for v in row.values())
            assert reader.coverage(VIEW.name) == 1.0

            # slow: the server stops answering; reads give up at their timeout
            own_redis.pause()
            started = time.perf_counter()
            down = await _read_all(reader, users, timeout_s=0.2)
            assert time.perf_counter() - started < 1.0
            assert all(v.is_fallback for row in down for v in row.values())
            assert reader.coverage(VIEW.name) < 0.6
            # and a ticket still gets through the features step, its values flagged
            env = Envelope(
                ticket=Ticket(ticket_id="x1", text="hi", user_id=users[0], created_at=iso(now_ms)),
                workflow="w",
                workflow_version=1,
                step="features",
                trace_id="t",
                arrival="0:0",
                started_at=datetime.now(timezone.utc),
            )
            s = Step(name="features", type="feature_lookup", views=[VIEW.name], timeout_ms=200)
            run = getattr(step, "run", None) or step  # the handler API of agents/ moves
            await asyncio.wait_for(run(env, s), 2)
            assert env.context.features and all(
                v.is_fallback for v in env.context.features.values()
            )

            # back: real values again, and coverage returns to 1 within its window
            own_redis.resume()
            await asyncio.sleep(0.2)
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                back = await _read_all(reader, users)
                if all(not v.is_fallback for row in back for v in row.values()):
                    break
                await asyncio.sleep(0.1)
            else:
                pytest.fail("reads did not recover after Redis came back")
            await asyncio.sleep(1.1)
            await _read_all(reader, users)
            assert reader.coverage(VIEW.name) == 1.0

            # down: connection refused, answered fast; up again from its append-only file
            own_redis.stop()
            started = time.perf_counter()
            down = await _read_all(reader, users)
            assert time.perf_counter() - started < 0.5
            assert all(v.is_fallback for row in down for v in row.values())
            own_redis.start()
            await asyncio.sleep(0.2)
            back = await _read_all(reader, users)
            assert all(not v.is_fallback for row in back for v in row.values())
            assert back == up
        finally:
            await reader.close()

    asyncio.run(scenario())

    # the writer after the restart: the server lost its scripts, the writer loads them again
    more = generate_stream(5, seed=14, now_ms=int(time.time() * 1000), grace_s=600, tag="d")
    totals = asyncio.run(write_all(url, "own:fv", more))
    assert totals.get("applied", 0) > 0


def test_writer_raises_while_redis_is_down_so_the_job_retries(own_redis):
    url = f"redis://127.0.0.1:{own_redis.port}/0"
    own_redis.stop()
    records = generate_stream(2, seed=15, now_ms=int(time.time() * 1000), grace_s=600, tag="e")
    with pytest.raises((redis.RedisError, OSError)):
        asyncio.run(write_all(url, "own:fv", records))


@pytest.fixture(autouse=True)
def _no_proxy_env(monkeypatch):
    # the reader's settings come from the environment: keep a developer's out of the tests
    for name in list(os.environ):
        if name.startswith("TICKETFLOW_FEATURES_"):
            monkeypatch.delenv(name)
