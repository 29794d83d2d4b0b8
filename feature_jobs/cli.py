"""The data layer's commands, mounted by `ticketflow.cli`:

ticketflow features            run the streaming feature jobs (also `features run`)
ticketflow features describe   the views, their signatures and what the store holds
ticketflow features drift --now  one drift check per view, printed and published
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from feature_jobs.settings import FeatureSettings
from schemas.features import FeatureView
from streams.kafka_config import confluent_config
from streams.settings import Settings
from streams.watermarks import watermarks

features_app = typer.Typer(
    help="Feature views: run the streaming jobs, describe the views, check drift.",
    invoke_without_command=True,
    no_args_is_help=False,
)
console = Console()


def _settings() -> tuple[Settings, FeatureSettings]:
    return Settings(), FeatureSettings()


def _views(views_file: Path | None) -> dict[str, FeatureView]:
    from feature_jobs.views import VIEWS, ViewsFileError, load_views

    if views_file is None:
        return VIEWS
    try:
        return load_views(views_file)
    except ViewsFileError as exc:
        console.print(f"[red]{exc}[/]")
        raise typer.Exit(2) from exc


ViewsFile = Annotated[
    Path | None, typer.Option("--views-file", help="views YAML (default: feature_jobs/views.yaml)")
]


@features_app.callback()
def _default(
    ctx: typer.Context,
    loglevel: Annotated[str, typer.Option(help="log level of the job")] = "warning",
    views_file: ViewsFile = None,
) -> None:
    """Without a command: run the streaming feature jobs."""
    if ctx.invoked_subcommand is None:
        run(loglevel=loglevel, views_file=views_file)


@features_app.command("run")
def run(
    loglevel: Annotated[str, typer.Option(help="log level of the job")] = "warning",
    views_file: ViewsFile = None,
) -> None:
    """Run the streaming feature jobs (Faust agents on the views' source topics)."""
    from feature_jobs.job import run_job

    s, fs = _settings()
    views = _views(views_file)
    sys.argv = [sys.argv[0], "worker"]  # Faust's worker parses argv
    run_job(s, fs, views, loglevel=loglevel)


async def _store_status(s: Settings, fs: FeatureSettings, views: dict[str, FeatureView]) -> dict:
    import redis.asyncio as aioredis

    from feature_jobs.store import ViewKeys
    from streams.redis_config import async_client

    out: dict[str, dict] = {}
    r = async_client(s.redis, socket_timeout=1.0, socket_connect_timeout=1.0)
    try:
        for name, v in views.items():
            k = ViewKeys.of(v, fs.key_prefix)
            try:
                built, pointer = await r.mget(k.built, k.pointer)
            except (aioredis.RedisError, OSError) as exc:
                out[name] = {"status": f"redis unreachable: {exc}"}
                continue
            if built is not None and built.decode() == k.signature:
                status = "built: served"
            elif pointer is not None:
                status = f"not built: the store holds signature {pointer.decode()} (refused)"
            else:
                status = "not built: no data yet (reads fall back)"
            out[name] = {"status": status, "stored": pointer.decode() if pointer else None}
    finally:
        await r.aclose()
    return out


@features_app.command("describe")
def describe(
    as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
    views_file: ViewsFile = None,
) -> None:
    """Print the feature views, their signatures and whether the store serves them."""
    s, fs = _settings()
    views = _views(views_file)
    store = asyncio.run(_store_status(s, fs, views))
    if as_json:
        doc = {
            name: {
                "signature": v.signature(),
                "store": store.get(name),
                "definition": v.model_dump(mode="json"),
            }
            for name, v in views.items()
        }
        typer.echo(json.dumps(doc, indent=2, ensure_ascii=False))
        return
    for name, v in views.items():
        _describe_view(name, v, store.get(name, {}).get("status"))


def _describe_view(name: str, v: FeatureView, status: str | None) -> None:
    # short lines and a borderless table: readable in an 80-column terminal
    sig = v.signature()
    console.print(f"[bold]{name}[/]  signature [cyan]{sig[:16]}[/]… (--json: all {len(sig)})")
    console.print(f"  entity {v.entity} · source {v.source_topic} · ttl {v.ttl_seconds} s")
    console.print(
        f"  grace {v.grace_seconds} s · event time {v.event_time_field} · "
        f"event id {v.event_id_field}"
    )
    console.print(f"  store: {status}")
    table = Table(box=None, padding=(0, 2, 0, 0), pad_edge=False, header_style="bold underline")
    for column in ("feature", "type", "aggregation", "win/bucket", "field", "default"):
        table.add_column(column, no_wrap=True, overflow="ellipsis")
    for f in v.features:
        bucket = _dur(f.bucket_s) if f.bucketed else "-"
        table.add_row(
            f.name,
            escape(f.type),
            f.aggregation,
            f"{_dur(f.window_seconds)} / {bucket}",
            f.field or "-",
            json.dumps(f.default),
        )
    console.print(table)


@features_app.command("prune")
def prune(
    dry_run: Annotated[bool, typer.Option("--dry-run", help="count, delete nothing")] = False,
    views_file: ViewsFile = None,
) -> None:
    """Delete the keys of superseded view definitions (else they live out their TTLs)."""
    s, fs = _settings()
    views = _views(views_file)
    counts = asyncio.run(_prune(s, fs, views, dry_run))
    for name, n in counts.items():
        verb = "would delete" if dry_run else "deleted"
        console.print(f"{name}: {verb} {n} key(s) of other signatures")


async def _prune(s: Settings, fs: FeatureSettings, views: dict[str, FeatureView], dry_run: bool):

    from feature_jobs.store import SIG_CHARS, ViewKeys
    from streams.redis_config import async_client

    r = async_client(s.redis, socket_timeout=5.0)
    counts: dict[str, int] = {}
    try:
        for name, v in views.items():
            keep = ViewKeys.of(v, fs.key_prefix)
            base = f"{fs.key_prefix}:{name}:"
            doomed: list[bytes] = []
            n = 0
            async for key in r.scan_iter(match=base + "*", count=2000):
                tag = key.decode()[len(base) :].split(":", 1)[0]
                if len(tag) != SIG_CHARS or tag == keep.tag:
                    continue  # the pointer, or the current definition's keys
                n += 1
                if not dry_run:
                    doomed.append(key)
                    if len(doomed) >= 1000:
                        await r.delete(*doomed)
                        doomed = []
            if doomed:
                await r.delete(*doomed)
            counts[name] = n
    finally:
        await r.aclose()
    return counts


def _dur(seconds: int | None) -> str:
    if not seconds:
        return "-"
    for unit, n in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds % n == 0:
            return f"{seconds // n} {unit}"
    return f"{seconds} s"


@features_app.command("drift")
def drift(
    now: Annotated[bool, typer.Option("--now", help="run one check now")] = False,
    view: Annotated[str | None, typer.Option(help="only this view")] = None,
    since_s: Annotated[
        float | None, typer.Option(help="sample entities updated in the last N seconds")
    ] = None,
    reference: Annotated[
        Path | None, typer.Option(help="compare with this reference profile (JSON)")
    ] = None,
    save_reference: Annotated[
        bool, typer.Option(help="make this sample the stored reference profile")
    ] = False,
    export_reference: Annotated[
        Path | None, typer.Option(help="write the reference profile used to this file")
    ] = None,
    publish: Annotated[bool, typer.Option(help="publish the reports to features.drift")] = True,
    views_file: ViewsFile = None,
) -> None:
    """Run a drift check per view (`--now`) and print its DriftReport; else show the last ones."""
    s, fs = _settings()
    views = _views(views_file)
    names = [view] if view else list(views)
    for n in names:
        if n not in views:
            console.print(f"[red]unknown view {n!r}[/] (known: {sorted(views)})")
            raise typer.Exit(2)
    if not now:
        _show_last_reports(s, names)
        return
    reports = asyncio.run(
        _drift_now(s, fs, views, names, since_s, reference, save_reference, export_reference)
    )
    if publish:
        _publish(s, reports)
    for r in reports:
        typer.echo(r.model_dump_json(indent=2))
    if any(r.drifted for r in reports):
        raise typer.Exit(3)


async def _drift_now(s, fs, views, names, since_s, reference, save_reference, export_reference):
    from feature_jobs.drift import (
        DriftChecker,
        ReferenceProfile,
        Thresholds,
        build_reference,
        split_fallbacks,
    )

    period = since_s if since_s is not None else fs.drift_period_s
    checker = DriftChecker(
        s.redis,
        views,
        fs.key_prefix,
        sample_size=fs.drift_sample_size,
        period_s=period,
        thresholds=Thresholds(min_sample=fs.drift_min_sample),
    )
    reports = []
    try:
        for name in names:
            ref = None
            if reference is not None:
                ref = ReferenceProfile.model_validate_json(reference.read_bytes())
            if save_reference:
                since = int((time.time() - period) * 1000)
                real, _ = split_fallbacks(await checker.sample(name, since))
                ref = build_reference(views[name], real)
                await checker.save_reference(ref)
                console.print(f"reference profile of {name} saved ({len(real)} entities)")
            report = await checker.check(name, reference=ref)
            if export_reference is not None:
                used = ref or await checker.load_reference(name)
                if used is not None:
                    export_reference.write_bytes(used.to_json())
            reports.append(report)
    finally:
        await checker.close()
    return reports


def _publish(s: Settings, reports) -> None:
    from confluent_kafka import Producer

    from streams.codecs import encode
    from streams.topics import Topics

    topic = Topics(s.topic_prefix).features_drift
    p = Producer(confluent_config(s, {"linger.ms": 5}))
    for r in reports:
        p.produce(topic, key=r.view.encode(), value=encode(r))
    left = p.flush(10)
    if left:
        console.print(f"[yellow]{left} report(s) not published to {topic}[/]")


def _show_last_reports(s: Settings, names: list[str]) -> None:
    from confluent_kafka import Consumer, TopicPartition

    from streams.topics import Topics

    topic = Topics(s.topic_prefix).features_drift
    c = Consumer(
        confluent_config(
            s, {"group.id": f"tf-drift-show-{time.time()}", "enable.auto.commit": False}
        )
    )
    last: dict[str, bytes] = {}
    try:
        meta = c.list_topics(topic, timeout=10).topics.get(topic)
        if meta is None or meta.error is not None:
            console.print(f"no reports: {topic} does not exist")
            return
        tps = []
        for p in meta.partitions:
            lo, hi = watermarks(c, TopicPartition(topic, p))
            if hi > lo:
                tps.append(TopicPartition(topic, p, max(lo, hi - 50)))
        if tps:
            c.assign(tps)
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                msg = c.poll(0.5)
                if msg is None:
                    if all(c.position([tp])[0].offset >= watermarks(c, tp)[1] for tp in tps):
                        break
                    continue
                if not msg.error() and msg.key():
                    last[msg.key().decode()] = msg.value()
    finally:
        c.close()
    shown = False
    for n in names:
        if n in last:
            shown = True
            typer.echo(last[n].decode())
    if not shown:
        console.print("no drift reports yet; run `ticketflow features drift --now`")
