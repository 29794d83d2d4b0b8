"""`ticketflow bench pipeline`: the whole pipeline against the limits that matter, in one run.

(a) the floor: a raw aiokafka relay chain over as many hops as the workflow has, same
    partitions and record size, doing no work;
(b) the naive baseline the seed articles warn about: one consumer doing every step in one
    function, one synchronous gateway call per ticket;
(c) ticketflow's worker (model v1, exactly-once results), topic per step (the default);
(d) the same with step fusion: [validate, clean] and [features, infer, rules, route] each
    carried by one agent (the workflow definition's `fuse`), two hops instead of six;
(e) the peer: the same six steps written idiomatically in quix-streams, exactly-once on
    (`benchmarks.peer`, run from its own venv, `.venv-peer`: `make peer` builds it;
    skipped, saying so, where it is missing).

For each: sustained throughput (a burst, first publish to last result) and the CPU per ticket
of the variant's own process(es) over that burst (every variant runs in processes of its
own; the gateway, Triton, Kafka and Redis are not counted), then end-to-end latency under an
open-loop producer at 25/50/75 % of that variant's maximum; for (c), (d) and (e) the per-step
breakdown from the decision paths. JSON and a PNG under bench/results/.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
import urllib.request
import uuid
import zlib
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import yaml
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from agents.definition import load_definition
from devstack import app_processes
from devstack.app_processes import Service
from streams.admin import delete_prefixed, ensure_topics, topic_size
from streams.kafka_config import aiokafka_kwargs
from streams.settings import REPO_ROOT, Settings
from streams.topics import Topics
from training.corpus import generate

console = Console()
HOPS = 6  # validate, clean, features, infer, rules, route
LOADS = (0.25, 0.5, 0.75)
LOW_RATE = 5.0  # tickets/s: the idle-stack latency, before the loads relative to the burst
PEER_COMMITS = (1.0, 0.1)  # s: today's worker cadence, and Kafka Streams' exactly-once default
WARM_UP = 200  # tickets through each variant before its measurements
BREAKDOWN_LOAD = 0.5  # the load whose results give the per-step breakdown
BETWEEN = "between steps"
VARIANTS = "benchmarks.variants"  # (a) and (b), each run in a process of its own
PEER = "benchmarks.peer"  # (e), run by the peer venv's python
PEER_PYTHON = REPO_ROOT / ".venv-peer" / "bin" / "python"
CPU_NOTE = (
    "user+sys CPU of the variant's own process(es) over the max-throughput burst, per ticket "
    "out; the gateway, Triton, Kafka and Redis are not counted"
)


@dataclass
class Variant:
    name: str
    max_per_s: float = 0.0
    latency_ms: dict[str, dict[str, float]] = field(default_factory=dict)
    steps_ms: dict[str, float] = field(default_factory=dict)
    recovery: dict[str, float] = field(default_factory=dict)
    # CPU (user + sys) of the variant's own process(es) over the max-throughput burst
    cpu_ms_per_ticket: float | None = None
    # the whole machine's busy cores over that burst (every process: broker, gateway,
    # Triton, this client): what is left for a second worker process
    cores_busy: float | None = None
    # a ticketflow worker's mean hop between two steps, split where it is measured
    hop_ms: dict[str, float] = field(default_factory=dict)
    # the report's name for it in ratios (a, b, c, c2, d, e, e0.1); empty: by position
    key: str = ""


def _tickets(n: int, run: str) -> list[tuple[bytes, bytes]]:
    """(key, value) pairs of `n` tickets, about 300 bytes each, keyed by ticket id.

    The texts come from a seed of their own for every `run` (each phase of each variant):
    the gateway's response cache keeps every text it has answered for minutes, so phases that
    repeated the texts of an earlier one measured the cache instead of the models."""
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
        for i, t in enumerate(generate(n, seed=zlib.crc32(run.encode())))
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
        **aiokafka_kwargs(settings),
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
    cpu: Callable[[], float] | None = None,
) -> tuple[float, list[float], list[bytes], float]:
    """Publish `records` (at `rate`, or all at once) and wait for as many on `sinks`.

    Returns the throughput, the end-to-end latencies in ms, the results' values and the CPU
    seconds `cpu` (the variant's clock) moved while the records went through (nan: none).
    """
    consumer = await _results_consumer(settings, sinks)
    producer = AIOKafkaProducer(**aiokafka_kwargs(settings), linger_ms=2)
    await producer.start()
    # read after the results consumer has joined, so only the records' own work counts
    cpu_before = cpu() if cpu else float("nan")
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
        cpu_s = cpu() - cpu_before if cpu else float("nan")
    finally:
        await feeder
        await producer.stop()
        await consumer.stop()
    return len(values) / elapsed, latencies, values, cpu_s


async def _measure(
    settings: Settings,
    variant: Variant,
    source: str,
    sinks: list[str],
    n: int,
    run: str,
    progress: Progress,
    cpu: Callable[[], float] | None = None,
    metrics: Callable[[], str] | None = None,
) -> list[bytes]:
    """Throughput (and CPU per ticket, given the variant's clock `cpu`), then latency;
    with the worker's `metrics` text, the hop split at the breakdown load."""
    task = progress.add_task(f"{variant.name}: throughput", total=None)
    # connections, caches and the first assignment warmed before anything is measured
    await _run_load(settings, source, sinks, _tickets(WARM_UP, f"{run}-warm"), None)
    marks: list[tuple[float, float]] = []

    def clock() -> float:  # read just before the burst's first record and after its last
        marks.append((machine_busy_s(), time.monotonic()))
        return cpu() if cpu else float("nan")

    rate, _, values, cpu_s = await _run_load(
        settings, source, sinks, _tickets(n, f"{run}-max"), None, clock
    )
    variant.max_per_s = round(rate, 1)
    if cpu is not None and values:
        variant.cpu_ms_per_ticket = round(cpu_s * 1000 / len(values), 3)
    if len(marks) == 2 and marks[1][1] > marks[0][1]:
        busy = (marks[1][0] - marks[0][0]) / (marks[1][1] - marks[0][1])
        variant.cores_busy = round(busy, 2)
    progress.update(task, description=f"{variant.name}: {rate:.0f}/s max", completed=1, total=1)
    count = int(LOW_RATE * 10)  # 10 s at an idle rate
    _, lat, _, _ = await _run_load(settings, source, sinks, _tickets(count, f"{run}-low"), LOW_RATE)
    variant.latency_ms[f"{LOW_RATE:g}/s"] = {"offered_per_s": LOW_RATE, **_percentiles(lat)}
    for load in LOADS:
        offered = max(1.0, rate * load)
        count = max(50, int(offered * 8))  # about 8 s of traffic
        t = progress.add_task(f"{variant.name}: {int(load * 100)} % load", total=None)
        before = metrics() if metrics and load == BREAKDOWN_LOAD else None
        _, lat, at_load, _ = await _run_load(
            settings, source, sinks, _tickets(count, f"{run}-{load}"), offered
        )
        variant.latency_ms[f"{int(load * 100)}%"] = {
            "offered_per_s": round(offered, 1),
            **_percentiles(lat),
        }
        if load == BREAKDOWN_LOAD:  # a sustainable load: the burst's breakdown is its queue
            values = at_load
            if before is not None:
                variant.hop_ms = hop_split(before, metrics())
        progress.update(t, completed=1, total=1)
    return values


# ---- variants in processes of their own, and their CPU time ------------------------------------

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _proc_stat(pid: str) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (which may hold spaces)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:  # gone since /proc was listed
        return None
    return text[text.rindex(")") + 2 :].split()


def process_cpu_s(pid: int) -> float:
    """User plus system CPU seconds of process `pid` and its descendants, threads included."""
    stats = {
        int(e.name): st
        for e in Path("/proc").iterdir()
        if e.name.isdigit()
        if (st := _proc_stat(e.name)) is not None
    }
    tree, grew = {pid}, True
    while grew:
        kids = {p for p, st in stats.items() if int(st[1]) in tree} - tree
        tree |= kids
        grew = bool(kids)
    # utime and stime, fields 14 and 15 of stat(5)
    ticks = sum(int(stats[p][11]) + int(stats[p][12]) for p in tree if p in stats)
    return ticks / _CLOCK_TICKS


def machine_busy_s() -> float:
    """CPU seconds every core of the machine has spent busy since boot (/proc/stat)."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    except OSError:
        return float("nan")
    # user nice system idle iowait irq softirq steal: all but idle and iowait are busy
    ticks = [int(f) for f in fields[:8]]
    return (sum(ticks) - ticks[3] - ticks[4]) / _CLOCK_TICKS


def _spawn(settings: Settings, python: Path | str, args: list[str], log_name: str) -> Service:
    logs = settings.state_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    log_path = logs / f"{log_name}.log"
    with log_path.open("ab") as log:
        proc = subprocess.Popen(
            [str(python), "-m", *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=REPO_ROOT,
            start_new_session=True,
        )
    return Service(log_name, proc, log_path)


async def _in_process(
    service: Service, body: Callable[[Callable[[], float]], Awaitable[list[bytes]]]
) -> list[bytes]:
    """Run `body` (given the CPU clock of `service`'s process) while the process lives."""
    try:
        await asyncio.sleep(3)  # consumers joined
        measuring = asyncio.ensure_future(body(lambda: process_cpu_s(service.process.pid)))
        while not measuring.done():
            if service.process.poll() is not None:  # the variant died: say where to look
                measuring.cancel()
                raise RuntimeError(
                    f"{service.name} exited ({service.process.returncode}); see {service.log_path}"
                )
            await asyncio.wait({measuring}, timeout=1)
        return measuring.result()
    finally:
        await asyncio.to_thread(service.stop)


# ---- the whole benchmark ---------------------------------------------------------------------


async def _bench(
    settings: Settings,
    n: int,
    out_dir: Path,
    processes: tuple[int, ...] = (1,),
    recovery: bool = True,
) -> tuple[list[Variant], dict]:
    """Every variant's figures, and why any was skipped: (c) once per process count in
    `processes` (c2 for two), (e) at each of PEER_COMMITS."""
    run = uuid.uuid4().hex[:6]
    raw = [f"bench-{run}.raw.{i}" for i in range(HOPS + 1)]
    naive_in, naive_out = f"bench-{run}.naive.in", f"bench-{run}.naive.out"
    ensure_topics(settings, {t: {} for t in [*raw, naive_in, naive_out]})
    a, b = Variant("raw relay (a)"), Variant("naive (b)")
    d = Variant("ticketflow fused (d)", key="d")
    cs = {k: Variant(_c_name(k), key="c" if k == 1 else f"c{k}") for k in processes}
    naive_n = max(200, n // 5)  # the naive consumer is slow: a smaller burst says as much
    skipped: dict[str, str] = {}
    try:
        with Progress(console=console) as progress:
            relay = _spawn(settings, sys.executable, [VARIANTS, "relay", *raw], f"bench-a-{run}")
            await _in_process(
                relay,
                lambda cpu: _measure(settings, a, raw[0], [raw[-1]], n, run, progress, cpu),
            )
            naive = _spawn(
                settings, sys.executable, [VARIANTS, "naive", naive_in, naive_out], f"bench-b-{run}"
            )
            await _in_process(
                naive,
                lambda cpu: _measure(
                    settings, b, naive_in, [naive_out], naive_n, run, progress, cpu
                ),
            )
            for k, c in cs.items():
                wf = settings.workflow_file
                await _ticketflow(settings, c, wf, f"{run}c{k}", n, progress, k, recovery)
            fused = fused_definition(settings.workflow_file, out_dir)
            await _ticketflow(settings, d, fused, f"{run}d", n, progress, 1, recovery)
            variants = [a, b, *cs.values(), d]
            for commit in PEER_COMMITS:
                key = "e" if commit == settings.commit_interval_s else f"e{commit:g}"
                e = Variant(f"quix-streams EOS (e) commit {commit:g} s", key=key)
                why = await _peer(settings, e, f"{run}{key.replace('.', '')}", n, progress, commit)
                if why is None:
                    variants.append(e)
                else:
                    skipped[key] = why
    finally:  # a broker with hundreds of leftover partitions is slower for every later run
        delete_prefixed(settings, f"bench-{run}", f"bench-{run}")
        delete_prefixed(settings, f"changelog__bench-{run}", f"bench-{run}")
    return variants, skipped


async def _peer(
    settings: Settings,
    variant: Variant,
    run: str,
    n: int,
    progress: Progress,
    commit_interval_s: float | None = None,
) -> str | None:
    """(e), the quix-streams peer in its own venv: None when measured, else why not.

    A peer that fails is reported, not raised: the other variants' figures still stand.
    """
    if not PEER_PYTHON.exists():
        why = f"{PEER_PYTHON} is missing; build it with `make peer`"
        console.print(f"[yellow]skipping {variant.name}: {why}[/]")
        return why
    topics = [f"bench-{run}.peer.{i}" for i in range(HOPS + 1)]
    ensure_topics(settings, {t: {} for t in topics})
    state_dir = settings.state_dir / f"bench-peer-{run}"
    # quix names its changelog topics after the group: `changelog__<group>--<topic>--default`
    args = [PEER, "--group", f"bench-{run}e", "--state-dir", str(state_dir)]
    if commit_interval_s is not None:
        args += ["--commit-interval", str(commit_interval_s)]
    args += topics
    peer = _spawn(settings, PEER_PYTHON, args, f"bench-e-{run}")
    try:
        values = await _in_process(
            peer,
            lambda cpu: _measure(settings, variant, topics[0], topics[-1:], n, run, progress, cpu),
        )
    except (RuntimeError, OSError) as exc:
        console.print(f"[red]{variant.name} failed: {exc}[/]")
        return f"failed: {exc}"
    finally:
        shutil.rmtree(state_dir, ignore_errors=True)
    variant.steps_ms = _step_breakdown(values)
    return None


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


def _c_name(processes: int) -> str:
    return "ticketflow (c)" if processes == 1 else f"ticketflow (c) x{processes} processes"


async def _ticketflow(
    settings: Settings,
    variant: Variant,
    workflow: Path,
    run: str,
    n: int,
    progress: Progress,
    processes: int = 1,
    recovery: bool = True,
) -> None:
    """Throughput, latency and (one process, `recovery`) SIGKILL recovery of a worker
    running `workflow` in `processes` processes (CPU: the supervisor and its children)."""
    topics = Topics(f"bench-{run}.")
    port = app_processes.free_port()
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
    worker = app_processes.start_worker(
        worker_settings, env, log_name=f"bench-worker-{run}", processes=processes
    )
    outs = result_topics(topics)
    pid = worker.process.pid
    try:
        values = await _measure(
            settings,
            variant,
            topics.tickets_in,
            outs,
            n,
            run,
            progress,
            lambda: process_cpu_s(pid),
            lambda: _worker_metrics(port),
        )
        rate = variant.max_per_s * 0.5
        if processes > 1 or not recovery:
            successors = {}
        # the successor restarts under the killed worker's id (static membership), then
        # under none: it waits for the dead member's session to time out
        else:
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
    worker: app_processes.Service,
    sinks: list[str],
    rate: float,
    run: str,
) -> tuple[app_processes.Service, dict[str, float]]:
    """SIGKILL the worker under steady load, start a successor with `env`: how long until
    results flow again, and how fast its table came back from the changelog."""
    topics = Topics(worker_settings.topic_prefix)
    consumer = await _results_consumer(settings, sinks)
    producer = AIOKafkaProducer(**aiokafka_kwargs(settings), linger_ms=2)
    await producer.start()
    records = _tickets(int(rate * 40) + 100, f"{run}-rec")
    stop = asyncio.Event()
    feeder = asyncio.ensure_future(_feed(producer, topics.tickets_in, records, rate, stop=stop))
    try:
        await asyncio.sleep(5)  # steady state
        worker.kill()
        killed = time.monotonic()
        worker = await asyncio.to_thread(
            app_processes.start_worker, worker_settings, env, f"bench-worker-{run}"
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


HOP_SERIES = {
    "workflow_hop_fetched_seconds": "produce → fetched",
    "workflow_hop_delivered_seconds": "produce → handler",
}


def _worker_metrics(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        return resp.read().decode()


def _hop_totals(text: str) -> dict[str, list[float]]:
    """[sum, count] of each hop histogram, over all steps (agents/hops.py)."""
    totals = {name: [0.0, 0.0] for name in HOP_SERIES}
    for family in text_string_to_metric_families(text):
        for sample in family.samples if family.name in totals else ():
            if sample.name.endswith("_sum"):
                totals[family.name][0] += sample.value
            elif sample.name.endswith("_count"):
                totals[family.name][1] += sample.value
    return totals


def hop_split(before: str, after: str) -> dict[str, float]:
    """The mean hop between the two /metrics texts, in ms: produce to fetched by the
    worker's consumer, fetched to the step's handler, and the whole hop."""
    a, b = _hop_totals(before), _hop_totals(after)
    mean = {}
    for name in HOP_SERIES:
        count = b[name][1] - a[name][1]
        mean[name] = (b[name][0] - a[name][0]) / count * 1000 if count else float("nan")
    fetched, delivered = (mean[name] for name in HOP_SERIES)
    return {
        "produce → fetched": round(fetched, 2),
        "fetched → handler": round(delivered - fetched, 2),
        "hop": round(delivered, 2),
    }


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


def bench_pipeline(
    tickets: int = 2000,
    out: Path = Path("bench/results"),
    processes: tuple[int, ...] = (1,),
    recovery: bool = True,
) -> None:
    """Raw Kafka relay vs naive consumer vs ticketflow vs quix-streams: throughput, CPU,
    latency, steps."""
    with stack_and_gateway() as (settings, _):
        variants, skipped = asyncio.run(_bench(settings, tickets, out, processes, recovery))
    _report(variants, out, skipped)


@contextlib.contextmanager
def stack_and_gateway() -> Iterator[tuple[Settings, int | None]]:
    """The local stack up, and a gateway: the one already answering, or one started here and
    stopped on the way out. Yields the settings and the gateway's pid (None: not ours, and
    no pid file says whose)."""
    import devstack as stack
    from devstack.process import live_record, pid_path
    from streams.settings import get_settings

    settings = get_settings()
    stack.up(settings)
    gateway = (
        None if app_processes.gateway_ready(settings) else app_processes.start_gateway(settings)
    )
    record = live_record(pid_path(settings, "gateway"))
    pid = gateway.process.pid if gateway else (record.pid if record else None)
    try:
        yield settings, pid
    finally:
        if gateway is not None:
            gateway.stop()


def result_topics(topics: Topics) -> list[str]:
    """The three route topics a worker of `topics` writes its results to."""
    return [topics.out(r) for r in ("auto_classify", "manual_review", "after_sales")]


def _ratio(x: float | None, y: float | None) -> float | None:
    return round(x / y, 3) if x is not None and y else None


def _ratios(by: dict[str, Variant], figure: Callable[[Variant], float | None]) -> dict:
    """c and d (and c2, two processes) over a, b and the peers e (at the worker's commit
    interval) and e0.1 (None where the other variant has no figure)."""
    xs = [x for x in ("c", "d", "c2") if x in by]
    ys = ["a", "b", "e", *(y for y in by if y.startswith("e") and y != "e")]
    out = {
        f"{x}_over_{y}": _ratio(figure(by[x]), figure(by[y]) if y in by else None)
        for x in xs
        for y in ys
    }
    if "c2" in by:
        out["c2_over_c"] = _ratio(figure(by["c2"]), figure(by["c"]))
    return out


def _cpu_cell(v: Variant) -> str:
    return "n/a" if v.cpu_ms_per_ticket is None else f"{v.cpu_ms_per_ticket:.2f}"


def _report(variants: list[Variant], out: Path, skipped: dict[str, str] | None = None) -> None:
    """Table, ratios, JSON and plot; `variants` are (a) to (d), and (e) unless `skipped`."""
    by = {v.key or k: v for k, v in zip("abcde", variants, strict=False)}
    by.update({v.key: v for v in variants[5:] if v.key})
    keys = list(dict.fromkeys(k for v in variants for k in v.latency_ms))
    table = Table(
        "variant", "max/s", "CPU ms/ticket", "cores busy", *(f"p50/p99 @{k}" for k in keys)
    )
    for v in variants:
        at = {k: v.latency_ms.get(k) for k in keys}
        cells = [f"{x['p50']:.0f}/{x['p99']:.0f} ms" if x else "-" for x in at.values()]
        busy = "n/a" if v.cores_busy is None else f"{v.cores_busy:.2f}/{os.cpu_count()}"
        table.add_row(v.name, f"{v.max_per_s:.0f}", _cpu_cell(v), busy, *cells)
    console.print(table)
    console.print(f"CPU ms/ticket: {CPU_NOTE}")
    ratios = _ratios(by, lambda v: v.max_per_s)
    cpu_ratios = _ratios(by, lambda v: v.cpu_ms_per_ticket)
    for title, rs in (("max/s", ratios), ("CPU ms/ticket", cpu_ratios)):
        console.print(
            f"{title}: " + "   ".join(f"{k.replace('_over_', '/')} = {r}" for k, r in rs.items())
        )
    for v in variants[2:]:
        console.print(f"{v.name} per-step mean latency (ms): {v.steps_ms}")
        if v.hop_ms:
            console.print(f"{v.name} mean hop between two steps (ms): {v.hop_ms}")
        if v.recovery:
            console.print(f"{v.name} recovery after SIGKILL: {v.recovery}")
    for key, why in (skipped or {}).items():
        console.print(f"[yellow]({key}) skipped: {why}[/]")
    out.mkdir(parents=True, exist_ok=True)
    report = {
        "variants": [v.__dict__ for v in variants],
        "ratios": ratios,
        "cpu_ratios": cpu_ratios,
        "cpu_ms_per_ticket": CPU_NOTE,
        "skipped": skipped or {},
    }
    (out / "pipeline.json").write_text(json.dumps(report, indent=2))
    _plot(variants, out / "pipeline.png")
    console.print(f"wrote {out / 'pipeline.json'} and {out / 'pipeline.png'}")


def _plot(variants: list[Variant], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, cpu, middle, right) = plt.subplots(
        1, 4, figsize=(21, 4.6), gridspec_kw={"width_ratios": [1.2, 0.9, 1.2, 0.8]}
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
    _cpu_bars(cpu, variants)
    _bars(middle, variants[2:], _where_time_goes)
    middle.set(
        ylabel="mean ms",
        yscale="log",  # a step takes ms, a hop under exactly-once up to a commit interval
        title=f"at {int(BREAKDOWN_LOAD * 100)} % load: where time goes",
    )
    _bars(
        right,
        [v for v in variants if v.recovery],
        lambda v: {kind.replace("_", " "): r["flowing_again_s"] for kind, r in v.recovery.items()},
    )
    right.axhline(10, color="grey", linewidth=0.8, linestyle=":")  # the recovery target
    right.set(ylabel="seconds", title="SIGKILL: until results flow again")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _where_time_goes(v: Variant) -> dict[str, float]:
    """Mean ms per step and between steps, then one hop split in its two parts."""
    split = {f"1 hop: {k}": x for k, x in v.hop_ms.items() if k != "hop"}
    return {**v.steps_ms, **split}


def _cpu_bars(ax: Any, variants: list[Variant]) -> None:
    """CPU ms per ticket, one bar per variant, each labelled with its max/s."""
    xs = range(len(variants))
    heights = [v.cpu_ms_per_ticket or 0.0 for v in variants]
    bars = ax.bar(xs, heights, color=[f"C{i}" for i in xs])
    ax.bar_label(bars, labels=[f"{v.max_per_s:.0f}/s" for v in variants], fontsize=7)
    ax.set_xticks(xs, [v.name for v in variants], fontsize=8, rotation=20)
    ax.set(ylabel="CPU ms per ticket", title="CPU per ticket (variant's processes only)")


def _bars(ax: Any, variants: list[Variant], series: Callable[[Variant], dict]) -> None:
    """Grouped bars: one group per key of any variant's `series`, one bar per variant."""
    if not variants:  # e.g. no recovery measured (--quick)
        return
    width = 0.8 / len(variants)
    keys = list(dict.fromkeys(k for v in variants for k in series(v)))
    for i, v in enumerate(variants):
        values = series(v)
        xs = [j + (i - (len(variants) - 1) / 2) * width for j in range(len(keys))]
        ax.bar(xs, [values.get(k, 0.0) for k in keys], width, label=v.name)
    ax.set_xticks(range(len(keys)), keys, fontsize=8, rotation=20)
    ax.legend(fontsize=7)
