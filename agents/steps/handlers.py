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
    """One gateway call per ticket, all of a batch at once, behind a circuit breaker.

    One ticket per request keeps canary routing sticky per ticket (the gateway picks a
    request's version from its first input's id); the gateway merges the concurrent calls
    of every worker into Triton batches, which is its job.
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

    async def run(self, env: Envelope, step: Step) -> None:
        # past its deadline a ticket is degraded, but still gets one call within the step's
        # timeout: reviewers then see the model's advice and the result names its version
        if env.context.degraded and not env.context.deadline_passed:
            return
        if not self.breaker.allow():
            degrade(env, "CIRCUIT_OPEN: inference gateway failing, call skipped")
            return
        try:
            resp = await self._predict(env, step)
        except GatewayError as exc:
            self.breaker.record(ok=exc.code == ErrorCode.INVALID_INPUT)
            failure = self._failure(env, exc)
            if failure is not None:
                raise failure from exc
            return
        except BaseException:  # whatever ends the call must count, or a probe never returns
            self.breaker.record(ok=False)
            raise
        self.breaker.record(ok=True)
        out = resp.outputs[0]
        env.context.prediction = Prediction(
            category=Category(out.label),
            confidence=out.confidence,
            scores=out.scores,
            model_name=resp.model,
            model_version=resp.version,
        )

    def _budget(self, env: Envelope, step: Step) -> float:
        timeout = step.timeout_ms or 300
        if env.context.deadline_passed:
            return timeout
        return min(timeout, remaining_ms(env, self._deadline_ms(env)))

    async def _predict(self, env: Envelope, step: Step) -> PredictResponse:
        budget_ms = self._budget(env, step)
        if budget_ms <= 0:
            raise GatewayError(ErrorCode.TIMEOUT, "no time left in the workflow deadline")
        item = PredictInput(
            id=env.ticket.ticket_id,
            text=env.context.clean_text or env.ticket.text,
            features={k: v.value for k, v in env.context.features.items()},
        )
        return await self._client.predict(step.model or "", [item], timeout_ms=int(budget_ms))

    @staticmethod
    def _failure(env: Envelope, exc: GatewayError) -> BaseException | None:
        if exc.code == ErrorCode.INVALID_INPUT:
            return BadRecord(ErrorClass.INFERENCE_INVALID_INPUT, exc.message)
        if exc.retryable:
            return RetryableError(exc.message, code=exc.code.value)
        degrade(env, f"inference {exc.code.value}: {exc.message}")
        return None
