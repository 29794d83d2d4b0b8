"""The OpenAPI 3.1 document served at `/openapi.json`.

Written by hand around the record schemas, which come from the pydantic models the
workflow itself uses (`Ticket`, `TicketResult`), so the document cannot drift from the
validation. The integration tests run schemathesis against the live service with it.
"""

from __future__ import annotations

from typing import Any

from pydantic.json_schema import models_json_schema

from ingest.http_fields import IDEMPOTENCY_KEY_PATTERN
from ingest.problems import TITLES, TYPE_PREFIX
from ingest.settings import IngestSettings
from schemas.tickets import Ticket, TicketResult

REF = "#/components/schemas/{model}"
STATUSES = [
    "accepted",
    "received",
    "running",
    "waiting_retry",
    "awaiting_review",
    "completed",
    "degraded",
    "dead_lettered",
]


def _ref(name: str) -> dict[str, str]:
    return {"$ref": REF.format(model=name)}


def _header(description: str, schema: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"description": description, "schema": schema or {"type": "string"}}


HEADERS: dict[str, Any] = {
    "RateLimit": _header(
        "The buckets' state after this request (draft-ietf-httpapi-ratelimit-headers): "
        '`"key";r=<left>;t=<seconds until full>, "ip";r=...;t=...`.'
    ),
    "RateLimit-Policy": _header(
        'The buckets: `"key";q=<burst>;w=<seconds to refill>, "ip";q=...;w=...`.'
    ),
    "Retry-After": _header("Seconds to wait before trying again.", {"type": "integer"}),
    "traceparent": _header("The W3C trace context the records carry (ingest's span)."),
    "WWW-Authenticate": _header("The Bearer challenge (RFC 6750)."),
    "Idempotent-Replayed": _header("`true` when this is a stored response replayed."),
    "Allow": _header("The methods the path allows."),
}


def _problem(description: str, *headers: str) -> dict[str, Any]:
    out: dict[str, Any] = {
        "description": description,
        "content": {"application/problem+json": {"schema": _ref("Problem")}},
    }
    if headers:
        out["headers"] = {h: {"$ref": f"#/components/headers/{h}"} for h in headers}
    return out


def _json(description: str, schema: dict[str, Any], *headers: str) -> dict[str, Any]:
    out = _problem(description, *headers)
    out["content"] = {"application/json": {"schema": schema}}
    return out


LIMITED = ("RateLimit", "RateLimit-Policy")
AUTH_ERRORS = {
    "401": _problem("No API key, or an unknown or revoked one.", "WWW-Authenticate"),
    "403": _problem("The API key lacks the scope.", "WWW-Authenticate"),
    "429": _problem("Over quota.", "Retry-After", *LIMITED),
    "503": _problem(
        "Kafka did not acknowledge in time, or Redis is unavailable and ingest fails "
        "closed. Nothing was accepted; retry after the given time.",
        "Retry-After",
    ),
}


def _submit(s: IngestSettings) -> dict[str, Any]:
    submit_response = _ref("SubmitResponse")
    return {
        "operationId": "submitTickets",
        "summary": "Submit one ticket, or a batch",
        "description": (
            f'One `Ticket` object, or `{{"tickets": [Ticket, ...]}}` with 1 to {s.batch_max} '
            "tickets (any object that has a `tickets` member is a batch). Each record goes "
            "to `tickets.in`, keyed by its ticket_id, with a `traceparent` header, and is "
            "answered only once the broker acknowledged it (acks=all, idempotent producer). "
            "A single ticket answers 202, or the ticket's problem. A batch answers 202 when "
            "every ticket was accepted, else 207 with each rejected ticket's problem "
            "(the accepted ones are on the topic); 503 when Kafka acknowledged none of them. "
            f"The body is at most {s.body_limit_bytes} bytes, each ticket's record at most "
            f"{s.max_record_bytes} bytes. Needs the `submit` scope."
        ),
        "security": [{"bearer": ["submit"]}],
        "parameters": [
            {
                "name": "Idempotency-Key",
                "in": "header",
                "required": False,
                "description": (
                    "draft-ietf-httpapi-idempotency-key-header: a Structured Field string "
                    '(`"..."`, or a bare token) of 1-255 visible ASCII characters '
                    'without `"` or `\\`, unique per operation and API key.'
                ),
                "schema": {"type": "string", "pattern": IDEMPOTENCY_KEY_PATTERN},
            },
            {
                "name": "traceparent",
                "in": "header",
                "required": False,
                "description": "W3C trace context; a valid one is continued, else a new trace.",
                "schema": {"type": "string"},
            },
        ],
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {"schema": {"anyOf": [_ref("Ticket"), _ref("TicketBatch")]}}
            },
        },
        "responses": {
            "202": _json(
                "Every ticket is on tickets.in.",
                submit_response,
                "traceparent",
                "Idempotent-Replayed",
                *LIMITED,
            ),
            "207": _json(
                "A batch of which some tickets were rejected (see `rejected`).",
                submit_response,
                "traceparent",
                "Idempotent-Replayed",
                "Retry-After",
                *LIMITED,
            ),
            "400": _problem(
                "The body or a ticket does not match the schema; `errors` names the fields "
                "by JSON pointer.",
                "Idempotent-Replayed",
                *LIMITED,
            ),
            "409": _problem(
                "A request with this Idempotency-Key is in flight, or the ticket_id was "
                "submitted by another API key.",
                "Idempotent-Replayed",
                *LIMITED,
            ),
            "413": _problem(
                "The body, or the ticket's record, is over the size limit.",
                "Idempotent-Replayed",
                *LIMITED,
            ),
            "408": _problem("The body did not arrive within the time allowed.", *LIMITED),
            "415": _problem("Not `application/json`, or not valid UTF-8 JSON.", *LIMITED),
            "422": _problem("The Idempotency-Key was used with another payload.", *LIMITED),
            **AUTH_ERRORS,
        },
    }


def _lookup() -> dict[str, Any]:
    return {
        "operationId": "getTicket",
        "summary": "A submitted ticket's state, and its result once done",
        "description": (
            "Tickets submitted with this API key (any ticket with the `admin` scope). "
            "Needs the `read` scope."
        ),
        "security": [{"bearer": ["read"]}],
        "parameters": [
            {
                "name": "ticket_id",
                "in": "path",
                "required": True,
                "schema": {"type": "string", "minLength": 1, "maxLength": 128},
            }
        ],
        "responses": {
            "200": _json("The ticket.", _ref("TicketStatus"), *LIMITED),
            "404": _problem("No such ticket submitted with this key.", *LIMITED),
            **AUTH_ERRORS,
        },
    }


def _plain(operation_id: str, summary: str, schema: dict[str, Any], ctype: str) -> dict:
    return {
        "operationId": operation_id,
        "summary": summary,
        "security": [],
        "responses": {
            "200": {"description": "OK", "content": {ctype: {"schema": schema}}},
        },
    }


def _schemas(s: IngestSettings) -> dict[str, Any]:
    _, generated = models_json_schema(
        [(Ticket, "validation"), (TicketResult, "serialization")], ref_template=REF
    )
    schemas: dict[str, Any] = dict(generated["$defs"])
    schemas["TicketBatch"] = {
        "type": "object",
        "required": ["tickets"],
        "properties": {
            "tickets": {
                "type": "array",
                "minItems": 1,
                "maxItems": s.batch_max,
                # each entry is checked on its own, and refused on its own (207): a batch
                # with a bad entry, even one that is no object, is still a well-formed batch
                "items": {"description": "A `Ticket`; checked and answered one by one."},
            }
        },
    }
    schemas["Problem"] = {
        "type": "object",
        "description": "RFC 9457 problem details; never echoes the request's values.",
        "required": ["type", "title", "status"],
        "properties": {
            "type": {"type": "string", "enum": [TYPE_PREFIX + k for k in TITLES]},
            "title": {"type": "string"},
            "status": {"type": "integer", "minimum": 400, "maximum": 599},
            "detail": {"type": "string"},
            "errors": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["pointer", "detail"],
                    "properties": {
                        "pointer": {"type": "string", "description": "RFC 6901 JSON pointer"},
                        "detail": {"type": "string"},
                    },
                },
            },
        },
    }
    schemas["SubmitResponse"] = {
        "type": "object",
        "required": ["accepted", "rejected"],
        "properties": {
            "accepted": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["index", "ticket_id", "status_url"],
                    "properties": {
                        "index": {"type": "integer", "minimum": 0},
                        "ticket_id": {"type": "string"},
                        "status_url": {"type": "string"},
                    },
                },
            },
            "rejected": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["index", "problem"],
                    "properties": {
                        "index": {"type": "integer", "minimum": 0},
                        "problem": _ref("Problem"),
                    },
                },
            },
        },
    }
    nullable = {"type": ["string", "null"]}
    schemas["TicketStatus"] = {
        "type": "object",
        "required": ["ticket_id", "status", "result"],
        "properties": {
            "ticket_id": {"type": "string"},
            "status": {"type": "string", "enum": STATUSES},
            "step": nullable,
            "route": nullable,
            "submitted_at": nullable,
            "trace_id": nullable,
            "error_class": nullable,
            "result": {"anyOf": [_ref("TicketResult"), {"type": "null"}]},
        },
    }
    return schemas


def document(s: IngestSettings) -> dict[str, Any]:
    ready = {
        "type": "object",
        "required": ["ready"],
        "properties": {
            "ready": {"type": "boolean"},
            "redis": {"type": "boolean"},
            "kafka": {"type": "boolean"},
        },
    }
    readyz = _plain("ready", "Redis and Kafka answer", ready, "application/json")
    readyz["responses"]["503"] = {
        "description": "Not ready",
        "content": {"application/json": {"schema": ready}},
    }
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "ticketflow ingest",
            "version": "1.0.0",
            "description": (
                "HTTP access to ticketflow's `tickets.in`: API keys with scopes, per-key "
                "and per-IP token buckets, idempotency keys, RFC 9457 problems."
            ),
        },
        "paths": {
            "/v1/tickets": {"post": _submit(s)},
            "/v1/tickets/{ticket_id}": {"get": _lookup()},
            "/healthz": {"get": _plain("health", "Alive", {"type": "object"}, "application/json")},
            "/readyz": {"get": readyz},
            "/metrics": {"get": _plain("metrics", "Prometheus", {"type": "string"}, "text/plain")},
            "/openapi.json": {
                "get": _plain("openapi", "This document", {"type": "object"}, "application/json")
            },
        },
        "components": {
            "schemas": _schemas(s),
            "headers": {k: v for k, v in HEADERS.items()},
            "securitySchemes": {
                "bearer": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "An API key from `ticketflow keys create`.",
                }
            },
        },
    }
