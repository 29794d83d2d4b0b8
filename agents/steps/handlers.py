"""Handlers of the step types after `validator`: each reads and extends envelopes' context.

Steps work on a batch of envelopes at a time (what one poll of the step's topic gave);
`run_batch` returns, for each envelope, None on success or the exception it failed with.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence

from agents.breaker import CircuitBreaker
from agents.errors import BadRecord, RetryableError
from agents.steps.clean import clean_text
from agents.steps.rules import RULES, RuleInput, apply_rules
from feature_jobs.reader import OnlineFeatureReader
from inference_gateway.client import GatewayClient
from inference_gateway.errors import GatewayError
from schemas.gateway import ErrorCode, PredictInput, PredictResponse
from schemas.tickets import Category, Envelope, ErrorClass, Prediction
from schemas.workflow import Step

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
        data = RuleInput(env.context.clean_text or env.ticket.text, env.context, step.threshold)
        env.context.rule = apply_rules(step.rules, data)


def remaining_ms(env: Envelope, deadline_ms: int) -> float:
    elapsed = (time.time() - env.started_at.timestamp()) * 1000
    return deadline_ms - elapsed


def degrade(env: Envelope, reason: str) -> None:
    env.context.degraded = True
    env.context.degraded_reason = reason


class InferenceStep(Handler):
    """One gateway call per batch, behind a circuit breaker; the gateway merges callers."""

    def __init__(
        self, client: GatewayClient, deadline_ms: int, breaker: CircuitBreaker | None = None
    ) -> None:
        self._client = client
        self._deadline_ms = deadline_ms
        self.breaker = breaker or CircuitBreaker("inference_gateway")

    async def run_batch(self, envs: Sequence[Envelope], step: Step) -> Outcomes:
        outcomes: Outcomes = [None] * len(envs)
        # past its deadline a ticket is degraded, but still gets one call within the step's
        # timeout: reviewers then see the model's advice and the result names its version
        live = [
            i for i, e in enumerate(envs) if not e.context.degraded or e.context.deadline_passed
        ]
        if not live:
            return outcomes
        if not self.breaker.allow():
            for i in live:
                degrade(envs[i], "CIRCUIT_OPEN: inference gateway failing, call skipped")
            return outcomes
        budget = min(step.timeout_ms or 300, *(self._budget(envs[i], step) for i in live))
        try:
            resp = await self._predict([envs[i] for i in live], step, budget)
        except GatewayError as exc:
            self.breaker.record(ok=exc.code == ErrorCode.INVALID_INPUT, n=len(live))
            if exc.code == ErrorCode.INVALID_INPUT and len(live) > 1:
                return await self._one_by_one(envs, live, step, outcomes)
            for i in live:
                outcomes[i] = self._failure(envs[i], exc)
            return outcomes
        self.breaker.record(ok=True, n=len(live))
        for i, out in zip(live, resp.outputs, strict=True):
            envs[i].context.prediction = Prediction(
                category=Category(out.label),
                confidence=out.confidence,
                scores=out.scores,
                model_name=resp.model,
                model_version=resp.version,
            )
        return outcomes

    def _budget(self, env: Envelope, step: Step) -> float:
        if env.context.deadline_passed:
            return step.timeout_ms or 300
        return remaining_ms(env, self._deadline_ms)

    async def _predict(
        self, envs: Sequence[Envelope], step: Step, budget_ms: float
    ) -> PredictResponse:
        if budget_ms <= 0:
            raise GatewayError(ErrorCode.TIMEOUT, "no time left in the workflow deadline")
        inputs = [
            PredictInput(
                id=e.ticket.ticket_id,
                text=e.context.clean_text or e.ticket.text,
                features={k: v.value for k, v in e.context.features.items()},
            )
            for e in envs
        ]
        return await self._client.predict(step.model or "", inputs, timeout_ms=int(budget_ms))

    async def _one_by_one(
        self, envs: Sequence[Envelope], live: list[int], step: Step, outcomes: Outcomes
    ) -> Outcomes:
        """A batch refused as invalid: find which inputs are, so the others still classify."""
        for i in live:
            sub = await self.run_batch([envs[i]], step)
            outcomes[i] = sub[0]
        return outcomes

    @staticmethod
    def _failure(env: Envelope, exc: GatewayError) -> BaseException | None:
        if exc.code == ErrorCode.INVALID_INPUT:
            return BadRecord(ErrorClass.INFERENCE_INVALID_INPUT, exc.message)
        if exc.retryable:
            return RetryableError(exc.message, code=exc.code.value)
        degrade(env, f"inference {exc.code.value}: {exc.message}")
        return None
