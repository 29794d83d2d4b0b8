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
    """Answers every input, each output's version from `versions` (by id, else none)."""

    def __init__(
        self, error: GatewayError | None = None, versions: dict[str, str] | None = None
    ) -> None:
        self.error = error
        self.versions = versions or {}
        self.calls: list[list[str]] = []
        self.timeouts: list[int] = []

    async def predict(self, model, inputs, timeout_ms, version=None):
        self.calls.append([i.id for i in inputs])
        self.timeouts.append(timeout_ms)
        if self.error:
            raise self.error
        return PredictResponse(
            model=model,
            version="v1",
            latency_ms=1.0,
            outputs=[
                PredictOutput(
                    id=i.id,
                    label="billing",
                    confidence=0.9,
                    scores={"billing": 0.9},
                    version=self.versions.get(i.id),
                )
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


async def test_a_batch_is_one_request_each_ticket_named_by_its_own_version():
    gw = FakeGateway(versions={"a": "v1", "b": "v2"})
    envs = [envelope("a"), envelope("b"), envelope("c")]
    outcomes = await InferenceStep(gw, DEADLINE).run_batch(envs, STEP)
    assert outcomes == [None, None, None]
    assert gw.calls == [["a", "b", "c"]]
    # each ticket's own output's version; the response's when the output names none
    assert [e.context.prediction.model_version for e in envs] == ["v1", "v2", "v1"]


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


class CountingBreaker(CircuitBreaker):
    """A breaker that counts its checks and records."""

    def __init__(self, **kwargs) -> None:
        super().__init__("t", **kwargs)
        self.checks, self.records = 0, []

    def allow(self) -> bool:
        self.checks += 1
        return super().allow()

    def record(self, ok: bool, n: int = 1) -> None:
        self.records.append(ok)
        super().record(ok, n)


class RefusesBad(FakeGateway):
    """A gateway that answers 400 for the whole request when any input's id is "bad"."""

    async def predict(self, model, inputs, timeout_ms, version=None):
        if any(i.id == "bad" for i in inputs):
            self.calls.append([i.id for i in inputs])
            raise GatewayError(ErrorCode.INVALID_INPUT, "inputs.1.text: bad")
        return await super().predict(model, inputs, timeout_ms, version)


async def test_the_breaker_is_checked_and_recorded_once_per_call():
    breaker = CountingBreaker()
    envs = [envelope(t) for t in "abcd"]
    await InferenceStep(FakeGateway(), DEADLINE, breaker).run_batch(envs, STEP)
    assert (breaker.checks, breaker.records) == (1, [True])


async def test_an_open_breaker_degrades_the_whole_batch_without_calling():
    gw, breaker = FakeGateway(), CountingBreaker(min_calls=1)
    breaker.record(ok=False)
    envs = [envelope(t) for t in "abc"]
    outcomes = await InferenceStep(gw, DEADLINE, breaker).run_batch(envs, STEP)
    assert outcomes == [None] * 3 and gw.calls == [] and breaker.checks == 1
    assert all(e.context.degraded_reason.startswith("CIRCUIT_OPEN") for e in envs)


@pytest.mark.parametrize(
    ("code", "expected"),
    [(ErrorCode.OVERLOADED, RetryableError), (ErrorCode.TIMEOUT, RetryableError)],
)
async def test_a_failed_batch_call_fails_each_ticket_alike(code, expected):
    breaker = CountingBreaker()
    envs = [envelope(t) for t in "abc"]
    gw = FakeGateway(GatewayError(code, "x"))
    outcomes = await InferenceStep(gw, DEADLINE, breaker).run_batch(envs, STEP)
    assert all(isinstance(o, expected) and o.code == code.value for o in outcomes)
    assert len({id(o) for o in outcomes}) == 3  # one error each, not one shared
    assert gw.calls == [["a", "b", "c"]] and breaker.records == [False]


async def test_an_internal_error_degrades_the_whole_batch():
    envs = [envelope(t) for t in "ab"]
    gw = FakeGateway(GatewayError(ErrorCode.INTERNAL, "boom"))
    assert await InferenceStep(gw, DEADLINE).run_batch(envs, STEP) == [None, None]
    assert all("INTERNAL" in e.context.degraded_reason for e in envs)


async def test_invalid_input_in_a_batch_is_split_until_the_bad_ticket_is_alone():
    gw, breaker = RefusesBad(), CountingBreaker()
    envs = [envelope("a"), envelope("bad"), envelope("c")]
    outcomes = await InferenceStep(gw, DEADLINE, breaker).run_batch(envs, STEP)
    assert outcomes[0] is None and outcomes[2] is None
    assert isinstance(outcomes[1], BadRecord)
    assert outcomes[1].error_class == ErrorClass.INFERENCE_INVALID_INPUT
    assert gw.calls[0] == ["a", "bad", "c"]
    assert sorted(gw.calls[1:]) == [["a"], ["bad"], ["bad", "c"], ["c"]]
    assert envs[0].context.prediction is not None and envs[1].context.prediction is None
    # invalid input is the caller's fault, not the gateway's: every call counts as ok
    assert breaker.checks == 5 and breaker.records == [True] * 5


async def test_one_bad_ticket_among_many_costs_a_few_calls_not_one_per_ticket():
    gw = RefusesBad()
    envs = [envelope(f"t{i}") for i in range(200)]
    envs[137] = envelope("bad")
    outcomes = await InferenceStep(gw, DEADLINE).run_batch(envs, STEP)
    assert [i for i, o in enumerate(outcomes) if o is not None] == [137]
    assert len(gw.calls) <= 2 * 8 + 1  # two calls per halving, log2(200) < 8 halvings


async def test_the_budget_is_the_smallest_of_the_batch():
    gw = FakeGateway()
    envs = [envelope("fresh"), envelope("old", age_ms=1900)]
    await InferenceStep(gw, DEADLINE).run_batch(envs, STEP)
    assert gw.calls == [["fresh", "old"]]
    assert 50 <= gw.timeouts[0] <= 100  # the old one's ~100 ms left, not the step's 300


async def test_a_ticket_without_time_left_times_out_and_stays_out_of_the_call():
    gw, breaker = FakeGateway(), CountingBreaker()
    envs = [envelope("late", age_ms=2500), envelope("ok")]
    outcomes = await InferenceStep(gw, DEADLINE, breaker).run_batch(envs, STEP)
    assert isinstance(outcomes[0], RetryableError) and outcomes[0].code == "TIMEOUT"
    assert outcomes[1] is None and gw.calls == [["ok"]] and gw.timeouts == [300]
    assert breaker.records == [True]


async def test_a_batch_with_no_time_left_makes_no_call_and_no_breaker_record():
    gw, breaker = FakeGateway(), CountingBreaker()
    outcomes = await InferenceStep(gw, DEADLINE, breaker).run_batch(
        [envelope("late", age_ms=2500)], STEP
    )
    assert isinstance(outcomes[0], RetryableError)
    assert gw.calls == [] and breaker.checks == 0 and breaker.records == []


async def test_degraded_tickets_are_skipped_unless_past_their_deadline():
    gw = FakeGateway()
    skipped, advised, fresh = envelope("s"), envelope("p", age_ms=5000), envelope("f")
    skipped.context.degraded = True
    advised.context.degraded, advised.context.deadline_passed = True, True
    outcomes = await InferenceStep(gw, DEADLINE).run_batch([skipped, advised, fresh], STEP)
    assert outcomes == [None] * 3 and sorted(gw.calls) == [["f"], ["p"]]
    assert skipped.context.prediction is None and advised.context.prediction is not None


async def test_advice_past_the_deadline_is_not_squeezed_into_anothers_remainder():
    gw = FakeGateway()
    late, advised = envelope("late", age_ms=1950), envelope("p", age_ms=5000)
    advised.context.degraded, advised.context.deadline_passed = True, True
    await InferenceStep(gw, DEADLINE).run_batch([late, advised], STEP)
    timeouts = dict(zip((c[0] for c in gw.calls), gw.timeouts, strict=True))
    assert timeouts["p"] == 300 and timeouts["late"] <= 50


async def test_a_large_batch_is_chunked_to_at_most_256_inputs_a_call():
    gw, breaker = FakeGateway(), CountingBreaker()
    envs = [envelope(f"t{i}") for i in range(600)]
    outcomes = await InferenceStep(gw, DEADLINE, breaker).run_batch(envs, STEP)
    assert outcomes == [None] * 600
    assert sorted(len(c) for c in gw.calls) == [88, 256, 256]
    assert sorted(i for c in gw.calls for i in c) == sorted(e.ticket.ticket_id for e in envs)
    assert breaker.checks == 3 and breaker.records == [True] * 3


async def test_an_answer_that_does_not_line_up_degrades_as_internal():
    class Short(FakeGateway):
        async def predict(self, model, inputs, timeout_ms, version=None):
            resp = await super().predict(model, inputs, timeout_ms, version)
            return resp.model_copy(update={"outputs": resp.outputs[:1]})

    breaker = CountingBreaker()
    envs = [envelope("a"), envelope("b")]
    assert await InferenceStep(Short(), DEADLINE, breaker).run_batch(envs, STEP) == [None, None]
    assert all("INTERNAL" in e.context.degraded_reason for e in envs)
    assert envs[0].context.prediction is None and breaker.records == [False]


async def test_run_handles_one_envelope_and_raises_its_failure():
    env = envelope("a")
    await InferenceStep(FakeGateway(versions={"a": "v2"}), DEADLINE).run(env, STEP)
    assert env.context.prediction.model_version == "v2"
    failing = InferenceStep(FakeGateway(GatewayError(ErrorCode.OVERLOADED, "x")), DEADLINE)
    with pytest.raises(RetryableError):
        await failing.run(envelope("b"), STEP)
