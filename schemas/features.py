"""Feature views: what the online store keeps per entity, and for how long."""

from __future__ import annotations

import hashlib
from typing import Annotated, Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field

FeatureType = Literal["int", "float", "str", "bool", "list[str]", "timestamp"]
Aggregation = Literal["count", "mean", "distinct", "last", "count_matching"]


class Feature(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: Annotated[str, Field(pattern=r"^[a-z][a-z0-9_]*$")]
    type: FeatureType
    default: Any
    aggregation: Aggregation
    window_seconds: int | None = Field(None, ge=1)
    field: str | None = None


class FeatureView(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: Annotated[str, Field(pattern=r"^[a-z][a-z0-9_]*$")]
    entity: str
    source_topic: str
    features: list[Feature] = Field(min_length=1)
    # mandatory: a key without a TTL is how a feature store fills Redis (seed article)
    ttl_seconds: int = Field(ge=1)

    def signature(self) -> str:
        """SHA-256 of the canonical definition; serving refuses data written under another."""
        canonical = orjson.dumps(self.model_dump(mode="json"), option=orjson.OPT_SORT_KEYS)
        return hashlib.sha256(canonical).hexdigest()

    def defaults(self) -> dict[str, Any]:
        return {f.name: f.default for f in self.features}
