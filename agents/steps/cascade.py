"""Cascade inference: the cheap version first, the expensive one only when it is unsure.

An `inference_call` step with `cascade: {first: v1, then: v2, below: 0.85}` calls `first`
for every ticket and `then` for those whose answer from `first` is below `below`. The
ticket's prediction names the version that decided; each call has its own decision-path
and audit entry (`infer.v1`, `infer.v2`). A failed call fails the step as any inference
call does (retried, degraded or dead-lettered by the runner); a retry calls both again.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence

from agents.steps.record import Record, record_took, sub_step
from schemas.tickets import Envelope, StepStatus
from schemas.workflow import Cascade, Step

Outcomes = list[BaseException | None]
Call = Callable[[Sequence[Envelope], Step], Awaitable[Outcomes]]


async def run_cascade(
    call: Call, envs: Sequence[Envelope], step: Step, record: Record | None
) -> Outcomes:
    cascade = step.cascade
    assert cascade is not None
    first = sub_step(step, cascade.first, version=cascade.first, cascade=None)
    then = sub_step(step, cascade.then, version=cascade.then, cascade=None)
    t0 = time.perf_counter()
    outcomes = await call(envs, first)
    took = time.perf_counter() - t0
    unsure = [i for i, env in enumerate(envs) if outcomes[i] is None and _unsure(env, cascade)]
    for i, env in enumerate(envs):
        _record_call(record, env, first, outcomes[i], took, _verdict(env, cascade, i in unsure))
    if not unsure:
        return outcomes
    t1 = time.perf_counter()
    again = await call([envs[i] for i in unsure], then)
    took = time.perf_counter() - t1
    for i, outcome in zip(unsure, again, strict=True):
        outcomes[i] = outcome
        _record_call(record, envs[i], then, outcome, took, "decided")
    return outcomes


def _unsure(env: Envelope, cascade: Cascade) -> bool:
    """Answered by `first` below the threshold, with time left for a second call."""
    pred = env.context.prediction
    if env.context.degraded or pred is None or pred.model_version != cascade.first:
        return False
    return pred.confidence < cascade.below


def _verdict(env: Envelope, cascade: Cascade, unsure: bool) -> str | None:
    pred = env.context.prediction
    if pred is None or env.context.degraded:
        return None
    if unsure:
        return f"confidence {pred.confidence:.3f} below {cascade.below}: asked {cascade.then}"
    return "decided"


def _record_call(
    record: Record | None,
    env: Envelope,
    step: Step,
    outcome: BaseException | None,
    took: float,
    verdict: str | None,
) -> None:
    if outcome is not None:  # the runner records the step's retry or dead letter with its reason
        record_took(record, env, step, StepStatus.failed, took, type(outcome).__name__)
    elif env.context.degraded:
        record_took(record, env, step, StepStatus.degraded, took, env.context.degraded_reason)
    else:
        record_took(record, env, step, StepStatus.ok, took, verdict)
