"""Feature views: what the online store keeps per entity, how it is computed, for how long.

A view is data (the default one lives in `feature_jobs/views.yaml`). Its signature is the
SHA-256 of its canonical definition; the store keeps the signature of the definition its data
was built under, and the reader refuses a view whose stored signature differs from the code's.
"""

from __future__ import annotations

import hashlib
import re
from typing import Annotated, Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, model_validator

FeatureType = Literal["int", "float", "str", "bool", "list[str]", "timestamp"]
Aggregation = Literal["count", "mean", "distinct", "last", "count_matching"]
Transform = Literal["length"]

# the TTL of the default view; every view must still name its own (seed article: a view
# without a TTL is how a feature store fills Redis)
DEFAULT_TTL_SECONDS = 300
DEFAULT_GRACE_SECONDS = 600
MAX_SLOTS = 1000  # buckets a windowed feature may keep per entity

Name = Annotated[str, Field(pattern=r"^[a-z][a-z0-9_]*$", max_length=64)]

_AGG_TYPES: dict[str, set[str]] = {
    "count": {"int"},
    "count_matching": {"int"},
    "mean": {"float"},
    "distinct": {"list[str]"},
    "last": {"int", "float", "str", "bool", "timestamp"},
}


class Feature(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: Name
    type: FeatureType
    default: Any
    aggregation: Aggregation
    # sliding event-time window; None: over the entity's whole life in the store (its TTL)
    window_seconds: int | None = Field(None, ge=1)
    # windows are kept as a ring of buckets: the window's edge is exact to one bucket
    bucket_seconds: int | None = Field(None, ge=1)
    # the record field the aggregation reads (not needed by `count`)
    field: str | None = None
    # `count_matching`: a regular expression searched in the field (case-insensitive)
    match: str | None = None
    # `mean`: applied to the field before aggregating
    transform: Transform | None = None

    @model_validator(mode="after")
    def _check(self) -> Feature:
        if self.type not in _AGG_TYPES[self.aggregation]:
            allowed = sorted(_AGG_TYPES[self.aggregation])
            raise ValueError(f"{self.name}: {self.aggregation} gives {allowed}, not {self.type}")
        if self.aggregation != "count" and not self.field:
            raise ValueError(f"{self.name}: {self.aggregation} needs a `field`")
        if self.aggregation == "count_matching":
            if not self.match:
                raise ValueError(f"{self.name}: count_matching needs a `match` pattern")
            try:
                re.compile(self.match)
            except re.error as exc:
                raise ValueError(f"{self.name}: bad `match` pattern: {exc}") from exc
        elif self.match is not None:
            raise ValueError(f"{self.name}: `match` is only for count_matching")
        if self.transform is not None and self.aggregation != "mean":
            raise ValueError(f"{self.name}: `transform` is only for mean")
        if self.bucket_seconds is not None:
            if self.window_seconds is None:
                raise ValueError(f"{self.name}: `bucket_seconds` needs `window_seconds`")
            if self.aggregation in ("distinct", "last"):
                raise ValueError(f"{self.name}: {self.aggregation} windows need no buckets")
            if self.window_seconds % self.bucket_seconds:
                raise ValueError(f"{self.name}: the window is not a whole number of buckets")
        return self

    @property
    def bucketed(self) -> bool:
        return self.window_seconds is not None and self.aggregation in (
            "count",
            "count_matching",
            "mean",
        )

    @property
    def bucket_s(self) -> int:
        """The bucket size: as given, else a sixtieth of the window (at least a second)."""
        if self.window_seconds is None:
            return 0
        return self.bucket_seconds or max(1, self.window_seconds // 60)


class FeatureView(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: Name
    # the record field naming the entity the features are kept for
    entity: str
    # the logical topic (the deployment's prefix goes in front)
    source_topic: str
    features: list[Feature] = Field(min_length=1)
    # mandatory: every key the view writes expires. The entity's state lives until its newest
    # event has left the longest window (plus the grace period), then `ttl_seconds` more; a
    # view without windows keeps an entity `ttl_seconds` after its last event
    ttl_seconds: int = Field(ge=1)
    # the record fields giving each event its time and its identity (for de-duplication)
    event_time_field: str = "created_at"
    event_id_field: str = "ticket_id"
    # events older than the entity's newest event by more than this are counted as late and
    # dropped; events dated this far in the future are refused
    grace_seconds: int = Field(DEFAULT_GRACE_SECONDS, ge=0)

    @model_validator(mode="after")
    def _check(self) -> FeatureView:
        names = [f.name for f in self.features]
        if len(set(names)) != len(names):
            raise ValueError(f"view {self.name}: duplicate feature names {names}")
        for f in self.features:
            if f.bucketed and f.window_seconds is not None:
                slots = f.window_seconds // f.bucket_s + -(-self.grace_seconds // f.bucket_s) + 1
                if slots > MAX_SLOTS:
                    raise ValueError(
                        f"{self.name}.{f.name}: {slots} buckets per entity (at most {MAX_SLOTS});"
                        " use larger buckets"
                    )
        return self

    def signature(self) -> str:
        """SHA-256 of the canonical definition; serving refuses data written under another."""
        canonical = orjson.dumps(self.model_dump(mode="json"), option=orjson.OPT_SORT_KEYS)
        return hashlib.sha256(canonical).hexdigest()

    def defaults(self) -> dict[str, Any]:
        return {f.name: f.default for f in self.features}

    @property
    def longest_window_s(self) -> int:
        return max((f.window_seconds or 0) for f in self.features)

    @property
    def horizon_s(self) -> int:
        """How long after an entity's newest event its state still matters."""
        longest = max(
            ((f.window_seconds or 0) + (f.bucket_s if f.bucketed else 0)) for f in self.features
        )
        return longest + self.grace_seconds if longest else 0
