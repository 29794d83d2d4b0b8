"""Spot checks: a sampled automatic decision is copied to reviewers, never held back.

The `sample` rule (agents/steps/rules.py) marks a share of the automatic decisions. The
router then writes, in the transaction of the ticket's one `TicketResult`, a `SpotCheck`
copy to `tickets.review.spot_checks`, and leaves the ticket `completed` with its
`spot_check` pending. A reviewer's decision on it (agents/review_agent.py) produces no
second result: it is recorded as an agreement or a disagreement with the model.
"""

from __future__ import annotations

from typing import Any

from agents.steps.rules import SAMPLE
from schemas.review import SpotCheck
from schemas.tickets import Envelope, TicketResult
from streams.codecs import encode
from streams.topics import Topics

PENDING = "pending"
DECIDED = "decided"

Record = tuple[str, bytes, bytes, list[tuple[str, bytes]], int | None]


def is_spot_check(env: Envelope, result: TicketResult) -> bool:
    """Sampled, and the automatic decision stands (a router that sends everything to review
    already has a person look at it)."""
    rule = env.context.rule
    return rule is not None and SAMPLE in rule.fired and result.route == rule.route


def copy_records(
    topics: Topics, env: Envelope, result: TicketResult, headers: list[tuple[str, bytes]]
) -> list[Record]:
    """The spot-check copy of a result, for the router's transaction (none unless sampled)."""
    if not is_spot_check(env, result):
        return []
    copy = SpotCheck(ticket_id=result.ticket_id, result=result)
    return [(topics.review_spot_checks, result.ticket_id.encode(), encode(copy), headers, None)]


def state_fields(env: Envelope, result: TicketResult) -> dict[str, Any]:
    """What a spot-checked ticket's state keeps for the reviewer's decision."""
    if not is_spot_check(env, result):
        return {}
    return {"spot_check": PENDING, "result": result.model_dump(mode="json")}
