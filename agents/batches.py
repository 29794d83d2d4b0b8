"""A batch that fails is never given up and never stops its partition.

An infrastructure error (broker, cluster metadata, Redis, gateway unreachable) is
retried, with backoff bounded at `MAX_BACKOFF_S`, a metric and a log line per attempt.
Any other error may be a record at fault: the batch is split in halves until each record
that fails alone is found. Such a record is dead-lettered only once that is proven:

- it fails again on its own, `CONFIRM_ATTEMPTS` times, with backoff in between;
- and it is not the whole batch failing record by record, which means the system is at
  fault, not the records (a broker outage can surface as an error we do not list: a
  table whose changelog shows no partitions during one did): then the batch is retried as
  an infrastructure error.

Redoing part of a batch is safe: steps are at-least-once and the router's ledger keeps
results single.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import aiohttp
import aiokafka.errors
import redis.exceptions
from confluent_kafka import KafkaError, KafkaException
from faust.exceptions import ConsumerNotStarted, PartitionsMismatch

from agents import metrics
from streams.kafka_errors import kafka_error

log = logging.getLogger(__name__)

MAX_BACKOFF_S = 5.0
CONFIRM_ATTEMPTS = 3
INFRA_ERRORS: tuple[type[BaseException], ...] = (
    KafkaException,
    aiokafka.errors.KafkaError,
    PartitionsMismatch,  # a topic's metadata while the broker is away
    ConsumerNotStarted,
    OSError,  # ConnectionError and socket errors
    TimeoutError,
    asyncio.TimeoutError,
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    aiohttp.ClientError,
)


# Kafka errors about the record itself, not about the cluster
RECORD_FAULTS = frozenset(
    {
        KafkaError.MSG_SIZE_TOO_LARGE,
        KafkaError.INVALID_MSG_SIZE,
        KafkaError.INVALID_MSG,
        KafkaError.RECORD_LIST_TOO_LARGE,
        KafkaError.INVALID_RECORD,
        KafkaError._INVALID_ARG,
    }
)


def is_infrastructure(exc: BaseException) -> bool:
    """Whether `exc` says a service is away, rather than that the record is at fault."""
    err = kafka_error(exc)
    if err is not None:
        return err.code() not in RECORD_FAULTS
    return isinstance(exc, INFRA_ERRORS)


def backoff_s(attempt: int) -> float:
    return min(MAX_BACKOFF_S, 0.1 * 2**attempt)


async def process_isolated(
    what: str,
    handle: Callable[[Sequence[Any]], Awaitable[None]],
    events: Sequence[Any],
    poisoned: Callable[[Any, BaseException], None],
) -> None:
    """Run `handle` over `events` until each has been handled or proven at fault."""
    attempt = 0
    todo = list(events)
    while todo:
        succeeded, suspects = await _bisect(what, handle, todo)
        if not suspects:
            return
        if not succeeded and len(suspects) > 1:  # every record failed: the system is at fault
            attempt += 1
            metrics.INFRA_RETRIES.labels(what).inc()
            log.warning(
                "%s: every record of a batch of %d fails (%s); retrying it (attempt %d)",
                what,
                len(suspects),
                _describe(suspects[0][1]),
                attempt,
            )
            await asyncio.sleep(backoff_s(attempt))
            todo = [event for event, _ in suspects]
            continue
        todo = []
        for event, exc in suspects:
            if await _fails_again(what, handle, event):
                log.error("%s: a record fails on its own (%s); dead-lettered", what, _describe(exc))
                _dead_letter(what, poisoned, event, exc)
            # else it went through on a later attempt: handled


async def _bisect(
    what: str, handle: Callable[[Sequence[Any]], Awaitable[None]], events: list[Any]
) -> tuple[int, list[tuple[Any, BaseException]]]:
    """(records handled, records that failed alone), retrying infrastructure errors."""
    pending: list[list[Any]] = [events]
    succeeded, attempt = 0, 0
    suspects: list[tuple[Any, BaseException]] = []
    while pending:
        batch = pending.pop()
        try:
            await handle(batch)
            succeeded += len(batch)
        except Exception as exc:
            if not is_infrastructure(exc):
                if len(batch) == 1:
                    suspects.append((batch[0], exc))
                    continue
                metrics.BATCH_SPLITS.labels(what).inc()
                half = len(batch) // 2
                pending.extend([batch[half:], batch[:half]])  # the first half goes first
                continue
            attempt += 1
            metrics.INFRA_RETRIES.labels(what).inc()
            log.warning("%s: %s (attempt %d); retrying", what, _describe(exc), attempt)
            pending.append(batch)
            await asyncio.sleep(backoff_s(attempt))
    return succeeded, suspects


async def _fails_again(
    what: str, handle: Callable[[Sequence[Any]], Awaitable[None]], event: Any
) -> bool:
    """Whether `event` fails on its own CONFIRM_ATTEMPTS more times (outages not counted)."""
    failures = attempt = 0
    while failures < CONFIRM_ATTEMPTS:
        attempt += 1
        await asyncio.sleep(backoff_s(attempt))
        try:
            await handle([event])
            return False
        except Exception as exc:
            if not is_infrastructure(exc):
                failures += 1
                continue
            metrics.INFRA_RETRIES.labels(what).inc()
            log.warning("%s: %s (attempt %d); retrying", what, _describe(exc), attempt)
    return True


def _dead_letter(
    what: str, poisoned: Callable[[Any, BaseException], None], event: Any, exc: BaseException
) -> None:
    try:
        poisoned(event, exc)
    except Exception:  # nothing more can be done for it here: say so loudly
        log.critical("%s: a record at fault could not be dead-lettered either", what, exc_info=True)


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc)[:200]}"
