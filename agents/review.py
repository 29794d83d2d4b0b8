"""Human review: tickets routed to `manual_review` wait for a reviewer's decision.

The router publishes their `TicketResult` to `tickets.out.manual_review` (the reviewers'
queue) and leaves them `awaiting_review` with that result in their state. A
`ReviewDecision` on `tickets.review.decisions` completes the ticket: its final result, with
the reviewer's category and a `review` entry on its decision path, goes to
`tickets.out.reviewed`. Decisions for unknown or finished tickets are refused.

A spot-checked ticket (agents/spot_check.py) is `completed` with its `spot_check`
pending: a decision on it produces no second result. Either kind of decision is set
against what the pipeline proposed (`review_outcome`), published to
`tickets.review.outcomes` and counted per model version.
"""

from __future__ import annotations

import logging
from datetime import datetime, timezone

from pydantic import ValidationError

from agents.spot_check import PENDING
from schemas.review import ReviewKind, ReviewOutcome
from schemas.tickets import DecisionStep, ReviewDecision, StepStatus, TicketResult

log = logging.getLogger(__name__)
REVIEWED_ROUTE = "reviewed"


class ReviewRefused(ValueError):
    """A decision that cannot apply; the message says why."""


def check_decidable(ticket_id: str, state: dict | None) -> ReviewKind:
    """What kind of review the ticket awaits, or ReviewRefused saying why none."""
    if state is None:
        raise ReviewRefused(f"unknown ticket {ticket_id!r}: no worker has seen it")
    if state["status"] == "completed" and state.get("spot_check") == PENDING:
        return "spot_check"
    if state.get("spot_check"):
        raise ReviewRefused(f"ticket {ticket_id!r}: its spot check is already decided")
    if state["status"] != "awaiting_review":
        raise ReviewRefused(
            f"ticket {ticket_id!r} is {state['status']}, not awaiting review"
            + (f" (route {state['route']})" if state.get("route") else "")
        )
    return "manual"


def routed_result(state: dict, ticket_id: str) -> TicketResult:
    """The result the router kept in the ticket's state (manual reviews, spot checks)."""
    try:
        return TicketResult.model_validate(state["result"])
    except (KeyError, ValidationError) as exc:
        raise ReviewRefused(f"ticket {ticket_id!r}: no routed result kept") from exc


def review_outcome(
    routed: TicketResult, decision: ReviewDecision, kind: ReviewKind
) -> ReviewOutcome:
    """The reviewer's category next to the one the pipeline proposed."""
    return ReviewOutcome(
        ticket_id=decision.ticket_id,
        kind=kind,
        proposed=routed.category,
        decided=decision.category,
        agreed=routed.category == decision.category,
        model_name=routed.model_name,
        model_version=routed.model_version,
        workflow=routed.workflow,
        workflow_version=routed.workflow_version,
        reviewer=decision.reviewer,
        decided_at=decision.decided_at,
    )


def reviewed_result(state: dict, decision: ReviewDecision) -> TicketResult:
    """The ticket's final result: the routed one, decided by a person."""
    routed = routed_result(state, decision.ticket_id)
    waited_ms = max(0.0, (decision.decided_at - routed.completed_at).total_seconds() * 1000)
    human = DecisionStep(
        step="review",
        status=StepStatus.ok,
        latency_ms=round(waited_ms, 3),
        detail=f"{decision.reviewer}: {routed.category.value} -> {decision.category.value}"
        + (f" ({decision.note})" if decision.note else ""),
    )
    return routed.model_copy(
        update={
            "route": REVIEWED_ROUTE,
            "category": decision.category,
            "confidence": 1.0,
            "decision_path": [*routed.decision_path, human],
            "completed_at": datetime.now(timezone.utc),
            "latency_ms": routed.latency_ms + waited_ms,
        }
    )
