"""Fakes shared by the unit tests of the inference steps (parallel branches, cascades)."""

from __future__ import annotations

from datetime import datetime, timezone

from schemas.tickets import DecisionStep, Envelope, StepStatus, Ticket

LABELS = ["billing", "after_sales", "technical", "account", "shipping", "general"]


def scores(**named: float) -> dict[str, float]:
    """A score vector: the named labels as given, the rest sharing what is left evenly."""
    rest = (1 - sum(named.values())) / (len(LABELS) - len(named))
    return {label: named.get(label, rest) for label in LABELS}


class Recorder:
    """Emitter.record's stand-in: keeps each entry with the model version its audit names."""

    def __init__(self) -> None:
        self.audited: list[tuple[str, StepStatus, str | None, str | None]] = []

    def __call__(self, env, step, status, t0, detail=None) -> DecisionStep:
        entry = DecisionStep(step=step.name, status=status, latency_ms=1.0, detail=detail)
        env.path.append(entry)
        pred = env.context.prediction
        self.audited.append((step.name, status, detail, pred.model_version if pred else None))
        return entry


def envelope(tid: str, step: str) -> Envelope:
    now = datetime.now(timezone.utc)
    return Envelope(
        ticket=Ticket(ticket_id=tid, text="the invoice is wrong", created_at=now),
        workflow="w",
        workflow_version=1,
        step=step,
        trace_id="a" * 32,
        arrival="0:1",
        started_at=now,
    )
