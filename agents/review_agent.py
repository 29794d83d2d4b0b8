"""The review agent: a reviewer's decision completes a ticket waiting in `manual_review`,
or records the verdict of a spot check.

Each decision is read with `read_decision`; one that cannot be read is dead-lettered
alone, one that cannot apply (unknown ticket, already decided) is refused and counted.
See agents/review.py for what a decided result holds. Every applied decision is also set
against what the pipeline proposed: a `ReviewOutcome` on `tickets.review.outcomes` and the
`workflow_review_agreement_total` counter, per model version. A spot check's decision
produces nothing else: the ticket already has its one result.
"""

from __future__ import annotations

import logging
from typing import Any

from agents import metrics
from agents.decoding import read_decision
from agents.emitter import Emitter
from agents.errors import BadRecord
from agents.review import (
    REVIEWED_ROUTE,
    ReviewRefused,
    check_decidable,
    review_outcome,
    reviewed_result,
    routed_result,
)
from agents.spot_check import DECIDED
from agents.state import TicketStates
from schemas.review import ReviewOutcome
from schemas.tickets import ReviewDecision
from streams.codecs import encode
from streams.headers import child_traceparent
from streams.topics import Topics

log = logging.getLogger(__name__)
NO_MODEL = "none"  # the model_version label of a decision on a ticket no model answered


class ReviewAgent:
    def __init__(self, states: TicketStates, emitter: Emitter, topics: Topics) -> None:
        self.states = states
        self.emitter = emitter
        self.topics = topics

    def handle(self, event: Any) -> None:
        message = event.message
        try:
            decision = read_decision(message.value, key=message.key)
        except BadRecord as exc:
            self.emitter.dead_letter(event, "review", exc.error_class, exc.reason, 1)
            return
        self.states.at(event)
        state = self.states.get(decision.ticket_id)
        try:
            kind = check_decidable(decision.ticket_id, state)
            assert state is not None  # check_decidable refuses a ticket with no state
            routed = routed_result(state, decision.ticket_id)
        except ReviewRefused as exc:
            log.warning("review decision refused: %s", exc)
            metrics.REVIEWS.labels("refused").inc()
            return
        assert state is not None  # check_decidable refuses None
        outcome = review_outcome(routed, decision, kind)
        if kind == "spot_check":
            self._spot_checked(event, state, outcome)
        else:
            self._completed(event, state, decision)
        self._record(state, outcome)

    def _completed(self, event: Any, state: dict, decision: ReviewDecision) -> None:
        """A manual review: the ticket's final result, on tickets.out.reviewed."""
        result = reviewed_result(state, decision)
        self.emitter.producer.produce(
            self.topics.out(REVIEWED_ROUTE),
            decision.ticket_id.encode(),
            encode(result),
            self._headers(state),
        )
        result_json = result.model_dump(mode="json")
        # every write of the table goes through move(), under one set of rules
        self.states.move(
            event, state, "completed", "review", route=REVIEWED_ROUTE, result=result_json
        )
        metrics.REVIEWS.labels("completed").inc()
        metrics.TICKETS.labels(REVIEWED_ROUTE).inc()

    def _spot_checked(self, event: Any, state: dict, outcome: ReviewOutcome) -> None:
        """A spot check: no second result; the ticket stays completed, its check decided."""
        verdict = "agree" if outcome.agreed else f"disagree: {outcome.decided.value}"
        self.states.move(
            event, state, "completed", "review", spot_check=DECIDED, spot_check_verdict=verdict
        )
        metrics.REVIEWS.labels("spot_checked").inc()

    def _record(self, state: dict, outcome: ReviewOutcome) -> None:
        self.emitter.producer.produce(
            self.topics.review_outcomes,
            outcome.ticket_id.encode(),
            encode(outcome),
            self._headers(state),
        )
        metrics.REVIEW_AGREEMENT.labels(
            outcome.model_version or NO_MODEL,
            outcome.kind,
            "agree" if outcome.agreed else "disagree",
        ).inc()

    @staticmethod
    def _headers(state: dict) -> list[tuple[str, bytes]]:
        return [("traceparent", child_traceparent(state["trace_id"]).encode())]
