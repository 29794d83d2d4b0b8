"""A batch that fails is never given up and never stops its partition.

An infrastructure error (broker, Redis, gateway unreachable) is retried, with backoff
bounded at `MAX_BACKOFF_S`, a metric and a log line per attempt. Any other error is
deterministic: the batch is split in halves until the one record at fault is found, and
that record alone is dead-lettered. Redoing part of a batch is safe: steps are
at-least-once and the router's ledger keeps results single.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import aiohttp
import redis.exceptions
from confluent_kafka import KafkaException

from agents import metrics

log = logging.getLogger(__name__)

MAX_BACKOFF_S = 5.0
INFRA_ERRORS: tuple[type[BaseException], ...] = (
    KafkaException,
    OSError,  # ConnectionError and socket errors
    TimeoutError,
    asyncio.TimeoutError,
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    aiohttp.ClientError,
)


def backoff_s(attempt: int) -> float:
    return min(MAX_BACKOFF_S, 0.1 * 2**attempt)


async def process_isolated(
    what: str,
    handle: Callable[[Sequence[Any]], Awaitable[None]],
    events: Sequence[Any],
    poisoned: Callable[[Any, BaseException], None],
) -> None:
    """Run `handle` over `events` until each has been handled or found at fault."""
    pending: list[Sequence[Any]] = [events]
    attempt = 0
    while pending:
        batch = pending.pop()
        try:
            await handle(batch)
        except INFRA_ERRORS as exc:
            attempt += 1
            metrics.INFRA_RETRIES.labels(what).inc()
            log.warning("%s: %s (attempt %d); retrying", what, _describe(exc), attempt)
            pending.append(batch)
            await asyncio.sleep(backoff_s(attempt))
        except Exception as exc:
            if len(batch) == 1:
                log.exception("%s: a record fails deterministically; dead-lettered", what)
                poisoned(batch[0], exc)
                continue
            metrics.BATCH_SPLITS.labels(what).inc()
            half = len(batch) // 2
            pending.extend([batch[half:], batch[:half]])  # the first half goes first


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc)[:200]}"
