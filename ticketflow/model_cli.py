"""`ticketflow model build|deploy|promote|rollback|retire|ls`: a model version rolled out live.

The logic is training.builds (training) and inference_gateway.model.rollout (repository,
Triton, routing); this module reads the settings (TICKETFLOW_KAFKA_BOOTSTRAP, _TOPIC_PREFIX,
_TRITON_GRPC, _STATE_DIR), names the topics and prints. Builds are staged in
<state dir>/model-builds/<time>-<type>/; `deploy` takes the latest unless given one.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from inference_gateway.errors import GatewayError
from inference_gateway.model import rollout
from inference_gateway.model.repository import BUILD_FILE, MODEL_DIR
from streams.settings import Settings, get_settings
from streams.topics import Topics
from training import builds

model_app = typer.Typer(
    help="Build a model version and roll it out without a restart.", no_args_is_help=True
)
console = Console()
err = Console(stderr=True)

Repository = Annotated[
    Path | None,
    typer.Option(help="the model repository Triton serves (default: the package's)"),
]


def _target(repository: Path | None) -> rollout.Target:
    s = get_settings()
    repo = repository or MODEL_DIR.parent
    return rollout.Target(repo, s.triton_grpc, s.kafka_bootstrap, s.topic_prefix)


def builds_dir(settings: Settings) -> Path:
    return settings.state_dir / "model-builds"


def latest_build(settings: Settings) -> Path | None:
    found = [p for p in builds_dir(settings).glob("*") if (p / BUILD_FILE).exists()]
    return max(found, key=lambda p: p.stat().st_mtime, default=None)


def _fail(message: str) -> None:
    err.print(f"[red]{escape(message)}[/]", highlight=False)
    raise typer.Exit(1)


# what a rollout step refuses with; a malformed vN is a GatewayError (INVALID_INPUT)
Refused = (rollout.RolloutError, GatewayError)


def _why(error: Exception) -> str:
    return error.message if isinstance(error, GatewayError) else str(error)


@model_app.command("build")
def build(
    kind: Annotated[str, typer.Option("--type", help="v1, v2 or v2-int8")] = "v1",
    feedback: Annotated[
        bool, typer.Option(help="learn from reviewers' decisions on tickets.out.reviewed")
    ] = True,
    feedback_weight: Annotated[
        int, typer.Option(min=1, help="times each reviewed ticket counts")
    ] = builds.DEFAULT_FEEDBACK_WEIGHT,
    out: Annotated[Path | None, typer.Option(help="staging folder (default: a new one)")] = None,
) -> None:
    """Train a new version from the corpus plus reviewers' decisions, into a staging folder."""
    from training import feedback as reviews

    s = get_settings()
    if kind not in builds.TYPES:
        _fail(f"--type must be one of {', '.join(builds.TYPES)}")
    examples: list[reviews.Example] = []
    if feedback:
        topics = Topics(s.topic_prefix)
        try:
            examples = reviews.read_reviewed(
                s.kafka_bootstrap, topics.out("reviewed"), topics.tickets_in
            )
        except Exception as error:
            _fail(f"could not read the reviewers' decisions: {error}")
        console.print(f"{len(examples)} reviewed ticket(s) from {topics.out('reviewed')}")
    out = out or builds_dir(s) / f"{time.strftime('%Y%m%d-%H%M%S')}-{kind}"
    try:
        record = builds.build(kind, out, examples, feedback_weight)
    except (ValueError, FileExistsError) as error:
        _fail(str(error))
    console.print(
        f"[green]built[/] {kind} in {record['build_seconds']} s: held-out accuracy "
        f"{record['accuracy']:.4f}, hand-written {record['handwritten_accuracy']:.3f}"
    )
    console.print(f"staged in {out}; next: ticketflow model deploy")


@model_app.command("deploy")
def deploy(
    staging: Annotated[
        Path | None, typer.Argument(help="a staged build (default: the latest)")
    ] = None,
    canary: Annotated[int, typer.Option(min=0, max=100, help="% of traffic to it")] = 10,
    repository: Repository = None,
) -> None:
    """Add the build as a new version, load it into the running Triton, publish a canary."""
    staging = staging or latest_build(get_settings())
    if staging is None:
        _fail("no staged build: run `ticketflow model build` first")
    target = _target(repository)
    try:
        done = rollout.deploy(target, staging, canary)
    except rollout.RolloutError as error:
        _fail(str(error))
    console.print(f"[green]deployed[/] v{done.version}; Triton serves {done.loaded}")
    console.print(f"published to {target.topic}: {done.routing.model_dump_json()}")


@model_app.command("promote")
def promote(
    version: Annotated[str | None, typer.Argument(help="vN (default: the newest routed)")] = None,
    repository: Repository = None,
) -> None:
    """Move all traffic to the version; the config it replaces goes onto the history."""
    target = _target(repository)
    try:
        config = rollout.promote(target, version)
    except Refused as error:
        _fail(_why(error))
    console.print(f"[green]promoted[/]: {config.model_dump_json()}")


@model_app.command("rollback")
def rollback(
    steps: Annotated[int, typer.Option(min=1, help="how many changes to undo")] = 1,
    repository: Repository = None,
) -> None:
    """Publish the previous routing config again (from config.routing.history)."""
    target = _target(repository)
    try:
        config = rollout.rollback(target, steps)
    except rollout.RolloutError as error:
        _fail(str(error))
    console.print(f"[green]rolled back[/]: {config.model_dump_json()}")


@model_app.command("retire")
def retire(
    version: Annotated[str, typer.Argument(help="vN, a built version taking no traffic")],
    keep_files: Annotated[bool, typer.Option(help="unload only, keep its folder")] = False,
    repository: Repository = None,
) -> None:
    """Unload a version no config routes to and remove its folder."""
    target = _target(repository)
    try:
        number = int(rollout.triton_version(version))
        remaining = rollout.retire(target, number, keep_files=keep_files)
    except Refused as error:
        _fail(_why(error))
    console.print(f"[green]retired[/] {version}; Triton serves {remaining}")


@model_app.command("ls")
def ls(
    repository: Repository = None,
    as_json: Annotated[bool, typer.Option("--json", help="JSON lines instead of a table")] = False,
) -> None:
    """Versions on disk, their state in Triton and their share of the traffic."""
    target = _target(repository)
    try:
        rows = rollout.listing(target)
    except Exception as error:
        _fail(f"could not list {target.model}: {error}")
    if as_json:
        for row in rows:
            print(json.dumps(row.__dict__))
        return
    table = Table("version", "type", "on disk", "in Triton", "traffic", "held-out acc.")
    for r in rows:
        acc = f"{r.accuracy:.4f}" if r.accuracy is not None else "-"
        table.add_row(f"v{r.version}", r.kind, "yes" if r.on_disk else "no", r.state,
                      f"{r.share} %", acc)  # fmt: skip
    console.print(table)
