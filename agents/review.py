"""Human review: tickets routed to `manual_review` wait for a reviewer's decision.

The router publishes their `TicketResult` to `tickets.out.manual_review` (the reviewers'
queue) and leaves them `awaiting_review` with that result in their state. A
`ReviewDecision` on `tickets.review.decisions` completes the ticket: its final result, with
the reviewer's category and a `review` entry on its decision path, goes to
`tickets.out.reviewed`. Decisions for unknown or finished tickets are refused.
"""

from __future__ import annotations

import logging
from datetime import datetime, timezone

from pydantic import ValidationError

from schemas.tickets import DecisionStep, ReviewDecision, StepStatus, TicketResult

log = logging.getLogger(__name__)
REVIEWED_ROUTE = "reviewed"


class ReviewRefused(ValueError):
    """A decision that cannot apply; the message says why."""


def check_decidable(ticket_id: str, state: dict | None) -> None:
    if state is None:
        raise ReviewRefused(f"unknown ticket {ticket_id!r}: no worker has seen it")
    if state["status"] != "awaiting_review":
        raise ReviewRefused(
            f"ticket {ticket_id!r} is {state['status']}, not awaiting review"
            + (f" (route {state['route']})" if state.get("route") else "")
        )


def reviewed_result(state: dict, decision: ReviewDecision) -> TicketResult:
    """The ticket's final result: the routed one, decided by a person."""
    try:
        routed = TicketResult.model_validate(state["result"])
    except (KeyError, ValidationError) as exc:
        raise ReviewRefused(f"ticket {decision.ticket_id!r}: no routed result kept") from exc
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
