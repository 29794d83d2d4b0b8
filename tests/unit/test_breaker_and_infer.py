from datetime import datetime, timedelta, timezone

import pytest

from agents.breaker import CircuitBreaker, State
from agents.errors import BadRecord, RetryableError
from agents.steps.handlers import InferenceStep
from inference_gateway.errors import GatewayError
from schemas.gateway import ErrorCode, PredictOutput, PredictResponse
from schemas.tickets import Envelope, ErrorClass, Ticket
from schemas.workflow import Step


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_breaker_opens_above_half_failures_with_volume_then_probes_and_closes():
    clock = Clock()
    b = CircuitBreaker("t", min_calls=10, cooldown_s=5, clock=clock)
    for _ in range(9):
        b.record(ok=False)
    assert b.state == State.CLOSED  # not enough volume yet
    b.record(ok=True)
    b.record(ok=False)
    assert b.state == State.OPEN and not b.allow()
    clock.now += 5
    assert b.allow() and b.state == State.HALF_OPEN
    assert not b.allow()  # one probe at a time
    b.record(ok=False)
    assert b.state == State.OPEN
    clock.now += 5
    assert b.allow()
    b.record(ok=True)
    assert b.state == State.CLOSED and b.allow()


def test_breaker_forgets_failures_older_than_its_window():
    clock = Clock()
    b = CircuitBreaker("t", min_calls=4, window_s=10, clock=clock)
    for _ in range(3):
        b.record(ok=False)
    clock.now += 11
    b.record(ok=False)
    b.record(ok=True)
    assert b.state == State.CLOSED


class FakeGateway:
    def __init__(self, error: GatewayError | None = None) -> None:
        self.error = error
        self.calls: list[list[str]] = []

    async def predict(self, model, inputs, timeout_ms, version=None):
        self.calls.append([i.id for i in inputs])
        if self.error:
            raise self.error
        return PredictResponse(
            model=model,
            version="v1",
            latency_ms=1.0,
            outputs=[
                PredictOutput(id=i.id, label="billing", confidence=0.9, scores={"billing": 0.9})
                for i in inputs
            ],
        )


def envelope(tid: str, age_ms: float = 0) -> Envelope:
    now = datetime.now(timezone.utc)
    return Envelope(
        ticket=Ticket(ticket_id=tid, text="invoice wrong", created_at=now),
        workflow="w",
        workflow_version=1,
        step="infer",
        trace_id="a" * 32,
        arrival="0:1",
        started_at=now - timedelta(milliseconds=age_ms),
    )


def DEADLINE(_env) -> int:
    return 2000


STEP = Step(name="infer", type="inference_call", model="ticket_classifier", timeout_ms=300)


async def test_each_ticket_is_its_own_request_so_canaries_stay_sticky():
    gw = FakeGateway()
    envs = [envelope("a"), envelope("b")]
    outcomes = await InferenceStep(gw, DEADLINE).run_batch(envs, STEP)
    assert outcomes == [None, None]
    assert sorted(gw.calls) == [["a"], ["b"]]
    assert envs[0].context.prediction.model_version == "v1"


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        (ErrorCode.INVALID_INPUT, BadRecord),
        (ErrorCode.OVERLOADED, RetryableError),
        (ErrorCode.TIMEOUT, RetryableError),
        (ErrorCode.MODEL_UNAVAILABLE, RetryableError),
    ],
)
async def test_gateway_errors_map_to_dead_letter_or_retry(code, expected):
    env = envelope("a")
    [outcome] = await InferenceStep(FakeGateway(GatewayError(code, "x")), DEADLINE).run_batch(
        [env], STEP
    )
    assert isinstance(outcome, expected)
    if expected is BadRecord:
        assert outcome.error_class == ErrorClass.INFERENCE_INVALID_INPUT


async def test_internal_error_degrades_at_once():
    env = envelope("a")
    [outcome] = await InferenceStep(
        FakeGateway(GatewayError(ErrorCode.INTERNAL, "boom")), DEADLINE
    ).run_batch([env], STEP)
    assert outcome is None and env.context.degraded and "INTERNAL" in env.context.degraded_reason


async def test_open_breaker_degrades_without_calling():
    gw = FakeGateway()
    step = InferenceStep(gw, DEADLINE, CircuitBreaker("t", min_calls=1))
    step.breaker.record(ok=False)
    env = envelope("a")
    await step.run_batch([env], STEP)
    assert gw.calls == [] and env.context.degraded_reason.startswith("CIRCUIT_OPEN")


async def test_past_the_deadline_one_call_still_gives_advice():
    gw = FakeGateway()
    env = envelope("a", age_ms=5000)
    env.context.degraded, env.context.deadline_passed = True, True
    await InferenceStep(gw, DEADLINE).run_batch([env], STEP)
    assert gw.calls == [["a"]] and env.context.prediction is not None


def test_an_idle_open_breaker_reports_half_open_after_its_cooldown():
    clock = Clock()
    b = CircuitBreaker("t", min_calls=1, cooldown_s=5, clock=clock)
    b.record(ok=False)
    clock.now += 5
    b.refresh()
    assert b.state == State.HALF_OPEN


def test_a_lost_probe_is_replaced_after_a_cooldown():
    clock = Clock()
    b = CircuitBreaker("t", min_calls=1, cooldown_s=5, clock=clock)
    b.record(ok=False)
    clock.now += 5
    assert b.allow()  # the probe, which never reports back
    assert not b.allow()
    clock.now += 5
    assert b.allow()
