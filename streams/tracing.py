"""OpenTelemetry spans of the workflow worker: one per step a ticket goes through.

Off unless an OTLP endpoint is configured (`OTEL_EXPORTER_OTLP_ENDPOINT` or
`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, docs/tracing.md): `configure` then installs the SDK's
provider, exporting over OTLP/HTTP. Off, no SDK provider exists and every hook returns after
one call of the API's get_tracer_provider() (docs/tracing.md has the measured cost).

A step runs on a batch of tickets, each in its own trace, so spans are kept per envelope,
never as the "current" span: `StepSpans.start` opens a ticket's step span before its handler
runs (its parent: the span that sent the record, from the record's `traceparent`), `finish`
closes it when the step's audit record is written, and `traceparent` is what the next
record of the ticket carries, so the next step's span is this one's child.
"""

from __future__ import annotations

import os
import time
import weakref
from collections.abc import Iterable
from typing import Any, Generic, TypeVar

from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, Status, StatusCode, TraceFlags
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from schemas.tickets import Envelope

TRACER_NAME = "ticketflow.worker"
ENDPOINT_VARS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
_OFF = (trace.ProxyTracerProvider, trace.NoOpTracerProvider)
_PROPAGATOR = TraceContextTextMapPropagator()
_cached: tuple[object, trace.Tracer] | None = None


def configure(service_name: str) -> bool:
    """Install the SDK's provider with an OTLP/HTTP exporter when an endpoint is set; once.
    True when tracing is on."""
    trace.get_tracer_provider()  # loads one named by OTEL_PYTHON_TRACER_PROVIDER
    if step_spans.refresh():
        return True
    if not any(os.environ.get(v) for v in ENDPOINT_VARS) or _disabled():
        return False
    # imported here: a worker without an endpoint never loads the SDK
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    name = os.environ.get("OTEL_SERVICE_NAME") or service_name
    provider = TracerProvider(resource=Resource.create({"service.name": name}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    step_spans.refresh()
    return True


def _disabled() -> bool:
    return os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true"


def tracer() -> trace.Tracer | None:
    """The worker's tracer, or None when tracing is off (no SDK provider installed)."""
    global _cached
    # the API's public accessor (~0.7 µs when off: it looks OTEL_PYTHON_TRACER_PROVIDER up),
    # not its private global, which no release promises to keep
    provider = trace.get_tracer_provider()
    if isinstance(provider, _OFF):
        return None
    if _cached is None or _cached[0] is not provider:
        _cached = (provider, provider.get_tracer(TRACER_NAME))
    return _cached[1]


def remote_context(traceparent: str | None, trace_id: str) -> SpanContext | None:
    """The span context of a W3C `traceparent`, if valid and of the trace `trace_id`."""
    if not traceparent:
        return None
    ctx = _PROPAGATOR.extract({"traceparent": traceparent})
    span_context = trace.get_current_span(ctx).get_span_context()
    if not span_context.is_valid or f"{span_context.trace_id:032x}" != trace_id:
        return None
    return span_context


def _entry_context(trace_id: str) -> SpanContext:
    """The parent of a step span whose sender is unknown: the validate step (a producer's
    span, if any, was never exported), the route step (the engine does not hand this module
    its record's header) and a step after a retry tier (which runs no step, so sends this).

    The SDK roots a span only in a trace id of its own making, so this stand-in keeps the
    span in the ticket's trace. Its id is the same for the whole trace: a backend shows such
    spans side by side under one missing "ticket" span."""
    return SpanContext(
        int(trace_id, 16),
        int(trace_id[16:], 16) or 1,
        is_remote=True,
        trace_flags=TraceFlags(TraceFlags.SAMPLED),
    )


V = TypeVar("V")


class _ByIdentity(Generic[V]):
    """A map keyed weakly by object identity (envelopes are unhashable pydantic models):
    an entry goes with its envelope, so a ticket dropped on any path leaks nothing."""

    def __init__(self) -> None:
        self._items: dict[int, tuple[weakref.ref[Any], V]] = {}

    def get(self, obj: object) -> V | None:
        item = self._items.get(id(obj))
        return item[1] if item is not None and item[0]() is obj else None

    def pop(self, obj: object) -> V | None:
        value = self.get(obj)
        if value is not None:
            del self._items[id(obj)]
        return value

    def __setitem__(self, obj: object, value: V) -> None:
        key = id(obj)
        items = self._items

        def forget(_: object, k: int = key) -> None:
            items.pop(k, None)

        self._items[key] = (weakref.ref(obj, forget), value)

    def __len__(self) -> int:
        return len(self._items)


class StepSpans:
    """Step spans by envelope: the open one, and the latest closed one's context."""

    def __init__(self) -> None:
        self._open: _ByIdentity[trace.Span] = _ByIdentity()
        self._last: _ByIdentity[SpanContext] = _ByIdentity()
        # whether a provider was installed when last looked (configure, and once per batch):
        # with tracing off every hook returns on this one attribute read, not on a lookup
        # of the provider (~1 µs each, four or five per ticket and step)
        self.on = False

    def refresh(self) -> bool:
        """Look the provider up again (a worker does it once per batch); whether it is on."""
        self.on = tracer() is not None
        return self.on

    def start(self, step: str, items: Iterable[tuple[Envelope, str | None]]) -> None:
        """Open the step's span of each (envelope, traceparent of the record that carried it)."""
        if not self.on:
            return
        t = tracer()
        if t is None:
            return
        for env, carried in items:
            parent = self._last.get(env) or remote_context(carried, env.trace_id)
            self._open[env] = t.start_span(
                f"step {step}",
                _parent(parent or _entry_context(env.trace_id)),
                kind=trace.SpanKind.CONSUMER,
                attributes=_attributes(env, step),
            )

    def adopt(self, env: Envelope, carried: str | None) -> None:
        """Take the `traceparent` of the record that carried `env` as its sender's span, for a
        step this module does not open (validate, route) or a record passed on (the retry
        tier): its span, or its next record, continues from there."""
        if not self.on or (ctx := remote_context(carried, env.trace_id)) is None:
            return
        self._last[env] = ctx

    def contexts(self, envs: Iterable[Envelope]) -> dict[str, SpanContext]:
        """ticket_id -> its open step span, for the calls a handler makes on their behalf."""
        if not len(self._open):  # tracing off: nothing was opened
            return {}
        return {
            env.ticket.ticket_id: span.get_span_context()
            for env in envs
            if (span := self._open.get(env)) is not None
        }

    def finish(self, env: Envelope, step: str, status: str, latency_ms: float) -> None:
        """Close the ticket's span of `step` (a step run outside `start` gets one from its
        latency, so every audited step has its span)."""
        if not self.on and not len(self._open):
            return
        now = time.time_ns()
        span = self._open.pop(env)
        if span is None:
            t = tracer() if self.on else None
            if t is None:
                return
            parent = self._last.get(env) or _entry_context(env.trace_id)
            span = t.start_span(
                f"step {step}",
                _parent(parent),
                kind=trace.SpanKind.CONSUMER,
                attributes=_attributes(env, step),
                start_time=now - int(latency_ms * 1e6),
            )
        span.set_attribute("ticketflow.status", status)
        span.set_attribute("ticketflow.attempt", env.attempt)
        self._last[env] = span.get_span_context()
        span.end(end_time=now)

    def fail(self, env: Envelope, error_class: str) -> None:
        """Close the ticket's open span as failed: it was dead-lettered."""
        if not len(self._open):
            return
        span = self._open.pop(env)
        if span is None:
            return
        span.set_attribute("ticketflow.status", "dead_lettered")
        span.set_attribute("ticketflow.error_class", error_class)
        span.set_status(Status(StatusCode.ERROR, error_class))
        self._last[env] = span.get_span_context()
        span.end()

    def traceparent(self, env: Envelope) -> str | None:
        """The `traceparent` of the ticket's latest step span, for its next record (None
        when tracing is off)."""
        if not self.on and not len(self._last):
            return None
        ctx = self._last.get(env)
        if ctx is None:
            if not self.on:
                return None
            ctx = _entry_context(env.trace_id)  # e.g. the retry tier's, which runs no step
        return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


def _parent(ctx: SpanContext) -> Any:
    return trace.set_span_in_context(NonRecordingSpan(ctx))


def _attributes(env: Envelope, step: str) -> dict[str, Any]:
    return {
        "ticketflow.ticket_id": env.ticket.ticket_id,
        "ticketflow.step": step,
        "ticketflow.workflow": env.workflow,
        "ticketflow.workflow_version": env.workflow_version,
        "ticketflow.attempt": env.attempt,
    }


# one per process, as the tracer provider is: the runner opens a ticket's span, the emitter
# closes it and sends it on, and a span is found by its envelope's identity
step_spans = StepSpans()
