"""`ticketflow bench ingest`: the HTTP ingest API against a bare producer, in one run.

The same records (tickets of about 300 bytes, keyed by ticket id) go to tickets.in of a
topic prefix of the run's own:

- bare, async: one confluent-kafka producer (ingest's configuration: acks=all, idempotent)
  producing every record, then flushing: the broker's ceiling on this machine;
- bare, same pattern: the same producer, but as ingest's clients use it, every record
  (or batch of 100) waits for its own acknowledgement, with as many in flight as the HTTP
  clients have requests: the ceiling for a service that answers only after the ack;
- ingest, single posts and batches of 100, closed loop with `concurrency` requests in flight
  (accepted tickets/s, latency per request), then single posts open-loop at half of their
  maximum for a few seconds (the latency target's load).

Ingest runs as its own process (`ticketflow ingest`, uvloop) with a key whose buckets do
not limit; the HTTP clients are minimal keep-alive HTTP/1.1 connections in this process,
so the load generator costs little CPU beside the service it measures. JSON and a PNG go
under bench/results/.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import orjson
from confluent_kafka import Producer
from rich.console import Console
from rich.table import Table

from benchmarks.pipeline import process_cpu_s
from devstack import app_processes
from ingest.keys import KeyStore
from ingest.limits import Limit, Limits, LimitStore
from ingest.service import redis_client
from ingest.settings import IngestSettings
from streams.admin import delete_prefixed, ensure_topics
from streams.kafka_config import confluent_config
from streams.producer import BASE_CONFIG
from streams.topics import Topics
from training.corpus import generate

console = Console()
BATCH = 100
BATCH_CONCURRENCY = 4  # batches in flight (400 tickets), for ingest and the bare producer alike
OPEN_LOOP_S = 5.0
OPEN_LOAD = 0.5  # the latency target's load: half of the single posts' maximum
WARM_UP = 200
TARGETS = {"single_ratio": 0.3, "batch_ratio": 0.7, "single_p99_ms_at_half": 25.0}


@dataclass
class Figure:
    name: str
    tickets_per_s: float = 0.0
    requests: int = 0
    latency_ms: dict[str, float] = field(default_factory=dict)
    cpu_ms_per_ticket: float | None = None
    refused: int = 0


def percentiles(values: list[float]) -> dict[str, float]:
    if len(values) < 2:
        return {"p50": float("nan"), "p99": float("nan")}
    qs = statistics.quantiles(values, n=100, method="inclusive")
    return {"p50": round(qs[49], 2), "p99": round(qs[98], 2)}


def tickets(n: int, tag: str) -> list[tuple[str, bytes]]:
    return [
        (
            f"{tag}-{i}",
            orjson.dumps(
                {
                    "ticket_id": f"{tag}-{i}",
                    "text": t["text"],
                    "user_id": f"u{i % 97}",
                    "created_at": "2026-12-01T00:00:00Z",
                }
            ),
        )
        for i, t in enumerate(generate(n, seed=11))
    ]


# ---- the bare producer -------------------------------------------------------------------------


def _producer(kafka: Mapping[str, Any], topic: str) -> Producer:
    """Ingest's producer configuration, connected and with its producer id: the first
    record waits half a second for both, which is no part of any rate."""
    p = Producer({**kafka, **BASE_CONFIG, "acks": "all", "enable.idempotence": True})
    p.produce(topic, key=b"warm-up", value=tickets(1, "warm-up")[0][1])
    assert p.flush(30) == 0, "the bare producer could not deliver"
    return p


def bare_async(kafka: Mapping[str, Any], topic: str, records: list[tuple[str, bytes]]) -> Figure:
    """Every record produced at once, then one flush: the broker's ceiling."""
    p = _producer(kafka, topic)
    start = time.perf_counter()
    for key, value in records:
        while True:
            try:
                p.produce(topic, key=key.encode(), value=value)
                break
            except BufferError:
                p.poll(0.005)
        p.poll(0)
    assert p.flush(60) == 0, "the bare producer could not deliver"
    elapsed = time.perf_counter() - start
    return Figure("bare producer, async", len(records) / elapsed, len(records))


def bare_acked(
    kafka: Mapping[str, Any],
    topic: str,
    records: list[tuple[str, bytes]],
    size: int,
    in_flight: int,
) -> Figure:
    """Groups of `size` records, `in_flight` groups at a time, each waiting for all its acks:
    what ingest's clients do, on the producer alone."""
    p = _producer(kafka, topic)
    groups = [records[i : i + size] for i in range(0, len(records), size)]
    latencies: list[float] = []
    state = {"open": 0}

    def send(group: list[tuple[str, bytes]]) -> None:
        left = [len(group)]
        sent_at = time.perf_counter()

        def acked(err: Any, _msg: Any) -> None:
            assert err is None, err
            left[0] -= 1
            if left[0] == 0:
                latencies.append((time.perf_counter() - sent_at) * 1000)
                state["open"] -= 1

        for key, value in group:
            p.produce(topic, key=key.encode(), value=value, on_delivery=acked)
        state["open"] += 1

    start = time.perf_counter()
    queue = list(groups)
    while queue or state["open"]:
        while queue and state["open"] < in_flight:
            send(queue.pop(0))
        p.poll(0.0005)
    elapsed = time.perf_counter() - start
    name = "bare producer, each record acked" if size == 1 else f"bare producer, {size} acked"
    return Figure(name, len(records) / elapsed, len(groups), percentiles(latencies))


# ---- HTTP ---------------------------------------------------------------------------------------


class Connection:
    """One keep-alive HTTP/1.1 connection; aiohttp always answers with a Content-Length."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, port: int) -> Connection:
        return cls(*await asyncio.open_connection("127.0.0.1", port))

    async def send(self, request: bytes) -> tuple[int, bytes]:
        self.writer.write(request)
        head = await self.reader.readuntil(b"\r\n\r\n")
        at = head.lower().index(b"content-length:") + 15
        length = int(head[at : head.index(b"\r\n", at)])
        return int(head[9:12]), await self.reader.readexactly(length)

    def close(self) -> None:
        self.writer.close()


def post(port: int, token: str, body: bytes) -> bytes:
    return (
        f"POST /v1/tickets HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Authorization: Bearer {token}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body


def batches_of(records: list[tuple[str, bytes]]) -> list[tuple[int, bytes]]:
    return [
        (len(chunk), b'{"tickets":[' + b",".join(v for _, v in chunk) + b"]}")
        for chunk in (records[i : i + BATCH] for i in range(0, len(records), BATCH))
    ]


async def closed_loop(
    port: int,
    token: str,
    bodies: list[tuple[int, bytes]],
    in_flight: int,
    name: str,
    cpu: Callable[[], float],
) -> Figure:
    """`in_flight` clients, each posting its next body when the last was answered."""
    queue = list(reversed(bodies))
    latencies: list[float] = []
    counts = {"accepted": 0, "refused": 0}

    async def client() -> None:
        conn = await Connection.open(port)
        try:
            while queue:
                n, body = queue.pop()
                sent = time.perf_counter()
                status, _ = await conn.send(post(port, token, body))
                latencies.append((time.perf_counter() - sent) * 1000)
                counts["accepted" if status == 202 else "refused"] += n if status == 202 else 1
        finally:
            conn.close()

    cpu_before, start = cpu(), time.perf_counter()
    await asyncio.gather(*(client() for _ in range(in_flight)))
    elapsed, cpu_s = time.perf_counter() - start, cpu() - cpu_before
    accepted = counts["accepted"]
    return Figure(
        name,
        accepted / elapsed,
        len(bodies),
        percentiles(latencies),
        round(cpu_s * 1000 / max(accepted, 1), 3),
        counts["refused"],
    )


async def open_loop(
    port: int, token: str, bodies: list[tuple[int, bytes]], rate: float, name: str
) -> Figure:
    """Posts sent at `rate` a second whatever the answers; latency from the scheduled time,
    so a post that waits for a free connection counts its wait (no coordinated omission)."""
    pool: asyncio.Queue[Connection] = asyncio.Queue()
    for _ in range(32):
        pool.put_nowait(await Connection.open(port))
    latencies: list[float] = []
    refused = [0]

    async def one(due: float, body: bytes) -> None:
        conn = await pool.get()
        status, _ = await conn.send(post(port, token, body))
        latencies.append((time.perf_counter() - due) * 1000)
        refused[0] += status != 202
        pool.put_nowait(conn)

    start = time.perf_counter()
    tasks = []
    for i, (_, body) in enumerate(bodies):
        due = start + i / rate
        if (wait := due - time.perf_counter()) > 0:
            await asyncio.sleep(wait)
        tasks.append(asyncio.ensure_future(one(due, body)))
    await asyncio.gather(*tasks)
    elapsed = time.perf_counter() - start
    while not pool.empty():
        pool.get_nowait().close()
    ok = len(bodies) - refused[0]
    return Figure(name, ok / elapsed, len(bodies), percentiles(latencies), refused=refused[0])


# ---- the run ------------------------------------------------------------------------------------


async def _key(settings: IngestSettings) -> str:
    redis = redis_client(settings.model_copy(update={"redis_timeout_s": 5.0}))
    try:
        token, _ = await KeyStore(redis, settings.redis_prefix).create("bench", "submit")
        unlimited = Limit(rate=1_000_000, burst=1_000_000)
        store = LimitStore(redis, settings.redis_prefix, Limits(key=unlimited, ip=unlimited))
        await store.set("key", unlimited)
        await store.set("ip", unlimited)
        return token
    finally:
        await redis.aclose()


async def _forget(settings: IngestSettings) -> None:
    redis = redis_client(settings.model_copy(update={"redis_timeout_s": 5.0}))
    try:
        async for name in redis.scan_iter(match=settings.redis_prefix + "*", count=1000):
            await redis.delete(name)
    finally:
        await redis.aclose()


async def _ingest_phases(
    port: int,
    token: str,
    singles: list[tuple[str, bytes]],
    batch_records: list[tuple[str, bytes]],
    concurrency: int,
    cpu: Callable[[], float],
    tag: str,
) -> list[Figure]:
    ones = [(1, v) for _, v in singles]
    warm = [(1, v) for _, v in tickets(WARM_UP, f"{tag}-warm")]
    await closed_loop(port, token, warm, concurrency, "warm-up", cpu)
    single = await closed_loop(port, token, ones, concurrency, "ingest, single posts", cpu)
    batch = await closed_loop(
        port,
        token,
        batches_of(batch_records),
        BATCH_CONCURRENCY,
        f"ingest, batches of {BATCH}",
        cpu,
    )
    rate = max(single.tickets_per_s * OPEN_LOAD, 1.0)
    n = int(rate * OPEN_LOOP_S)
    opened = [(1, v) for _, v in tickets(n, f"{tag}-open")]
    half = await open_loop(port, token, opened, rate, f"ingest, single posts at {OPEN_LOAD:.0%}")
    half.latency_ms["offered_per_s"] = round(rate, 1)
    return [single, batch, half]


def bench_ingest(
    singles: int = 3000,
    batches: int = 60,
    concurrency: int = 32,
    out: Path = Path("bench/results"),
) -> None:
    import devstack as stack
    from streams.settings import get_settings

    shared = get_settings()
    stack.up(shared)
    run = uuid.uuid4().hex[:6]
    prefix = f"bi{run}."
    topic = Topics(prefix).tickets_in
    ensure_topics(shared, {topic: {}})
    port = app_processes.free_port()
    settings = IngestSettings(
        redis_prefix=f"bench{run}:ingest:",
        topic_prefix=prefix,
        port=port,
        index_results=False,
        worker_url="off",
    )
    env = {
        "TICKETFLOW_TOPIC_PREFIX": prefix,
        "TICKETFLOW_INGEST_REDIS_PREFIX": settings.redis_prefix,
        "TICKETFLOW_INGEST_PORT": str(port),
        "TICKETFLOW_INGEST_INDEX_RESULTS": "false",
        "TICKETFLOW_INGEST_WORKER_URL": "off",
    }
    single_records = tickets(singles, f"{run}-s")
    batch_records = tickets(batches * BATCH, f"{run}-b")
    kafka = confluent_config(shared)
    try:
        bare_async(kafka, topic, tickets(WARM_UP, f"{run}-w"))  # warm-up
        bare = [
            bare_async(kafka, topic, single_records + batch_records),
            bare_acked(kafka, topic, single_records, 1, concurrency),
            bare_acked(kafka, topic, batch_records, BATCH, BATCH_CONCURRENCY),
        ]
        token = asyncio.run(_key(settings))
        service = app_processes.start(
            "ingest", ["ingest"], shared, env, log_name=f"bench-ingest-{run}"
        )
        try:
            app_processes.wait_until(
                lambda: app_processes.http_ok(f"http://127.0.0.1:{port}/readyz"),
                service,
                60,
                "ready",
            )
            cpu = lambda: process_cpu_s(service.process.pid)  # noqa: E731
            measured = _run(
                _ingest_phases(port, token, single_records, batch_records, concurrency, cpu, run)
            )
        finally:
            service.stop()
    finally:
        asyncio.run(_forget(settings))
        delete_prefixed(shared, prefix, prefix)
    report(bare, measured, concurrency, out)


def _run(work: Awaitable[list[Figure]]) -> list[Figure]:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(work)  # type: ignore[arg-type]
    return uvloop.run(work)  # type: ignore[arg-type]


def _ratio(x: float, y: float) -> float:
    return round(x / y, 3) if y else float("nan")


def report(bare: list[Figure], measured: list[Figure], concurrency: int, out: Path) -> dict:
    ceiling, bare_single, bare_batch = bare
    single, batch, half = measured
    ratios = {
        "single_over_bare_acked": _ratio(single.tickets_per_s, bare_single.tickets_per_s),
        "batch_over_bare_acked": _ratio(batch.tickets_per_s, bare_batch.tickets_per_s),
        "single_over_bare_async": _ratio(single.tickets_per_s, ceiling.tickets_per_s),
        "batch_over_bare_async": _ratio(batch.tickets_per_s, ceiling.tickets_per_s),
    }
    verdict = {
        "single_ratio": ratios["single_over_bare_acked"] >= TARGETS["single_ratio"],
        "batch_ratio": ratios["batch_over_bare_acked"] >= TARGETS["batch_ratio"],
        "single_p99_ms_at_half": half.latency_ms.get("p99", 1e9)
        <= TARGETS["single_p99_ms_at_half"],
    }
    table = Table("what", "tickets/s", "requests", "p50 ms", "p99 ms", "ingest CPU ms/ticket")
    for f in (*bare, *measured):
        cpu = "" if f.cpu_ms_per_ticket is None else f"{f.cpu_ms_per_ticket:.3f}"
        table.add_row(
            f.name,
            f"{f.tickets_per_s:,.0f}",
            str(f.requests),
            str(f.latency_ms.get("p50", "")),
            str(f.latency_ms.get("p99", "")),
            cpu,
        )
    console.print(table)
    console.print("ratios: " + "   ".join(f"{k} = {v}" for k, v in ratios.items()))
    console.print(
        f"targets {TARGETS}: "
        + ", ".join(f"{k} {'met' if v else 'MISSED'}" for k, v in verdict.items())
    )
    refused = sum(f.refused for f in measured)
    if refused:
        console.print(f"[red]{refused} request(s) not answered 202[/]")
    data = {
        "bare": [asdict(f) for f in bare],
        "ingest": [asdict(f) for f in measured],
        "ratios": ratios,
        "targets": TARGETS,
        "met": verdict,
        "concurrency": {"single": concurrency, "batch": BATCH_CONCURRENCY, "batch_size": BATCH},
        "note": (
            "bare async: every record produced, then one flush (the broker's ceiling); bare "
            "acked: each record (or batch) waits for its own ack, as many in flight as the "
            "HTTP clients have requests (the ceiling of a service that answers after the ack)"
        ),
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "ingest.json").write_text(json.dumps(data, indent=2))
    plot(bare, measured, out / "ingest.png")
    console.print(f"wrote {out / 'ingest.json'} and {out / 'ingest.png'}")
    return data


def plot(bare: list[Figure], measured: list[Figure], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.6))
    rows = [*bare, *measured]
    xs = range(len(rows))
    bars = left.bar(xs, [f.tickets_per_s for f in rows], color=[f"C{i}" for i in xs])
    left.bar_label(bars, labels=[f"{f.tickets_per_s:,.0f}" for f in rows], fontsize=7)
    left.set_xticks(xs, [f.name.replace(", ", "\n") for f in rows], fontsize=7)
    left.set(ylabel="accepted tickets/s", yscale="log", title="throughput (log scale)")
    timed = [f for f in rows if f.latency_ms]
    width = 0.4
    ys = range(len(timed))
    for k, (q, offset) in enumerate((("p50", -width / 2), ("p99", width / 2))):
        right.bar(
            [y + offset for y in ys],
            [f.latency_ms[q] for f in timed],
            width,
            label=q,
            color=f"C{k}",
        )
    right.axhline(TARGETS["single_p99_ms_at_half"], color="grey", linewidth=0.8, linestyle=":")
    right.set_xticks(ys, [f.name.replace(", ", "\n") for f in timed], fontsize=7)
    right.set(ylabel="ms per request", title="latency per request (batch: all 100 acked)")
    right.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
