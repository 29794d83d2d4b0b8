"""JSON Schema export of every record and API body, for users of other languages."""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel

from schemas.features import FeatureView
from schemas.gateway import ErrorResponse, PredictRequest, PredictResponse
from schemas.review import ReviewOutcome, SpotCheck
from schemas.routing import RoutingConfig
from schemas.selection import WorkflowSelector
from schemas.tickets import (
    AuditRecord,
    AuditTrail,
    DriftReport,
    Envelope,
    ReviewDecision,
    Ticket,
    TicketResult,
)
from schemas.workflow import WorkflowDefinition

EXPORTED: dict[str, type[BaseModel]] = {
    "Ticket": Ticket,
    "Envelope": Envelope,
    "TicketResult": TicketResult,
    "ReviewDecision": ReviewDecision,
    "SpotCheck": SpotCheck,
    "ReviewOutcome": ReviewOutcome,
    "AuditRecord": AuditRecord,
    "AuditTrail": AuditTrail,
    "DriftReport": DriftReport,
    "RoutingConfig": RoutingConfig,
    "PredictRequest": PredictRequest,
    "PredictResponse": PredictResponse,
    "ErrorResponse": ErrorResponse,
    "WorkflowDefinition": WorkflowDefinition,
    "WorkflowSelector": WorkflowSelector,
    "FeatureView": FeatureView,
}


def json_schemas() -> dict[str, dict]:
    return {name: model.model_json_schema() for name, model in EXPORTED.items()}


def export(directory: Path) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, schema in json_schemas().items():
        path = directory / f"{name}.schema.json"
        path.write_text(json.dumps(schema, indent=2, sort_keys=True) + "\n")
        written.append(path)
    return written
