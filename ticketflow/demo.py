"""`ticketflow demo`: the whole pipeline on a few hundred fresh sample tickets."""

from __future__ import annotations

import time
import uuid
from collections import Counter
from datetime import datetime, timezone

import orjson
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from inference_gateway.model.corpus import generate
from streams.kafka_config import confluent_config
from streams.settings import Settings
from streams.topics import Topics
from ticketflow import kafka_io, services, stack

console = Console()
PUBLISH_RATE = 100.0
MALFORMED = [b"\xff\xfe not utf-8", b"{not json", b'{"ticket_id": "no-text"}']


def sample_tickets(count: int, run: str) -> list[dict]:
    now = datetime.now(timezone.utc).isoformat()
    channels = ["email", "chat", "web", "phone", "api"]
    return [
        {
            "ticket_id": f"demo-{run}-{i:05d}",
            "text": t["text"],
            "user_id": f"user-{i % 37}",
            "channel": channels[i % len(channels)],
            "language": t["language"],
            "created_at": now,
        }
        for i, t in enumerate(generate(count, seed=int(time.time())))
    ]


def _start_missing(settings: Settings) -> list[services.Service]:
    started = []
    if not services.gateway_ready(settings):
        console.print("starting the inference gateway …")
        started.append(services.start_gateway(settings))
    if not services.worker_ready(settings):
        console.print("starting a workflow worker …")
        started.append(services.start_worker(settings))
    return started


def run_demo(settings: Settings, count: int) -> None:
    console.print("bringing up the local stack (Kafka, Redis, Triton) …")
    stack.up(settings)
    started = _start_missing(settings)
    try:
        _publish_and_watch(settings, count)
    finally:
        for service in reversed(started):
            service.stop()
    console.print(
        "\nThe stack is still up: `ticketflow stack status`, and "
        "`ticketflow stack down` (or `make down`) to stop it."
    )


def _publish_and_watch(settings: Settings, count: int) -> None:
    topics = Topics(settings.topic_prefix)
    run = uuid.uuid4().hex[:6]
    tickets = sample_tickets(count, run)
    records = [(t["ticket_id"].encode(), orjson.dumps(t)) for t in tickets]
    records += [(f"demo-{run}-bad-{i}".encode(), raw) for i, raw in enumerate(MALFORMED)]
    kafka_io.produce_all(confluent_config(settings), topics.tickets_in, records)
    console.print(
        f"published {count} tickets and {len(MALFORMED)} malformed records to {topics.tickets_in}"
    )
    results = _watch(settings, topics, run, count)
    _summarise(results, count)


def _watch(settings: Settings, topics: Topics, run: str, count: int) -> list[dict]:
    routes = ["auto_classify", "manual_review", "after_sales"]
    results: list[dict] = []
    columns = (TextColumn("tickets"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console) as bar:
        task = bar.add_task("results", total=count)
        deadline = time.monotonic() + 180
        for rec in kafka_io.follow(
            confluent_config(settings), [topics.out(r) for r in routes], idle_s=30
        ):
            result = orjson.loads(rec.value or b"{}")
            if str(result.get("ticket_id", "")).startswith(f"demo-{run}-"):
                results.append(result)
                bar.advance(task)
            if len(results) >= count or time.monotonic() > deadline:
                break
    return results


def _summarise(results: list[dict], count: int) -> None:
    per_route = Counter(r["route"] for r in results)
    table = Table("route", "tickets")
    for route, n in per_route.most_common():
        table.add_row(route, str(n))
    console.print(table)
    console.print(f"{len(results)} of {count} results")
    # one decision per route, then a few more
    shown = list({r["route"]: r for r in reversed(results)}.values())
    shown += [r for r in results[:6] if r not in shown][: max(0, 4 - len(shown))]
    for r in shown:
        path = " → ".join(
            f"{p['step']}:{p['status']}({p['latency_ms']:.1f}ms)" for p in r["decision_path"]
        )
        console.print(
            f"[bold]{r['ticket_id']}[/] {r['route']} / {r['category']} "
            f"{r['confidence']:.2f} by {r.get('model_name')} {r.get('model_version')}"
            f"\n  {path}"
        )
