"""Issue 11: one ticket's bad content fails that ticket only, never its batch.

The inference step is driven against a gateway fake that validates each request with the
gateway's own parser (`parse_predict`), so a request holding one input the gateway refuses
is refused whole, as the real one does. Poisoned envelopes are built past validation, as a
record the decoders did not see (or a bug upstream) would carry them.
"""

from __future__ import annotations

from datetime import datetime, timezone

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agents.breaker import CircuitBreaker
from agents.errors import BadRecord
from agents.steps.handlers import InferenceStep, RuleEngineStep
from agents.steps.rules import RuleInput, apply_rules
from inference_gateway.errors import ErrorCode, GatewayError
from inference_gateway.server import parse_predict
from schemas.gateway import PredictOutput, PredictResponse
from schemas.tickets import (
    Category,
    Context,
    Envelope,
    ErrorClass,
    FeatureValue,
    Prediction,
    Ticket,
)
from schemas.workflow import Step

NOW = datetime.now(timezone.utc)
INFER = Step(name="infer", type="inference_call", model="ticket_classifier", timeout_ms=300)
RULES = Step(name="rules", type="rule_engine", rules=["refund_check", "score_threshold"])
PROPERTY = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


class ValidatingGateway:
    """Answers like the gateway: the whole request refused when any input is invalid."""

    def __init__(self, label: str = "billing") -> None:
        self.label = label
        self.calls = 0

    async def predict(self, model, inputs, timeout_ms, version=None):
        self.calls += 1
        payload = {"inputs": [i.model_dump(mode="json") for i in inputs], "timeout_ms": 300}
        try:
            body = orjson.dumps(payload)
        except TypeError as exc:  # as the real client answers it
            raise GatewayError(ErrorCode.INVALID_INPUT, str(exc)) from None
        request = parse_predict(body)
        outputs = [
            PredictOutput(id=i.id, label=self.label, confidence=0.9, scores={}, version="v1")
            for i in request.inputs
        ]
        return PredictResponse(model=model, version="v1", outputs=outputs, latency_ms=1.0)


def envelope(tid: str, text: str = "my invoice is wrong") -> Envelope:
    return Envelope(
        ticket=Ticket(ticket_id=tid, text=text, created_at=NOW),
        workflow="ticket_classify",
        workflow_version=1,
        step="infer",
        trace_id="a" * 32,
        arrival="0:1",
        started_at=datetime.now(timezone.utc),
    )


def poison(env: Envelope, kind: str) -> Envelope:
    """What a record past the decoders, or a bug upstream, could leave in a context."""
    if kind == "huge_int_feature":
        env.context.features["f"] = FeatureValue(value=2**70)
    elif kind == "long_clean_text":
        env.context.clean_text = "x" * 30_000
    elif kind == "object_feature":
        env.context.features["f"] = FeatureValue(value=object())
    return env


KINDS = ["huge_int_feature", "long_clean_text", "object_feature"]


@PROPERTY
@given(
    st.integers(min_value=1, max_value=300),
    st.data(),
    st.sampled_from(KINDS),
)
async def test_one_poisoned_ticket_fails_alone_and_the_breaker_never_counts_it(n, data, kind):
    bad = data.draw(st.integers(min_value=0, max_value=n - 1))
    envs = [envelope(f"t{i}") for i in range(n)]
    poison(envs[bad], kind)
    breaker = CircuitBreaker("t", min_calls=1)
    gateway = ValidatingGateway()
    outcomes = await InferenceStep(gateway, lambda _e: 2000, breaker).run_batch(envs, INFER)
    failed = [i for i, o in enumerate(outcomes) if o is not None]
    assert failed == [bad]
    assert isinstance(outcomes[bad], BadRecord)
    assert outcomes[bad].error_class == ErrorClass.INFERENCE_INVALID_INPUT
    assert all(e.context.prediction is not None for i, e in enumerate(envs) if i != bad)
    assert breaker.state.name == "CLOSED"  # invalid input is no gateway failure


async def test_a_batch_the_gateway_refuses_whole_is_bisected_to_its_bad_ticket():
    class RefusesOne(ValidatingGateway):
        async def predict(self, model, inputs, timeout_ms, version=None):
            if any(i.id == "t77" for i in inputs):
                self.calls += 1
                raise GatewayError(ErrorCode.INVALID_INPUT, "inputs.77.text: refused")
            return await super().predict(model, inputs, timeout_ms, version)

    envs = [envelope(f"t{i}") for i in range(256)]
    gateway = RefusesOne()
    outcomes = await InferenceStep(gateway, lambda _e: 2000).run_batch(envs, INFER)
    assert [i for i, o in enumerate(outcomes) if o is not None] == [77]
    assert gateway.calls <= 1 + 2 * 8


async def test_an_answer_that_is_no_prediction_degrades_its_ticket_only():
    class OneOddLabel(ValidatingGateway):
        async def predict(self, model, inputs, timeout_ms, version=None):
            resp = await super().predict(model, inputs, timeout_ms, version)
            resp.outputs[1].label = "not-a-category"
            return resp

    envs = [envelope(f"t{i}") for i in range(3)]
    outcomes = await InferenceStep(OneOddLabel(), lambda _e: 2000).run_batch(envs, INFER)
    assert outcomes == [None, None, None]
    assert envs[1].context.degraded and envs[1].context.prediction is None
    assert not envs[0].context.degraded and envs[0].context.prediction is not None


contexts = st.builds(
    Context,
    clean_text=st.none() | st.text(max_size=300),
    features=st.dictionaries(
        st.text(max_size=8), st.builds(FeatureValue, value=st.none() | st.integers()), max_size=3
    ),
    prediction=st.none()
    | st.builds(
        Prediction,
        category=st.sampled_from(Category),
        confidence=st.floats(min_value=0, max_value=1),
        scores=st.just({}),
        model_name=st.text(max_size=8),
        model_version=st.text(max_size=8),
    ),
    degraded=st.booleans(),
    degraded_reason=st.none() | st.text(max_size=40),
    deadline_passed=st.booleans(),
)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=2000), contexts, st.floats(min_value=0, max_value=1))
def test_rules_decide_a_route_for_any_schema_valid_context(text, context, threshold):
    outcome = apply_rules(["refund_check", "score_threshold"], RuleInput(text, context, threshold))
    assert outcome.route in {"auto_classify", "manual_review", "after_sales"}


async def test_the_rule_step_settles_a_mixed_batch_per_ticket():
    envs = [envelope(f"t{i}", text) for i, text in enumerate(["refund please", "\ufdfa" * 9])]
    envs[1].context.prediction = None
    assert await RuleEngineStep().run_batch(envs, RULES) == [None, None]
    assert [e.context.rule.route for e in envs] == ["after_sales", "manual_review"]


async def test_a_handler_that_raises_for_one_ticket_fails_that_ticket_only():
    class Fussy(RuleEngineStep):
        async def run(self, env, step):
            if env.ticket.ticket_id == "t1":
                raise ValueError("this one")
            await super().run(env, step)

    envs = [envelope(f"t{i}") for i in range(3)]
    outcomes = await Fussy().run_batch(envs, RULES)
    assert outcomes[0] is None and outcomes[2] is None and isinstance(outcomes[1], ValueError)
