"""Traces across the worker and the gateway, with the SDK's in-memory exporter.

The real step runner, emitter and infer handler call a real gateway app (in process, on a
local port) whose Triton client talks to a fake gRPC stub: one ticket must give one trace
from its step spans through the gateway's request, batch and Triton spans.
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace
from unittest import mock

import pytest
from aiohttp.test_utils import TestServer
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from agents.definition import load_definition
from agents.emitter import Emitter
from agents.runner import StepRunner
from agents.steps.handlers import InferenceStep, ProcessorStep
from agents.topology import Topology
from inference_gateway import tracing as gateway_tracing
from inference_gateway.client import GatewayClient
from inference_gateway.config import GatewayConfig
from inference_gateway.server import create_app
from inference_gateway.testing import fake_scores
from inference_gateway.triton import TritonClient
from schemas.tickets import Envelope, ErrorClass, Ticket
from streams import tracing
from streams.settings import Settings
from streams.topics import Topics

DEFINITION = load_definition(Settings().workflow_file)
TOPICS = Topics("p.")
TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
SENDER = "00f067aa0ba902b7"


@pytest.fixture
def spans():
    """An SDK provider for this test only (the API's global is otherwise left unset)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with mock.patch.object(trace, "_TRACER_PROVIDER", provider):
        tracing.step_spans.refresh()  # what a worker does at each batch
        yield exporter
    tracing.step_spans.refresh()
    provider.shutdown()


class FakeProducer:
    def __init__(self) -> None:
        self.sent: list[tuple] = []

    def produce(self, topic, key, value, headers=None, partition=None):
        self.sent.append((topic, key, value, dict(headers or [])))

    def headers_to(self, topic: str) -> list[dict]:
        return [h for t, _, _, h in self.sent if t == topic]

    def produce_many(self, records):
        for topic, key, value, headers, partition in records:
            self.produce(topic, key, value, headers, partition)


class FakeStates:
    def at(self, event):
        pass

    def move(self, event, fresh, status, step, attempt=1, **fields):
        pass


class FakeGrpc:
    """tritonclient's aio client, as far as TritonClient.infer uses it."""

    def __init__(self) -> None:
        self.calls = 0

    async def infer(self, model, inputs, **kwargs):
        self.calls += 1
        n = inputs[0].shape()[0]
        return SimpleNamespace(as_numpy=lambda name: fake_scores(["x"] * n))

    async def close(self):
        pass


def envelope(ticket_id: str, step: str, trace_id: str = TRACE) -> Envelope:
    now = datetime.now(timezone.utc)
    return Envelope(
        ticket=Ticket(ticket_id=ticket_id, text=f"invoice {ticket_id} wrong", created_at=now),
        workflow=DEFINITION.name,
        workflow_version=DEFINITION.version,
        step=step,
        trace_id=trace_id,
        arrival="0:1",
        started_at=now - timedelta(milliseconds=5),
    )


def carried(traceparent: str | bytes) -> SimpleNamespace:
    value = traceparent if isinstance(traceparent, bytes) else traceparent.encode()
    message = SimpleNamespace(
        topic="p.tickets.step", partition=0, offset=1, key=b"k", value=b"{}", headers=[]
    )
    message.headers = [("traceparent", value)]
    return SimpleNamespace(message=message)


async def gateway(max_queue_delay_us: int = 500) -> tuple[TestServer, FakeGrpc]:
    triton = TritonClient("127.0.0.1:1")
    grpc = triton._client = FakeGrpc()  # type: ignore[assignment]
    config = GatewayConfig(max_queue_delay_us=max_queue_delay_us, cache_size=0)
    server = TestServer(create_app(config, backend=triton))
    await server.start_server()
    return server, grpc


def worker(client: GatewayClient) -> tuple[StepRunner, FakeProducer]:
    producer = FakeProducer()
    topology = Topology(DEFINITION)
    handlers = {
        "processor": ProcessorStep(),
        "inference_call": InferenceStep(client, lambda env: 60_000),
    }
    emitter = Emitter(producer, TOPICS, max_replays=3)  # type: ignore[arg-type]
    return StepRunner(topology, handlers, emitter, FakeStates(), TOPICS), producer


def by_name(finished: tuple[ReadableSpan, ...]) -> dict[str, list[ReadableSpan]]:
    out: dict[str, list[ReadableSpan]] = {}
    for span in finished:
        out.setdefault(span.name, []).append(span)
    return out


def parent_of(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


async def test_one_ticket_is_one_trace_from_its_steps_through_the_gateway_to_triton(spans):
    server, grpc = await gateway()
    client = GatewayClient(str(server.make_url("")))
    try:
        runner, producer = worker(client)
        # clean, as the step after validate: its record carried the sender's traceparent
        env = envelope("t-1", "clean")
        event = carried(f"00-{TRACE}-{SENDER}-01")
        [(_, env)] = await runner.run(DEFINITION.step("clean"), [(event, env)], keyed=True)
        runner.emitter.send(TOPICS.step("infer"), env)
        [sent] = producer.headers_to(TOPICS.step("infer"))
        # infer, in the next agent: a fresh envelope, carried by the record clean sent
        env2 = Envelope.model_validate_json(env.model_dump_json())
        going_on = await runner.run(
            DEFINITION.step("infer"), [(carried(sent["traceparent"]), env2)], keyed=True
        )
        assert [e.context.prediction is not None for _, e in going_on] == [True]
    finally:
        await client.close()
        await server.close()

    assert grpc.calls == 1
    s = by_name(spans.get_finished_spans())
    assert {sp.context.trace_id for sp in spans.get_finished_spans()} == {int(TRACE, 16)}
    clean, infer = s["step clean"][0], s["step infer"][0]
    call, request = s["gateway predict"][0], s["POST /v1/models/{model}/predict"][0]
    batch, grpc = s["batch ticket_classifier v1"][0], s["triton infer"][0]
    assert parent_of(clean) == int(SENDER, 16)
    assert parent_of(infer) == clean.context.span_id  # through the record's traceparent
    assert parent_of(call) == infer.context.span_id and call.kind is SpanKind.CLIENT
    assert parent_of(request) == call.context.span_id and request.kind is SpanKind.SERVER
    assert parent_of(batch) == request.context.span_id  # one request: the batch is its child
    assert parent_of(grpc) == batch.context.span_id
    assert infer.attributes["ticketflow.ticket_id"] == "t-1"
    assert infer.attributes["ticketflow.status"] == "ok"
    assert infer.attributes["ticketflow.workflow_version"] == DEFINITION.version
    assert batch.attributes["ticketflow.batch_size"] == 1
    # the step spans run for as long as the audit records say
    assert infer.start_time <= call.start_time and call.end_time <= infer.end_time


async def test_a_call_for_several_tickets_and_a_batch_of_several_requests_link_their_causes(
    spans,
):
    server, grpc = await gateway(max_queue_delay_us=200_000)  # the two calls share a batch
    client = GatewayClient(str(server.make_url("")))
    try:
        runner, _ = worker(client)
        traces = [f"{i:032x}" for i in (1, 2, 3)]
        envs = [envelope(f"t-{i}", "infer", tid) for i, tid in enumerate(traces)]
        events = [carried(f"00-{tid}-{SENDER}-01") for tid in traces]
        # tickets 0 and 1 in one step batch (one call); ticket 2 from a second worker's batch
        items = list(zip(events, envs, strict=True))
        infer = DEFINITION.step("infer")
        await asyncio.gather(
            runner.run(infer, items[:2], keyed=True), runner.run(infer, items[2:], keyed=True)
        )
    finally:
        await client.close()
        await server.close()

    assert grpc.calls == 1  # one batch for the two requests
    s = by_name(spans.get_finished_spans())
    steps = {sp.attributes["ticketflow.ticket_id"]: sp for sp in s["step infer"]}
    assert {sp.context.trace_id for sp in steps.values()} == {int(t, 16) for t in traces}
    calls = sorted(s["gateway predict"], key=lambda sp: sp.attributes["ticketflow.inputs"])
    single, double = calls
    # one ticket: the call is in its trace; two: a trace of its own, linked to both
    assert parent_of(single) == steps["t-2"].context.span_id
    assert double.parent is None and double.context.trace_id not in {int(t, 16) for t in traces}
    assert {link.context.span_id for link in double.links} == {
        steps["t-0"].context.span_id,
        steps["t-1"].context.span_id,
    }
    [batch] = s["batch ticket_classifier v1"]
    requests = s["POST /v1/models/{model}/predict"]
    assert batch.parent is None and len(batch.links) == 2
    assert {link.context.span_id for link in batch.links} == {r.context.span_id for r in requests}
    assert batch.attributes["ticketflow.batch_size"] == 3
    assert parent_of(s["triton infer"][0]) == batch.context.span_id


def test_a_dead_lettered_step_ends_its_span_as_an_error(spans):
    env = envelope("t-9", "rules")
    tracing.step_spans.start("rules", [(env, None)])
    tracing.step_spans.fail(env, ErrorClass.INTERNAL.value)
    [span] = spans.get_finished_spans()
    assert span.status.status_code is StatusCode.ERROR
    assert span.attributes["ticketflow.error_class"] == ErrorClass.INTERNAL.value
    # no carried traceparent: still the ticket's trace
    assert span.context.trace_id == int(TRACE, 16)


def test_a_foreign_or_garbage_traceparent_is_not_a_parent(spans):
    env = envelope("t-8", "rules")
    other = "00-" + "f" * 32 + "-" + SENDER + "-01"
    tracing.step_spans.start("rules", [(env, other)])
    tracing.step_spans.finish(env, "rules", "ok", 1.0)
    env2 = envelope("t-7", "rules")
    tracing.step_spans.start("rules", [(env2, "00-zz-not-one")])
    tracing.step_spans.finish(env2, "rules", "ok", 1.0)
    for span in spans.get_finished_spans():
        assert span.context.trace_id == int(TRACE, 16)
        assert parent_of(span) != int(SENDER, 16)


def test_off_no_spans_and_the_records_carry_a_traceparent_as_before():
    assert tracing.tracer() is None and gateway_tracing.tracer() is None
    producer = FakeProducer()
    emitter = Emitter(producer, TOPICS, max_replays=3)  # type: ignore[arg-type]
    env = envelope("t-1", "clean")
    tracing.step_spans.start("clean", [(env, None)])
    assert tracing.step_spans.contexts([env]) == {}
    emitter.send(TOPICS.step("infer"), env)
    [headers] = producer.headers_to(TOPICS.step("infer"))
    assert headers["traceparent"].decode().split("-")[1] == TRACE
    with gateway_tracing.client_span("m", []) as extra:
        assert extra == {}


def test_configure_installs_nothing_without_an_endpoint(monkeypatch):
    for name in tracing.ENDPOINT_VARS:
        monkeypatch.delenv(name, raising=False)
    assert tracing.configure("w") is False and gateway_tracing.configure("g") is False
    assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)


def test_spans_hold_no_ticket_text(spans):
    env = envelope("t-5", "clean")
    tracing.step_spans.start("clean", [(env, None)])
    tracing.step_spans.finish(env, "clean", "ok", 1.0)
    [span] = spans.get_finished_spans()
    assert all(env.ticket.text not in str(v) for v in span.attributes.values())


def test_an_envelope_gone_leaves_no_entry():
    spans = tracing.StepSpans()
    env = envelope("t-4", "clean")
    spans._last[env] = trace.INVALID_SPAN_CONTEXT
    assert len(spans._last) == 1
    del env
    assert len(spans._last) == 0


def test_tracers_follow_the_global_provider():
    # the fixtures install a provider by patching the API's global (tests only: the code
    # reads it through the public get_tracer_provider())
    assert hasattr(trace, "_TRACER_PROVIDER")
    provider = TracerProvider()
    with mock.patch.object(trace, "_TRACER_PROVIDER", provider):
        assert trace.get_tracer_provider() is provider
        assert tracing.tracer() is not None and gateway_tracing.tracer() is not None


def test_steps_whose_sender_is_unknown_share_one_stand_in_parent_in_the_tickets_trace(spans):
    # validate (audited without a span opened) and route (its record's header not at hand)
    validate, route = envelope("t-6", "validate"), envelope("t-6", "route")
    tracing.step_spans.finish(validate, "validate", "ok", 2.0)
    tracing.step_spans.finish(route, "route", "ok", 1.0)
    # a retry tier re-sends a fresh envelope: its record names the same stand-in
    retried = envelope("t-6", "infer")
    header = tracing.step_spans.traceparent(retried)
    assert header is not None
    first, second = spans.get_finished_spans()
    assert first.parent is not None and second.parent is not None
    assert first.parent.span_id == second.parent.span_id == int(header.split("-")[2], 16)
    assert {first.context.trace_id, second.context.trace_id} == {int(TRACE, 16)}
    # its duration is the audited latency
    assert first.end_time - first.start_time == 2_000_000


def test_an_adopted_traceparent_is_the_parent_and_passes_through_a_retry_tier(spans):
    sender = f"00-{TRACE}-{SENDER}-01"
    route = envelope("t-3", "route")
    tracing.step_spans.adopt(route, sender)  # the router's record: no span opened for it
    tracing.step_spans.finish(route, "route", "ok", 1.0)
    [span] = spans.get_finished_spans()
    assert parent_of(span) == int(SENDER, 16)
    waiting = envelope("t-3", "infer")  # the retry tier re-sends what it was sent
    tracing.step_spans.adopt(waiting, sender)
    assert tracing.step_spans.traceparent(waiting) == sender
    foreign = envelope("t-3", "infer")
    tracing.step_spans.adopt(foreign, "00-" + "e" * 32 + f"-{SENDER}-01")
    assert tracing.step_spans.traceparent(foreign) != sender
