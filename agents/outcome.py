"""The closed set of things a step can do with one ticket, and how a handler's result maps
onto it. One place (`agents.runner.StepRunner.apply`) acts on each kind."""

from __future__ import annotations

from dataclasses import dataclass

from agents.errors import BadRecord, RetryableError
from schemas.tickets import Envelope, ErrorClass

# steps whose success may still leave the ticket degraded (a fallback decided)
DEGRADABLE = frozenset({"inference_call", "parallel"})


@dataclass(frozen=True)
class Ok:
    """The step did its work; the ticket goes on."""


@dataclass(frozen=True)
class Degraded:
    """The step fell back (the reason is on the envelope); the ticket goes on."""


@dataclass(frozen=True)
class Retry:
    """A dependency failed in a way that may pass: try the step again later."""

    error: RetryableError


@dataclass(frozen=True)
class DeadLetter:
    """The ticket cannot go on: dead-lettered with its class, the record unchanged."""

    error_class: ErrorClass
    reason: str


StepOutcome = Ok | Degraded | Retry | DeadLetter


def outcome_of(result: BaseException | None, env: Envelope, step_type: str) -> StepOutcome:
    """What a handler's per-envelope result (None or the exception it failed with) means."""
    if result is None:
        return Degraded() if env.context.degraded and step_type in DEGRADABLE else Ok()
    if isinstance(result, RetryableError):
        return Retry(result)
    if isinstance(result, BadRecord):
        return DeadLetter(result.error_class, result.reason)
    return DeadLetter(ErrorClass.INTERNAL, f"{type(result).__name__} in step")
