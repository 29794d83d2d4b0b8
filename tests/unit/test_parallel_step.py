"""Issue 14 part 1: a parallel step runs its branches at once, joins them, merges scores."""

from __future__ import annotations

import asyncio
import time

import pytest

from agents.errors import BadRecord, RetryableError
from agents.outcome import Degraded, Ok, outcome_of
from agents.steps.handlers import Handler, InferenceStep, ProcessorStep, degrade
from agents.steps.merge import merge_predictions
from agents.steps.parallel import ParallelStep
from inference_gateway.errors import GatewayError
from schemas.gateway import ErrorCode, PredictOutput, PredictResponse
from schemas.tickets import (
    Category,
    Envelope,
    ErrorClass,
    FeatureValue,
    Prediction,
    StepStatus,
)
from schemas.workflow import Step
from tests.unit.step_fakes import Recorder, scores
from tests.unit.step_fakes import envelope as fake_envelope


class VersionedGateway:
    """Answers each pinned version with its own scores, after `delay_s`; or fails."""

    def __init__(self, answers: dict[str, dict[str, float]], delay_s: float = 0.0) -> None:
        self.answers = answers
        self.delay_s = delay_s
        self.errors: dict[str, GatewayError] = {}
        self.calls: list[tuple[str | None, list[str]]] = []

    async def predict(self, model, inputs, timeout_ms, version=None):
        self.calls.append((version, [i.id for i in inputs]))
        await asyncio.sleep(self.delay_s)
        if version in self.errors:
            raise self.errors[version]
        vector = self.answers[version]
        label = max(vector, key=vector.get)
        outputs = [
            PredictOutput(
                id=i.id, label=label, confidence=vector[label], scores=vector, version=version
            )
            for i in inputs
        ]
        return PredictResponse(model=model, version=version, outputs=outputs, latency_ms=1.0)


def envelope(tid: str = "t-1") -> Envelope:
    return fake_envelope(tid, "infer_ensemble")


def branch(version: str, timeout_ms: int = 300) -> Step:
    return Step(
        name=version, type="inference_call", model="m", version=version, timeout_ms=timeout_ms
    )


def group(*branches: Step, join: str = "all", merge: str = "mean") -> Step:
    return Step(
        name="infer_ensemble", type="parallel", branches=list(branches), join=join, merge=merge
    )


def parallel(gateway, record=None, **extra: Handler) -> ParallelStep:
    def deadline(_env) -> int:
        return 2000

    handlers = {"inference_call": InferenceStep(gateway, deadline), **extra}
    return ParallelStep(handlers, record)


V1 = scores(billing=0.6, account=0.3)
V2 = scores(billing=0.2, account=0.7)


async def test_two_versions_are_merged_by_the_mean_of_their_scores_then_argmax():
    gw = VersionedGateway({"v1": V1, "v2": V2})
    rec = Recorder()
    env = envelope()
    [outcome] = await parallel(gw, rec).run_batch([env], group(branch("v1"), branch("v2")))
    assert outcome is None and outcome_of(outcome, env, "parallel") == Ok()
    pred = env.context.prediction
    # mean: billing 0.4, account 0.5 -> account, though v1 alone said billing
    assert pred.category == Category.account and pred.confidence == pytest.approx(0.5)
    assert pred.model_version == "v1+v2" and sum(pred.scores.values()) == pytest.approx(1)
    assert sorted(v for v, _ in gw.calls) == ["v1", "v2"]  # each branch named its version
    # one entry per branch, each audited with its own branch's prediction
    assert [e.step for e in env.path] == ["infer_ensemble.v1", "infer_ensemble.v2"]
    assert [(s, v) for s, _, _, v in rec.audited] == [
        ("infer_ensemble.v1", "v1"),
        ("infer_ensemble.v2", "v2"),
    ]


async def test_branches_run_at_once():
    gw = VersionedGateway({"v1": V1, "v2": V2}, delay_s=0.3)
    t0 = time.perf_counter()
    await parallel(gw).run_batch(
        [envelope("a"), envelope("b")], group(branch("v1", 900), branch("v2", 900))
    )
    assert time.perf_counter() - t0 < 0.55  # one call's time, not two
    assert len(gw.calls) == 2  # one call per branch for the whole batch


async def test_max_confidence_takes_the_surest_branch_as_it_is():
    gw = VersionedGateway({"v1": V1, "v2": V2})
    env = envelope()
    await parallel(gw).run_batch([env], group(branch("v1"), branch("v2"), merge="max_confidence"))
    assert env.context.prediction.model_version == "v2"
    assert env.context.prediction.confidence == pytest.approx(0.7)


async def test_join_all_a_branch_that_may_pass_retries_the_step():
    gw = VersionedGateway({"v1": V1, "v2": V2})
    gw.errors["v2"] = GatewayError(ErrorCode.OVERLOADED, "queue full", retryable=True)
    rec = Recorder()
    env = envelope()
    [outcome] = await parallel(gw, rec).run_batch([env], group(branch("v1"), branch("v2")))
    assert isinstance(outcome, RetryableError) and outcome.code == "OVERLOADED"
    assert [(s, st) for s, st, _, _ in rec.audited] == [
        ("infer_ensemble.v1", StepStatus.ok),
        ("infer_ensemble.v2", StepStatus.failed),
    ]


async def test_join_all_a_bad_record_in_a_branch_dead_letters_even_when_another_may_pass():
    gw = VersionedGateway({"v1": V1, "v2": V2})
    gw.errors["v1"] = GatewayError(ErrorCode.OVERLOADED, "queue full", retryable=True)
    gw.errors["v2"] = GatewayError(ErrorCode.INVALID_INPUT, "bad text")
    [outcome] = await parallel(gw).run_batch([envelope()], group(branch("v1"), branch("v2")))
    assert isinstance(outcome, BadRecord)
    assert outcome.error_class == ErrorClass.INFERENCE_INVALID_INPUT


async def test_join_all_a_degraded_branch_degrades_the_ticket_with_its_reason():
    gw = VersionedGateway({"v1": V1, "v2": V2})
    gw.errors["v2"] = GatewayError(ErrorCode.MODEL_UNAVAILABLE, "v2 not loaded", retryable=False)
    env = envelope()
    [outcome] = await parallel(gw).run_batch([env], group(branch("v1"), branch("v2")))
    assert outcome is None and outcome_of(outcome, env, "parallel") == Degraded()
    assert env.context.degraded and env.context.degraded_reason.startswith("v2: inference")


async def test_best_available_uses_the_branch_that_answered_and_marks_the_other_degraded():
    gw = VersionedGateway({"v1": V1, "v2": V2})
    gw.errors["v2"] = GatewayError(ErrorCode.OVERLOADED, "queue full", retryable=True)
    rec = Recorder()
    env = envelope()
    [outcome] = await parallel(gw, rec).run_batch(
        [env], group(branch("v1"), branch("v2"), join="best_available")
    )
    assert outcome is None and not env.context.degraded
    assert env.context.prediction.model_version == "v1"
    assert env.context.prediction.category == Category.billing
    [v2] = [e for e in env.path if e.step == "infer_ensemble.v2"]
    assert v2.status == StepStatus.degraded and v2.detail == "OVERLOADED: queue full"


async def test_best_available_with_no_branch_left_fails_as_inference_does():
    gw = VersionedGateway({"v1": V1, "v2": V2})
    for v in ("v1", "v2"):
        gw.errors[v] = GatewayError(ErrorCode.TIMEOUT, "slow", retryable=True)
    env = envelope()
    step = group(branch("v1"), branch("v2"), join="best_available")
    [outcome] = await parallel(gw).run_batch([env], step)
    assert isinstance(outcome, RetryableError)  # the runner retries, then degrades
    for v in ("v1", "v2"):
        gw.errors[v] = GatewayError(ErrorCode.MODEL_UNAVAILABLE, "down", retryable=False)
    env = envelope()
    [outcome] = await parallel(gw).run_batch([env], step)
    assert outcome is None and env.context.degraded and env.context.prediction is None


async def test_a_branch_past_its_own_timeout_fails_alone():
    class Stuck(Handler):
        async def run(self, env, step):
            await asyncio.sleep(5)

    gw = VersionedGateway({"v1": V1})
    slow = Step(name="slow", type="processor", handler="text_cleaner", timeout_ms=50)
    env = envelope()
    t0 = time.perf_counter()
    [outcome] = await parallel(gw, Recorder(), processor=Stuck()).run_batch(
        [env], group(branch("v1"), slow, join="best_available")
    )
    assert time.perf_counter() - t0 < 1
    assert outcome is None and env.context.prediction.model_version == "v1"
    [entry] = [e for e in env.path if e.step == "infer_ensemble.slow"]
    assert entry.status == StepStatus.degraded and entry.detail.startswith("TIMEOUT")
    [outcome] = await parallel(gw, processor=Stuck()).run_batch(
        [envelope()], group(branch("v1"), slow)
    )
    assert isinstance(outcome, RetryableError) and outcome.code == "TIMEOUT"


async def test_what_non_inference_branches_add_is_merged_into_the_ticket():
    class Features(Handler):
        async def run(self, env, step):
            env.context.features["tickets_1h"] = FeatureValue(value=3)

    gw = VersionedGateway({"v1": V1})
    tidy = Step(name="tidy", type="processor", handler="text_cleaner")
    feats = Step(name="stats", type="feature_lookup", views=["user_ticket_stats"])
    env = envelope()
    [outcome] = await parallel(gw, processor=ProcessorStep(), feature_lookup=Features()).run_batch(
        [env], group(branch("v1"), tidy, feats)
    )
    assert outcome is None
    assert env.context.clean_text == "the invoice is wrong"
    assert env.context.features["tickets_1h"].value == 3
    assert env.context.prediction.model_version == "v1"


async def test_a_ticket_degraded_before_the_step_is_not_a_branch_failure():
    gw = VersionedGateway({"v1": V1, "v2": V2})
    env = envelope()
    degrade(env, "WORKFLOW_DEADLINE: deadline passed")
    env.context.deadline_passed = True  # advice calls still run
    [outcome] = await parallel(gw).run_batch([env], group(branch("v1"), branch("v2")))
    assert outcome is None and env.context.prediction.model_version == "v1+v2"
    assert env.context.degraded_reason.startswith("WORKFLOW_DEADLINE")


def test_merge_of_one_prediction_is_itself_and_of_none_is_an_error():
    p = Prediction(
        category="billing", confidence=0.9, scores={}, model_name="m", model_version="v1"
    )
    assert merge_predictions([p]) is p
    with pytest.raises(ValueError):
        merge_predictions([])
    q = p.model_copy(
        update={"category": Category.account, "confidence": 0.5, "model_version": "v2"}
    )
    merged = merge_predictions([p, q])  # no score vectors: each counts as its label alone
    assert merged.category == Category.billing and merged.confidence == pytest.approx(0.45)


async def test_a_cascade_inside_a_branch_has_one_entry_under_the_group():
    from schemas.workflow import Cascade

    gw = VersionedGateway({"v1": scores(billing=0.5), "v2": V2})
    rec = Recorder()
    fast = Step(
        name="fast",
        type="inference_call",
        model="m",
        timeout_ms=300,
        cascade=Cascade(first="v1", then="v2", below=0.9),
    )
    env = envelope()
    [outcome] = await parallel(gw, rec).run_batch([env], group(fast))
    assert outcome is None and env.context.prediction.model_version == "v2"
    # the branch's one entry: a cascade adds none of its own (one entry per step)
    assert [e.step for e in env.path] == ["infer_ensemble.fast"]
