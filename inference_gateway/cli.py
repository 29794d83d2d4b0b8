"""Command-line pieces of the inference layer, mounted by `ticketflow.cli`:

    config_app       `ticketflow config get|set|validate|route-test`: the routing config on the
                     compacted topic TICKETFLOW_TOPIC_PREFIX + "config.routing"

`config validate` here handles routing configs (JSON); `ticketflow.cli` keeps the workflow
definitions (YAML) and hands JSON files to `validate_routing_file`.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from inference_gateway.config import DEFAULT_KAFKA_BOOTSTRAP
from inference_gateway.routing import DEFAULT_CONFIG, bucket_of, pick_version
from inference_gateway.routing_store import (
    RoutingFileError,
    parse_routing,
    publish,
    read_configs,
    validate_routing_file,
)
from inference_gateway.routing_watch import routing_topic
from schemas.routing import RoutingConfig

config_app = typer.Typer(
    help="The canary routing config on config.routing (and config validation).",
    no_args_is_help=True,
)
console = Console()
err = Console(stderr=True)

Bootstrap = Annotated[
    str | None,
    typer.Option(help="Kafka bootstrap servers (default: TICKETFLOW_KAFKA_BOOTSTRAP)"),
]
Prefix = Annotated[str | None, typer.Option(help="topic prefix (default: TICKETFLOW_TOPIC_PREFIX)")]


def _bootstrap(value: str | None) -> str:
    return value or os.environ.get("TICKETFLOW_KAFKA_BOOTSTRAP", DEFAULT_KAFKA_BOOTSTRAP)


def _topic(prefix: str | None) -> str:
    return routing_topic(
        os.environ.get("TICKETFLOW_TOPIC_PREFIX", "") if prefix is None else prefix
    )


def _fail(message: str, code: int = 1) -> None:
    err.print(f"[red]{message}[/]", highlight=False)
    raise typer.Exit(code)


@config_app.command("validate")
def config_validate(
    file: Annotated[Path, typer.Argument(help="a routing config (JSON)")],
) -> None:
    """Check a routing config: weights are integers 0-100 summing to 100, default among them."""
    if file.suffix in {".yaml", ".yml"}:
        _fail(f"{file}: a workflow definition; this command checks routing configs (JSON)", 2)
    try:
        config = validate_routing_file(file)
    except RoutingFileError as error:
        _fail(f"{file}: invalid routing config\n{error}")
    console.print(f"[green]ok[/]: routing {config.name} {config.versions} default {config.default}")


@config_app.command("set")
def config_set(
    file: Annotated[Path, typer.Argument(help="a routing config (JSON), or - for stdin")],
    bootstrap: Bootstrap = None,
    prefix: Prefix = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="validate only")] = False,
) -> None:
    """Validate a routing config, then publish it; every gateway follows it within a second."""
    try:
        if str(file) == "-":
            config = parse_routing(sys.stdin.buffer.read())
        else:
            config = validate_routing_file(file)
    except RoutingFileError as error:
        _fail(f"{file}: invalid routing config, not published\n{error}")
    topic = _topic(prefix)
    if dry_run:
        console.print(f"[green]valid[/] (dry run): would publish {config.model_dump_json()}")
        return
    try:
        previous = read_configs(_bootstrap(bootstrap), topic).get(config.name)
        publish(config, _bootstrap(bootstrap), topic)
    except Exception as error:
        _fail(f"could not publish to {topic}: {error}")
    console.print(f"[green]published[/] to {topic}: {config.model_dump_json()}")
    if isinstance(previous, RoutingConfig):
        console.print(f"previous (to roll back, publish it again): {previous.model_dump_json()}")


@config_app.command("get")
def config_get(
    name: Annotated[str | None, typer.Argument(help="config name (default: all)")] = None,
    bootstrap: Bootstrap = None,
    prefix: Prefix = None,
) -> None:
    """Print the routing configs in force (the latest record per name on config.routing)."""
    topic = _topic(prefix)
    try:
        configs = read_configs(_bootstrap(bootstrap), topic)
    except Exception as error:
        _fail(f"could not read {topic}: {error}")
    if DEFAULT_CONFIG.name not in configs:
        configs[DEFAULT_CONFIG.name] = DEFAULT_CONFIG  # what the gateways use when none is set
    if name is not None:
        if name not in configs:
            _fail(f"no routing config named {name!r} on {topic}")
        configs = {name: configs[name]}
    out = {}
    for key, value in configs.items():
        if isinstance(value, RoutingConfig):
            out[key] = value.model_dump()
        else:
            out[key] = {"invalid": value, "note": "ignored by the gateways"}
    console.print_json(json.dumps(out if name is None else out[name]))


@config_app.command("route-test")
def config_route_test(
    ids: Annotated[list[str], typer.Argument(help="input (ticket) ids")],
    name: Annotated[str, typer.Option(help="model / config name")] = DEFAULT_CONFIG.name,
    file: Annotated[
        Path | None, typer.Option(help="use this config file instead of the published one")
    ] = None,
    bootstrap: Bootstrap = None,
    prefix: Prefix = None,
) -> None:
    """Which version each id goes to (sticky: crc32(id) % 100 against the weights)."""
    if file is not None:
        try:
            config = validate_routing_file(file)
        except RoutingFileError as error:
            _fail(f"{file}: invalid routing config\n{error}")
        source = str(file)
    else:
        topic = _topic(prefix)
        try:
            found = read_configs(_bootstrap(bootstrap), topic).get(name)
        except Exception as error:
            _fail(f"could not read {topic}: {error}")
        if isinstance(found, RoutingConfig):
            config, source = found, topic
        elif name == DEFAULT_CONFIG.name:
            config, source = DEFAULT_CONFIG, "the default (nothing valid published)"
        else:
            _fail(f"no routing config named {name!r} on {topic}")
    # the config on a line of its own: as the table's title it wrapped to the narrow table
    console.print(f"{config.name} {config.versions} ({source})", markup=False, highlight=False)
    table = Table("id", "bucket", "version")
    table.columns[0].overflow = "fold"  # an id is shown whole, however long
    for input_id in ids:
        table.add_row(Text(input_id), str(bucket_of(input_id)), pick_version(config, input_id))
    console.print(table)
