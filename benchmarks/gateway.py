"""`ticketflow bench gateway`: what the gateway's batching buys, and what it costs.

Closed-loop load (C callers, each sending one ticket, waiting for the answer, sending the
next) at several concurrencies C, against a private tritonserver (free ports, a temporary
model repository holding only the benchmarked version) and a private gateway process:

    (a) batching off: the gateway sends every request alone (max_batch_size 1, as many in
        flight as callers) to a Triton whose model config has max_batch_size 1 and no
        dynamic batcher;
    (b) batching on: the gateway's batcher (max_batch_size, max_queue_delay_us, adaptive
        delay unless --fixed-delay) in front of the repository's own config (Triton's
        dynamic batcher on);
    (c) the ceiling: the Triton client called directly, no gateway, with pre-formed batches
        of the mean size the gateway formed in (b) at that concurrency, from ceil(C / size)
        callers.

Every point reports throughput (tickets/s) and p50/p95/p99 latency (per ticket; in (c) a
ticket's latency is its batch's), the ratios b/a and b/c, and the gateway's mean batch size;
JSON and a PNG plot (latency against throughput) go to `out_dir`. The response cache and
dedupe are off and the tickets are distinct corpus tickets, so nothing is answered for free.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from inference_gateway import triton_server
from inference_gateway.routing import triton_version

MODEL = "ticket_classifier"
TIMEOUT_MS = 30_000  # generous: a benchmark measures latency, it does not enforce it


@dataclass
class BenchSettings:
    concurrency: list[int] = field(default_factory=lambda: [1, 4, 16, 64])
    seconds: float = 8.0
    warmup_s: float = 1.5
    version: str = "v2"
    max_batch_size: int = 32
    max_queue_delay_us: int = 2000
    adaptive_delay: bool = True
    out_dir: Path = Path("bench/results")
    modes: list[str] = field(default_factory=lambda: ["a", "b", "c"])
    n_texts: int = 3000


@dataclass
class Point:
    mode: str
    concurrency: int
    requests: int
    tickets: int
    errors: int
    seconds: float
    throughput: float
    p50_ms: float
    p95_ms: float
    p99_ms: float
    mean_batch: float | None = None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pct(samples: list[float], q: float) -> float:
    if not samples:
        return math.nan
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def prepare_repository(dest: Path, version: str, batching: bool) -> Path:
    """A model repository with `version` of ticket_classifier only (its directory linked)."""
    src = triton_server.DEFAULT_MODEL_REPOSITORY / MODEL
    number = triton_version(version)
    if not (src / number / "model.py").exists():
        raise RuntimeError(f"{src / number} has no model.py")
    model_dir = dest / MODEL
    model_dir.mkdir(parents=True)
    (model_dir / number).symlink_to(src / number, target_is_directory=True)
    shutil.copyfile(src / "labels.txt", model_dir / "labels.txt")
    config = (src / "config.pbtxt").read_text(encoding="utf-8")
    config = re.sub(
        r"version_policy:.*",
        f"version_policy: {{ specific: {{ versions: [ {number} ] }} }}",
        config,
    )
    if not batching:
        config = re.sub(r"max_batch_size:\s*\d+", "max_batch_size: 1", config)
        config = _drop_block(config, "dynamic_batching")
    (model_dir / "config.pbtxt").write_text(config, encoding="utf-8")
    return dest


def _drop_block(text: str, name: str) -> str:
    start = text.find(name)
    if start < 0:
        return text
    depth, i = 0, text.index("{", start)
    while True:
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        i += 1
        if depth == 0:
            return text[:start] + text[i:]


@contextlib.contextmanager
def triton(repo: Path, log: Path) -> Iterator[str]:
    grpc, http, metrics = _free_port(), _free_port(), _free_port()
    cmd = triton_server.tritonserver_command(repo, grpc, http, metrics)
    process = triton_server.start(cmd, log)
    try:
        triton_server.wait_ready(f"127.0.0.1:{grpc}", MODEL, 120, process=process)
        yield f"127.0.0.1:{grpc}"
    finally:
        triton_server.stop(process)
        for region in Path("/dev/shm").glob(f"ticketflow_{grpc}_*"):
            with contextlib.suppress(OSError):
                region.unlink()


@contextlib.contextmanager
def gateway(triton_url: str, log: Path, **flags: int | str) -> Iterator[str]:
    port = _free_port()
    argv = [sys.executable, "-m", "inference_gateway", "--host", "127.0.0.1"]
    argv += ["--port", str(port), "--triton-url", triton_url, "--log-level", "WARNING"]
    for name, value in flags.items():  # a value of "" is a switch
        argv += [f"--{name.replace('_', '-')}", *([str(value)] if value != "" else [])]
    env = {
        **os.environ,
        "TICKETFLOW_GATEWAY_ROUTING_WATCH": "0",
        "TICKETFLOW_GATEWAY_CACHE_SIZE": "0",
        "TICKETFLOW_GATEWAY_DEDUPE": "0",
        "TICKETFLOW_GATEWAY_ADMISSION": "0",
        # the bench's own gateway on a loopback port: its load is the measurement, so
        # neither a token nor the request cap may stand in its way
        "TICKETFLOW_GATEWAY_MAX_CONCURRENT_REQUESTS": "4096",
    }
    env.pop("TICKETFLOW_GATEWAY_TOKEN", None)
    with log.open("ab") as out:
        process = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"the gateway exited with {process.returncode}; see {log}")
            with contextlib.suppress(OSError), urllib.request.urlopen(url + "/healthz", timeout=1):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"the gateway did not start; see {log}")
            time.sleep(0.1)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _batch_totals(url: str, version: str) -> tuple[float, float]:
    """(sum, count) of inference_batch_size for the model version, from /metrics."""
    with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
        text = r.read().decode()
    labels = f'model="{MODEL}",version="{version}"'
    values = {}
    for kind in ("sum", "count"):
        m = re.search(rf"^inference_batch_size_{kind}\{{{labels}\}} (\S+)$", text, re.M)
        values[kind] = float(m.group(1)) if m else 0.0
    return values["sum"], values["count"]


async def closed_loop(
    call: Callable[[int], Awaitable[int]],
    workers: int,
    warmup_s: float,
    seconds: float,
    tick: Callable[[float], None] | None = None,
) -> tuple[list[float], int, int, float]:
    """Run `workers` loops of `call(i)` (returns tickets answered); latencies (ms) of calls
    that started after the warm-up and ended in the window, tickets, errors, window seconds."""
    t0 = time.monotonic()
    start, stop = t0 + warmup_s, t0 + warmup_s + seconds
    latencies: list[float] = []
    counts = {"tickets": 0, "errors": 0}
    sequence = iter(range(1 << 62))

    async def worker() -> None:
        while (now := time.monotonic()) < stop:
            began = now
            try:
                n = await call(next(sequence))
            except Exception:
                n = -1
            ended = time.monotonic()
            if began >= start and ended <= stop:
                if n < 0:
                    counts["errors"] += 1
                else:
                    latencies.append((ended - began) * 1000)
                    counts["tickets"] += n

    async def progress() -> None:
        while time.monotonic() < stop:
            await asyncio.sleep(0.25)
            if tick is not None:
                tick(min(time.monotonic() - t0, warmup_s + seconds))

    await asyncio.gather(progress(), *(worker() for _ in range(workers)))
    return latencies, counts["tickets"], counts["errors"], seconds


def _point(mode: str, c: int, result: tuple, per_call_tickets: int = 1) -> Point:
    latencies, tickets, errors, seconds = result
    return Point(
        mode=mode,
        concurrency=c,
        requests=len(latencies),
        tickets=tickets,
        errors=errors,
        seconds=seconds,
        throughput=round(tickets / seconds, 2),
        p50_ms=round(_pct(latencies, 0.50), 2),
        p95_ms=round(_pct(latencies, 0.95), 2),
        p99_ms=round(_pct(latencies, 0.99), 2),
    )


async def _gateway_points(
    mode: str, url: str, texts: list[str], s: BenchSettings, progress: Progress
) -> list[Point]:
    import aiohttp
    import orjson

    points = []
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as http:

        async def call(i: int) -> int:
            body = {
                "inputs": [{"id": f"bench-{i}", "text": texts[i % len(texts)]}],
                "version": s.version,
                "timeout_ms": TIMEOUT_MS,
            }
            async with http.post(
                f"{url}/v1/models/{MODEL}/predict",
                data=orjson.dumps(body),
                headers={"Content-Type": "application/json"},
            ) as r:
                await r.read()
                if r.status != 200:
                    raise RuntimeError(f"HTTP {r.status}")
            return 1

        await _warm(call)
        for c in s.concurrency:
            task = progress.add_task(f"({mode}) C={c}", total=s.warmup_s + s.seconds)
            before = _batch_totals(url, s.version)
            result = await closed_loop(
                call,
                c,
                s.warmup_s,
                s.seconds,
                lambda t, task=task: progress.update(task, completed=t),
            )
            after = _batch_totals(url, s.version)
            point = _point(mode, c, result)
            batches = after[1] - before[1]
            point.mean_batch = round((after[0] - before[0]) / batches, 2) if batches else None
            points.append(point)
            progress.update(task, completed=s.warmup_s + s.seconds)
    return points


async def _warm(call: Callable[[int], Awaitable[int]], tries: int = 200) -> None:
    """Until the first answer (the gateway's batcher and Triton's model warm up)."""
    for i in range(tries):
        try:
            await call(i)
            return
        except Exception:
            await asyncio.sleep(0.1)
    raise RuntimeError("no answer from the gateway during warm-up")


async def _direct_points(
    triton_url: str, texts: list[str], s: BenchSettings, sizes: dict[int, float], progress: Progress
) -> list[Point]:
    from inference_gateway.triton import TritonClient

    client = TritonClient(triton_url)
    points = []
    try:
        for c in s.concurrency:
            size = max(1, min(s.max_batch_size, round(sizes.get(c) or min(c, s.max_batch_size))))
            workers = max(1, math.ceil(c / size))

            async def call(i: int, size: int = size) -> int:
                start = (i * size) % len(texts)
                batch = (texts + texts)[start : start + size]
                await client.infer(batch, s.version, timeout_s=TIMEOUT_MS / 1000)
                return size

            await _warm(call)
            task = progress.add_task(f"(c) C={c} as {workers}x{size}", total=s.warmup_s + s.seconds)
            result = await closed_loop(
                call, workers, s.warmup_s, s.seconds,
                lambda t, task=task: progress.update(task, completed=t),
            )  # fmt: skip
            point = _point("c", c, result)
            point.mean_batch = float(size)
            points.append(point)
            progress.update(task, completed=s.warmup_s + s.seconds)
    finally:
        await client.close()
    return points


def run(s: BenchSettings, console: Console | None = None) -> dict[str, Any]:
    """Run the benchmark; returns (and writes) the results."""
    from training import corpus

    console = console or Console()
    s.out_dir.mkdir(parents=True, exist_ok=True)
    texts = [r["text"] for r in corpus.generate(s.n_texts, seed=2024)]
    points: list[Point] = []
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="tf-bench-") as tmp, Progress(
        TextColumn("{task.description:<22}"), BarColumn(), TimeRemainingColumn(),
        console=console, transient=False,
    ) as progress:  # fmt: skip
        logs = Path(tmp)
        if "a" in s.modes:
            repo = prepare_repository(Path(tmp) / "repo-a", s.version, batching=False)
            with triton(repo, logs / "triton-a.log") as url, gateway(
                url, logs / "gateway-a.log", max_batch_size=1,
                max_inflight_batches=max(s.concurrency), max_queue_size=100_000,
            ) as gw:  # fmt: skip
                points += asyncio.run(_gateway_points("a", gw, texts, s, progress))
        if "b" in s.modes or "c" in s.modes:
            repo = prepare_repository(Path(tmp) / "repo-b", s.version, batching=True)
            with triton(repo, logs / "triton-b.log") as url:
                sizes: dict[int, float] = {}
                if "b" in s.modes:
                    flags = {"adaptive_delay": ""} if s.adaptive_delay else {}
                    with gateway(
                        url, logs / "gateway-b.log", max_batch_size=s.max_batch_size,
                        max_queue_delay_us=s.max_queue_delay_us, max_queue_size=100_000, **flags,
                    ) as gw:  # fmt: skip
                        got = asyncio.run(_gateway_points("b", gw, texts, s, progress))
                    points += got
                    sizes = {p.concurrency: p.mean_batch or 1.0 for p in got}
                if "c" in s.modes:
                    points += asyncio.run(_direct_points(url, texts, s, sizes, progress))
    result = summarize(points, s, time.monotonic() - started)
    (s.out_dir / "gateway.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    plot(result, s.out_dir / "gateway.png")
    return result


def summarize(points: list[Point], s: BenchSettings, wall_s: float) -> dict[str, Any]:
    by = {(p.mode, p.concurrency): p for p in points}
    ratios = []
    for c in s.concurrency:
        a, b, d = by.get(("a", c)), by.get(("b", c)), by.get(("c", c))
        row: dict[str, Any] = {"concurrency": c}
        if a and b and a.throughput:
            row["b_over_a"] = round(b.throughput / a.throughput, 3)
            row["p99_b_minus_a_ms"] = round(b.p99_ms - a.p99_ms, 2)
        if b and d and d.throughput:
            row["b_over_c"] = round(b.throughput / d.throughput, 3)
        ratios.append(row)
    low = min(s.concurrency)
    b1, c1 = by.get(("b", low)), by.get(("c", low))
    return {
        "settings": {**asdict(s), "out_dir": str(s.out_dir)},
        "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]},
        "wall_seconds": round(wall_s, 1),
        "points": [asdict(p) for p in points],
        "ratios": ratios,
        "added_latency_p50_ms_at_low_load": (
            round(b1.p50_ms - c1.p50_ms, 2) if b1 and c1 else None
        ),
        "best_throughput": {
            m: max((p.throughput for p in points if p.mode == m), default=None) for m in "abc"
        },
    }


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = {"a": "(a) batching off", "b": "(b) gateway batching", "c": "(c) Triton direct"}
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharex=True)
    for mode, label in names.items():
        pts = sorted(
            (p for p in result["points"] if p["mode"] == mode), key=lambda p: p["concurrency"]
        )
        if not pts:
            continue
        x = [p["throughput"] for p in pts]
        for ax, key in zip(axes, ("p50_ms", "p99_ms"), strict=True):
            ax.plot(x, [p[key] for p in pts], marker="o", label=label)
            for p in pts:
                ax.annotate(f"C={p['concurrency']}", (p["throughput"], p[key]), fontsize=7,
                            xytext=(3, 3), textcoords="offset points")  # fmt: skip
    s = result["settings"]
    for ax, key in zip(axes, ("p50", "p99"), strict=True):
        ax.set_yscale("log")
        ax.set_xlabel("throughput (tickets/s)")
        ax.set_ylabel(f"{key} latency (ms)")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(
        f"{MODEL} {s['version']} on {result['machine']['cpus']} CPUs: closed loop, "
        f"max_batch_size {s['max_batch_size']}, delay {s['max_queue_delay_us']} µs"
        + (" (adaptive)" if s.get("adaptive_delay") else ""),
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def print_summary(result: dict[str, Any], console: Console) -> None:
    table = Table("mode", "C", "tickets/s", "p50 ms", "p95 ms", "p99 ms", "batch", "errors")
    for p in result["points"]:
        table.add_row(
            p["mode"], str(p["concurrency"]), f"{p['throughput']:.1f}", f"{p['p50_ms']:.1f}",
            f"{p['p95_ms']:.1f}", f"{p['p99_ms']:.1f}",
            "" if p["mean_batch"] is None else f"{p['mean_batch']:.1f}", str(p["errors"]),
        )  # fmt: skip
    console.print(table)
    ratios = Table("C", "b/a throughput", "p99 b-a (ms)", "b/c throughput")
    for r in result["ratios"]:
        ratios.add_row(
            str(r["concurrency"]), str(r.get("b_over_a", "")),
            str(r.get("p99_b_minus_a_ms", "")), str(r.get("b_over_c", "")),
        )  # fmt: skip
    console.print(ratios)
    added = result["added_latency_p50_ms_at_low_load"]
    if added is not None:
        console.print(f"gateway's added p50 latency at the lowest load: {added:.2f} ms")
    out = result["settings"]["out_dir"]
    console.print(f"wrote {out}/gateway.json and {out}/gateway.png ({result['wall_seconds']} s)")
