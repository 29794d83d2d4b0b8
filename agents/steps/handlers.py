"""Handlers of the step types after `validator`: each reads and extends envelopes' context.

Steps work on a batch of envelopes at a time (what one poll of the step's topic gave);
`run_batch` returns, for each envelope, None on success or the exception it failed with.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence

import orjson
from pydantic import ValidationError

from agents.breaker import CircuitBreaker
from agents.errors import BadRecord, RetryableError
from agents.steps.cascade import run_cascade
from agents.steps.clean import clean_text
from agents.steps.refund_intent import load_head
from agents.steps.rules import RULES, RuleInput, apply_rules
from feature_jobs.reader import OnlineFeatureReader
from inference_gateway.client import GatewayClient
from inference_gateway.errors import GatewayError
from schemas.gateway import ErrorCode, PredictInput, PredictOutput, PredictResponse
from schemas.tickets import Category, Envelope, ErrorClass, Prediction
from schemas.workflow import Step

log = logging.getLogger(__name__)
Outcomes = list[BaseException | None]


class Handler:
    """Base: a per-envelope `run`, applied to a batch concurrently."""

    async def run(self, env: Envelope, step: Step) -> None:
        raise NotImplementedError

    async def run_batch(self, envs: Sequence[Envelope], step: Step) -> Outcomes:
        results = await asyncio.gather(*(self.run(e, step) for e in envs), return_exceptions=True)
        return list(results)


Processor = Callable[[Envelope], Awaitable[None]]


async def text_cleaner(env: Envelope) -> None:
    env.context.clean_text = clean_text(env.ticket.text)


PROCESSORS: dict[str, Processor] = {"text_cleaner": text_cleaner}
KNOWN_RULES = frozenset(RULES)


class ProcessorStep(Handler):
    async def run(self, env: Envelope, step: Step) -> None:
        await PROCESSORS[step.handler or ""](env)


class FeatureLookupStep(Handler):
    def __init__(self, reader: OnlineFeatureReader) -> None:
        self._reader = reader

    async def run(self, env: Envelope, step: Step) -> None:
        timeout_s = (step.timeout_ms or 800) / 1000
        for view in step.views:
            env.context.features.update(
                await self._reader.read(view, env.ticket.user_id, timeout_s)
            )


class RuleEngineStep(Handler):
    async def run(self, env: Envelope, step: Step) -> None:
        text = env.context.clean_text or env.ticket.text
        band = step.intent_band
        head = load_head() if band is not None else None
        pred = env.context.prediction
        intent = head.score(text, pred) if head and pred and not env.context.degraded else None
        data = RuleInput(
            text,
            env.context,
            step.threshold,
            step.after_sales_threshold,
            ticket_id=env.ticket.ticket_id,
            sample_share=step.sample_share,
            intent=intent,
            intent_band=band,
        )
        env.context.rule = apply_rules(step.rules, data)


def remaining_ms(env: Envelope, deadline_ms: int) -> float:
    elapsed = (time.time() - env.started_at.timestamp()) * 1000
    return deadline_ms - elapsed


def degrade(env: Envelope, reason: str) -> None:
    env.context.degraded = True
    env.context.degraded_reason = reason


# inputs per gateway call: a quarter of the gateway's 1,024 per request, so a large poll
# becomes a few calls whose bodies and answers stay small and can overlap
MAX_INPUTS_PER_CALL = 256


class InferenceStep(Handler):
    """One gateway call per batch of tickets (chunks of MAX_INPUTS_PER_CALL), behind a breaker.

    The gateway routes each input by its own id, so canaries stay sticky per ticket however
    the tickets are batched; one call per batch instead of one per ticket spares the worker
    and the gateway an HTTP request, its JSON and its batcher entry per ticket (tickets past
    their workflow deadline, called for advice, go in a call of their own). Each call is
    checked against the breaker once and recorded once; its budget is the smallest of its
    tickets'. An input this side can already tell is invalid (see `predict_input`) never
    joins a call; the gateway refuses a whole request for one bad input (INVALID_INPUT, 400),
    so such a call is split in halves until the bad ticket is alone (about 2 log2 n calls
    for one bad ticket among n), and only it is dead-lettered. Neither counts against the
    breaker: invalid input is the caller's fault, not the gateway's.
    """

    def __init__(
        self,
        client: GatewayClient,
        deadline_ms: Callable[[Envelope], int],
        breaker: CircuitBreaker | None = None,
    ) -> None:
        self._client = client
        self._deadline_ms = deadline_ms  # of the ticket's own workflow version
        self.breaker = breaker or CircuitBreaker("inference_gateway")
        # a cascade's second opinion is best-effort: its failures must not open the breaker
        # that guards every ticket's first call
        self.second_breaker = CircuitBreaker("inference_gateway_cascade")

    async def run_batch(self, envs: Sequence[Envelope], step: Step) -> Outcomes:
        if step.cascade is not None:
            return await run_cascade(self._run_batch, self._run_second, envs, step)
        return await self._run_batch(envs, step)

    async def run(self, env: Envelope, step: Step) -> None:
        [outcome] = await self.run_batch([env], step)
        if outcome is not None:
            raise outcome

    async def _run_second(self, envs: Sequence[Envelope], step: Step) -> Outcomes:
        return await self._run_batch(envs, step, self.second_breaker)

    async def _run_batch(
        self, envs: Sequence[Envelope], step: Step, breaker: CircuitBreaker | None = None
    ) -> Outcomes:
        outcomes: Outcomes = [None] * len(envs)
        # past its deadline a ticket is degraded, but still gets one call within the step's
        # timeout: reviewers then see the model's advice and the result names its version
        todo = [
            i
            for i, env in enumerate(envs)
            if not env.context.degraded or env.context.deadline_passed
        ]
        # a ticket past its deadline gets the step's whole timeout (advice only), the others
        # their deadline's remainder: sharing a call, the advice would get the smallest
        # remainder and often time out, so the two kinds go in separate calls
        kinds = [
            [i for i in todo if not envs[i].context.deadline_passed],
            [i for i in todo if envs[i].context.deadline_passed],
        ]
        chunks = [
            kind[k : k + MAX_INPUTS_PER_CALL]
            for kind in kinds
            for k in range(0, len(kind), MAX_INPUTS_PER_CALL)
        ]
        results = await asyncio.gather(
            *(self._call([envs[i] for i in chunk], step, breaker) for chunk in chunks)
        )
        for chunk, result in zip(chunks, results, strict=True):
            for i, outcome in zip(chunk, result, strict=True):
                outcomes[i] = outcome
        return outcomes

    async def _call(
        self, envs: list[Envelope], step: Step, breaker: CircuitBreaker | None = None
    ) -> Outcomes:
        """One gateway call for `envs` (those with time left), their outcomes in order."""
        outcomes: Outcomes = [None] * len(envs)
        # under 1 ms is no time at all (and timeout_ms 0 would be refused as invalid input)
        late = GatewayError(ErrorCode.TIMEOUT, "no time left in the workflow deadline")
        calling: list[int] = []
        items: list[PredictInput] = []
        budgets: list[float] = []
        for i, env in enumerate(envs):
            budget = self._budget(env, step)
            if budget < 1:
                outcomes[i] = self._failure(env, late)
                continue
            try:
                items.append(predict_input(env))
            except BadRecord as exc:  # refused here, so it cannot spoil the others' call
                outcomes[i] = exc
                continue
            calling.append(i)
            budgets.append(budget)
        if not calling:
            return outcomes  # no call, so nothing for the breaker to count
        called = [envs[i] for i in calling]
        answered = await self._guarded(called, items, min(budgets), step, breaker or self.breaker)
        for i, outcome in zip(calling, answered, strict=True):
            outcomes[i] = outcome
        return outcomes

    async def _guarded(
        self,
        envs: list[Envelope],
        items: list[PredictInput],
        budget_ms: float,
        step: Step,
        breaker: CircuitBreaker,
    ) -> Outcomes:
        """The call behind the breaker: one check, one record; predictions set on success."""
        if not breaker.allow():
            for env in envs:
                degrade(env, "CIRCUIT_OPEN: inference gateway failing, call skipped")
            return [None] * len(envs)
        try:
            resp = await self._predict(items, budget_ms, step)
        except GatewayError as exc:
            breaker.record(ok=exc.code == ErrorCode.INVALID_INPUT)
            if exc.code == ErrorCode.INVALID_INPUT and len(envs) > 1:
                return await self._bisect(envs, step, breaker)
            return [self._failure(env, exc) for env in envs]
        except Exception as exc:  # whatever ends the call must count, or a probe never returns
            breaker.record(ok=False)
            return [exc] * len(envs)
        except BaseException:
            breaker.record(ok=False)
            raise
        breaker.record(ok=True)
        for env, out in zip(envs, resp.outputs, strict=True):
            _set_prediction(env, resp, out)
        return [None] * len(envs)

    async def _bisect(self, envs: list[Envelope], step: Step, breaker: CircuitBreaker) -> Outcomes:
        # the gateway refused the whole call for some input: each half is called again,
        # and a half refused again is split again, until the bad tickets are alone
        middle = len(envs) // 2
        halves = await asyncio.gather(
            self._call(envs[:middle], step, breaker), self._call(envs[middle:], step, breaker)
        )
        return [*halves[0], *halves[1]]

    def _budget(self, env: Envelope, step: Step) -> float:
        timeout = step.timeout_ms or 300
        if env.context.deadline_passed:
            return timeout
        return min(timeout, remaining_ms(env, self._deadline_ms(env)))

    async def _predict(
        self, items: list[PredictInput], budget_ms: float, step: Step
    ) -> PredictResponse:
        resp = await self._client.predict(
            step.model or "", items, timeout_ms=int(budget_ms), version=step.version
        )
        # outputs are matched to tickets by position: an answer that does not line up is
        # the gateway's fault, not the tickets'
        if [out.id for out in resp.outputs] != [item.id for item in items]:
            raise GatewayError(
                ErrorCode.INTERNAL,
                f"gateway answered {len(resp.outputs)} outputs for {len(items)} inputs, "
                "not in the request's order",
            )
        return resp

    @staticmethod
    def _failure(env: Envelope, exc: GatewayError) -> BaseException | None:
        if exc.code == ErrorCode.INVALID_INPUT:
            return BadRecord(ErrorClass.INFERENCE_INVALID_INPUT, exc.message)
        if exc.retryable:
            return RetryableError(exc.message, code=exc.code.value)
        degrade(env, f"inference {exc.code.value}: {exc.message}")
        return None


def model_text(env: Envelope) -> str:
    """What the model reads: the cleaned text, or the ticket's own when cleaning left none
    (a ticket of markup only); both are 1 to MAX_TEXT_CHARS characters."""
    return env.context.clean_text or env.ticket.text


def predict_input(env: Envelope) -> PredictInput:
    """The ticket as one gateway input, or BadRecord(INFERENCE_INVALID_INPUT) for a ticket
    the gateway would refuse (and with it every ticket sharing its call)."""
    features = {name: f.value for name, f in env.context.features.items()}
    try:
        orjson.dumps(features)  # what the client will send: integers past 64 bits fail
        return PredictInput(id=env.ticket.ticket_id, text=model_text(env), features=features)
    except (TypeError, ValidationError) as exc:
        reason = f"input the gateway cannot take: {exc}"[:500]
        raise BadRecord(ErrorClass.INFERENCE_INVALID_INPUT, reason) from None


def _set_prediction(env: Envelope, resp: PredictResponse, out: PredictOutput) -> None:
    """Set the ticket's prediction; an answer that is no prediction degrades it alone."""
    try:
        env.context.prediction = Prediction(
            category=Category(out.label),
            confidence=out.confidence,
            scores=out.scores,
            model_name=resp.model,
            # the version that answered this ticket (a request may mix canary versions)
            model_version=out.version or resp.version,
        )
    except (ValueError, ValidationError) as exc:  # an unknown label, a confidence past 1
        log.warning("gateway answer for %s is no prediction: %s", env.ticket.ticket_id, exc)
        degrade(env, f"inference {ErrorCode.INTERNAL.value}: answer is no prediction")
