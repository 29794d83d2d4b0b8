"""Issue 14 part 4: cascade inference, the cheap version first, the other only when unsure."""

from __future__ import annotations

import pytest

from agents.errors import RetryableError
from agents.steps.handlers import InferenceStep
from inference_gateway.errors import GatewayError
from schemas.gateway import ErrorCode, PredictOutput, PredictResponse
from schemas.tickets import Category, Envelope, StepStatus
from schemas.workflow import Cascade, Step
from tests.unit.step_fakes import Recorder, scores
from tests.unit.step_fakes import envelope as fake_envelope


def envelope(tid: str) -> Envelope:
    return fake_envelope(tid, "infer")


class PerTicketGateway:
    """Answers `(version, ticket_id)` with its scores; records each call's version and ids."""

    def __init__(self, answers: dict[tuple[str, str], dict[str, float]]) -> None:
        self.answers = answers
        self.calls: list[tuple[str | None, list[str]]] = []
        self.errors: dict[str, GatewayError] = {}

    async def predict(self, model, inputs, timeout_ms, version=None):
        self.calls.append((version, [i.id for i in inputs]))
        if version in self.errors:
            raise self.errors[version]
        outputs = []
        for i in inputs:
            vector = self.answers[(version, i.id)]
            label = max(vector, key=vector.get)
            outputs.append(
                PredictOutput(
                    id=i.id, label=label, confidence=vector[label], scores=vector, version=version
                )
            )
        return PredictResponse(model=model, version=version, outputs=outputs, latency_ms=1.0)


STEP = Step(
    name="infer",
    type="inference_call",
    model="ticket_classifier",
    timeout_ms=300,
    cascade=Cascade(first="v1", then="v2", below=0.85),
)
SURE = scores(billing=0.95)
UNSURE = scores(billing=0.55, account=0.35)
V2_SAYS_ACCOUNT = scores(account=0.9)


def deadline(_env) -> int:
    return 2000


async def test_a_confident_first_answer_decides_without_the_second_version():
    gw = PerTicketGateway({("v1", "a"): SURE})
    rec = Recorder()
    env = envelope("a")
    assert await InferenceStep(gw, deadline, record=rec).run_batch([env], STEP) == [None]
    assert gw.calls == [("v1", ["a"])]
    assert env.context.prediction.model_version == "v1"
    assert [(e.step, e.status, e.detail) for e in env.path] == [
        ("infer.v1", StepStatus.ok, "decided")
    ]


async def test_only_the_unsure_tickets_of_a_batch_go_to_the_second_version():
    gw = PerTicketGateway({("v1", "a"): SURE, ("v1", "b"): UNSURE, ("v2", "b"): V2_SAYS_ACCOUNT})
    rec = Recorder()
    a, b = envelope("a"), envelope("b")
    assert await InferenceStep(gw, deadline, record=rec).run_batch([a, b], STEP) == [None, None]
    assert gw.calls == [("v1", ["a", "b"]), ("v2", ["b"])]
    assert a.context.prediction.model_version == "v1"
    # the version that decided is the ticket's model_version
    assert b.context.prediction.model_version == "v2"
    assert b.context.prediction.category == Category.account
    assert [e.step for e in b.path] == ["infer.v1", "infer.v2"]
    assert b.path[0].detail == "confidence 0.550 below 0.85: asked v2"
    # each call audited with the prediction it made
    assert [(s, v) for s, _, _, v in rec.audited if s.startswith("infer")] == [
        ("infer.v1", "v1"),
        ("infer.v1", "v1"),
        ("infer.v2", "v2"),
    ]


async def test_a_failed_second_call_fails_the_step_as_inference_does():
    gw = PerTicketGateway({("v1", "b"): UNSURE})
    gw.errors["v2"] = GatewayError(ErrorCode.OVERLOADED, "queue full", retryable=True)
    rec = Recorder()
    env = envelope("b")
    [outcome] = await InferenceStep(gw, deadline, record=rec).run_batch([env], STEP)
    assert isinstance(outcome, RetryableError) and outcome.code == "OVERLOADED"
    assert [(e.step, e.status) for e in env.path] == [
        ("infer.v1", StepStatus.ok),
        ("infer.v2", StepStatus.failed),
    ]


async def test_a_degraded_first_call_is_not_escalated():
    gw = PerTicketGateway({})
    gw.errors["v1"] = GatewayError(ErrorCode.MODEL_UNAVAILABLE, "gone", retryable=False)
    env = envelope("c")
    assert await InferenceStep(gw, deadline).run_batch([env], STEP) == [None]
    assert gw.calls == [("v1", ["c"])] and env.context.degraded


@pytest.mark.parametrize("below", [0.5, 0.96])
async def test_the_threshold_decides_who_is_unsure(below):
    gw = PerTicketGateway({("v1", "a"): SURE, ("v2", "a"): V2_SAYS_ACCOUNT})
    step = STEP.model_copy(update={"cascade": Cascade(first="v1", then="v2", below=below)})
    env = envelope("a")
    await InferenceStep(gw, deadline).run_batch([env], step)
    assert env.context.prediction.model_version == ("v2" if below > 0.95 else "v1")


async def test_a_pinned_version_is_sent_with_every_call():
    gw = PerTicketGateway({("v2", "a"): SURE})
    step = Step(name="infer", type="inference_call", model="m", version="v2")
    env = envelope("a")
    await InferenceStep(gw, deadline).run_batch([env], step)
    assert gw.calls == [("v2", ["a"])] and env.context.prediction.model_version == "v2"
