"""The worker's view of Kafka and Redis, as gauges for the alert rules (deploy/alerts).

Neither Kafka nor Redis exports Prometheus metrics in this deployment, so the worker, which
needs both, says whether it reaches them (`workflow_dependency_up`), and how far its consumer
is behind the log end (`workflow_consumer_lag`). Refreshed by a timer in agents/worker.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import defaultdict
from typing import Any

from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from agents import metrics
from streams import faust_adapter
from streams.redis_config import async_client
from streams.settings import Settings

log = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 1.0


def _bootstrap(settings: Settings) -> list[tuple[str, int]]:
    out = []
    for server in settings.kafka_bootstrap.split(","):
        host, _, port = server.strip().rpartition(":")
        out.append((host or "127.0.0.1", int(port)))
    return out


class DependencyProbe:
    """PING Redis; open a TCP connection to a bootstrap broker (a stopped broker refuses it)."""

    def __init__(self, settings: Settings) -> None:
        # no retries: one failed probe is the answer, the next tick asks again
        self._redis = async_client(
            settings.redis,
            socket_timeout=PROBE_TIMEOUT_S,
            socket_connect_timeout=PROBE_TIMEOUT_S,
            retry=Retry(NoBackoff(), 0),
        )
        self._brokers = _bootstrap(settings)

    async def check(self) -> None:
        metrics.DEPENDENCY_UP.labels("redis").set(await self._redis_up())
        metrics.DEPENDENCY_UP.labels("kafka").set(await self._kafka_up())

    async def _redis_up(self) -> int:
        try:
            return int(bool(await self._redis.ping()))
        except Exception:  # any failure means "not reachable now"; never the URL in a log
            return 0

    async def _kafka_up(self) -> int:
        for host, port in self._brokers:
            try:
                _, writer = await asyncio.wait_for(
                    asyncio.open_connection(host, port), PROBE_TIMEOUT_S
                )
            except (OSError, TimeoutError):
                continue
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
            return 1
        return 0

    async def close(self) -> None:
        await self._redis.aclose()


def consumer_lag(consumer: Any) -> dict[str, int]:
    """Records not yet fetched, per topic: the log end minus the next offset to read.

    Partitions with nothing read since their assignment are left out (no position yet).
    """
    lag: dict[str, int] = defaultdict(int)
    read = faust_adapter.read_offsets(consumer)
    for tp in consumer.assignment():
        last = read.get(tp)
        end = consumer.highwater(tp)
        if last is None or end is None:
            continue
        lag[tp.topic] += max(0, end - last - 1)
    return dict(lag)


def record_lag(consumer: Any) -> None:
    lag = consumer_lag(consumer)
    # revoked topics go; no scrape sees the gap (no await between clear and set)
    metrics.CONSUMER_LAG.clear()
    for topic, value in lag.items():
        metrics.CONSUMER_LAG.labels(topic).set(value)
