"""Canary routing through the real Kafka and Triton: a config published on config.routing
takes effect in a running gateway without a restart, sticky per id, every output names its
version, and one request's inputs are each routed by their own id; an invalid record is
ignored (the config in force stays); rollback is publishing the previous config.
`ticketflow config get|route-test` read the same topic."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest
from typer.testing import CliRunner

from inference_gateway.cli import config_app
from inference_gateway.client import GatewayClient
from inference_gateway.config import GatewayConfig
from inference_gateway.routing import bucket_of
from inference_gateway.routing_store import publish
from inference_gateway.routing_watch import routing_topic
from inference_gateway.server import GatewayServer
from inference_gateway.triton import TritonClient
from schemas.gateway import PredictInput
from schemas.routing import RoutingConfig

pytestmark = pytest.mark.integration

MODEL = "ticket_classifier"
TRITON_URL = os.environ.get("TICKETFLOW_TRITON_GRPC", "127.0.0.1:8001")
KAFKA = os.environ.get("TICKETFLOW_KAFKA_BOOTSTRAP", "127.0.0.1:9092")
IDS = [f"canary-{i}" for i in range(40)]


def _unavailable(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI is set: integration tests must not skip)")
    pytest.skip(reason)


@pytest.fixture
def prefix() -> Iterator[str]:
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": KAFKA})
    try:
        admin.list_topics(timeout=5)
    except Exception as error:
        _unavailable(f"no Kafka at {KAFKA}: {error}")
    prefix = f"it-canary-{uuid.uuid4().hex[:8]}."
    yield prefix
    for future in admin.delete_topics([routing_topic(prefix)], operation_timeout=10).values():
        with contextlib.suppress(Exception):
            future.result()


@pytest.fixture
async def gateway(prefix: str) -> AsyncIterator[GatewayServer]:
    triton = TritonClient(TRITON_URL)
    ready = await triton.ready(MODEL, "v1") and await triton.ready(MODEL, "v2")
    await triton.close()
    if not ready:
        _unavailable(f"Triton at {TRITON_URL} does not serve {MODEL} v1 and v2")
    config = GatewayConfig(
        triton_url=TRITON_URL, port=0, kafka_bootstrap=KAFKA, topic_prefix=prefix,
        shutdown_grace_s=5,
    )  # fmt: skip
    async with GatewayServer(config) as server:
        yield server


def config(**weights: int) -> RoutingConfig:
    return RoutingConfig(name=MODEL, versions=weights, default="v1")


async def versions(client: GatewayClient) -> dict[str, str]:
    answers = await asyncio.gather(
        *(
            client.predict(MODEL, [PredictInput(id=i, text="where is my refund?")], 3000)
            for i in IDS
        )
    )
    for answer in answers:
        assert answer.outputs[0].id in IDS and answer.version in ("v1", "v2")
    return {a.outputs[0].id: a.version for a in answers}


async def until(client: GatewayClient, want: dict[str, str], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while (got := await versions(client)) != want:
        assert time.monotonic() < deadline, f"routing did not follow: {got}"
        await asyncio.sleep(0.2)


def expected(split: int) -> dict[str, str]:
    return {i: "v1" if bucket_of(i) < split else "v2" for i in IDS}


async def test_a_canary_takes_effect_without_restart_and_rolls_back(
    gateway: GatewayServer, prefix: str
) -> None:
    topic = routing_topic(prefix)
    async with GatewayClient(gateway.url) as client:
        assert set((await versions(client)).values()) == {"v1"}  # nothing published yet

        await asyncio.to_thread(publish, config(v1=50, v2=50), KAFKA, topic)
        await until(client, expected(50))
        assert await versions(client) == expected(50)  # sticky: the same ids, the same versions

        # an invalid record (a string weight), published around the CLI's validation
        from confluent_kafka import Producer

        producer = Producer({"bootstrap.servers": KAFKA})
        bad = b'{"name": "ticket_classifier", "versions": {"v1": "100"}, "default": "v1"}'
        producer.produce(topic, key=MODEL.encode(), value=bad)
        producer.flush(10)
        await asyncio.sleep(1.5)
        assert await versions(client) == expected(50)  # ignored: the canary stays
        assert gateway.watcher is not None and gateway.watcher.status.invalid >= 1

        await asyncio.to_thread(publish, config(v1=100), KAFKA, topic)  # rollback
        await until(client, expected(100))


async def test_the_cli_reads_what_the_gateway_follows(gateway: GatewayServer, prefix: str) -> None:
    runner = CliRunner()
    topic = routing_topic(prefix)
    await asyncio.to_thread(publish, config(v1=80, v2=20), KAFKA, topic)
    got = await asyncio.to_thread(
        runner.invoke, config_app, ["get", MODEL, "--prefix", prefix, "--bootstrap", KAFKA]
    )
    assert got.exit_code == 0, got.output
    assert '"v2": 20' in got.output
    ids = ["a-ticket", "another-ticket"]
    routed = await asyncio.to_thread(
        runner.invoke, config_app, ["route-test", *ids, "--prefix", prefix, "--bootstrap", KAFKA]
    )
    assert routed.exit_code == 0, routed.output
    for i in ids:
        line = next(x for x in routed.output.splitlines() if i in x)
        assert ("v1" if bucket_of(i) < 80 else "v2") in line


def route_test(prefix: str, ids: list[str]) -> dict[str, str]:
    """`ticketflow config route-test`'s answer for each id, read from its table."""
    routed = CliRunner().invoke(
        config_app, ["route-test", *ids, "--prefix", prefix, "--bootstrap", KAFKA]
    )
    assert routed.exit_code == 0, routed.output
    rows = [[cell.strip() for cell in line.split("│")] for line in routed.output.splitlines()]
    return {row[1]: row[3] for row in rows if len(row) == 5 and row[1] in ids}


async def test_one_request_routes_each_input_by_its_own_id(
    gateway: GatewayServer, prefix: str
) -> None:
    await asyncio.to_thread(publish, config(v1=50, v2=50), KAFKA, routing_topic(prefix))
    inputs = [PredictInput(id=i, text=f"order {n}: where is my refund?") for n, i in enumerate(IDS)]
    async with GatewayClient(gateway.url) as client:
        await until(client, expected(50))
        first = await client.predict(MODEL, inputs, 10_000)
        again = await client.predict(MODEL, inputs, 10_000)  # sticky: the same versions
        pinned = {v: await client.predict(MODEL, inputs, 10_000, version=v) for v in ("v1", "v2")}

    assert [o.id for o in first.outputs] == IDS
    got = {o.id: o.version for o in first.outputs}
    assert set(got.values()) == {"v1", "v2"}
    assert got == await asyncio.to_thread(route_test, prefix, IDS) == expected(50)
    assert {o.id: o.version for o in again.outputs} == got
    assert first.version == first.outputs[0].version
    # each output was computed by its own version: its scores are that version's
    assert pinned["v1"].outputs[0].scores != pytest.approx(pinned["v2"].outputs[0].scores)
    for n, output in enumerate(first.outputs):
        assert output.version is not None
        want = pinned[output.version].outputs[n]
        assert output.scores == pytest.approx(want.scores, abs=1e-6)
