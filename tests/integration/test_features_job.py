"""The streaming feature job end to end: tickets.in on Kafka -> the Faust job -> Redis.

A generated stream (late, too late, duplicated and future events included) against an
independent computation; every key with a TTL; the stream published a second time changes
nothing; a changed view definition is refused by the reader until the job has rebuilt it.
The job runs as `python -m feature_jobs` on a topic prefix, key prefix and Redis database of
this run; the source topic has one partition so that arrival order is the produce order.
"""

from __future__ import annotations

import asyncio
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import orjson
import pytest
import redis
import yaml
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from feature_jobs.cli import _prune
from feature_jobs.reader import OnlineFeatureReader, SignatureMismatch
from feature_jobs.settings import FeatureSettings
from feature_jobs.store import ViewKeys, materialize
from feature_jobs.views import VIEWS_FILE, load_views
from streams.admin import delete_prefixed
from streams.settings import REPO_ROOT, Settings
from tests.integration.test_features_store import (
    assert_same,
    generate_stream,
    oracle,
    redis_url,
)

pytestmark = pytest.mark.integration

RUN = uuid.uuid4().hex[:8]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Job:
    """`python -m feature_jobs` in a child process, with its own web port."""

    def __init__(self, env: dict[str, str], views_file: Path, log: Path) -> None:
        self.port = free_port()
        full = {**os.environ, **env, "TICKETFLOW_FEATURES_WEB_PORT": str(self.port)}
        self.log = log
        with log.open("ab") as fh:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "feature_jobs", "--views-file", str(views_file)],
                cwd=REPO_ROOT,
                env=full,
                stdout=fh,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def metrics(self) -> dict[str, float]:
        """feature_job_events_total by outcome (all views)."""
        try:
            url = f"http://127.0.0.1:{self.port}/metrics"
            with urllib.request.urlopen(url, timeout=1) as resp:
                text = resp.read().decode()
        except OSError:
            return {}
        out: dict[str, float] = {}
        for m in re.finditer(r"^feature_job_events_total\{([^}]*)\} (\S+)$", text, re.M):
            outcome = re.search(r'outcome="([^"]+)"', m.group(1)).group(1)
            out[outcome] = out.get(outcome, 0.0) + float(m.group(2))
        return out

    def wait(self, what: str, check, timeout_s: float = 30) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the feature job exited: {self.log.read_text()[-3000:]}")
            if check():
                return
            time.sleep(0.1)
        raise TimeoutError(f"feature job: not {what} after {timeout_s} s; see {self.log}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    settings = Settings()
    client = redis.Redis.from_url(redis_url(), socket_connect_timeout=2)
    try:
        client.ping()
        AdminClient({"bootstrap.servers": settings.kafka_bootstrap}).list_topics(timeout=5)
    except Exception:
        import devstack as stack

        stack.up(settings)
    topic_prefix = f"itf{RUN}."
    key_prefix = f"itf{RUN}:fv"
    admin = AdminClient({"bootstrap.servers": settings.kafka_bootstrap})
    source = f"{topic_prefix}tickets.in"
    for f in admin.create_topics([NewTopic(source, 1, 1)]).values():
        f.result()
    yield {
        "settings": settings,
        "source": source,
        "key_prefix": key_prefix,
        "url": redis_url(),
        "client": client,
        "tmp": tmp_path_factory.mktemp("features"),
        "env": {
            "TICKETFLOW_TOPIC_PREFIX": topic_prefix,
            "TICKETFLOW_REDIS_URL": redis_url(),
            "TICKETFLOW_FEATURES_KEY_PREFIX": key_prefix,
            "TICKETFLOW_FEATURES_DRIFT_ENABLED": "false",
            "TICKETFLOW_FEATURES_BATCH_WITHIN_S": "0.02",
        },
    }
    keys = list(client.scan_iter(match=f"{key_prefix}:*", count=1000))
    for i in range(0, len(keys), 500):
        client.delete(*keys[i : i + 500])
    delete_prefixed(settings, topic_prefix, f"{topic_prefix}ticketflow-features")


def produce(settings: Settings, topic: str, records: list[dict]) -> None:
    p = Producer({"bootstrap.servers": settings.kafka_bootstrap, "linger.ms": 5})
    for r in records:
        p.produce(topic, key=r["ticket_id"].encode(), value=orjson.dumps(r))
    assert p.flush(30) == 0


def changed_views_file(tmp: Path) -> Path:
    """The default views with one definition changed: tickets_1h in 5-minute buckets."""
    doc = yaml.safe_load(VIEWS_FILE.read_text())
    for f in doc["views"][0]["features"]:
        if f["name"] == "tickets_1h":
            f["bucket_seconds"] = 300
    path = tmp / "views-v2.yaml"
    path.write_text(yaml.safe_dump(doc, allow_unicode=True))
    return path


def check_against_oracle(client, view, key_prefix, records, now_ms) -> None:
    as_of = int(time.time() * 1000)
    want = oracle(view, records, as_of, now_ms)
    keys = ViewKeys.of(view, key_prefix)
    for entity, values in want.items():
        assert_same(materialize(view, client.hgetall(keys.state(entity)), as_of), values)


def test_job_counts_windows_replays_idempotently_and_rebuilds_a_changed_view(env):
    settings, client, key_prefix = env["settings"], env["client"], env["key_prefix"]
    v1 = load_views(VIEWS_FILE)
    view = v1["user_ticket_stats"]
    now_ms = int(time.time() * 1000)
    records = generate_stream(80, seed=21, now_ms=now_ms, grace_s=view.grace_seconds, tag="j")
    produce(settings, env["source"], records)
    n = len(records)

    job = Job(env["env"], VIEWS_FILE, env["tmp"] / "job-v1.log")
    try:
        k1 = ViewKeys.of(view, key_prefix)
        job.wait("built", lambda: client.get(k1.built) is not None, 40)
        job.wait("through the stream", lambda: sum(job.metrics().values()) >= n)
        counted = job.metrics()
        assert counted["late"] > 0 and counted["duplicate"] > 0 and counted["future"] > 0
        check_against_oracle(client, view, key_prefix, records, now_ms)

        keys = list(client.scan_iter(match=f"{key_prefix}:*", count=1000))
        assert keys and all(client.pttl(k) > 0 for k in keys), "a key without a TTL"

        # the same records published again (a producer retry, an ops replay): no change
        before = {k: client.hgetall(k) for k in keys if not k.endswith((b":ids", b"__"))}
        produce(settings, env["source"], records)
        job.wait("through the replay", lambda: sum(job.metrics().values()) >= 2 * n)
        assert job.metrics().get("applied") == counted.get("applied")
        assert {k: client.hgetall(k) for k in before} == before
    finally:
        job.stop()

    # a changed definition: refused by the reader, naming both signatures ...
    v2_file = changed_views_file(env["tmp"])
    v2 = load_views(v2_file)
    sig1, sig2 = view.signature(), v2["user_ticket_stats"].signature()
    assert sig1 != sig2
    user = next(r["user_id"] for r in records if r.get("user_id"))

    async def read(views):
        reader = OnlineFeatureReader(env["url"], views, cache_ttl_s=0, key_prefix=key_prefix)
        try:
            return await reader.read("user_ticket_stats", user, 1.0)
        finally:
            await reader.close()

    with pytest.raises(SignatureMismatch) as err:
        asyncio.run(read(v2))
    assert sig1 in str(err.value) and sig2 in str(err.value)
    assert not any(v.is_fallback for v in asyncio.run(read(v1)).values())

    # ... until the job under the new definition has rebuilt it from the topic, which now
    # holds the stream twice: the rebuilt counts are those of the stream once
    job2 = Job(env["env"], v2_file, env["tmp"] / "job-v2.log")
    try:
        k2 = ViewKeys.of(v2["user_ticket_stats"], key_prefix)
        job2.wait("rebuilt", lambda: client.get(k2.built) is not None, 40)
        got = asyncio.run(read(v2))
        assert not any(v.is_fallback for v in got.values())
        check_against_oracle(client, v2["user_ticket_stats"], key_prefix, records, now_ms)
        assert client.get(k2.pointer).decode() == sig2
    finally:
        job2.stop()
    assert client.pttl(k2.built) > 0 and client.pttl(k2.pointer) > 0

    # the superseded definition's keys can go before their TTLs: `features prune`
    fs = FeatureSettings(key_prefix=key_prefix)
    s = Settings(redis_url=env["url"])
    pruned = asyncio.run(_prune(s, fs, v2, dry_run=False))["user_ticket_stats"]
    assert pruned > 0
    left = {k.decode() for k in client.scan_iter(match=f"{key_prefix}:*", count=1000)}
    assert not any(k1.tag in k for k in left) and any(k2.tag in k for k in left)
    with pytest.raises(SignatureMismatch):
        asyncio.run(read(v1))
