"""Handlers of the step types after `validator`: each reads and extends an envelope's context."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Protocol

from agents.errors import BadRecord, RetryableError
from agents.steps.clean import clean_text
from agents.steps.rules import RULES, RuleInput, apply_rules
from feature_jobs.reader import OnlineFeatureReader
from inference_gateway.client import GatewayClient
from inference_gateway.errors import GatewayError
from schemas.gateway import ErrorCode, PredictInput
from schemas.tickets import Category, Envelope, ErrorClass, Prediction
from schemas.workflow import Step


class Handler(Protocol):
    async def __call__(self, env: Envelope, step: Step) -> None: ...


Processor = Callable[[Envelope], Awaitable[None]]


async def text_cleaner(env: Envelope) -> None:
    env.context.clean_text = clean_text(env.ticket.text)


PROCESSORS: dict[str, Processor] = {"text_cleaner": text_cleaner}


class ProcessorStep:
    async def __call__(self, env: Envelope, step: Step) -> None:
        await PROCESSORS[step.handler or ""](env)


class FeatureLookupStep:
    def __init__(self, reader: OnlineFeatureReader) -> None:
        self._reader = reader

    async def __call__(self, env: Envelope, step: Step) -> None:
        timeout_s = (step.timeout_ms or 800) / 1000
        for view in step.views:
            values = await self._reader.read(view, env.ticket.user_id, timeout_s)
            env.context.features.update(values)


def remaining_ms(env: Envelope, deadline_ms: int) -> float:
    elapsed = (time.time() - env.started_at.timestamp()) * 1000
    return deadline_ms - elapsed


class InferenceStep:
    def __init__(self, client: GatewayClient, deadline_ms: int) -> None:
        self._client = client
        self._deadline_ms = deadline_ms

    async def __call__(self, env: Envelope, step: Step) -> None:
        if env.context.degraded:  # degraded earlier (deadline, breaker): don't spend the call
            return
        budget = min(step.timeout_ms or 300, remaining_ms(env, self._deadline_ms))
        if budget <= 0:
            raise RetryableError("no time left in the workflow deadline", code="TIMEOUT")
        features = {k: v.value for k, v in env.context.features.items()}
        item = PredictInput(
            id=env.ticket.ticket_id,
            text=env.context.clean_text or env.ticket.text,
            features=features,
        )
        try:
            resp = await self._client.predict(step.model or "", [item], timeout_ms=int(budget))
        except GatewayError as exc:
            if exc.code == ErrorCode.INVALID_INPUT:
                raise BadRecord(ErrorClass.INFERENCE_INVALID_INPUT, exc.message) from exc
            if exc.retryable:
                raise RetryableError(exc.message, code=exc.code.value) from exc
            env.context.degraded = True
            env.context.degraded_reason = f"inference {exc.code.value}: {exc.message}"
            return
        out = resp.outputs[0]
        env.context.prediction = Prediction(
            category=Category(out.label),
            confidence=out.confidence,
            scores=out.scores,
            model_name=resp.model,
            model_version=resp.version,
        )


class RuleEngineStep:
    async def __call__(self, env: Envelope, step: Step) -> None:
        data = RuleInput(env.context.clean_text or env.ticket.text, env.context, step.threshold)
        env.context.rule = apply_rules(step.rules, data)


KNOWN_RULES = frozenset(RULES)
