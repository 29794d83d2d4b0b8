"""Records of the review side: spot-check copies and reviewers' verdicts on the model.

`SpotCheck` (on `tickets.review.spot_checks`): a copy of an automatic decision for a
reviewer to check; the ticket's one `TicketResult` went to its route as usual.
`ReviewOutcome` (on `tickets.review.outcomes`): what a reviewer decided next to what the
pipeline proposed, for a spot check or an ordinary manual review; `ticketflow review stats`
reads these to give each model version its human-measured agreement.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from schemas.tickets import Category, TicketId, TicketResult, UtcDatetime, utcnow

ReviewKind = Literal["spot_check", "manual"]


class SpotCheck(BaseModel):
    """An automatic decision copied to reviewers; the result itself is not held back."""

    ticket_id: TicketId
    result: TicketResult
    sampled_at: UtcDatetime = Field(default_factory=utcnow)


class ReviewOutcome(BaseModel):
    """A reviewer's decision set against the category the pipeline proposed.

    `proposed` is the routed result's category: the model's, unless a rule overrode it
    (a refund request in a VIP ticket). `model_version` is None when no model answered
    (a degraded ticket): such outcomes measure no model.
    """

    ticket_id: TicketId
    kind: ReviewKind
    proposed: Category
    decided: Category
    agreed: bool
    model_name: str | None = None
    model_version: str | None = None
    workflow: str | None = None
    workflow_version: int | None = None
    reviewer: str = "anonymous"
    decided_at: UtcDatetime = Field(default_factory=utcnow)
