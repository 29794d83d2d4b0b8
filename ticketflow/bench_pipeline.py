"""`ticketflow bench pipeline`: the whole pipeline against the limits that matter, in one run.

(a) the floor: a raw aiokafka relay chain over as many hops as the workflow has, same
    partitions and record size, doing no work;
(b) the naive baseline the seed articles warn about: one consumer doing every step in one
    function, one synchronous gateway call per ticket;
(c) ticketflow's worker (model v1, exactly-once results), topic per step (the default);
(d) the same with step fusion: [validate, clean] and [features, infer, rules, route] each
    carried by one agent (the workflow definition's `fuse`), two hops instead of six.

For each: sustained throughput (a burst, first publish to last result), then end-to-end
latency under an open-loop producer at 25/50/75 % of that variant's maximum; for (c) the
per-step breakdown from the decision paths. JSON and a PNG under bench/results/.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import statistics
import time
import urllib.request
import uuid
from collections import defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import yaml
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from agents.definition import load_definition
from agents.steps.clean import clean_text
from agents.steps.rules import RuleInput, apply_rules
from agents.steps.validate import parse_ticket
from feature_jobs.reader import OnlineFeatureReader
from feature_jobs.views import VIEWS
from inference_gateway.client import GatewayClient
from inference_gateway.model.corpus import generate
from schemas.gateway import PredictInput
from schemas.tickets import Category, Context, Prediction
from streams.admin import delete_prefixed, ensure_topics, topic_size
from streams.settings import Settings
from streams.topics import Topics
from ticketflow import services

console = Console()
HOPS = 6  # validate, clean, features, infer, rules, route
LOADS = (0.25, 0.5, 0.75)
WARM_UP = 200  # tickets through each variant before its measurements
BREAKDOWN_LOAD = 0.5  # the load whose results give the per-step breakdown
BETWEEN = "between steps"


@dataclass
class Variant:
    name: str
    max_per_s: float = 0.0
    latency_ms: dict[str, dict[str, float]] = field(default_factory=dict)
    steps_ms: dict[str, float] = field(default_factory=dict)
    recovery: dict[str, float] = field(default_factory=dict)


def _tickets(n: int, run: str) -> list[tuple[bytes, bytes]]:
    """(key, value) pairs of `n` tickets, about 300 bytes each, keyed by ticket id."""
    return [
        (
            f"{run}-{i}".encode(),
            orjson.dumps(
                {
                    "ticket_id": f"{run}-{i}",
                    "text": t["text"],
                    "user_id": f"u{i % 97}",
                    "created_at": "2026-12-01T00:00:00Z",
                }
            ),
        )
        for i, t in enumerate(generate(n, seed=7))
    ]


def _percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {"p50": float("nan"), "p95": float("nan"), "p99": float("nan")}
    qs = statistics.quantiles(values, n=100, method="inclusive")
    return {"p50": round(qs[49], 2), "p95": round(qs[94], 2), "p99": round(qs[98], 2)}


# ---- measuring a variant ----------------------------------------------------------------------


async def _results_consumer(settings: Settings, sinks: list[str]) -> AIOKafkaConsumer:
    """A read_committed consumer of `sinks`, assigned and at their end."""
    consumer = AIOKafkaConsumer(
        *sinks,
        bootstrap_servers=settings.kafka_bootstrap,
        group_id=f"bench-{uuid.uuid4().hex[:6]}",
        auto_offset_reset="latest",
        isolation_level="read_committed",
    )
    await consumer.start()
    for _ in range(200):  # up to 10 s for the group to assign its partitions
        if consumer.assignment():
            break
        await asyncio.sleep(0.05)
    await consumer.seek_to_end()
    return consumer


async def _feed(
    producer: AIOKafkaProducer,
    topic: str,
    records: list[tuple[bytes, bytes]],
    rate: float | None,
    sent: dict[bytes, float] | None = None,
    stop: asyncio.Event | None = None,
) -> None:
    """Publish open-loop at `rate` a second (or as fast as possible), noting send times."""
    start = time.monotonic()
    for i, (key, value) in enumerate(records):
        if stop is not None and stop.is_set():
            break
        if rate and (ahead := i / rate - (time.monotonic() - start)) > 0:
            await asyncio.sleep(ahead)
        if sent is not None:
            sent[key] = time.monotonic()
        await producer.send(topic, key=key, value=value)
    await producer.flush()


# ---- running a variant ----------------------------------------------------------------------


async def _run_load(
    settings: Settings,
    source: str,
    sinks: list[str],
    records: list[tuple[bytes, bytes]],
    rate: float | None,
) -> tuple[float, list[float], list[bytes]]:
    """Publish `records` (at `rate`, or all at once) and wait for as many on `sinks`.

    Returns the throughput, the end-to-end latencies in ms and the results' values.
    """
    consumer = await _results_consumer(settings, sinks)
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap, linger_ms=2)
    await producer.start()
    first = time.monotonic()
    latencies: list[float] = []
    values: list[bytes] = []
    sent: dict[bytes, float] = {}

    feeder = asyncio.ensure_future(_feed(producer, source, records, rate, sent=sent))
    deadline = time.monotonic() + 120 + len(records) / max(rate or 1000, 1)
    try:
        while len(values) < len(records) and time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=200)
            now = time.monotonic()
            for msgs in batch.values():
                for m in msgs:
                    if m.key in sent:
                        values.append(m.value)
                        latencies.append((now - sent.pop(m.key)) * 1000)
        elapsed = time.monotonic() - first
    finally:
        await feeder
        await producer.stop()
        await consumer.stop()
    return len(values) / elapsed, latencies, values


async def _measure(
    settings: Settings,
    variant: Variant,
    source: str,
    sinks: list[str],
    n: int,
    run: str,
    progress: Progress,
) -> list[bytes]:
    task = progress.add_task(f"{variant.name}: throughput", total=None)
    # connections, caches and the first assignment warmed before anything is measured
    await _run_load(settings, source, sinks, _tickets(WARM_UP, f"{run}-warm"), None)
    rate, _, values = await _run_load(settings, source, sinks, _tickets(n, f"{run}-max"), None)
    variant.max_per_s = round(rate, 1)
    progress.update(task, description=f"{variant.name}: {rate:.0f}/s max", completed=1, total=1)
    for load in LOADS:
        offered = max(1.0, rate * load)
        count = max(50, int(offered * 8))  # about 8 s of traffic
        t = progress.add_task(f"{variant.name}: {int(load * 100)} % load", total=None)
        _, lat, at_load = await _run_load(
            settings, source, sinks, _tickets(count, f"{run}-{load}"), offered
        )
        variant.latency_ms[f"{int(load * 100)}%"] = {
            "offered_per_s": round(offered, 1),
            **_percentiles(lat),
        }
        if load == BREAKDOWN_LOAD:  # a sustainable load: the burst's breakdown is its queue
            values = at_load
        progress.update(t, completed=1, total=1)
    return values


# ---- (a) the raw relay chain -----------------------------------------------------------------


async def _relay(settings: Settings, topics: list[str], stop: asyncio.Event) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap, linger_ms=1)
    await producer.start()
    consumers = []
    for src, dst in itertools.pairwise(topics):
        c = AIOKafkaConsumer(
            src,
            bootstrap_servers=settings.kafka_bootstrap,
            group_id=f"relay-{src}",
            auto_offset_reset="latest",
        )
        await c.start()
        consumers.append((c, dst))

    async def hop(c: AIOKafkaConsumer, dst: str) -> None:
        while not stop.is_set():
            for msgs in (await c.getmany(timeout_ms=100)).values():
                for m in msgs:
                    await producer.send(dst, key=m.key, value=m.value)

    try:
        await asyncio.gather(*(hop(c, d) for c, d in consumers))
    finally:
        for c, _ in consumers:
            await c.stop()
        await producer.stop()


# ---- (b) the naive single function -----------------------------------------------------------


async def _naive(settings: Settings, source: str, sink: str, stop: asyncio.Event) -> None:
    consumer = AIOKafkaConsumer(
        source,
        bootstrap_servers=settings.kafka_bootstrap,
        group_id=f"naive-{source}",
        auto_offset_reset="latest",
    )
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap)
    reader = OnlineFeatureReader(settings.redis_url, VIEWS)
    gateway = GatewayClient(settings.gateway_url)
    await consumer.start()
    await producer.start()
    try:
        while not stop.is_set():
            for msgs in (await consumer.getmany(timeout_ms=100)).values():
                for m in msgs:  # every step, in order, one ticket at a time
                    ticket = parse_ticket(m.value, settings.max_record_bytes)
                    text = clean_text(ticket.text)
                    await reader.read("user_ticket_stats", ticket.user_id, 0.8)
                    resp = await gateway.predict(
                        "ticket_classifier",
                        [PredictInput(id=ticket.ticket_id, text=text)],
                        timeout_ms=300,
                    )
                    out = resp.outputs[0]
                    ctx = Context(
                        prediction=Prediction(
                            category=Category(out.label),
                            confidence=out.confidence,
                            model_name=resp.model,
                            model_version=resp.version,
                        )
                    )
                    apply_rules(["refund_check", "score_threshold"], RuleInput(text, ctx, 0.5))
                    await producer.send_and_wait(sink, key=m.key, value=m.value)
    finally:
        await consumer.stop()
        await producer.stop()
        await gateway.close()
        await reader.close()


async def _with_background(
    job: Callable[[asyncio.Event], Awaitable[None]], body: Callable[[], Awaitable[list[bytes]]]
) -> list[bytes]:
    stop = asyncio.Event()
    task = asyncio.ensure_future(job(stop))
    await asyncio.sleep(3)  # consumers joined
    measuring = asyncio.ensure_future(body())
    try:
        await asyncio.wait({task, measuring}, return_when=asyncio.FIRST_COMPLETED)
        if task.done() and task.exception() is not None:  # the variant died: say why
            measuring.cancel()
            raise task.exception()
        return await measuring
    finally:
        stop.set()
        await asyncio.gather(task, return_exceptions=True)


# ---- the whole benchmark ---------------------------------------------------------------------


async def _bench(settings: Settings, n: int, out_dir: Path) -> list[Variant]:
    run = uuid.uuid4().hex[:6]
    raw = [f"bench-{run}.raw.{i}" for i in range(HOPS + 1)]
    naive_in, naive_out = f"bench-{run}.naive.in", f"bench-{run}.naive.out"
    ensure_topics(settings, {t: {} for t in [*raw, naive_in, naive_out]})
    a, b = Variant("raw relay (a)"), Variant("naive (b)")
    c, d = Variant("ticketflow (c)"), Variant("ticketflow fused (d)")
    naive_n = max(200, n // 5)  # the naive consumer is slow: a smaller burst says as much
    try:
        with Progress(console=console) as progress:
            await _with_background(
                lambda stop: _relay(settings, raw, stop),
                lambda: _measure(settings, a, raw[0], [raw[-1]], n, run, progress),
            )
            await _with_background(
                lambda stop: _naive(settings, naive_in, naive_out, stop),
                lambda: _measure(settings, b, naive_in, [naive_out], naive_n, run, progress),
            )
            await _ticketflow(settings, c, settings.workflow_file, f"{run}c", n, progress)
            fused = fused_definition(settings.workflow_file, out_dir)
            await _ticketflow(settings, d, fused, f"{run}d", n, progress)
    finally:  # a broker with hundreds of leftover partitions is slower for every later run
        delete_prefixed(settings, f"bench-{run}", f"bench-{run}")
    return [a, b, c, d]


def fused_definition(path: Path, out_dir: Path) -> Path:
    """The workflow at `path` with its stateless and stateful runs fused (two hops).

    Written to `out_dir` and loaded once, so a bad fusion is refused here, not in a worker.
    """
    data = yaml.safe_load(path.read_text())
    names = [s["name"] for s in data["steps"]]
    data["fuse"] = [names[:2], names[2:]]  # [validate, clean], [features ... route]
    out_dir.mkdir(parents=True, exist_ok=True)
    fused = (out_dir / f"{path.stem}.fused.yaml").resolve()
    fused.write_text(yaml.safe_dump(data, sort_keys=False))
    load_definition(fused)
    return fused


async def _ticketflow(
    settings: Settings, variant: Variant, workflow: Path, run: str, n: int, progress: Progress
) -> None:
    """Throughput, latency and SIGKILL recovery of a worker running `workflow`."""
    topics = Topics(f"bench-{run}.")
    port = services.free_port()
    env = {
        "TICKETFLOW_TOPIC_PREFIX": topics.prefix,
        "TICKETFLOW_WORKER_WEB_PORT": str(port),
        "TICKETFLOW_WORKFLOW_FILE": str(workflow),
        "TICKETFLOW_WORKER_ID": "bench-1",
    }
    worker_settings = settings.model_copy(
        update={
            "topic_prefix": topics.prefix,
            "worker_web_port": port,
            "workflow_file": workflow,
            "worker_id": "bench-1",
        }
    )
    worker = services.start_worker(worker_settings, env, log_name=f"bench-worker-{run}")
    outs = [topics.out(r) for r in ("auto_classify", "manual_review", "after_sales")]
    try:
        values = await _measure(settings, variant, topics.tickets_in, outs, n, run, progress)
        rate = variant.max_per_s * 0.5
        # the successor restarts under the killed worker's id (static membership), then
        # under none: it waits for the dead member's session to time out
        successors = {
            "same_worker_id": env,
            "new_worker": {**env, "TICKETFLOW_WORKER_ID": ""},
        }
        for kind, successor_env in successors.items():
            task = progress.add_task(f"{variant.name}: SIGKILL, {kind}", total=None)
            worker, variant.recovery[kind] = await _recovery(
                settings, worker_settings, successor_env, worker, outs, rate, f"{run}{kind}"
            )
            progress.update(task, completed=1, total=1)
    finally:
        worker.stop()
    variant.steps_ms = _step_breakdown(values)


async def _recovery(
    settings: Settings,
    worker_settings: Settings,
    env: dict[str, str],
    worker: services.Service,
    sinks: list[str],
    rate: float,
    run: str,
) -> tuple[services.Service, dict[str, float]]:
    """SIGKILL the worker under steady load, start a successor with `env`: how long until
    results flow again, and how fast its table came back from the changelog."""
    topics = Topics(worker_settings.topic_prefix)
    consumer = await _results_consumer(settings, sinks)
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap, linger_ms=2)
    await producer.start()
    records = _tickets(int(rate * 40) + 100, f"{run}-rec")
    stop = asyncio.Event()
    feeder = asyncio.ensure_future(_feed(producer, topics.tickets_in, records, rate, stop=stop))
    try:
        await asyncio.sleep(5)  # steady state
        worker.kill()
        killed = time.monotonic()
        worker = await asyncio.to_thread(
            services.start_worker, worker_settings, env, f"bench-worker-{run}"
        )
        ready_s = time.monotonic() - killed  # a new process, its table restored
        await consumer.seek_to_end()
        flowing_s = float("nan")
        for _ in range(300):  # results from the new worker: tickets flow again
            if any((await consumer.getmany(timeout_ms=100)).values()):
                flowing_s = time.monotonic() - killed
                break
    finally:
        stop.set()
        await feeder
        await producer.stop()
        await consumer.stop()
    changelog = f"{worker_settings.topic_prefix}ticketflow-ticket_state-changelog"
    restored = await asyncio.to_thread(topic_size, settings, changelog)
    restore_s = _restore_seconds(worker_settings)
    return worker, {
        "flowing_again_s": round(flowing_s, 2),
        "worker_ready_s": round(ready_s, 2),
        "changelog_records": restored,
        "restore_s": restore_s,
        "restore_records_per_s": round(restored / restore_s, 1) if restore_s else float("nan"),
    }


def _restore_seconds(settings: Settings) -> float:
    """How long the worker's last table restore took, from its /ready view."""
    url = f"http://127.0.0.1:{settings.worker_web_port}/ready"
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return float(orjson.loads(resp.read()).get("restore_s", "nan"))
    except OSError:  # rebalancing again (503): no figure this time
        return float("nan")


def _step_breakdown(values: list[bytes]) -> dict[str, float]:
    """Mean ms in each step, and between them: what the workflow's latency spent elsewhere
    than in a step (Kafka hops, waiting for a batch), from validation to the result."""
    per_step: dict[str, list[float]] = defaultdict(list)
    for value in values:
        result = orjson.loads(value)
        path = result.get("decision_path", [])
        for entry in path:
            per_step[entry["step"]].append(entry["latency_ms"])
        per_step[BETWEEN].append(result["latency_ms"] - sum(e["latency_ms"] for e in path))
    return {s: round(statistics.mean(v), 3) for s, v in per_step.items()}


def bench_pipeline(tickets: int = 2000, out: Path = Path("bench/results")) -> None:
    """Raw Kafka relay vs naive consumer vs ticketflow: throughput, latency, steps."""
    from streams.settings import get_settings
    from ticketflow import stack

    settings = get_settings()
    stack.up(settings)
    gateway = None if services.gateway_ready(settings) else services.start_gateway(settings)
    try:
        variants = asyncio.run(_bench(settings, tickets, out))
    finally:
        if gateway is not None:
            gateway.stop()
    _report(variants, out)


def _report(variants: list[Variant], out: Path) -> None:
    a, b, c, d = variants
    table = Table("variant", "max/s", *(f"p50/p99 @{int(x * 100)}%" for x in LOADS))
    for v in variants:
        cells = [
            f"{v.latency_ms[k]['p50']:.0f}/{v.latency_ms[k]['p99']:.0f} ms" for k in v.latency_ms
        ]
        table.add_row(v.name, f"{v.max_per_s:.0f}", *cells)
    console.print(table)
    ratios = {
        f"{x}_over_{y}": round(v.max_per_s / w.max_per_s, 3) if w.max_per_s else None
        for x, v in (("c", c), ("d", d))
        for y, w in (("a", a), ("b", b))
    }
    console.print("   ".join(f"{k.replace('_over_', '/')} = {r}" for k, r in ratios.items()))
    for v in (c, d):
        console.print(f"{v.name} per-step mean latency (ms): {v.steps_ms}")
        console.print(f"{v.name} recovery after SIGKILL: {v.recovery}")
    out.mkdir(parents=True, exist_ok=True)
    report = {"variants": [v.__dict__ for v in variants], "ratios": ratios}
    (out / "pipeline.json").write_text(json.dumps(report, indent=2))
    _plot(variants, out / "pipeline.png")
    console.print(f"wrote {out / 'pipeline.json'} and {out / 'pipeline.png'}")


def _plot(variants: list[Variant], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, middle, right) = plt.subplots(
        1, 3, figsize=(16, 4.4), gridspec_kw={"width_ratios": [1.2, 1.2, 0.8]}
    )
    for v in variants:
        offered = [x["offered_per_s"] for x in v.latency_ms.values()]
        left.plot(offered, [x["p50"] for x in v.latency_ms.values()], "o--", label=f"{v.name} p50")
        left.plot(offered, [x["p99"] for x in v.latency_ms.values()], "o-", label=f"{v.name} p99")
    left.axhline(100, color="grey", linewidth=0.8, linestyle=":")  # the p99 target
    left.set(
        xlabel="offered load (tickets/s)",
        ylabel="end-to-end latency (ms)",
        xscale="log",
        yscale="log",
        title="latency against offered load",
    )
    left.legend(fontsize=7)
    _bars(middle, variants[2:], lambda v: v.steps_ms)
    middle.set(
        ylabel="mean ms", title=f"ticketflow at {int(BREAKDOWN_LOAD * 100)} % load: where time goes"
    )
    _bars(
        right,
        variants[2:],
        lambda v: {kind.replace("_", " "): r["flowing_again_s"] for kind, r in v.recovery.items()},
    )
    right.axhline(10, color="grey", linewidth=0.8, linestyle=":")  # the recovery target
    right.set(ylabel="seconds", title="SIGKILL: until results flow again")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _bars(ax: Any, variants: list[Variant], series: Callable[[Variant], dict]) -> None:
    """Grouped bars: one group per key of `series`, one bar per variant."""
    width = 0.8 / len(variants)
    for i, v in enumerate(variants):
        values = series(v)
        xs = [j + (i - (len(variants) - 1) / 2) * width for j in range(len(values))]
        ax.bar(xs, list(values.values()), width, label=v.name)
        ax.set_xticks(range(len(values)), list(values), fontsize=8, rotation=20)
    ax.legend(fontsize=7)
