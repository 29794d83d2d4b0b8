"""Issue 14 part 4: cascade inference, the cheap version first, the other only when unsure."""

from __future__ import annotations

import pytest

from agents.steps.cascade import cascade_detail
from agents.steps.handlers import InferenceStep
from inference_gateway.errors import GatewayError
from schemas.gateway import ErrorCode, PredictOutput, PredictResponse
from schemas.tickets import Category, Envelope
from schemas.workflow import Cascade, Step
from tests.unit.step_fakes import envelope as fake_envelope
from tests.unit.step_fakes import scores


def envelope(tid: str) -> Envelope:
    return fake_envelope(tid, "infer")


class PerTicketGateway:
    """Answers `(version, ticket_id)` with its scores; records each call's version and ids."""

    def __init__(self, answers: dict[tuple[str, str], dict[str, float]]) -> None:
        self.answers = answers
        self.calls: list[tuple[str | None, list[str]]] = []
        self.errors: dict[str, GatewayError] = {}
        self.versions: dict[str, str] = {}  # the routed version that answers an id

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
                    id=i.id,
                    label=label,
                    confidence=vector[label],
                    scores=vector,
                    version=self.versions.get(i.id, version or "v1"),
                )
            )
        answered = version or "v1"
        return PredictResponse(model=model, version=answered, outputs=outputs, latency_ms=1.0)


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
    env = envelope("a")
    assert await InferenceStep(gw, deadline).run_batch([env], STEP) == [None]
    assert gw.calls == [("v1", ["a"])]
    assert env.context.prediction.model_version == "v1"
    # the step's one entry is the runner's: the cascade adds none of its own
    assert env.path == []
    assert cascade_detail(env, STEP.cascade) == "v1 decided"


async def test_only_the_unsure_tickets_of_a_batch_go_to_the_second_version():
    gw = PerTicketGateway({("v1", "a"): SURE, ("v1", "b"): UNSURE, ("v2", "b"): V2_SAYS_ACCOUNT})
    a, b = envelope("a"), envelope("b")
    assert await InferenceStep(gw, deadline).run_batch([a, b], STEP) == [None, None]
    assert gw.calls == [("v1", ["a", "b"]), ("v2", ["b"])]
    assert a.context.prediction.model_version == "v1"
    # the version that decided is the ticket's model_version
    assert b.context.prediction.model_version == "v2"
    assert b.context.prediction.category == Category.account
    assert a.path == b.path == []
    assert cascade_detail(b, STEP.cascade) == "below 0.85: v2 decided"


@pytest.mark.parametrize("retryable", [True, False])
async def test_a_failed_second_call_leaves_the_first_answer_standing(retryable):
    gw = PerTicketGateway({("v1", "b"): UNSURE})
    code = ErrorCode.OVERLOADED if retryable else ErrorCode.MODEL_UNAVAILABLE
    gw.errors["v2"] = GatewayError(code, "v2 is not loaded", retryable=retryable)
    env = envelope("b")
    step = InferenceStep(gw, deadline)
    assert await step.run_batch([env], STEP) == [None]
    assert gw.calls == [("v1", ["b"]), ("v2", ["b"])]
    pred = env.context.prediction
    assert (pred.model_version, pred.category, pred.confidence) == ("v1", Category.billing, 0.55)
    assert not env.context.degraded and env.context.degraded_reason is None
    assert cascade_detail(env, STEP.cascade) == "below 0.85, v2 did not answer: v1 decided"


async def test_second_opinions_that_fail_do_not_open_the_breaker_of_first_calls():
    gw = PerTicketGateway({("v1", str(i)): UNSURE for i in range(40)})
    gw.errors["v2"] = GatewayError(ErrorCode.MODEL_UNAVAILABLE, "gone", retryable=True)
    step = InferenceStep(gw, deadline)
    for i in range(40):  # every batch escalates, and every escalation fails
        assert await step.run_batch([envelope(str(i))], STEP) == [None]
    assert step.breaker.allow()
    assert sum(v == "v1" for v, _ in gw.calls) == 40


async def test_without_first_the_gateway_routes_the_first_call():
    routed = STEP.model_copy(update={"cascade": Cascade(then="v2", below=0.85)})
    gw = PerTicketGateway({(None, "a"): SURE, (None, "b"): UNSURE, ("v2", "b"): V2_SAYS_ACCOUNT})
    a, b = envelope("a"), envelope("b")
    assert await InferenceStep(gw, deadline).run_batch([a, b], routed) == [None, None]
    assert gw.calls == [(None, ["a", "b"]), ("v2", ["b"])]
    assert b.context.prediction.model_version == "v2"


async def test_a_ticket_routed_to_the_second_version_is_not_asked_again():
    routed = STEP.model_copy(update={"cascade": Cascade(then="v2", below=0.85)})
    gw = PerTicketGateway({(None, "a"): UNSURE})
    gw.versions = {"a": "v2"}
    env = envelope("a")
    await InferenceStep(gw, deadline).run_batch([env], routed)
    assert gw.calls == [(None, ["a"])]


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
