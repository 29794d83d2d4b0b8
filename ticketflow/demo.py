"""`ticketflow demo`: every layer on a few hundred fresh sample tickets, left running after.

Order: the stack (Kafka, Redis, Triton, Prometheus), then the gateway, ingest, the feature
job and a worker, detached (`ticketflow stack down` stops them). A warm-up wave of one
ticket per demo user goes first, and the rest only once the feature job has applied it, so
that repeat users' tickets are classified with their real features, not fallbacks.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Collection
from datetime import datetime, timezone

import orjson
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

import devstack as stack
from devstack import app_processes
from streams.kafka_config import confluent_config
from streams.settings import Settings
from streams.topics import Topics
from ticketflow import kafka_io
from training.corpus import generate

console = Console()
USERS = 37
MALFORMED = [b"\xff\xfe not utf-8", b"{not json", b'{"ticket_id": "no-text"}']
ROUTES = ["auto_classify", "manual_review", "after_sales"]


def sample_tickets(count: int, run: str) -> list[dict]:
    now = datetime.now(timezone.utc).isoformat()
    channels = ["email", "chat", "web", "phone", "api"]
    return [
        {
            "ticket_id": f"demo-{run}-{i:05d}",
            "text": t["text"],
            "user_id": f"user-{i % USERS}",
            "channel": channels[i % len(channels)],
            "language": t["language"],
            "created_at": now,
        }
        for i, t in enumerate(generate(count, seed=int(time.time())))
    ]


def run_demo(settings: Settings, count: int) -> None:
    started = datetime.now().replace(microsecond=0)  # local, as `dlq ls --since` reads it
    try:
        _start_everything(settings)
    except (stack.StackError, RuntimeError, TimeoutError) as exc:
        console.print(f"[red]the demo could not start:[/] {escape(str(exc))}")
        raise SystemExit(1) from exc
    run = uuid.uuid4().hex[:6]
    results = _publish_and_watch(settings, count, run)
    _summarise(results, count)
    _where_to_look(settings, results, started)


def _start_everything(settings: Settings) -> None:
    console.print("bringing up the local stack …")
    _stack_up(settings)
    for part in app_processes.APP_PARTS:
        console.print(f"  {app_processes.start_detached(settings, part.name)}")
    _wait_views_built(settings)


def _stack_up(settings: Settings) -> None:
    """The stack; without Prometheus the demo still runs (it only loses the live view)."""
    try:
        stack.up(settings)
    except stack.StackError as exc:
        missing = [p.name for p in stack.status(settings) if not p.healthy]
        if missing != ["prometheus"]:
            raise
        console.print(f"[yellow]Prometheus did not start:[/] {escape(str(exc))}")


# ---- the feature job -------------------------------------------------------------------------


def _job_metrics(settings: Settings) -> dict[str, float]:
    """The feature job's built flags and applied-event count, from its /metrics."""
    import urllib.request

    url = f"http://127.0.0.1:{settings.features.web_port}/metrics"
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            text = resp.read().decode()
    except OSError:
        return {}
    out: dict[str, float] = {"events": 0.0}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "feature_job_events_total":
                out["events"] += sample.value
            elif sample.name == "feature_view_built":
                out[f"built:{sample.labels.get('view')}"] = sample.value
    return out


def _wait_views_built(settings: Settings, timeout_s: float = 120) -> None:
    """Until every view is built (before that, every read is a fallback)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        built = [v for k, v in _job_metrics(settings).items() if k.startswith("built:")]
        if built and all(v == 1 for v in built):
            return
        time.sleep(0.5)
    console.print("[yellow]the feature views are not built yet: expect fallbacks[/]")


def _wait_applied(settings: Settings, before: float, n: int, timeout_s: float = 30) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if _job_metrics(settings).get("events", 0) >= before + n:
            return True
        time.sleep(0.2)
    return False


# ---- publishing and watching -----------------------------------------------------------------


def _records(tickets: list[dict]) -> list[tuple[bytes, bytes]]:
    return [(t["ticket_id"].encode(), orjson.dumps(t)) for t in tickets]


def _publish_and_watch(settings: Settings, count: int, run: str) -> list[dict]:
    kafka, topic = confluent_config(settings), Topics(settings.topic_prefix).tickets_in
    tickets = sample_tickets(count, run)
    warm_up, rest = tickets[:USERS], tickets[USERS:]
    before = _job_metrics(settings).get("events", 0.0)
    kafka_io.produce_all(kafka, topic, _records(warm_up))
    console.print(f"warm-up: {len(warm_up)} tickets, one per user, to {topic}")
    results = _watch(settings, f"demo-{run}-", len(warm_up))
    if not _wait_applied(settings, before, len(warm_up)):
        console.print("[yellow]the feature job has not applied the warm-up yet[/]")
    # the workers' feature reader caches what it read for the warm-up tickets this long
    time.sleep(settings.features.cache_ttl_s + 0.5)
    bad = [(f"demo-{run}-bad-{i}".encode(), raw) for i, raw in enumerate(MALFORMED)]
    kafka_io.produce_all(kafka, topic, _records(rest) + bad)
    console.print(f"then {len(rest)} tickets and {len(MALFORMED)} malformed records")
    seen = {r["ticket_id"] for r in results}
    later = _watch(settings, f"demo-{run}-", len(rest), skip=seen)
    return results + later


def _watch(settings: Settings, prefix: str, count: int, skip: Collection[str] = ()) -> list[dict]:
    topics = Topics(settings.topic_prefix)
    results: list[dict] = []
    columns = (TextColumn("results"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console) as bar:
        task = bar.add_task("results", total=count)
        deadline = time.monotonic() + 180
        for rec in kafka_io.follow(
            confluent_config(settings), [topics.out(r) for r in ROUTES], idle_s=30
        ):
            result = orjson.loads(rec.value or b"{}")
            ticket_id = str(result.get("ticket_id", ""))
            if ticket_id.startswith(prefix) and ticket_id not in skip:
                results.append(result)
                bar.advance(task)
            if len(results) >= count or time.monotonic() > deadline:
                break
    return results


# ---- what came out ---------------------------------------------------------------------------


def feature_share(results: list[dict]) -> tuple[int, int, int]:
    """(real feature values, all feature values, tickets whose features are all real)."""
    real = total = whole = 0
    for r in results:
        values = list((r.get("features") or {}).values())
        n_real = sum(1 for v in values if not v.get("is_fallback", True))
        real, total = real + n_real, total + len(values)
        whole += bool(values) and n_real == len(values)
    return real, total, whole


def with_history(results: list[dict]) -> int:
    """Tickets whose user had earlier tickets in the store (a feature other than empty)."""
    return sum(any(_history(v) for v in (r.get("features") or {}).values()) for r in results)


def _history(feature: dict) -> bool:
    return not feature.get("is_fallback", True) and feature.get("value") not in (0, None, [])


def _summarise(results: list[dict], count: int) -> None:
    table = Table("route", "tickets", "degraded")
    per_route = Counter(r["route"] for r in results)
    degraded = Counter(r["route"] for r in results if r.get("degraded"))
    for route, n in per_route.most_common():
        table.add_row(route, str(n), str(degraded[route]))
    console.print(table)
    real, total, whole = feature_share(results)
    share = f"{real / total:.0%}" if total else "n/a"
    console.print(f"{len(results)} of {count} results")
    console.print(f"features: {share} of values real (not fallback), all real on {whole}")
    console.print(f"  {with_history(results)} tickets carried their user's earlier tickets")
    for r in _examples(results):
        path = " → ".join(f"{p['step']}:{p['status']}" for p in r["decision_path"])
        console.print(
            f"[bold]{r['ticket_id']}[/] {r['route']} / {r['category']} "
            f"{r['confidence']:.2f} by {r.get('model_name')} {r.get('model_version')}"
            f"\n  {path} ({r.get('latency_ms', 0):.0f} ms)"
        )


def _examples(results: list[dict]) -> list[dict]:
    """One decision per route, then a few more."""
    shown = list({r["route"]: r for r in reversed(results)}.values())
    return shown + [r for r in results[:6] if r not in shown][: max(0, 4 - len(shown))]


def _where_to_look(settings: Settings, results: list[dict], started: datetime) -> None:
    from devstack import prometheus

    repeat = [r for r in results if int(r["ticket_id"].rsplit("-", 1)[1]) >= USERS]
    ticket = (repeat or results or [{"ticket_id": "<ticket id>"}])[0]["ticket_id"]
    review = next((r["ticket_id"] for r in results if r["route"] == "manual_review"), None)
    url = prometheus.base_url(settings)
    lines = [
        "The gateway, ingest, feature job and worker keep running (.stack/logs/).",
        f"  Prometheus   {url}/graph",
        f"  its alerts   {url}/alerts",
        f"  a trace      ticketflow trace {ticket}",
        f"  its state    ticketflow status {ticket}",
        f"  dead letters ticketflow dlq ls --since {started.isoformat()}",
        "               then ticketflow dlq show PARTITION:OFFSET",
        f"  review       ticketflow review decide {review} --category billing"
        if review
        else "  review       ticketflow review stats",
        "               ticketflow review spot-checks",
        "  features     ticketflow features describe",
        "  stop it all  ticketflow stack status; ticketflow stack down",
    ]
    console.print("\n" + "\n".join(lines), highlight=False)
