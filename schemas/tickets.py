"""Records on the ticket topics: `Ticket` in, `Envelope` between steps, `TicketResult` out."""

from __future__ import annotations

from datetime import datetime, timezone
from enum import Enum
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints

TicketId = Annotated[
    str, StringConstraints(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9._:-]+$")
]
MAX_TEXT_CHARS = 20_000


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def _assume_utc(value: datetime) -> datetime:
    # a time without an offset is read as UTC (as the feature store always read it): an
    # offset-naive datetime cannot be compared with ours, and would crash the step doing so
    return value if value.tzinfo is not None else value.replace(tzinfo=timezone.utc)


# every datetime on a topic: ISO 8601 with or without an offset, always aware once read
UtcDatetime = Annotated[datetime, AfterValidator(_assume_utc)]
# JSON has no NaN or infinity, but pydantic's parser accepts them: refuse them, since a
# latency of NaN or a confidence of infinity would fail a result built from it later
FINITE = ConfigDict(allow_inf_nan=False)


class Category(str, Enum):
    billing = "billing"
    after_sales = "after_sales"
    technical = "technical"
    account = "account"
    shipping = "shipping"
    general = "general"


# The order of the classifier's SCORES output; shared by training, serving and the gateway.
CATEGORIES: tuple[str, ...] = tuple(c.value for c in Category)


class Channel(str, Enum):
    email = "email"
    chat = "chat"
    web = "web"
    phone = "phone"
    api = "api"


class Ticket(BaseModel):
    """What producers publish to `tickets.in`, keyed by `ticket_id`.

    Unknown fields are ignored, not refused: producers may add fields before consumers
    know them (forward compatibility); what the workflow needs is validated strictly.
    """

    model_config = ConfigDict(extra="ignore")

    ticket_id: TicketId
    text: Annotated[str, StringConstraints(min_length=1, max_length=MAX_TEXT_CHARS)]
    user_id: str | None = Field(None, max_length=128)
    channel: Channel | None = None
    language: str | None = Field(None, max_length=16)
    created_at: UtcDatetime
    metadata: dict[str, str] = Field(default_factory=dict)


class StepStatus(str, Enum):
    ok = "ok"
    degraded = "degraded"
    failed = "failed"
    retrying = "retrying"
    skipped = "skipped"


class DecisionStep(BaseModel):
    """One entry of a decision path: what a step did for a ticket."""

    model_config = FINITE

    step: str
    status: StepStatus
    attempt: int = Field(1, ge=1)
    latency_ms: float = Field(ge=0)
    detail: str | None = None
    # when the step ended (epoch milliseconds: a datetime costs 1.4 µs to encode, a float
    # 0.1, and the entry is encoded again at every hop), and the model version the ticket
    # carried then: what the ticket's audit trail reports for the step (None in entries
    # written before the trail existed)
    at_ms: float | None = Field(None, ge=0)
    model_version: str | None = None

    def ended_at(self) -> datetime | None:
        if self.at_ms is None:
            return None
        return datetime.fromtimestamp(self.at_ms / 1000, timezone.utc)


class FeatureValue(BaseModel):
    value: Any
    is_fallback: bool = False


class Prediction(BaseModel):
    model_config = FINITE

    category: Category
    confidence: float = Field(ge=0, le=1)
    scores: dict[str, float] = Field(default_factory=dict)
    model_name: str
    model_version: str


class RuleOutcome(BaseModel):
    route: str
    category: Category
    fired: list[str] = Field(default_factory=list)
    reason: str | None = None


class Context(BaseModel):
    """What the steps have accumulated for a ticket so far."""

    # bounded like the ticket's text: an envelope carrying more would fail at inference
    clean_text: Annotated[str, StringConstraints(max_length=MAX_TEXT_CHARS)] | None = None
    features: dict[str, FeatureValue] = Field(default_factory=dict)
    prediction: Prediction | None = None
    degraded: bool = False
    degraded_reason: str | None = None
    # the workflow deadline passed: no more retries; a prediction still made is advisory
    deadline_passed: bool = False
    rule: RuleOutcome | None = None


class Envelope(BaseModel):
    """A ticket in flight, on `tickets.step.<step>` and `tickets.retry.<delay_ms>`."""

    ticket: Ticket
    workflow: str
    workflow_version: int
    step: str
    attempt: int = Field(1, ge=1)
    trace_id: str
    # where this arrival entered (`partition:offset` of tickets.in): tells a redelivery of
    # the same record from a second publish of the same ticket_id
    arrival: str
    # HMAC-SHA256 of the ticket text under the deployment's audit key (agents/audit.py), for
    # audit records, which never hold the text itself; the name is kept for their readers
    input_sha256: str = ""
    started_at: UtcDatetime
    # for the retry tiers: when the envelope is due back at `step`
    not_before: UtcDatetime | None = None
    context: Context = Field(default_factory=Context)
    path: list[DecisionStep] = Field(default_factory=list)


class TicketResult(BaseModel):
    """The one result of a ticket, on `tickets.out.<route>`."""

    model_config = FINITE

    ticket_id: TicketId
    route: str
    category: Category
    confidence: float = Field(ge=0, le=1)
    model_name: str | None
    model_version: str | None
    degraded: bool = False
    degraded_reason: str | None = None
    features: dict[str, FeatureValue] = Field(default_factory=dict)
    decision_path: list[DecisionStep]
    latency_ms: float = Field(ge=0)
    completed_at: UtcDatetime
    trace_id: str | None = None
    workflow: str | None = None
    workflow_version: int | None = None


class ReviewDecision(BaseModel):
    """A reviewer's decision for a ticket in `manual_review`, on `tickets.review.decisions`."""

    ticket_id: TicketId
    category: Category
    reviewer: str = "anonymous"
    note: str | None = Field(None, max_length=2000)
    decided_at: UtcDatetime = Field(default_factory=utcnow)


class AuditRecord(BaseModel):
    """One step's audit entry on `tickets.audit`: never the raw text, only its SHA-256."""

    model_config = FINITE

    ticket_id: TicketId
    trace_id: str
    workflow: str
    workflow_version: int
    step: str
    outcome: StepStatus
    attempt: int = Field(1, ge=1)
    latency_ms: float = Field(ge=0)
    input_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    model_version: str | None = None
    detail: str | None = None
    at: UtcDatetime = Field(default_factory=utcnow)


AuditOutcome = Literal["completed", "degraded", "awaiting_review", "dead_lettered"]


class AuditTrail(BaseModel):
    """A ticket's audit on `tickets.audit`, written once, when the ticket leaves the
    pipeline (its result, in the result's transaction, or its dead letter): every step's
    entry, as its decision path has them. Never the raw text, only its keyed digest."""

    model_config = FINITE

    ticket_id: TicketId
    trace_id: str
    workflow: str
    workflow_version: int
    input_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    outcome: AuditOutcome
    route: str | None = None
    model_version: str | None = None
    steps: list[DecisionStep]
    at: UtcDatetime

    def records(self) -> list[AuditRecord]:
        """One `AuditRecord` per step, as the topic carried them before the trail."""
        return [
            AuditRecord.model_construct(
                ticket_id=self.ticket_id,
                trace_id=self.trace_id,
                workflow=self.workflow,
                workflow_version=self.workflow_version,
                step=s.step,
                outcome=s.status,
                attempt=s.attempt,
                latency_ms=s.latency_ms,
                input_sha256=self.input_sha256,
                model_version=s.model_version,
                detail=s.detail,
                at=s.ended_at() or self.at,
            )
            for s in self.steps
        ]


class ErrorClass(str, Enum):
    DESERIALIZATION = "DESERIALIZATION"
    SCHEMA_VALIDATION = "SCHEMA_VALIDATION"
    PAYLOAD_TOO_LARGE = "PAYLOAD_TOO_LARGE"
    INFERENCE_INVALID_INPUT = "INFERENCE_INVALID_INPUT"
    RETRIES_EXHAUSTED = "RETRIES_EXHAUSTED"
    WORKFLOW_DEADLINE = "WORKFLOW_DEADLINE"
    INTERNAL = "INTERNAL"


class DriftReport(BaseModel):
    """A drift check's verdict for one feature view, on `features.drift`."""

    view: str
    checked_at: datetime = Field(default_factory=utcnow)
    sample_size: int = Field(ge=0)
    excluded_fallback: int = Field(0, ge=0)
    drifted: bool
    features: dict[str, dict[str, Any]] = Field(default_factory=dict)


TicketStatusName = Literal[
    "received",
    "running",
    "waiting_retry",
    "awaiting_review",
    "completed",
    "degraded",
    "dead_lettered",
]
