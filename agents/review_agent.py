"""The review agent: a reviewer's decision completes a ticket waiting in `manual_review`.

Each decision is read with `read_decision`; one that cannot be read is dead-lettered
alone, one that cannot apply (unknown ticket, already decided) is refused and counted.
See agents/review.py for what a decided result holds.
"""

from __future__ import annotations

import logging
from typing import Any

from agents import metrics
from agents.emitter import Emitter
from agents.errors import BadRecord
from agents.records import read_decision
from agents.review import REVIEWED_ROUTE, ReviewRefused, check_decidable, reviewed_result
from agents.state import TicketStates
from streams.codecs import encode
from streams.headers import child_traceparent
from streams.topics import Topics

log = logging.getLogger(__name__)


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
            check_decidable(decision.ticket_id, state)
            result = reviewed_result(state, decision)
        except ReviewRefused as exc:
            log.warning("review decision refused: %s", exc)
            metrics.REVIEWS.labels("refused").inc()
            return
        self.emitter.producer.produce(
            self.topics.out(REVIEWED_ROUTE),
            decision.ticket_id.encode(),
            encode(result),
            [("traceparent", child_traceparent(state["trace_id"]).encode())],
        )
        result_json = result.model_dump(mode="json")
        # every write of the table goes through move(), under one set of rules
        self.states.move(
            event, state, "completed", "review", route=REVIEWED_ROUTE, result=result_json
        )
        metrics.REVIEWS.labels("completed").inc()
        metrics.TICKETS.labels(REVIEWED_ROUTE).inc()
