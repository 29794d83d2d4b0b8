"""Reviewers' decisions as training examples: the human feedback loop of `ticketflow model build`.

A reviewed ticket's final `TicketResult` (on `tickets.out.reviewed`, see agents/review.py)
carries the category a person chose, but not the text: results never repeat it. The text is
the ticket's own record on `tickets.in`, found by `ticket_id`. Both topics are read from the
beginning to their end (read_committed: results are written in transactions); a ticket
reviewed twice counts once, with its latest decision.

The topic names are passed in (the command line knows the deployment's prefix), so this module
needs nothing of `streams`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from pydantic import ValidationError

from inference_gateway.topic_scan import scan_topic
from schemas.tickets import CATEGORIES, TicketResult


@dataclass(frozen=True)
class Example:
    """One reviewed ticket: its text and the category a reviewer gave it."""

    ticket_id: str
    text: str
    category: str


def scan(bootstrap: str, topic: str, timeout_s: float = 60.0) -> Iterator[tuple[bytes, bytes]]:
    """(key, value) of every record of `topic`, from the beginning to its end now.

    A missing topic yields nothing (no reviews yet); one not read to its end within
    `timeout_s` raises, rather than training on part of the decisions without a word.
    """
    for key, value in scan_topic(bootstrap, topic, "ticketflow-model-build", timeout_s):
        if value is not None:
            yield key, value


def decisions(records: Iterator[tuple[bytes, bytes]]) -> dict[str, str]:
    """ticket_id -> the reviewer's category, the latest per ticket; invalid records skipped."""
    out: dict[str, str] = {}
    for _key, value in records:
        try:
            result = TicketResult.model_validate_json(value)
        except ValidationError:
            continue  # not ours to judge here; the reviewed topic's consumers see it too
        if result.category.value in CATEGORIES:
            out[result.ticket_id] = result.category.value
    return out


def texts_of(records: Iterator[tuple[bytes, bytes]], wanted: set[str]) -> dict[str, str]:
    """ticket_id -> text for the `wanted` tickets among `tickets.in` records (JSON Tickets)."""
    out: dict[str, str] = {}
    for _key, value in records:
        try:
            ticket = json.loads(value)
        except (UnicodeDecodeError, ValueError):
            continue  # malformed input went to the dead-letter topic, not to a reviewer
        if not isinstance(ticket, dict):
            continue
        ticket_id, text = ticket.get("ticket_id"), ticket.get("text")
        if ticket_id in wanted and isinstance(text, str) and text.strip():
            out[ticket_id] = text
    return out


def join(decided: dict[str, str], texts: dict[str, str]) -> list[Example]:
    """Examples for the decided tickets whose text was found, in ticket_id order."""
    return [Example(tid, texts[tid], cat) for tid, cat in sorted(decided.items()) if tid in texts]


Scanner = Callable[[str, str], Iterator[tuple[bytes, bytes]]]


def read_reviewed(
    bootstrap: str, reviewed_topic: str, tickets_topic: str, scanner: Scanner | None = None
) -> list[Example]:
    """Every reviewed ticket with its text: the decisions first, then their texts."""
    read = scanner or scan
    decided = decisions(read(bootstrap, reviewed_topic))
    if not decided:
        return []
    return join(decided, texts_of(read(bootstrap, tickets_topic), set(decided)))
