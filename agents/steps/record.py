"""How a handler adds entries of its own to a ticket's decision path and audit.

A parallel step's branches each get an entry (`infer_ensemble.v1`, ...), next
to the one the runner writes for the step itself. The engine hands handlers the emitter's
`record`; unit tests hand them a list's append.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from schemas.tickets import DecisionStep, Envelope, StepStatus
from schemas.workflow import Step

# Emitter.record: (envelope, step, status, t0 from perf_counter, detail) -> the entry added
Record = Callable[[Envelope, Step, StepStatus, float, "str | None"], DecisionStep]


def sub_step(step: Step, suffix: str, **update: object) -> Step:
    """`step` renamed `<step>.<suffix>` for its entry: not validated, the dot is ours."""
    return step.model_copy(update={"name": f"{step.name}.{suffix}", **update})


def record_took(
    record: Record | None,
    env: Envelope,
    step: Step,
    status: StepStatus,
    seconds: float,
    detail: str | None = None,
) -> DecisionStep | None:
    """Record an entry for work that took `seconds` and is already over."""
    if record is None:
        return None
    return record(env, step, status, time.perf_counter() - seconds, detail)
