"""`ticketflow bench costs`: what one ticket costs every process of the machine, at given rates.

One worker process (default topology) runs on a prefix of its own; after a warm-up, an open
loop at each rate sends tickets whose texts no earlier phase sent (so the gateway's response
cache does not answer them), and a `read_committed` consumer waits for the results. For each
rate it reports the CPU seconds each process spent per ticket (the worker and its children,
the broker, Triton with its backend stubs, the gateway, Redis, and this load generator
itself), how busy the machine's cores were, and p50/p99 from send to result.

The pipeline benchmark's figures are per worker; this one says where the rest of the
machine's CPU goes, which is what queues a ticket once the cores are shared.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from rich.console import Console
from rich.table import Table

from benchmarks import pipeline as bench
from devstack import app_processes
from devstack.process import live_record, pid_path
from streams.admin import delete_prefixed
from streams.settings import Settings
from streams.topics import Topics

console = Console()
PHASE_S = 15.0  # seconds of traffic at each rate
STACK_PARTS = ("kafka", "triton", "redis")


def _own_cpu_s() -> float:
    """This process's CPU seconds, its threads included and its children not."""
    t = os.times()
    return t.user + t.system


def _clocks(settings: Settings, worker_pid: int, gateway_pid: int | None) -> dict:
    """A CPU clock (seconds) for each process measured, by name."""
    pids = {"worker": worker_pid}
    for part in STACK_PARTS:
        record = live_record(pid_path(settings, part))
        if record is not None:
            pids["broker" if part == "kafka" else part] = record.pid
    if gateway_pid is not None:
        pids["gateway"] = gateway_pid
    clocks: dict[str, Callable[[], float]] = {
        name: (lambda p=pid: bench.process_cpu_s(p)) for name, pid in pids.items()
    }
    clocks["client"] = _own_cpu_s
    return clocks


async def _phase(
    settings: Settings, topics: Topics, outs: list[str], rate: float, run: str, clocks: dict
) -> dict:
    records = bench._tickets(max(20, int(rate * PHASE_S)), f"{run}-{rate:g}")
    before = {k: c() for k, c in clocks.items()}
    busy, start = bench.machine_busy_s(), time.monotonic()
    _, latencies, values, _ = await bench._run_load(
        settings, topics.tickets_in, outs, records, rate
    )
    elapsed = time.monotonic() - start
    n = max(1, len(values))
    cpu = {k: round((c() - before[k]) * 1000 / n, 3) for k, c in clocks.items()}
    return {
        "offered_per_s": rate,
        "tickets": len(values),
        "cpu_ms_per_ticket": cpu,
        "cores_busy": round((bench.machine_busy_s() - busy) / elapsed, 2),
        **bench._percentiles(latencies),
    }


async def _measure(settings: Settings, rates: list[float], gateway_pid: int | None) -> list:
    run = uuid.uuid4().hex[:6]
    topics = Topics(f"bench-{run}.")
    port = app_processes.free_port()
    env = {
        "TICKETFLOW_TOPIC_PREFIX": topics.prefix,
        "TICKETFLOW_WORKER_WEB_PORT": str(port),
        "TICKETFLOW_WORKER_ID": "",
    }
    ws = settings.model_copy(
        update={"topic_prefix": topics.prefix, "worker_web_port": port, "worker_id": None}
    )
    worker = app_processes.start_worker(ws, env, log_name=f"bench-costs-{run}")
    outs = bench.result_topics(topics)
    try:
        warm = bench._tickets(bench.WARM_UP, f"{run}-warm")
        await bench._run_load(settings, topics.tickets_in, outs, warm, None)
        clocks = _clocks(settings, worker.process.pid, gateway_pid)
        phases = []
        for rate in rates:
            phases.append(await _phase(settings, topics, outs, rate, run, clocks))
            console.print(f"{rate:g}/s: {phases[-1]}")
        return phases
    finally:
        worker.stop()
        delete_prefixed(settings, f"bench-{run}", f"bench-{run}")
        delete_prefixed(settings, f"changelog__bench-{run}", f"bench-{run}")


def _report(phases: list[dict], out: Path) -> None:
    names = list(phases[0]["cpu_ms_per_ticket"]) if phases else []
    table = Table(title="CPU ms per ticket, by process")
    for col in ["rate /s", *names, "cores busy", "p50 ms", "p99 ms"]:
        table.add_column(col, justify="right")
    for p in phases:
        cpu = p["cpu_ms_per_ticket"]
        table.add_row(
            f"{p['offered_per_s']:g}",
            *(f"{cpu[n]:.2f}" for n in names),
            f"{p['cores_busy']:.2f}",
            f"{p['p50']:.0f}",
            f"{p['p99']:.0f}",
        )
    console.print(table)
    out.mkdir(parents=True, exist_ok=True)
    (out / "costs.json").write_text(json.dumps(phases, indent=1) + "\n")
    console.print(f"wrote {out / 'costs.json'}")


def bench_costs(rates: list[float], out: Path) -> None:
    with bench.stack_and_gateway() as (settings, gateway_pid):
        phases = asyncio.run(_measure(settings, rates, gateway_pid))
    _report(phases, out)
