"""The inference gateway's HTTP API (docs/architecture.md, "Inference gateway API")."""

from __future__ import annotations

from enum import Enum
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from schemas.tickets import MAX_TEXT_CHARS


class PredictInput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: Annotated[str, StringConstraints(min_length=1, max_length=128)]
    text: Annotated[str, StringConstraints(min_length=1, max_length=MAX_TEXT_CHARS)]
    features: dict[str, Any] = Field(default_factory=dict)


class PredictRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    inputs: list[PredictInput] = Field(min_length=1, max_length=1024)
    version: str | None = None
    timeout_ms: int | None = Field(None, ge=1, le=60_000)


class PredictOutput(BaseModel):
    id: str
    label: str
    confidence: float
    scores: dict[str, float]
    # the version that computed this output; None from a gateway that predates it
    version: str | None = None


class PredictResponse(BaseModel):
    """A predict answer; `outputs` are in the request's order.

    Without a pinned version each input is routed by its own id, so outputs of one request
    may come from different versions: each output's `version` says which. The top-level
    `version` is the first output's (all outputs' when they share one, always so for a
    single input or a pinned version).
    """

    model: str
    version: str
    outputs: list[PredictOutput]
    latency_ms: float


class ErrorCode(str, Enum):
    INVALID_INPUT = "INVALID_INPUT"
    OVERLOADED = "OVERLOADED"
    MODEL_UNAVAILABLE = "MODEL_UNAVAILABLE"
    TIMEOUT = "TIMEOUT"
    INTERNAL = "INTERNAL"


HTTP_STATUS: dict[ErrorCode, int] = {
    ErrorCode.INVALID_INPUT: 400,
    ErrorCode.OVERLOADED: 429,
    ErrorCode.MODEL_UNAVAILABLE: 503,
    ErrorCode.TIMEOUT: 504,
    ErrorCode.INTERNAL: 500,
}

RETRYABLE: dict[ErrorCode, bool] = {
    ErrorCode.INVALID_INPUT: False,
    ErrorCode.OVERLOADED: True,
    ErrorCode.MODEL_UNAVAILABLE: True,
    ErrorCode.TIMEOUT: True,
    ErrorCode.INTERNAL: False,
}


class ErrorBody(BaseModel):
    code: ErrorCode
    message: str
    retryable: bool


class ErrorResponse(BaseModel):
    error: ErrorBody

    @classmethod
    def of(cls, code: ErrorCode, message: str) -> ErrorResponse:
        return cls(error=ErrorBody(code=code, message=message, retryable=RETRYABLE[code]))
