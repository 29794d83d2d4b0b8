"""The `ticketflow bench` commands, mounted by `ticketflow.cli` as `bench_app`.

Each command imports its benchmark when it runs: `ticketflow --help` and the runtime
commands must not pay for matplotlib, aiokafka consumers or the corpus generator.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

bench_app = typer.Typer(
    help="Benchmarks, each measured in one run on this machine.", no_args_is_help=True
)
console = Console()
RESULTS = Path("bench/results")  # where every benchmark writes unless told otherwise


@bench_app.command("gateway")
def bench_gateway(
    concurrency: Annotated[
        str, typer.Option(help="closed-loop concurrencies, comma-separated")
    ] = "1,4,16,64",
    seconds: Annotated[float, typer.Option(help="measured seconds per point")] = 8.0,
    warmup: Annotated[float, typer.Option(help="warm-up seconds per point")] = 1.5,
    version: Annotated[str, typer.Option(help="model version to load")] = "v2",
    max_batch_size: Annotated[int, typer.Option(help="gateway batch size in mode (b)")] = 32,
    max_queue_delay_us: Annotated[int, typer.Option(help="gateway batch wait in (b)")] = 2000,
    adaptive_delay: Annotated[
        bool, typer.Option("--adaptive-delay/--fixed-delay", help="batch wait mode in (b)")
    ] = True,
    out: Annotated[Path, typer.Option(help="folder for gateway.json and gateway.png")] = RESULTS,
    modes: Annotated[str, typer.Option(help="which of a,b,c to run")] = "a,b,c",
) -> None:
    """Closed-loop load on the gateway: (a) batching off, (b) on, (c) Triton direct."""
    from benchmarks import gateway

    levels = [int(c) for c in concurrency.split(",") if c.strip()]
    result = gateway.run(
        gateway.BenchSettings(
            concurrency=levels,
            seconds=seconds,
            warmup_s=warmup,
            version=version,
            max_batch_size=max_batch_size,
            max_queue_delay_us=max_queue_delay_us,
            adaptive_delay=adaptive_delay,
            out_dir=out,
            modes=[m.strip() for m in modes.split(",") if m.strip()],
        ),
        console=console,
    )
    gateway.print_summary(result, console)


@bench_app.command("features")
def bench_features(
    events: Annotated[int, typer.Option(help="tickets the feature job consumes a run")] = 40_000,
    entities: Annotated[int, typer.Option(help="distinct users among them")] = 5_000,
    reads: Annotated[int, typer.Option(help="online reads per latency series")] = 5_000,
    benchmark_requests: Annotated[
        int, typer.Option(help="requests of the redis-benchmark run")
    ] = 100_000,
    repeats: Annotated[
        int, typer.Option(help="job runs, each between two redis-benchmark runs", min=1, max=9)
    ] = 3,
    workers: Annotated[
        int, typer.Option(help="feature job processes (one consumer group)", min=1, max=8)
    ] = 1,
    out: Annotated[Path, typer.Option(help="where the JSON and the PNG go")] = RESULTS,
) -> None:
    """Feature job updates/s vs redis-benchmark on the same script; online read p99."""
    from benchmarks.features import run_bench

    result = run_bench(
        events=events,
        entities=entities,
        reads=reads,
        benchmark_requests=benchmark_requests,
        workers=workers,
        repeats=repeats,
        out=out,
        echo=console.print,
    )
    typer.echo(json.dumps(result["summary"], indent=2))
    if not result["summary"]["targets_met"]:
        raise typer.Exit(1)


@bench_app.command("ingest")
def bench_ingest(
    singles: Annotated[int, typer.Option(help="single-ticket posts in the throughput run")] = 3000,
    batches: Annotated[int, typer.Option(help="batches of 100 in the throughput run")] = 60,
    concurrency: Annotated[int, typer.Option(help="requests in flight")] = 32,
    out: Annotated[Path, typer.Option(help="where the JSON and PNG go")] = RESULTS,
) -> None:
    """Ingest vs a bare confluent-kafka producer: tickets/s and p50/p99, singles and batches."""
    from benchmarks.ingest import bench_ingest as run

    run(singles, batches, concurrency, out)


@bench_app.command("pipeline")
def bench_pipeline(
    tickets: Annotated[int, typer.Option(help="tickets in each throughput burst")] = 2000,
    out: Annotated[Path, typer.Option(help="where the JSON and PNG go")] = RESULTS,
    processes: Annotated[
        str, typer.Option(help="worker process counts of (c), comma-separated, e.g. 1,2")
    ] = "1",
    quick: Annotated[
        bool, typer.Option(help="CI's short run: 300-ticket bursts, no SIGKILL recovery")
    ] = False,
) -> None:
    """Raw Kafka relay vs a naive consumer vs ticketflow vs quix-streams: throughput, CPU,
    latency against load, per step."""
    from benchmarks.pipeline import bench_pipeline as run

    run(300 if quick else tickets, out, _process_counts(processes), recovery=not quick)


@bench_app.command("costs")
def bench_costs(
    rates: Annotated[
        str, typer.Option(help="offered tickets/s, comma-separated, one phase each")
    ] = "50,300",
    out: Annotated[Path, typer.Option(help="where costs.json goes")] = RESULTS,
) -> None:
    """CPU per ticket of every process (worker, broker, Triton, gateway, Redis, the load
    generator) at each offered rate, one worker, fresh texts."""
    from benchmarks.costs import bench_costs as run

    try:
        values = [float(x) for x in rates.split(",") if x.strip()]
    except ValueError as exc:
        raise typer.BadParameter("--rates takes rates like 50,300") from exc
    if not values or min(values) <= 0:
        raise typer.BadParameter("--rates takes rates like 50,300")
    run(values, out)


def _process_counts(text: str) -> tuple[int, ...]:
    """`--processes 1,2` as counts; refused unless every one is a positive integer."""
    try:
        counts = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError as exc:
        raise typer.BadParameter("--processes takes counts like 1,2") from exc
    if not counts or min(counts) < 1:
        raise typer.BadParameter("--processes takes counts like 1,2")
    return counts
