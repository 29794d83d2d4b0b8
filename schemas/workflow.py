"""Workflow definitions as data: the steps, their order, timeouts and retry policies.

A definition is validated when it is loaded; structural errors name the field. Whether a
handler or rule name exists is checked by the engine against its registry (`agents`), since
only it knows them.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

StepName = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[a-z][a-z0-9_]*$")]
StepType = Literal[
    "validator", "processor", "feature_lookup", "inference_call", "rule_engine", "router"
]


class RetryPolicy(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max_attempts: int = Field(3, ge=1, le=5)
    backoff_ms: int = Field(200, ge=1, le=60_000)
    multiplier: float = Field(2.0, ge=1.0, le=10.0)
    jitter: float = Field(0.2, ge=0.0, le=1.0)

    def delay_ms(self, attempt: int) -> int:
        """The un-jittered delay before `attempt` (2, 3, ...)."""
        return int(self.backoff_ms * self.multiplier ** max(0, attempt - 2))


class Step(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: StepName
    type: StepType
    handler: str | None = None
    views: list[str] = Field(default_factory=list)
    model: str | None = None
    rules: list[str] = Field(default_factory=list)
    routes: list[str] = Field(default_factory=list)
    timeout_ms: int | None = Field(None, ge=1, le=60_000)
    retry: RetryPolicy | None = None
    # rule_engine: confidence below this sends the ticket to manual review
    threshold: float = Field(0.5, ge=0.0, le=1.0)
    # the step that follows; default: the next one in the list
    next: StepName | None = None

    @model_validator(mode="after")
    def _type_needs(self) -> Step:
        needs = {
            "processor": ("handler", self.handler),
            "inference_call": ("model", self.model),
        }
        if self.type in needs and not needs[self.type][1]:
            field = needs[self.type][0]
            raise ValueError(f"step {self.name!r} of type {self.type} needs `{field}`")
        if self.type == "rule_engine" and not self.rules:
            raise ValueError(f"step {self.name!r} of type rule_engine needs `rules`")
        if self.type == "router" and not self.routes:
            raise ValueError(f"step {self.name!r} of type router needs `routes`")
        return self


class WorkflowDefinition(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: StepName
    version: int = Field(ge=1)
    deadline_ms: int = Field(2000, ge=10, le=3_600_000)
    on_deadline: Literal["degrade", "dead_letter"] = "degrade"
    steps: list[Step] = Field(min_length=1)

    @model_validator(mode="after")
    def _graph(self) -> WorkflowDefinition:
        names = [s.name for s in self.steps]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"steps: duplicate step names {dupes}")
        if self.steps[0].type != "validator":
            raise ValueError("steps[0]: the first step must be of type validator")
        if self.steps[-1].type != "router" and self.steps[-1].next is None:
            raise ValueError("steps: the last step must be a router")
        for s in self.steps:
            if s.next is not None and s.next not in names:
                raise ValueError(f"steps.{s.name}.next: unknown step {s.next!r}")
        self._check_reachable_acyclic()
        return self

    def _check_reachable_acyclic(self) -> None:
        seen: list[str] = []
        step: Step | None = self.steps[0]
        while step is not None:
            if step.name in seen:
                raise ValueError(f"steps: cycle {' -> '.join([*seen, step.name])}")
            seen.append(step.name)
            step = self.next_step(step.name)
        unreachable = [s.name for s in self.steps if s.name not in seen]
        if unreachable:
            raise ValueError(f"steps: unreachable steps {unreachable}")

    def step(self, name: str) -> Step:
        for s in self.steps:
            if s.name == name:
                return s
        raise KeyError(name)

    def next_step(self, name: str) -> Step | None:
        """The step after `name`, or None after a router."""
        step = self.step(name)
        if step.next is not None:
            return self.step(step.next)
        if step.type == "router":
            return None
        index = self.steps.index(step)
        return self.steps[index + 1] if index + 1 < len(self.steps) else None

    @property
    def routes(self) -> list[str]:
        return sorted({r for s in self.steps if s.type == "router" for r in s.routes})
