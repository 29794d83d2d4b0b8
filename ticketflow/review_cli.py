"""`ticketflow review`: decide tickets, list pending spot checks, reviewers' agreement.

Registered by ticketflow/cli.py. Every command reads Kafka or a worker's web view, so it
works from any machine that reaches them.
"""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from schemas.review import ReviewOutcome, SpotCheck
from streams.kafka_config import confluent_config
from streams.settings import Settings, get_settings
from streams.topics import Topics
from ticketflow import kafka_io
from ticketflow.review_stats import Stats, agreement, latest_per_ticket
from ticketflow.worker_api import ticket_state

review_app = typer.Typer(
    help="Human review: tickets in manual_review, and spot checks of automatic decisions.",
    no_args_is_help=True,
)
console = Console()
IdleOpt = Annotated[
    float, typer.Option("--idle", help="seconds without a new record that end the reading")
]


@review_app.command("decide")
def review_decide(
    ticket_id: str,
    category: Annotated[str, typer.Option("--category", "-c", help="the reviewer's category")],
    note: Annotated[str | None, typer.Option("--note")] = None,
    reviewer: Annotated[str, typer.Option("--reviewer")] = "cli",
) -> None:
    """Decide a ticket in review, or a spot check (which makes no second result).

    A ticket awaiting review completes with this category on tickets.out.reviewed; a spot
    check is recorded as agreement or not with the model, and the ticket keeps its result.
    """
    from agents.review import ReviewRefused, check_decidable
    from schemas.tickets import ReviewDecision
    from streams.producer import BASE_CONFIG

    s = get_settings()
    try:
        decision = ReviewDecision(
            ticket_id=ticket_id, category=category, note=note, reviewer=reviewer
        )
        kind = check_decidable(ticket_id, ticket_state(s, ticket_id))
    except (ValueError, ReviewRefused) as exc:
        console.print(f"[red]refused:[/] {escape(str(exc))}")
        raise typer.Exit(1) from exc
    from confluent_kafka import Producer

    producer = Producer(confluent_config(s, BASE_CONFIG))
    producer.produce(
        Topics(s.topic_prefix).review_decisions,
        key=ticket_id.encode(),
        value=decision.model_dump_json().encode(),
    )
    if producer.flush(10):
        console.print("[red]the decision was not delivered[/]")
        raise typer.Exit(1)
    what = "spot check of " if kind == "spot_check" else ""
    console.print(f"decided {what}{escape(ticket_id)}: {decision.category.value}")


@review_app.command("stats")
def review_stats(
    as_json: Annotated[bool, typer.Option("--json", help="JSON lines instead of a table")] = False,
    idle: IdleOpt = 2.0,
) -> None:
    """Reviewers' agreement with the model, per model version.

    Spot checks and manual reviews apart and together: the human-measured quality of each
    version, read from tickets.review.outcomes.
    """
    s = get_settings()
    stats = agreement(_outcomes(s, idle))
    if as_json:
        for row in stats.rows:
            kind = row.kind or "all"
            line = {"model_version": row.model_version, "kind": kind, "decisions": row.decisions}
            line |= {"agreed": row.agreed, "agreement": round(row.rate, 4)}
            typer.echo(json.dumps(line))
        return
    _print_stats(stats)


@review_app.command("spot-checks")
def review_spot_checks(idle: IdleOpt = 2.0) -> None:
    """Spot checks still waiting for a reviewer (tickets.review.spot_checks)."""
    s = get_settings()
    topics = Topics(s.topic_prefix)
    decided = {o.ticket_id for o in _outcomes(s, idle)}
    pending = [
        c
        for c in _read(s, topics.review_spot_checks, SpotCheck, idle)
        if c.ticket_id not in decided
    ]
    table = Table(title=f"{len(pending)} spot check(s) pending", title_justify="left")
    for name in ("ticket", "category", "confidence", "model", "workflow"):
        table.add_column(name, overflow="fold")
    for check in {c.ticket_id: c for c in pending}.values():
        r = check.result
        table.add_row(
            escape(r.ticket_id),
            r.category.value,
            f"{r.confidence:.2f}",
            escape(r.model_version or "-"),
            escape(f"{r.workflow or '-'} v{r.workflow_version or '-'}"),
        )
    console.print(table)


def _outcomes(s: Settings, idle: float) -> list[ReviewOutcome]:
    return latest_per_ticket(_read(s, Topics(s.topic_prefix).review_outcomes, ReviewOutcome, idle))


def _read(s: Settings, topic: str, model, idle: float) -> list:
    """Every record of `topic` that parses as `model`; a stranger's record is skipped."""
    out = []
    for record in kafka_io.read_topic(confluent_config(s), topic, idle_s=idle):
        try:
            out.append(model.model_validate_json(record.value or b""))
        except ValueError:
            continue
    return out


def _print_stats(stats: Stats) -> None:
    # five short columns: readable in an 80-column terminal
    table = Table(title="reviewers' agreement with the model", title_justify="left")
    table.add_column("model version", overflow="fold", max_width=24)
    table.add_column("kind")
    table.add_column("decisions", justify="right")
    table.add_column("agreed", justify="right")
    table.add_column("agreement", justify="right")
    for row in stats.rows:
        style = "bold" if row.kind is None else ""
        table.add_row(
            escape(row.model_version),
            (row.kind or "all").replace("_", " "),
            str(row.decisions),
            str(row.agreed),
            f"{row.rate:.1%}",
            style=style,
        )
    if not stats.rows:
        console.print("no review decisions yet")
    else:
        console.print(table)
    if stats.without_model:
        console.print(
            f"{stats.without_model} decision(s) on tickets no model answered are not counted"
        )
