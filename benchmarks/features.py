"""`ticketflow bench features`: the feature job's updates/s against redis-benchmark running
the same update script, and the online reader's latency with its cache warm and cold.

1. `events` tickets of `entities` users go to a fresh `<prefix>tickets.in` (the deployment's
   partition count); the feature job (`python -m feature_jobs`, a fresh consumer group) reads
   them into Redis database 15 under a key prefix of the run. Its rate is taken from its own
   `feature_job_events_total` between 10 % and 90 % of the events, so start-up is left out.
   One event is one update however many of its view's windows it touches.
2. `redis-benchmark` runs the same EVALSHA with a representative event's arguments, entity
   and event id drawn at random, pipelined 16 deep (`-P 16`, 50 clients), on the same server.
3. Reads of the job's entities: cold (no in-process cache: one Redis round trip each) and
   warm (cache hits), one at a time, on loopback.

Everything the run wrote (keys under its prefix, its topic, its consumer group) is removed.
The machine is shared: the load average before and after is recorded with the figures.
"""

from __future__ import annotations

import asyncio
import os
import random
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import orjson

from feature_jobs.settings import FeatureSettings
from feature_jobs.store import MARK_BUILT_LUA, UPDATE_LUA, ViewEncoder, ViewKeys, marker_ttl_ms
from feature_jobs.views import VIEWS
from feature_jobs.writer import UPDATE_SHA, parse_ticket
from streams.kafka_config import confluent_config
from streams.redis_config import connection_kwargs, sync_client
from streams.settings import REPO_ROOT, Settings

BENCH_DB = 15
POLL_S = 0.1  # how often the job's counters are read while it runs
TARGET_RATIO = 0.25
TARGET_WARM_P99_MS = 2.0
TARGET_COLD_P99_MS = 5.0
VIEW = "user_ticket_stats"
WORDS = ["order", "account", "password", "invoice", "delivery", "broken", "refund", "screen"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tickets(n: int, entities: int, seed: int = 7) -> list[bytes]:
    rng = random.Random(seed)
    start = time.time() - 1800
    out = []
    for i in range(n):
        ts = start + 1800 * i / n  # in event-time order, as a live stream mostly is
        out.append(
            orjson.dumps(
                {
                    "ticket_id": f"b{i}",
                    "text": " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 40))),
                    "user_id": f"u{rng.randrange(entities)}",
                    "channel": rng.choice(["email", "chat", "web", "phone", "api"]),
                    "created_at": datetime.fromtimestamp(ts, timezone.utc).isoformat(),
                }
            )
        )
    return out


def _percentiles(samples: list[float]) -> dict[str, float]:
    xs = sorted(samples)

    def q(p: float) -> float:
        return xs[min(len(xs) - 1, int(p * len(xs)))] * 1000

    return {"p50_ms": q(0.50), "p95_ms": q(0.95), "p99_ms": q(0.99), "max_ms": xs[-1] * 1000}


def _events_done(port: int) -> float | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=1) as resp:
            text = resp.read().decode()
    except OSError:
        return None
    total = 0.0
    for m in re.finditer(r"^feature_job_events_total\{[^}]*\} (\S+)$", text, re.M):
        total += float(m.group(1))
    return total


def _run_job(
    settings: Settings, env: dict[str, str], n: int, workers: int, log: Path, echo
) -> dict[str, Any]:
    ports = [_free_port() for _ in range(workers)]
    procs: list[subprocess.Popen] = []
    samples: list[tuple[float, float]] = []
    with log.open("wb") as fh:
        for port in ports:
            full = {**os.environ, **env, "TICKETFLOW_FEATURES_WEB_PORT": str(port)}
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "feature_jobs"],
                    cwd=REPO_ROOT,
                    env=full,
                    stdout=fh,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
    started = time.monotonic()
    try:
        deadline = started + 60 + n / 1000
        while time.monotonic() < deadline:
            if any(p.poll() is not None for p in procs):
                raise RuntimeError(f"a feature job exited; see {log}")
            counts = [_events_done(port) for port in ports]
            if all(c is not None for c in counts):
                done = sum(counts)
                samples.append((time.monotonic(), done))
                if done >= n:
                    break
            time.sleep(POLL_S)
        else:
            raise TimeoutError(f"the feature job did not get through {n} events; see {log}")
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
    lo = next(s for s in samples if s[1] >= 0.1 * n)
    hi = next(s for s in samples if s[1] >= 0.9 * n)
    first = next(s for s in samples if s[1] > 0)
    rate = (hi[1] - lo[1]) / max(1e-9, hi[0] - lo[0])
    echo(
        f"feature job ({workers} worker{'s' if workers > 1 else ''}): {rate:,.0f} events/s "
        f"(10-90 %), first event {first[0] - started:.1f} s in"
    )
    return {
        "updates_per_s": rate,
        "events": n,
        "workers": workers,
        "startup_s": first[0] - started,
        "total_s": samples[-1][0] - first[0],
    }


def _redis_benchmark(settings: Settings, key_prefix: str, requests: int, entities: int, echo):
    binary = shutil.which("redis-benchmark")
    if binary is None:
        raise RuntimeError("redis-benchmark is missing: `apt-get install redis-tools`")
    host, port = settings.redis_host_port
    client = sync_client(settings.redis.with_db(BENCH_DB))
    _delete_prefix(client, key_prefix)  # every run starts from the same empty state
    client.script_load(UPDATE_LUA)
    view = VIEWS[VIEW]
    enc = ViewEncoder(view, key_prefix)
    now_ms = int(time.time() * 1000)
    rec = parse_ticket(_tickets(1, 1)[0])
    rec = rec.model_copy(update={"text": "my order has not arrived, please refund me"})
    args = enc.args(rec, "e__rand_int__", "i__rand_int__", now_ms - 60_000, now_ms)
    cmd = [
        binary, "-h", host, "-p", str(port), "--dbnum", str(BENCH_DB), "-n", str(requests),
        "-c", "50", "-P", "16", "-r", str(entities), "--csv",
        *_benchmark_auth(settings), "EVALSHA", UPDATE_SHA, "2", *args,
    ]  # fmt: skip
    env = {**os.environ}
    password = connection_kwargs(settings.redis).get("password")
    if password:
        env["REDISCLI_AUTH"] = password
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"redis-benchmark failed: {done.stderr[-500:]}")
    rows = [line for line in done.stdout.splitlines() if line.startswith('"EVALSHA')]
    rps = float(rows[-1].split(",")[1].strip('"'))
    echo(f"redis-benchmark, same script, -P 16: {rps:,.0f} updates/s")
    # the password, if any, is passed in REDISCLI_AUTH, never on the command line
    shown = " ".join(a if " " not in a and a else repr(a) for a in cmd[:20])
    return {"updates_per_s": rps, "requests": requests, "command": shown + " ..."}


def _benchmark_auth(settings: Settings) -> list[str]:
    """redis-benchmark's options for the same user and TLS as the job's client."""
    kw = connection_kwargs(settings.redis)
    out = ["--user", kw["username"]] if kw.get("username") else []
    if settings.redis.tls:
        out.append("--tls")
        if settings.redis_ca_file is not None:
            out += ["--cacert", str(settings.redis_ca_file)]
    return out


async def _reads(settings: Settings, key_prefix: str, users: list[str], reads: int, echo):
    from feature_jobs.reader import OnlineFeatureReader

    url = settings.redis.with_db(BENCH_DB)
    rng = random.Random(3)
    out: dict[str, Any] = {}
    cold = OnlineFeatureReader(url, VIEWS, cache_ttl_s=0, key_prefix=key_prefix)
    warm = OnlineFeatureReader(url, VIEWS, cache_ttl_s=3600, key_prefix=key_prefix)
    try:
        for reader in (cold, warm):  # connect, and load the warm cache
            for u in users[:reads]:
                await reader.read(VIEW, u, 1.0)
        for name, reader in (("cold", cold), ("warm", warm)):
            lat, fallbacks = [], 0
            for _ in range(reads):
                u = users[rng.randrange(min(reads, len(users)))]
                t = time.perf_counter()
                values = await reader.read(VIEW, u, 1.0)
                lat.append(time.perf_counter() - t)
                fallbacks += any(v.is_fallback for v in values.values())
            out[name] = {**_percentiles(lat), "reads": reads, "fallbacks": fallbacks}
            echo(f"online read, cache {name}: p99 {out[name]['p99_ms']:.3f} ms")
    finally:
        await cold.close()
        await warm.close()
    return out


def _plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    job = result["job"]["updates_per_s"]
    rb = result["redis_benchmark"]["updates_per_s"]
    a.bar(
        ["feature job\n(Faust, Kafka -> Redis)", "redis-benchmark\n(same script, -P 16)"],
        [job, rb],
        color=["tab:blue", "tab:gray"],
    )
    a.axhline(rb * TARGET_RATIO, color="tab:red", ls="--", lw=1, label="target: 25 %")
    a.set_ylabel("updates / s")
    a.set_title(f"updates into Redis: {result['ratio']:.0%} of redis-benchmark")
    a.legend()
    labels = ["p50_ms", "p95_ms", "p99_ms"]
    x = range(len(labels))
    for off, name, color in ((-0.2, "warm", "tab:green"), (0.2, "cold", "tab:orange")):
        vals = [result["reads"][name][k] for k in labels]
        b.bar([i + off for i in x], vals, width=0.4, label=f"cache {name}", color=color)
    b.axhline(TARGET_WARM_P99_MS, color="tab:green", ls="--", lw=1)
    b.axhline(TARGET_COLD_P99_MS, color="tab:orange", ls="--", lw=1)
    b.set_xticks(list(x), ["p50", "p95", "p99"])
    b.set_yscale("log")
    b.set_ylabel("ms")
    b.set_title("online read latency (loopback); dashed: p99 targets")
    b.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _delete_prefix(client, key_prefix: str) -> None:
    """Delete the keys of one prefix (never anything else: the server is shared)."""
    batch = []
    for k in client.scan_iter(match=f"{key_prefix}:*", count=5000):
        batch.append(k)
        if len(batch) >= 1000:
            client.delete(*batch)
            batch = []
    if batch:
        client.delete(*batch)


def _cleanup(settings: Settings, topic_prefix: str, key_prefix: str, group_prefix: str) -> None:
    from streams.admin import delete_prefixed

    _delete_prefix(sync_client(settings.redis.with_db(BENCH_DB)), key_prefix)
    delete_prefixed(settings, topic_prefix, group_prefix)


def _produce(settings: Settings, source: str, events: int, entities: int) -> None:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient(confluent_config(settings))
    for f in admin.create_topics([NewTopic(source, settings.partitions, 1)]).values():
        f.result()
    p = Producer(confluent_config(settings, {"linger.ms": 20}))
    for i, raw in enumerate(_tickets(events, entities)):
        p.produce(source, key=f"b{i}".encode(), value=raw)
        if i % 10_000 == 0:
            p.poll(0)
    if p.flush(60):
        raise RuntimeError("could not publish the benchmark's tickets")


def run_bench(
    events: int = 40_000,
    entities: int = 5_000,
    reads: int = 5_000,
    benchmark_requests: int = 100_000,
    workers: int = 1,
    repeats: int = 3,
    out: Path = Path("bench/results"),
    echo: Callable[..., Any] = print,
) -> dict[str, Any]:
    """Job runs and redis-benchmark runs alternate (rb, job, rb, job, ..., rb); each job run
    is compared with the mean of the redis-benchmark runs on either side of it, and the
    median of those ratios is the figure (the machine is shared: its load moves)."""
    settings = Settings()
    fs = FeatureSettings()
    run = uuid.uuid4().hex[:6]
    base = f"bench{run}"
    result: dict[str, Any] = {
        "when": datetime.now(timezone.utc).isoformat(),
        "command": f"ticketflow bench features --events {events} --entities {entities} "
        f"--reads {reads} --benchmark-requests {benchmark_requests} --workers {workers} "
        f"--repeats {repeats}",
        "machine": {"cpus": os.cpu_count(), "loadavg_before": os.getloadavg()},
        "settings": {
            "batch_size": fs.batch_size,
            "batch_within_s": fs.batch_within_s,
            "partitions": settings.partitions,
        },
    }
    out.mkdir(parents=True, exist_ok=True)
    jobs: list[dict[str, Any]] = []
    rbs: list[dict[str, Any]] = []
    try:
        rbs.append(_redis_benchmark(settings, f"{base}rb:fv", benchmark_requests, entities, echo))
        for i in range(repeats):
            topic_prefix, key_prefix = f"{base}r{i}.", f"{base}r{i}:fv"
            echo(f"run {i + 1}/{repeats}: {events:,} tickets of {entities:,} users")
            _produce(settings, f"{topic_prefix}tickets.in", events, entities)
            env = {
                "TICKETFLOW_TOPIC_PREFIX": topic_prefix,
                "TICKETFLOW_REDIS_URL": settings.redis.with_db(BENCH_DB).url.get_secret_value(),
                "TICKETFLOW_FEATURES_KEY_PREFIX": key_prefix,
                "TICKETFLOW_FEATURES_DRIFT_ENABLED": "false",
            }
            log = Path(settings.state_dir) / "logs" / "bench-features-job.log"
            log.parent.mkdir(parents=True, exist_ok=True)
            jobs.append(_run_job(settings, env, events, workers, log, echo))
            rbs.append(
                _redis_benchmark(settings, f"{base}rb:fv", benchmark_requests, entities, echo)
            )
            if i < repeats - 1:
                _cleanup(settings, topic_prefix, key_prefix, f"{topic_prefix}ticketflow-features")
        ratios = [
            j["updates_per_s"] / ((rbs[i]["updates_per_s"] + rbs[i + 1]["updates_per_s"]) / 2)
            for i, j in enumerate(jobs)
        ]
        order = sorted(range(len(ratios)), key=ratios.__getitem__)
        mid = order[len(order) // 2]
        result["runs"] = [
            {"job": j, "ratio": r, "redis_benchmark_around": [rbs[i], rbs[i + 1]]}
            for i, (j, r) in enumerate(zip(jobs, ratios, strict=True))
        ]
        result["ratio"] = ratios[mid]
        result["job"] = jobs[mid]
        rb_mid = (rbs[mid]["updates_per_s"] + rbs[mid + 1]["updates_per_s"]) / 2
        result["redis_benchmark"] = {**rbs[mid], "updates_per_s": rb_mid}
        # reads: of the last run's entities, with its view marked built
        client = sync_client(settings.redis.with_db(BENCH_DB))
        keys = ViewKeys.of(VIEWS[VIEW], key_prefix)
        if client.get(keys.built) is None:  # the job marks it once through; be sure
            client.eval(
                MARK_BUILT_LUA,
                2,
                keys.built,
                keys.pointer,
                keys.signature,
                marker_ttl_ms(VIEWS[VIEW]),
            )
        users = [f"u{i}" for i in range(entities)]
        random.Random(5).shuffle(users)
        result["reads"] = asyncio.run(_reads(settings, key_prefix, users, reads, echo))
    finally:
        for i in range(repeats):
            tp = f"{base}r{i}."
            _cleanup(settings, tp, f"{base}r{i}:fv", f"{tp}ticketflow-features")
        _cleanup(settings, f"{base}rb.", f"{base}rb:fv", f"{base}rb.")
    result["machine"]["loadavg_after"] = os.getloadavg()
    warm, cold = result["reads"]["warm"]["p99_ms"], result["reads"]["cold"]["p99_ms"]
    targets = {
        "ratio_ge_25pct": result["ratio"] >= TARGET_RATIO,
        "warm_p99_le_2ms": warm <= TARGET_WARM_P99_MS,
        "cold_p99_le_5ms": cold <= TARGET_COLD_P99_MS,
    }
    result["summary"] = {
        "job_updates_per_s": round(result["job"]["updates_per_s"]),
        "redis_benchmark_updates_per_s": round(result["redis_benchmark"]["updates_per_s"]),
        "ratio": round(result["ratio"], 3),
        "ratios": [round(r, 3) for r in ratios],
        "read_p99_warm_ms": round(warm, 3),
        "read_p99_cold_ms": round(cold, 3),
        "targets": targets,
        "targets_met": all(targets.values()),
    }
    (out / "features.json").write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2))
    _plot(result, out / "features.png")
    echo(f"wrote {out / 'features.json'} and {out / 'features.png'}")
    return result
