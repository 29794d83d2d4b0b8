"""Cascade inference: the cheap version first, the expensive one only when it is unsure.

An `inference_call` step with `cascade: {then: v2, below: 0.56}` asks the gateway for every
ticket as an ordinary call would (its routing picks the version, so rollouts and canaries
apply), and asks `then` again for those answered below `below`; `first: v1` pins the first
call instead. The ticket's prediction names the version that decided. The second opinion
is best-effort: if `then` fails (not loaded, overloaded, out of time), the first answer
stands, as a cascade without it would have decided; a failed first call fails the step as
any inference call does. The step keeps its one decision-path entry (the result's contract:
one entry per step); `cascade_detail` says in it which version decided and why.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from schemas.tickets import Context, Envelope
from schemas.workflow import Cascade, Step

Outcomes = list[BaseException | None]
Call = Callable[[Sequence[Envelope], Step], Awaitable[Outcomes]]


async def run_cascade(call: Call, second: Call, envs: Sequence[Envelope], step: Step) -> Outcomes:
    cascade = step.cascade
    assert cascade is not None
    outcomes = await call(envs, _version(step, cascade.first or step.version))
    unsure = [i for i, env in enumerate(envs) if outcomes[i] is None and _unsure(env, cascade)]
    if not unsure:
        return outcomes
    firsts = [envs[i].context.model_copy() for i in unsure]
    again = await second([envs[i] for i in unsure], _version(step, cascade.then))
    for i, first, outcome in zip(unsure, firsts, again, strict=True):
        if outcome is not None or envs[i].context.degraded:
            _restore(envs[i], first)
    return outcomes


def cascade_detail(env: Envelope, cascade: Cascade) -> str | None:
    """The decision-path detail of a cascade step that went well: who decided, and why."""
    pred = env.context.prediction
    if pred is None or env.context.degraded:
        return None
    if pred.model_version == cascade.then:
        return f"below {cascade.below}: {cascade.then} decided"
    if pred.confidence < cascade.below:
        return f"below {cascade.below}, {cascade.then} did not answer: {pred.model_version} decided"
    return f"{pred.model_version} decided"


def _version(step: Step, version: str | None) -> Step:
    """The step as one call to `version`, or to the routed one for None (not validated:
    built from a validated step)."""
    return step.model_copy(update={"version": version, "cascade": None})


def _restore(env: Envelope, first: Context) -> None:
    """Put back the first answer: the second call's failure is not the ticket's."""
    env.context.prediction = first.prediction
    env.context.degraded = first.degraded
    env.context.degraded_reason = first.degraded_reason


def _unsure(env: Envelope, cascade: Cascade) -> bool:
    """Answered below the threshold by another version than `then` (and by `first`, if
    pinned)."""
    pred = env.context.prediction
    if env.context.degraded or pred is None or pred.model_version == cascade.then:
        return False
    if cascade.first is not None and pred.model_version != cascade.first:
        return False
    return pred.confidence < cascade.below
