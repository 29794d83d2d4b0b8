"""Per-ticket state kept in a Faust table (backed by its changelog topic).

The value is a plain JSON dict, so the changelog is readable by any Kafka tool.

Only the home worker has the table (`TicketStates`); a pool worker sends each move there
as a record (`agents.remote_state.RemoteStates`). Both offer the steps one interface,
`States`, and every move, local or sent, passes the same rules (`allowed`).
"""

from __future__ import annotations

import time
from typing import Any, Protocol

TERMINAL = frozenset({"completed", "degraded", "dead_lettered"})
# routed: only a terminal status may follow (a reviewer's decision, or a late dead letter)
SETTLED = TERMINAL | {"awaiting_review"}
HISTORY_LIMIT = 32


def now_ms() -> int:
    return int(time.time() * 1000)


def new_state(ticket_id: str, arrival: str, trace_id: str, workflow: str, version: int) -> dict:
    return {
        "ticket_id": ticket_id,
        "arrival": arrival,
        "trace_id": trace_id,
        "workflow": workflow,
        "workflow_version": version,
        "status": "received",
        "step": None,
        "attempts": {},
        "history": [],
        "duplicates": 0,
        "route": None,
        "created_at": now_ms(),
        "updated_at": now_ms(),
    }


def transition(state: dict[str, Any], status: str, step: str | None, attempt: int = 1) -> dict:
    """A copy of `state` moved to `status` (tables must see a new value to write a changelog)."""
    new = dict(state)
    new["status"] = status
    new["step"] = step
    new["updated_at"] = now_ms()
    if step is not None:
        new["attempts"] = {**state["attempts"], step: attempt}
    history = [*state["history"], [step, status, new["updated_at"]]]
    new["history"] = history[-HISTORY_LIMIT:]
    return new


def record_duplicate(state: dict[str, Any], arrival: str) -> dict:
    new = dict(state)
    new["duplicates"] = state.get("duplicates", 0) + 1
    new["last_duplicate"] = {"arrival": arrival, "at": now_ms()}
    return new


def allowed(state: dict[str, Any], status: str, progress: int | None) -> bool:
    """Whether a ticket in `state` may move to `status`.

    A settled ticket never goes back to a running status (a redelivery after routing, or a
    pool's move that arrives after the ticket went on). `progress` is the number of
    decision-path entries the mover's envelope had: the ticket's own clock, which only
    grows as it goes on, so a move older than the last one applied is ignored. Wall clocks
    of two machines would not do: a hop takes a few milliseconds, about what they differ.
    """
    if state["status"] in SETTLED and status not in TERMINAL:
        return False
    return progress is None or progress >= state.get("progress", -1)


class States(Protocol):
    """What the steps need of ticket state, wherever it is kept."""

    def at(self, event: Any) -> None: ...

    def admit(
        self, event: Any, ticket_id: str, arrival: str, trace_id: str, workflow: str, version: int
    ) -> bool: ...

    def move(
        self, event: Any, fresh: dict, status: str, step: str, attempt: int = 1, **fields: Any
    ) -> None: ...

    def flush_changelog(self) -> int: ...


class TicketStates:
    """The `ticket_state` table, written through the ticket's own event's partition.

    `at(event)` must precede a write: a Faust table writes to the changelog partition of
    the current event, and in a batch that is the last event taken.
    """

    def __init__(self, table: Any, at: Any) -> None:
        self.table = table
        self._at = at  # streams.faust_adapter.set_current_event

    def at(self, event: Any) -> None:
        """Make `event` the current one, so table writes go to its partition."""
        self._at(event)

    def get(self, ticket_id: str) -> dict | None:
        return self.table.get(ticket_id)

    def flush_changelog(self) -> int:
        return self.table.flush_changelog()

    def admit(
        self, event: Any, ticket_id: str, arrival: str, trace_id: str, workflow: str, version: int
    ) -> bool:
        """Idempotency: False for a second publish of a ticket_id (recorded, then dropped).

        The same arrival seen again is a redelivery: it goes on, since redoing a step is
        harmless and the router's ledger keeps its result single.
        """
        self._at(event)
        state = self.table.get(ticket_id)
        if state is None:
            self.table[ticket_id] = new_state(ticket_id, arrival, trace_id, workflow, version)
            return True
        if state["arrival"] == arrival:
            return True
        self.table[ticket_id] = record_duplicate(state, arrival)
        return False

    def move(
        self, event: Any, fresh: dict, status: str, step: str, attempt: int = 1, **fields: Any
    ) -> None:
        """Move a ticket to `status`. `fresh` is the state its envelope implies: used when
        the table has none yet; its `progress`, when it has one, orders this move."""
        self._at(event)
        ticket_id = fresh["ticket_id"]
        state = self.table.get(ticket_id) or fresh
        progress = fresh.get("progress")
        if not allowed(state, status, progress):
            return
        new = transition(state, status, step, attempt)
        if progress is not None:
            new["progress"] = progress
        new.update({k: v for k, v in fields.items() if v is not None})
        self.table[ticket_id] = new

    def apply(self, event: Any, fresh: dict, status: str, step: str, attempt: int = 1) -> None:
        """A pool's move (agents.remote_state), under the same rules as a local one.

        A move of another arrival of the ticket_id is ignored: only the admitted one runs.
        """
        self._at(event)
        state = self.table.get(fresh["ticket_id"])
        if state is not None and state["arrival"] != fresh["arrival"]:
            return
        self.move(event, fresh, status, step, attempt)
