"""OpenTelemetry spans of an inference call: the caller's, the gateway's request, its batch,
and the Triton call (docs/tracing.md).

Off unless an OTLP endpoint is configured (`configure`, as the worker's streams/tracing.py:
the gateway may import only `schemas`, so it has its own few lines): then every hook returns
after one call of the API's get_tracer_provider().

One rule for an operation with several causes: one cause, its child; several, a new trace
with a link to each. The worker's call carries the tickets of a batch (each in its own
trace) and the gateway's batch merges several requests, so neither belongs to one trace.
A ticket alone in its call and a request alone in its batch stay in their trace, end to end.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from types import MappingProxyType
from typing import Any, cast

from opentelemetry import context, trace
from opentelemetry.trace import Link, NonRecordingSpan, SpanContext, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from schemas.gateway import PredictInput

TRACER_NAME = "ticketflow.inference"
ENDPOINT_VARS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
_OFF = (trace.ProxyTracerProvider, trace.NoOpTracerProvider)
_PROPAGATOR = TraceContextTextMapPropagator()
# the caller's spans of the inputs it is about to send, by input id (the ticket_id)
_CALLER_SPANS = context.create_key("ticketflow.caller_spans")
_cached: tuple[object, trace.Tracer] | None = None


def configure(service_name: str) -> bool:
    """Install the SDK's provider with an OTLP/HTTP exporter when an endpoint is set; once.
    True when tracing is on."""
    trace.get_tracer_provider()  # loads one named by OTEL_PYTHON_TRACER_PROVIDER
    if tracer() is not None:
        return True
    off = os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true"
    if off or not any(os.environ.get(v) for v in ENDPOINT_VARS):
        return False
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    name = os.environ.get("OTEL_SERVICE_NAME") or service_name
    provider = TracerProvider(resource=Resource.create({"service.name": name}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    return True


def tracer() -> trace.Tracer | None:
    """The tracer, or None when tracing is off (no SDK provider installed)."""
    global _cached
    # the API's public accessor (~0.7 µs when off: it looks OTEL_PYTHON_TRACER_PROVIDER up),
    # not its private global, which no release promises to keep
    provider = trace.get_tracer_provider()
    if isinstance(provider, _OFF):
        return None
    if _cached is None or _cached[0] is not provider:
        _cached = (provider, provider.get_tracer(TRACER_NAME))
    return _cached[1]


def _origin(causes: Sequence[SpanContext]) -> tuple[Any, list[Link] | None]:
    """(parent context, links) by the rule above."""
    if len(causes) == 1:
        return trace.set_span_in_context(NonRecordingSpan(causes[0])), None
    # an empty Context: a new trace, not whatever span happens to be current
    return context.Context(), [Link(c) for c in causes]


@contextmanager
def _span(t: trace.Tracer, name: str, parent: Any = None, **kwargs: Any) -> Iterator[trace.Span]:
    """A current span; a failure marks it with its error code only, never its message (it
    may quote input), so no exception is recorded."""
    with t.start_as_current_span(
        name, parent, record_exception=False, set_status_on_exception=False, **kwargs
    ) as span:
        try:
            yield span
        except BaseException as exc:
            failed(span, _code(exc))
            raise


def _code(exc: BaseException) -> str:
    code = getattr(exc, "code", None)
    return str(getattr(code, "value", None) or type(exc).__name__)


def failed(span: trace.Span | None, code: str) -> None:
    """Mark `span` failed with an error code."""
    if span is not None:
        span.set_attribute("ticketflow.error_code", code)
        span.set_status(Status(StatusCode.ERROR, code))


def _distinct(contexts: Iterable[SpanContext]) -> list[SpanContext]:
    # by span id: a SpanContext is not hashable (its trace state is not)
    return list({c.span_id: c for c in contexts}.values())


# Off, every hook below returns one of these shared, do-nothing context managers: a
# generator-based one would cost a microsecond per call, per ticket.
_NOTHING: AbstractContextManager[Any] = nullcontext()
_NO_HEADERS: AbstractContextManager[Mapping[str, str]] = nullcontext(MappingProxyType({}))


# ---- the caller (the worker's infer step) -------------------------------------------------


def caller_spans(spans: Mapping[str, SpanContext]) -> AbstractContextManager[Any]:
    """Calls made inside this block on behalf of inputs `spans` names are traced as theirs."""
    return _attached(dict(spans)) if spans else _NOTHING


@contextmanager
def _attached(spans: dict[str, SpanContext]) -> Iterator[None]:
    token = context.attach(context.set_value(_CALLER_SPANS, spans))
    try:
        yield
    finally:
        context.detach(token)


def client_span(
    model: str, inputs: Sequence[PredictInput]
) -> AbstractContextManager[Mapping[str, str]]:
    """The span of one predict call; gives the headers that carry it (`traceparent`)."""
    t = tracer()
    return _NO_HEADERS if t is None else _client_span(t, model, inputs)


@contextmanager
def _client_span(
    t: trace.Tracer, model: str, inputs: Sequence[PredictInput]
) -> Iterator[Mapping[str, str]]:
    # get_value gives an object; only caller_spans() stores under this key, a mapping
    known = cast(Mapping[str, SpanContext], context.get_value(_CALLER_SPANS) or {})
    causes = _distinct(known[i.id] for i in inputs if i.id in known)
    parent, links = _origin(causes) if causes else (None, None)
    attributes = {"ticketflow.model": model, "ticketflow.inputs": len(inputs)}
    with _span(
        t, "gateway predict", parent, kind=SpanKind.CLIENT, links=links, attributes=attributes
    ):
        headers: dict[str, str] = {}
        _PROPAGATOR.inject(headers)
        yield headers


# ---- the gateway ----------------------------------------------------------------------------


def server_span(headers: Mapping[str, str], model: str) -> AbstractContextManager[Any]:
    """The gateway's span of one predict request, continuing the caller's `traceparent`;
    gives the span (None when off)."""
    t = tracer()
    if t is None:
        return _NOTHING
    parent = _PROPAGATOR.extract({"traceparent": headers.get("traceparent", "")})
    name = "POST /v1/models/{model}/predict"
    return _span(t, name, parent, kind=SpanKind.SERVER, attributes={"ticketflow.model": model})


def current() -> SpanContext | None:
    """The current span's context (a request's, kept with its inputs in the batcher)."""
    if tracer() is None:
        return None
    ctx = trace.get_current_span().get_span_context()
    return ctx if ctx.is_valid else None


def batch_span(
    model: str, version: str, size: int, causes: Sequence[SpanContext | None]
) -> AbstractContextManager[Any]:
    """The span of one batch of `size` inputs from requests `causes`; the Triton call inside
    it is its child."""
    t = tracer()
    if t is None:
        return _NOTHING
    parent, links = _origin(_distinct(c for c in causes if c is not None))
    attributes = {
        "ticketflow.model": model,
        "ticketflow.version": version,
        "ticketflow.batch_size": size,
        "ticketflow.requests": len(causes),
    }
    return _span(t, f"batch {model} {version}", parent, links=links, attributes=attributes)


def triton_span(model: str, version: str, size: int) -> AbstractContextManager[Any]:
    """The span of one gRPC call to Triton (a child of the current batch)."""
    t = tracer()
    if t is None:
        return _NOTHING
    attributes = {
        "rpc.system": "grpc",
        "rpc.service": "inference.GRPCInferenceService",
        "rpc.method": "ModelInfer",
        "ticketflow.model": model,
        "ticketflow.version": version,
        "ticketflow.batch_size": size,
    }
    return _span(t, "triton infer", kind=SpanKind.CLIENT, attributes=attributes)
