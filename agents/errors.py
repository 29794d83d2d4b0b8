"""How a step says it failed; the engine turns these into retries, degradation or dead letters."""

from __future__ import annotations

from schemas.tickets import ErrorClass
from schemas.workflow import RetryableCode


class StepError(Exception):
    """Base of every failure a step reports on purpose."""

    error_class: ErrorClass = ErrorClass.INTERNAL


class BadRecord(StepError):
    """Input that can never succeed: dead-lettered at once with its class."""

    def __init__(self, error_class: ErrorClass, reason: str) -> None:
        super().__init__(reason)
        self.error_class = error_class
        self.reason = reason


class RetryableError(StepError):
    """A dependency that may answer next time (overloaded, timed out, unavailable)."""

    # a code that retry_on can name: a step's policy_for() finds its own policy for it
    DEFAULT_CODE: RetryableCode = "MODEL_UNAVAILABLE"

    def __init__(self, reason: str, code: str = DEFAULT_CODE) -> None:
        super().__init__(reason)
        self.reason = reason
        self.code = code
