"""Per-ticket state kept in a Faust table (backed by its changelog topic).

The value is a plain JSON dict, so the changelog is readable by any Kafka tool.
"""

from __future__ import annotations

import time
from typing import Any

TERMINAL = frozenset({"completed", "degraded", "dead_lettered"})
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
