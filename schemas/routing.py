"""The canary routing config published on `config.routing` (docs/architecture.md,
"Routing config")."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StrictInt, model_validator

Weight = Annotated[StrictInt, Field(ge=0, le=100)]


class RoutingConfig(BaseModel):
    # strict: a weight of "50" is refused, never read as a number
    model_config = ConfigDict(extra="forbid", strict=True)

    name: Annotated[str, Field(min_length=1, max_length=128)]
    versions: dict[str, Weight] = Field(min_length=1)
    default: str

    @model_validator(mode="after")
    def _weights_sum_to_100(self) -> RoutingConfig:
        total = sum(self.versions.values())
        if total != 100:
            raise ValueError(f"versions: weights must sum to 100, got {total}")
        if self.default not in self.versions:
            raise ValueError(
                f"default: {self.default!r} is not one of versions {list(self.versions)}"
            )
        return self
