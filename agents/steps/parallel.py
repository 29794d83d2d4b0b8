"""The `parallel` step: its branches run at once on copies of each ticket, then are joined.

Each branch is an ordinary step (processor, feature_lookup, inference_call, rule_engine) run
by that type's handler on its own copy of the batch, within its own `timeout_ms`. The join
then, per ticket:

- records one decision-path and audit entry per branch (`<step>.<branch>`), with the
  branch's own prediction on its audit record;
- `join: all`: a failed branch fails the step as its type fails today: an error that may
  pass is retried (the whole group, under the parallel step's retry policy), a bad record is
  dead-lettered, a degraded branch degrades the ticket;
- `join: best_available`: the failed branches are marked degraded with their reason and the
  others are used; with none left, the failures decide as under `all`;
- what the succeeding branches added to the context is merged in: features, cleaned text,
  rule outcome, and one prediction from the inference branches' (`merge`: the mean of their
  score vectors then argmax, model_version "v1+v2"; or the most confident).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from agents.errors import BadRecord, RetryableError
from agents.steps.handlers import Handler, Outcomes, degrade
from agents.steps.merge import merge_predictions
from agents.steps.record import Record, record_took, sub_step
from schemas.tickets import Envelope, Prediction, StepStatus
from schemas.workflow import Step

# a branch without its own timeout_ms gets its group's, else this
DEFAULT_BRANCH_TIMEOUT_MS = 1000
# the branch handler's own timeout (the gateway's budget) should fire first, so that the
# failure names its cause; this guard is for a handler that would not return at all
GUARD_MS = 100


@dataclass
class BranchRun:
    """One branch over the batch: its copies of the envelopes and their outcomes."""

    step: Step
    copies: list[Envelope]
    outcomes: Outcomes
    seconds: float


class ParallelStep(Handler):
    def __init__(self, handlers: Mapping[str, Handler], record: Record | None = None) -> None:
        self._handlers = handlers  # by step type, without `parallel`: groups do not nest
        self._record = record

    async def run_batch(self, envs: Sequence[Envelope], step: Step) -> Outcomes:
        runs = await asyncio.gather(*(self._branch(b, envs, step) for b in step.branches))
        return [self._join(step, env, i, runs) for i, env in enumerate(envs)]

    async def _branch(self, branch: Step, envs: Sequence[Envelope], group: Step) -> BranchRun:
        timeout_ms = branch.timeout_ms or group.timeout_ms or DEFAULT_BRANCH_TIMEOUT_MS
        # the handler's budget is the branch's timeout; entries it writes itself (a
        # cascade's calls) are named under the group: `infer_ensemble.fast.v1`
        qualified = f"{group.name}.{branch.name}"
        runs_as = branch.model_copy(update={"name": qualified, "timeout_ms": timeout_ms})
        copies = [env.model_copy(deep=True) for env in envs]
        handler = self._handlers[branch.type]
        t0 = time.perf_counter()
        try:
            outcomes = await asyncio.wait_for(
                handler.run_batch(copies, runs_as), (timeout_ms + GUARD_MS) / 1000
            )
        except asyncio.TimeoutError:
            late = RetryableError(f"branch {branch.name} took over {timeout_ms} ms", "TIMEOUT")
            outcomes = [late] * len(envs)
        except Exception as exc:  # a handler bug fails this branch, not its siblings
            outcomes = [exc] * len(envs)
        return BranchRun(branch, copies, list(outcomes), time.perf_counter() - t0)

    def _join(
        self, step: Step, env: Envelope, i: int, runs: Sequence[BranchRun]
    ) -> BaseException | None:
        base = len(env.path)  # entries a branch's handler added to its copy come after this
        failures: list[tuple[Step, BaseException | str]] = []
        succeeded: list[tuple[Step, Envelope]] = []
        for run in runs:
            copy, failure = run.copies[i], _failure(env, run.copies[i], run.outcomes[i])
            env.path.extend(copy.path[base:])
            if failure is None:
                succeeded.append((run.step, copy))
            else:
                failures.append((run.step, failure))
            status, detail = _entry(step, failure)
            entry = record_took(
                self._record, copy, sub_step(step, run.step.name), status, run.seconds, detail
            )
            if entry is not None:
                env.path.append(entry)
        if failures and (step.join == "all" or not succeeded):
            return _fail(env, failures)
        _merge_into(env, succeeded, step)
        return None


def _failure(
    env: Envelope, copy: Envelope, outcome: BaseException | None
) -> BaseException | str | None:
    """What went wrong in one branch for one ticket: an exception, a degraded reason, or None."""
    if outcome is not None:
        return outcome
    newly = copy.context.degraded and (
        not env.context.degraded or copy.context.degraded_reason != env.context.degraded_reason
    )
    return (copy.context.degraded_reason or "degraded") if newly else None


def _reason(failure: BaseException | str) -> str:
    if isinstance(failure, str):
        return failure
    if isinstance(failure, RetryableError):
        return f"{failure.code}: {failure.reason}"
    if isinstance(failure, BadRecord):
        return f"{failure.error_class.value}: {failure.reason}"
    return f"{type(failure).__name__} in branch"  # not its message: it may quote the record


def _entry(step: Step, failure: BaseException | str | None) -> tuple[StepStatus, str | None]:
    if failure is None:
        return StepStatus.ok, None
    status = StepStatus.degraded if step.join == "best_available" else StepStatus.failed
    return status, _reason(failure)


def _fail(env: Envelope, failures: list[tuple[Step, BaseException | str]]) -> BaseException | None:
    """The step's outcome from its failed branches: the gravest decides (a bad record, then an
    error that may pass); branches that only degraded degrade the ticket."""
    errors = [f for _, f in failures if isinstance(f, BaseException)]
    final = [e for e in errors if not isinstance(e, RetryableError)]
    if final or errors:
        return (final or errors)[0]
    reasons = "; ".join(f"{b.name}: {_reason(f)}" for b, f in failures)
    degrade(env, reasons[:500])
    return None


def _merge_into(env: Envelope, succeeded: list[tuple[Step, Envelope]], step: Step) -> None:
    """What the succeeding branches added, in branch order; predictions merged into one."""
    ctx = env.context
    # what a branch changed is judged against the ticket before the step, not against
    # what an earlier branch merged in
    clean_text, rule = ctx.clean_text, ctx.rule
    predictions: list[Prediction] = []
    for branch, copy in succeeded:
        got = copy.context
        ctx.features.update(got.features)
        if got.clean_text != clean_text:
            ctx.clean_text = got.clean_text
        if got.rule != rule:
            ctx.rule = got.rule
        # an inference branch's answer counts even when equal to one from an earlier attempt
        if got.prediction is not None and branch.type == "inference_call":
            predictions.append(got.prediction)
    if predictions:
        ctx.prediction = merge_predictions(predictions, step.merge)
