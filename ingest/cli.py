"""Command-line pieces of the access layer, mounted by `ticketflow.cli`:

ingest          `ticketflow ingest`: run the HTTP ingest service
keys_app        `ticketflow keys create|list|revoke`: API keys in Redis
limits_app      `ticketflow limits get|set`: the token buckets, changed at runtime
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, TypeVar

import orjson
import typer
from redis.exceptions import RedisError
from rich.console import Console
from rich.table import Table

from ingest.keys import KeyStore, KeyStoreError
from ingest.limits import KINDS, Limit, Limits, LimitStore
from ingest.settings import IngestSettings

console = Console()
err = Console(stderr=True)
keys_app = typer.Typer(help="API keys of the ingest service (stored hashed).", no_args_is_help=True)
limits_app = typer.Typer(
    help="Token buckets of the ingest service, per API key and per client IP.",
    no_args_is_help=True,
)
T = TypeVar("T")


def _with_redis(work: Callable[[IngestSettings, Any], Awaitable[T]]) -> T:
    """Run `work(settings, redis)` on a fresh client; exit 2 when Redis is away."""
    from ingest.service import redis_client

    settings = IngestSettings()

    async def main() -> T:
        redis = redis_client(settings.model_copy(update={"redis_timeout_s": 5.0}))
        try:
            return await work(settings, redis)
        finally:
            await redis.aclose()

    try:
        return asyncio.run(main())
    except RedisError as exc:
        err.print(f"[red]Redis is unavailable:[/] {type(exc).__name__}")
        raise typer.Exit(2) from exc


def ingest(
    host: Annotated[str | None, typer.Option(help="default: TICKETFLOW_INGEST_HOST")] = None,
    port: Annotated[int | None, typer.Option(help="default: TICKETFLOW_INGEST_PORT")] = None,
) -> None:
    """Run the HTTP ingest API in front of tickets.in (default 127.0.0.1:8090)."""
    from ingest.server import run

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    updates = {k: v for k, v in {"host": host, "port": port}.items() if v is not None}
    run(IngestSettings().model_copy(update=updates))


# ---- keys -----------------------------------------------------------------------------------


@keys_app.command("create")
def keys_create(
    name: Annotated[str, typer.Option(help="a unique name: A-Z a-z 0-9 . _ -, 1-64 chars")],
    scopes: Annotated[str, typer.Option(help="comma-separated: submit, read, admin")] = "submit",
) -> None:
    """Create a key; the key itself is printed once, alone on the last line."""

    async def work(settings: IngestSettings, redis: Any) -> tuple[str, Any]:
        return await KeyStore(redis, settings.redis_prefix).create(name, scopes)

    try:
        token, record = _with_redis(work)
    except KeyStoreError as exc:
        err.print(f"[red]refused:[/] {exc}")
        raise typer.Exit(1) from exc
    err.print(
        f"created key {record.name} (id {record.id}, scopes {','.join(sorted(record.scopes))}); "
        "it is shown only now:"
    )
    print(token)


@keys_app.command("list")
def keys_list(as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """Every key's name, id, scopes and creation time (never the key)."""

    async def work(settings: IngestSettings, redis: Any) -> list[Any]:
        return await KeyStore(redis, settings.redis_prefix).list()

    records = _with_redis(work)
    if as_json:
        print(orjson.dumps([r.public() for r in records]).decode())
        return
    table = Table("name", "id", "scopes", "created")
    for r in records:
        table.add_row(r.name, r.id, ",".join(sorted(r.scopes)), r.created_at)
    console.print(table)


@keys_app.command("revoke")
def keys_revoke(name: str) -> None:
    """Revoke a key: every ingest instance refuses it within TICKETFLOW_INGEST_KEY_CACHE_S."""

    async def work(settings: IngestSettings, redis: Any) -> bool:
        return await KeyStore(redis, settings.redis_prefix).revoke(name)

    if not _with_redis(work):
        err.print(f"[red]no key named {name}[/]")
        raise typer.Exit(1)
    console.print(f"revoked {name}")


# ---- limits ---------------------------------------------------------------------------------


def _store(settings: IngestSettings, redis: Any) -> LimitStore:
    defaults = Limits(
        key=Limit(rate=settings.key_rate, burst=settings.key_burst),
        ip=Limit(rate=settings.ip_rate, burst=settings.ip_burst),
    )
    return LimitStore(redis, settings.redis_prefix, defaults)


async def _key_id(settings: IngestSettings, redis: Any, name: str) -> str:
    record = await KeyStore(redis, settings.redis_prefix).by_name(name)
    if record is None:
        raise KeyStoreError(f"no key named {name}")
    return record.id


@limits_app.command("get")
def limits_get() -> None:
    """The default buckets in force, and every key's or address's own, as JSON."""

    async def work(settings: IngestSettings, redis: Any) -> dict:
        store = _store(settings, redis)
        names = {r.id: r.name for r in await KeyStore(redis, settings.redis_prefix).list()}
        own = {}
        for ident, limit in (await store.own_all()).items():
            kind, _, subject = ident.partition(":")
            label = f"key:{names.get(subject, subject)}" if kind == "key" else ident
            own[label] = limit.model_dump()
        return {"defaults": (await store.get()).model_dump(), "own": own}

    print(orjson.dumps(_with_redis(work), option=orjson.OPT_INDENT_2).decode())


@limits_app.command("set")
def limits_set(
    rate: Annotated[float | None, typer.Option(help="requests a second")] = None,
    burst: Annotated[int | None, typer.Option(help="the bucket's size (requests at once)")] = None,
    kind: Annotated[str, typer.Option(help="key or ip: whose buckets")] = "key",
    name: Annotated[
        str | None, typer.Option(help="one API key's own limit (with --kind key)")
    ] = None,
    ip: Annotated[str | None, typer.Option(help="one address's own limit (with --kind ip)")] = None,
    clear: Annotated[bool, typer.Option(help="remove that key's or address's own limit")] = False,
) -> None:
    """Change a bucket; every ingest instance applies it from its next request."""
    if kind not in KINDS:
        raise typer.BadParameter("--kind is key or ip")
    if clear and name is None and ip is None:
        raise typer.BadParameter("--clear needs --name or --ip")
    if not clear and (rate is None or burst is None):
        raise typer.BadParameter("--rate and --burst are needed")
    try:
        limit = None if clear else Limit(rate=rate, burst=burst)
    except ValueError as exc:
        raise typer.BadParameter(str(exc).splitlines()[-1]) from exc

    async def work(settings: IngestSettings, redis: Any) -> str:
        store = _store(settings, redis)
        if name is not None:
            ident = await _key_id(settings, redis, name)
            await store.set_own("key", ident, limit)
            return f"key {name}"
        if ip is not None:
            await store.set_own("ip", ip, limit)
            return f"address {ip}"
        assert limit is not None  # refused above
        await store.set(kind, limit)
        return f"every {kind}"

    try:
        who = _with_redis(work)
    except KeyStoreError as exc:
        err.print(f"[red]{exc}[/]")
        raise typer.Exit(1) from exc
    console.print(f"{who}: " + ("own limit removed" if clear else f"{rate}/s, burst {burst}"))
