"""The `ticketflow` command line (docs/architecture.md, "Command line")."""

from __future__ import annotations

import contextlib
import json
import logging
import sys
import urllib.error
import urllib.request
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import orjson
import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from benchmarks.cli import bench_app
from evaluation import after_sales as eval_after_sales
from evaluation import crossfit as eval_crossfit
from evaluation import decisions as eval_decisions
from evaluation import models as eval_models
from feature_jobs import cli as features_cli
from inference_gateway import cli as gateway_cli
from ingest import cli as ingest_cli
from streams.kafka_config import confluent_config
from streams.settings import Settings, get_settings
from streams.topics import Topics
from ticketflow import model_cli, review_cli

if TYPE_CHECKING:
    from ticketflow.replay import Report

app = typer.Typer(
    help="ticketflow: classify and route support tickets on Kafka.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)
stack_app = typer.Typer(help="The local Kafka, Redis and Triton.", no_args_is_help=True)
dlq_app = typer.Typer(help="Inspect and replay the dead-letter topic.", no_args_is_help=True)
config_app = typer.Typer(help="Validate and inspect configuration.", no_args_is_help=True)
app.add_typer(stack_app, name="stack")
app.add_typer(dlq_app, name="dlq")
app.add_typer(config_app, name="config")
console = Console()


def _settings() -> Settings:
    return get_settings()


# ---- stack ----------------------------------------------------------------------------------


SecureOpt = Annotated[
    bool,
    typer.Option(
        "--secure",
        help="the SASL_SSL broker (SCRAM-SHA-512, TLS, ACLs) on :9094 instead of the plain "
        "one; docs/security.md",
    ),
]


@stack_app.command("up")
def stack_up(
    secure: SecureOpt = False,
    no_prometheus: Annotated[
        bool, typer.Option("--no-prometheus", help="leave Prometheus (:9090) out")
    ] = False,
) -> None:
    """Start Kafka, Redis, Triton and Prometheus (those not already running); wait until healthy."""
    import devstack as stack

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    parts = stack.SECURE_PARTS if secure else stack.PARTS
    try:
        stack.up(_settings(), [p for p in parts if not (no_prometheus and p == "prometheus")])
    except stack.StackError as exc:
        console.print(f"[red]stack up failed:[/] {exc}")
        raise typer.Exit(1) from exc
    if secure:
        from devstack import kafka_secure

        where = kafka_secure.secrets_dir(_settings())
        console.print(
            f"secured Kafka: credentials in {where} (values not shown); a client as the worker "
            f"principal: [bold]set -a; . {where}/worker.env; set +a[/]"
        )
        from devstack import redis_secure

        console.print(
            f"secured Redis: rediss:// on :{redis_secure.port()}, credentials in "
            f"{redis_secure.secrets_dir(_settings())} (values not shown; one <user>.env each)"
        )
    try:
        stack_status(secure)
    except typer.Exit:
        if not no_prometheus:  # up() succeeded: only the part left out can be down
            raise


@stack_app.command("down")
def stack_down(secure: SecureOpt = False) -> None:
    """Stop what `stack up` started (with --secure: the secured broker and Redis alone)."""
    import devstack as stack
    from devstack import app_processes

    if not secure:  # the demo's detached gateway, feature job and worker first
        app_processes.stop_detached(_settings())
    stack.down(_settings(), ["kafka-secure", "redis-secure"] if secure else None)


@stack_app.command("status")
def stack_status(secure: SecureOpt = False) -> None:
    """Health of each part of the local stack, and of the demo's detached services."""
    import devstack as stack
    from devstack import app_processes

    # narrow columns, long ones cut with an ellipsis: readable in 80 columns
    table = Table("part", "health", "pid", "ports")
    table.add_column("log / note", no_wrap=True, overflow="ellipsis", max_width=44)
    healthy = True
    for part in stack.status(_settings(), secure=secure):
        healthy &= part.healthy
        table.add_row(*_status_row(part))
    for part in [] if secure else app_processes.detached_status(_settings()):
        table.add_row(*_status_row(part))
    console.print(table)
    if not healthy:
        raise typer.Exit(1)


def _status_row(part) -> tuple[str, ...]:
    pid = "-" if part.pid is None else str(part.pid) + ("" if part.ours else " (not ours)")
    note = part.detail or (_relative(part.log) if part.log is not None and part.ours else "")
    health = "[green]up[/]" if part.healthy else "[red]down[/]"
    return part.name, health, pid, ",".join(map(str, part.ports)), note


def _relative(path: Path) -> str:
    with contextlib.suppress(ValueError):
        return str(Path(path).resolve().relative_to(Path.cwd()))
    return str(path)


# ---- services -------------------------------------------------------------------------------


@app.command()
def worker(
    loglevel: str = "warning",
    # None when not given: TICKETFLOW_WORKER_STEPS then decides (empty: every step)
    steps: Annotated[
        str | None,
        typer.Option(
            help="comma-separated steps to run, e.g. infer,features: a pool of its own, or "
            "the home worker when they include the state-keeping steps "
            "(default: TICKETFLOW_WORKER_STEPS; empty: every step)"
        ),
    ] = None,
    processes: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="worker processes in one consumer group, each exactly-once, supervised by "
            "this one (default: the cores available)",
        ),
    ] = None,
) -> None:
    """Run a workflow worker (one Faust agent per step; `--steps` for some of them)."""
    from agents.step_selection import StepSetError
    from agents.supervisor import cores_available
    from agents.worker import run_worker, worker_steps

    settings = _settings()
    if steps is not None:
        settings = settings.model_copy(update={"worker_steps": steps})
    try:  # refused before anything starts
        worker_steps(settings)
    except StepSetError as exc:
        console.print(f"[red]worker refused:[/] {escape(str(exc))}")
        raise typer.Exit(2) from exc
    processes = processes or cores_available()
    if processes > 1:
        raise typer.Exit(_supervise(settings, processes, loglevel, steps))
    sys.argv = [sys.argv[0], "worker"]  # Faust's worker parses argv
    run_worker(settings, loglevel=loglevel)


def _supervise(settings: Settings, processes: int, loglevel: str, steps: str | None) -> int:
    """`processes` children of `worker --processes 1`, until SIGTERM (agents/supervisor.py)."""
    from agents.supervisor import Supervisor, child_port, worker_children

    argv = [sys.executable, "-m", "ticketflow.cli", "worker", "--processes", "1"]
    argv += ["--loglevel", loglevel, *(["--steps", steps] if steps is not None else [])]
    base = settings.worker_web_port
    children = worker_children(processes, argv, base, settings.worker_id)
    ports = ", ".join(str(child_port(base, c.index)) for c in children)
    console.print(f"worker: {processes} processes, web ports {ports}", highlight=False)
    with _scraped(settings, [child_port(base, c.index) for c in children[1:]]):
        return Supervisor(children).run()


@contextlib.contextmanager
def _scraped(settings: Settings, ports: list[int]):
    """The local Prometheus scrapes the stack's worker's other children too (its static
    target is the default port, child 0's); a test's or bench's worker is left alone."""
    from devstack import prometheus

    default = Settings.model_fields["worker_web_port"].default
    if settings.worker_web_port != default or settings.topic_prefix:
        yield
        return
    paths = [
        prometheus.register_target(settings, "worker", f"127.0.0.1:{p}", f"worker-p{p}")
        for p in ports
    ]
    try:
        yield
    finally:
        for path in paths:
            prometheus.unregister_target(path)


@app.command()
def gateway(
    # None when not given: the gateway's config then reads TICKETFLOW_GATEWAY_* (a default
    # written here would override the environment without a word)
    max_batch_size: Annotated[
        int | None,
        typer.Option(
            help="largest batch sent to Triton (default: TICKETFLOW_GATEWAY_MAX_BATCH_SIZE)"
        ),
    ] = None,
    max_queue_delay_us: Annotated[
        int | None,
        typer.Option(
            help="longest wait to fill a batch (default: TICKETFLOW_GATEWAY_MAX_QUEUE_DELAY_US)"
        ),
    ] = None,
) -> None:
    """Run the batching inference gateway in front of Triton (defaults: 32, 2000 µs)."""
    from inference_gateway.server import run

    s = _settings()
    host, port = s.gateway_host_port
    run(
        host=host,
        port=port,
        triton_url=s.triton_grpc,
        max_batch_size=max_batch_size,
        max_queue_delay_us=max_queue_delay_us,
    )


# ---- producing and consuming ----------------------------------------------------------------


@app.command()
def produce(file: Annotated[str, typer.Argument(help="JSON lines file, or - for stdin")]) -> None:
    """Publish tickets (one JSON object a line) to tickets.in, keyed by ticket_id."""
    from ticketflow.kafka_io import produce_all

    s = _settings()

    def records():
        with contextlib.ExitStack() as stack:
            lines = sys.stdin.buffer if file == "-" else stack.enter_context(Path(file).open("rb"))
            yield from _keyed(lines)

    def _keyed(lines):
        for line in lines:
            line = line.strip()
            if not line:
                continue
            try:
                key = str(orjson.loads(line).get("ticket_id", "")).encode() or None
            except (orjson.JSONDecodeError, AttributeError):
                key = None  # still published: validate dead-letters it with its class
            yield key, line

    n = produce_all(confluent_config(s), Topics(s.topic_prefix).tickets_in, records())
    console.print(f"published {n} record(s) to {Topics(s.topic_prefix).tickets_in}")


@app.command()
def consume(
    route: Annotated[str, typer.Argument(help="auto_classify, manual_review or after_sales")],
    follow: Annotated[bool, typer.Option("--follow", "-f", help="keep waiting")] = False,
) -> None:
    """Print the TicketResults of a route topic as JSON lines (read_committed)."""
    from ticketflow import kafka_io

    s = _settings()
    topic = Topics(s.topic_prefix).out(route)
    records = kafka_io.follow(confluent_config(s), [topic], idle_s=None if follow else 2.0)
    for rec in records:
        sys.stdout.write((rec.value or b"").decode("utf-8", "replace") + "\n")
        sys.stdout.flush()


@app.command()
def status(ticket_id: str) -> None:
    """Where a ticket is: its state from the workers' table."""
    try:
        state = _ticket_state(ticket_id)
    except urllib.error.HTTPError as exc:
        console.print(f"[red]{exc.read().decode() or exc}[/]")
        raise typer.Exit(1) from exc
    except OSError as exc:
        console.print(f"[red]no worker answers on {_ticket_url(ticket_id)}: {exc}[/]")
        raise typer.Exit(2) from exc
    if state is None:
        console.print(f"[red]unknown ticket {escape(repr(ticket_id))}[/]")
        raise typer.Exit(1)
    console.print(escape(_status_line(state)), highlight=False)
    console.print_json(orjson.dumps(state).decode())


def _status_line(state: dict) -> str:
    """One line first: the workflow and version the ticket runs on, and where it is."""
    where = state.get("status", "?")
    if state.get("route"):
        where += f", route {state['route']}"
    if state.get("spot_check"):
        where += f", spot check {state['spot_check']}"
    workflow = f"{state.get('workflow', '?')} v{state.get('workflow_version', '?')}"
    return f"{state.get('ticket_id', '?')}: workflow {workflow}, {where}"


def _ticket_url(ticket_id: str) -> str:
    return f"http://127.0.0.1:{_settings().worker_web_port}/ticket/{ticket_id}"


def _ticket_state(ticket_id: str) -> dict | None:
    """The ticket's state from the worker that owns it; None for an unknown ticket."""
    try:
        with urllib.request.urlopen(_ticket_url(ticket_id), timeout=5) as resp:
            return orjson.loads(resp.read())
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return None
        raise


# ---- dead letters ---------------------------------------------------------------------------


def _dead_letters(error_class: str | None, step: str | None, since: datetime | None):
    from ticketflow import kafka_io

    s = _settings()
    for rec in kafka_io.read_topic(confluent_config(s), Topics(s.topic_prefix).dlq):
        h = rec.headers
        if error_class and h.get("x-dlq-error-class") != error_class:
            continue
        if step and h.get("x-dlq-step") != step:
            continue
        if since and rec.timestamp_ms < since.timestamp() * 1000:
            continue
        yield rec


@dlq_app.command("ls")
def dlq_ls(
    error_class: Annotated[str | None, typer.Option("--error-class")] = None,
    step: Annotated[str | None, typer.Option("--step")] = None,
    since: Annotated[datetime | None, typer.Option("--since")] = None,
) -> None:
    """List dead letters with their class, step and reason."""
    _print_dead_letters([_dlq_row(rec) for rec in _dead_letters(error_class, step, since)])


def _printable(text: str) -> str:
    # keys and reasons come from producers: no control characters reach the terminal
    return "".join(c if c.isprintable() else "?" for c in text)


def _dlq_row(rec) -> tuple[str, ...]:
    h = rec.headers
    return (
        f"{rec.partition}:{rec.offset}",
        h.get("x-dlq-error-class", ""),
        h.get("x-dlq-step", ""),
        f"{len(rec.value or b'')} B",
        _printable((rec.key or b"").decode("utf-8", "replace")),
        _printable((h.get("x-dlq-reason", "").splitlines() or [""])[0]),
    )


def _print_dead_letters(rows: list[tuple[str, ...]]) -> None:
    """Two lines a dead letter, columns aligned, long ones cut with an ellipsis: a table of
    six columns collapsed into empty ones in an 80-column terminal."""
    from rich.text import Text

    header = ("at", "class", "step", "size", "key", "reason")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(4)]
    for i, row in enumerate([header, *rows]):
        style = "bold" if i == 0 else ""
        line = "  ".join(v.ljust(w) for v, w in zip(row[:4], widths, strict=True)) + "  " + row[4]
        console.print(Text(line, style=style), no_wrap=True, overflow="ellipsis")
        reason = Text("    " + row[5], style=style or "dim")
        console.print(reason, no_wrap=True, overflow="ellipsis")
    console.print(f"{len(rows)} dead letter(s); the whole record: ticketflow dlq show AT")


@dlq_app.command("show")
def dlq_show(
    position: Annotated[str, typer.Argument(help="PARTITION:OFFSET from `dlq ls`")],
) -> None:
    """Show one dead letter: its headers and its original bytes."""
    partition, _, offset = position.partition(":")
    for rec in _dead_letters(None, None, None):
        if rec.partition == int(partition) and rec.offset == int(offset):
            console.print_json(json.dumps(rec.headers))
            console.print(repr(rec.value), markup=False, highlight=False)
            return
    console.print(f"[red]no dead letter at {position}[/]")
    raise typer.Exit(1)


@dlq_app.command("replay")
def dlq_replay(
    error_class: Annotated[str | None, typer.Option("--error-class")] = None,
    step: Annotated[str | None, typer.Option("--step")] = None,
    since: Annotated[datetime | None, typer.Option("--since")] = None,
    until: Annotated[datetime | None, typer.Option("--until")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="only show what would go")] = False,
    rate: Annotated[float, typer.Option(help="records per second at most")] = 500.0,
    from_beginning: Annotated[bool, typer.Option(help="also what was replayed before")] = False,
) -> None:
    """Replay dead letters to the step that failed (or tickets.in), once each.

    A dead letter that nothing would consume is refused and listed with its reason; one
    whose x-replay-count is spent or forged goes to tickets.dlq.parked.
    """
    from agents.definition import DefinitionError
    from ticketflow.replay import Filters, replay

    try:
        report = replay(
            _settings(),
            Filters(error_class, step, since, until),
            dry_run=dry_run,
            rate=rate,
            from_beginning=from_beginning,
        )
    except DefinitionError as exc:
        console.print(f"[red]cannot tell where dead letters go back to:[/] {exc}")
        raise typer.Exit(1) from exc
    _print_replay(report)
    if report.count("not delivered"):
        raise typer.Exit(1)


def _print_replay(report: Report) -> None:
    from rich.markup import escape

    table = Table("at", "key")
    table.add_column("outcome", no_wrap=True)
    table.add_column("to", overflow="fold")
    table.add_column("reason", overflow="fold")
    # the refused and undelivered first: they are what the operator has to look at
    first = sorted(report.items, key=lambda i: i.outcome not in {"refused", "not delivered"})
    for item in first[:50]:
        table.add_row(
            f"{item.partition}:{item.offset}",
            escape((item.key or b"").decode("utf-8", "replace")),
            item.outcome,
            item.decision.topic or "",
            escape(item.decision.reason),
        )
    if report.items:
        console.print(table)
    outcomes = sorted({i.outcome for i in report.items})
    summary = ", ".join(f"{report.count(o)} {o}" for o in outcomes) or "nothing to replay"
    console.print(f"{summary}; {report.skipped} not matching the filters")
    for outcome in ("refused", "parked", "would park", "not delivered"):
        for reason, n in sorted(report.reasons(outcome).items()):
            console.print(f"  {outcome} {n}: {escape(reason)}")
    if report.already:
        console.print(f"{report.already} replayed by an earlier run, skipped")
    if report.deferred:
        console.print(f"[yellow]{report.deferred} left for the next run[/] (behind a hole)")
    if report.unread:
        console.print(f"[yellow]partitions not read to their end:[/] {report.unread}")


# ---- review (ticketflow/review_cli.py) -------------------------------------------------------

app.add_typer(review_cli.review_app, name="review")


# ---- config ---------------------------------------------------------------------------------


@config_app.command("validate")
def config_validate(file: Path) -> None:
    """Validate a workflow definition or selector (YAML), or a routing config (JSON).

    A selector is checked with every definition of its folder, as a worker loads them.
    """
    if file.suffix in {".yaml", ".yml"}:
        from agents.definition import SELECTOR_FILE, DefinitionError, load_definition

        try:
            if file.name == SELECTOR_FILE:
                _validate_selector(file)
                return
            d = load_definition(file)
        except DefinitionError as exc:
            console.print(f"[red]{escape(str(exc))}[/]")
            raise typer.Exit(1) from exc
        console.print(f"[green]ok[/]: workflow {d.name} v{d.version}, {len(d.steps)} steps")
        return
    gateway_cli.config_validate(file)


def _validate_selector(file: Path) -> None:
    from agents.definition import load_workflows

    workflows = load_workflows(_settings().workflow_file, file)
    selector = workflows.selector
    assert selector is not None  # a selector file was given
    loaded = ", ".join(f"{d.name} v{d.version}" for d in workflows.definitions)
    console.print(
        f"[green]ok[/]: selector, {len(selector.rules)} rule(s), default {selector.default}; "
        f"workflows loaded: {escape(loaded)}"
    )


# routing configs: the gateway's own commands (inference_gateway/cli.py)
config_app.command("set")(gateway_cli.config_set)
config_app.command("get")(gateway_cli.config_get)
config_app.command("route-test")(gateway_cli.config_route_test)

# feature views, their job and drift checks (feature_jobs/cli.py)
app.add_typer(features_cli.features_app, name="features")

app.add_typer(bench_app, name="bench")  # benchmarks/cli.py

# the HTTP access layer: the service, its API keys and its rate limits (ingest/cli.py)
app.command("ingest")(ingest_cli.ingest)
app.add_typer(ingest_cli.keys_app, name="keys")
app.add_typer(ingest_cli.limits_app, name="limits")
app.add_typer(model_cli.model_app, name="model")  # ticketflow/model_cli.py
app.add_typer(eval_after_sales.app, name="eval")  # offline evaluations (evaluation/after_sales.py)
eval_after_sales.app.command("models")(eval_models.models)  # evaluation/models.py
eval_after_sales.app.command("decisions")(eval_decisions.decisions)  # evaluation/decisions.py
eval_after_sales.app.command("crossfit")(eval_crossfit.crossfit)  # evaluation/crossfit.py


@app.command()
def chaos(
    rounds: Annotated[int, typer.Option(min=1, help="rounds, each on fresh topics")] = 5,
    workers: Annotated[int, typer.Option(min=2, help="workers in each round")] = 2,
    rate: Annotated[float, typer.Option(min=1, help="valid tickets a second")] = 100.0,
    round_s: Annotated[float, typer.Option(min=10, help="publishing time of a round")] = 60.0,
    seed: Annotated[int | None, typer.Option(help="the schedule's seed (random if unset)")] = None,
    out: Annotated[Path | None, typer.Option(help="JSON and PNG (<state dir>/chaos)")] = None,
    faults: Annotated[str, typer.Option(help="comma list to draw from (default all)")] = "",
    drain_s: Annotated[float, typer.Option(help="most a round waits for its results")] = 120.0,
    hostile: Annotated[str, typer.Option(help="hostile record kinds (default all; none)")] = "",
) -> None:
    """Fault campaign: kill and freeze workers, broker, Triton, Redis, gateway; check that
    every ticket has exactly one result. Exits 1 when a round is not exact (docs/chaos.md)."""
    import random

    from chaos.campaign import main
    from chaos.plan import Options, parse_faults, parse_hostile

    try:
        kinds, bad = parse_faults(faults), parse_hostile(hostile)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    s = _settings()
    seed = random.randrange(10**6) if seed is None else seed
    options = Options(rounds, workers, rate, round_s, seed, kinds, bad, drain_s=drain_s)
    raise typer.Exit(main(s, options, out or s.state_dir / "chaos"))


@app.command("schemas")
def export_schemas(out: Path = Path("schemas/json")) -> None:
    """Export the JSON Schema of every record and API body."""
    from schemas.export import export

    for path in export(out):
        console.print(str(path))


@app.command()
def demo(count: Annotated[int, typer.Option(help="tickets to publish")] = 300) -> None:
    """Start what is not running, publish sample tickets, and show where they went."""
    from ticketflow.demo import run_demo

    run_demo(_settings(), count)


app.command("trace")(__import__("ticketflow.trace", fromlist=["command"]).command)


if __name__ == "__main__":
    app()
