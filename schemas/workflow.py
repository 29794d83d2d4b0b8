"""Workflow definitions as data: the steps, their order, timeouts and retry policies.

A definition is validated when it is loaded; structural errors name the field. Whether a
handler or rule name exists is checked by the engine against its registry (`agents`), since
only it knows them.
"""

from __future__ import annotations

import functools
import itertools
from typing import Annotated, Any, Literal, cast

from pydantic import BaseModel, ConfigDict, Field, model_validator

StepName = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[a-z][a-z0-9_]*$")]
StepType = Literal[
    "validator",
    "processor",
    "feature_lookup",
    "inference_call",
    "rule_engine",
    "router",
    "parallel",
]
# what a branch of a `parallel` step may be: a step that works on the ticket's context, not
# one that admits (validator), ends (router) or nests a group
BRANCH_TYPES = frozenset({"processor", "feature_lookup", "inference_call", "rule_engine"})
# what the gateway takes as a version (inference_gateway/routing.py): anything else would
# be refused as INVALID_INPUT and dead-letter every ticket, so it is refused at load
ModelVersion = Annotated[str, Field(pattern=r"^v[1-9][0-9]{0,8}$")]


class RetryPolicy(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max_attempts: int = Field(3, ge=1, le=5)
    backoff_ms: int = Field(200, ge=1, le=60_000)
    multiplier: float = Field(2.0, ge=1.0, le=10.0)
    jitter: float = Field(0.2, ge=0.0, le=1.0)

    def delay_ms(self, attempt: int) -> int:
        """The un-jittered delay before `attempt` (2, 3, ...)."""
        return int(self.backoff_ms * self.multiplier ** max(0, attempt - 2))


# the gateway's retryable error codes; INVALID_INPUT and INTERNAL are never retried
RetryableCode = Literal["OVERLOADED", "TIMEOUT", "MODEL_UNAVAILABLE"]
Op = Literal["eq", "ne", "lt", "le", "gt", "ge", "in", "not_in"]
_MISSING = object()


class Condition(BaseModel):
    """A test over a ticket's context, e.g. `{field: prediction.confidence, op: lt, value: 0.8}`.

    `field` is a dot path into the envelope's context (`prediction.category`,
    `features.tickets_1h.value`, `degraded`, ...); a path that leads nowhere is false.
    """

    model_config = ConfigDict(extra="forbid")

    field: Annotated[str, Field(pattern=r"^[a-z_][a-z0-9_]*(\.[a-z0-9_]+)*$")]
    op: Op = "eq"
    value: Any

    def holds(self, context: Any) -> bool:
        actual = _lookup(context, self.field)
        if actual is _MISSING:
            return False
        if hasattr(actual, "value") and isinstance(self.value, str):
            actual = actual.value  # enums compare by their string value
        try:
            return _OPS[self.op](actual, self.value)
        except TypeError:  # e.g. None < 0.5: a condition that cannot hold
            return False


_OPS = {
    "eq": lambda a, b: a == b,
    "ne": lambda a, b: a != b,
    "lt": lambda a, b: a < b,
    "le": lambda a, b: a <= b,
    "gt": lambda a, b: a > b,
    "ge": lambda a, b: a >= b,
    "in": lambda a, b: a in b,
    "not_in": lambda a, b: a not in b,
}


def _lookup(obj: Any, path: str) -> Any:
    for part in path.split("."):
        if obj is None:
            return _MISSING
        obj = obj.get(part, _MISSING) if isinstance(obj, dict) else getattr(obj, part, _MISSING)
        if obj is _MISSING:
            return _MISSING
    return obj


class Branch(BaseModel):
    """One way out of a step: taken when `when` holds (or always, without `when`)."""

    model_config = ConfigDict(extra="forbid")

    when: Condition | None = None
    step: StepName


class Cascade(BaseModel):
    """Call the cheap version `first`; only when its confidence is below `below`, `then`."""

    model_config = ConfigDict(extra="forbid")

    # None: the version the gateway's routing picks per ticket, so a rollout applies
    first: ModelVersion | None = None
    then: ModelVersion
    below: float = Field(gt=0.0, le=1.0)

    @model_validator(mode="after")
    def _two_versions(self) -> Cascade:
        if self.first == self.then:
            raise ValueError("cascade: `first` and `then` must be different versions")
        return self


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
    # per error class, overriding `retry` (e.g. wait longer on OVERLOADED than on TIMEOUT)
    retry_on: dict[RetryableCode, RetryPolicy] = Field(default_factory=dict)
    # rule_engine: confidence below this sends the ticket to manual review
    threshold: float = Field(0.5, ge=0.0, le=1.0)
    # rule_engine (`refund_intent`): the model's after_sales probability at or above this
    # sends the ticket to after_sales even without a refund word; None: words only
    after_sales_threshold: float | None = Field(None, ge=0.0, le=1.0)
    # rule_engine (`refund_intent`): the refund-intent head's uncertain band [low, high):
    # at or above high, after_sales; inside, manual_review; None: no head, the probability
    intent_band: tuple[float, float] | None = None
    # rule_engine (`sample`): the share of automatic decisions copied to reviewers as spot
    # checks, chosen by ticket_id (a replay samples the same tickets); 0 samples none
    sample_share: float = Field(0.0, ge=0.0, le=1.0)
    # what follows: a step name, or branches tried in order (the last without `when`);
    # default: the next step in the list
    next: StepName | list[Branch] | None = None
    # batches of this step in flight at once in each worker: more for a step that waits on
    # a service (features, infer), so one slow call does not hold up the step's topic.
    # Tickets are independent and each is in one step at a time, so order is not at stake
    concurrency: int = Field(1, ge=1, le=16)
    # inference_call: the model version every call names (None: the routing config picks),
    # or a cascade of two versions
    version: ModelVersion | None = None
    cascade: Cascade | None = None
    # parallel: steps run at once on the same ticket, joined before the next step. `join`:
    # `all` must succeed (else the step fails as the failed branch's type does), or
    # `best_available` (failed branches are degraded, the others used). `merge`: how the
    # inference branches' predictions become one (mean of their scores, or the most confident)
    branches: list[Step] = Field(default_factory=list)
    join: Literal["all", "best_available"] = "all"
    merge: Literal["mean", "max_confidence"] = "mean"

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
        if self.type == "router" and self.concurrency != 1:
            raise ValueError(
                f"step {self.name!r}: a router runs one batch at a time (concurrency 1): "
                "its results commit in order, partition by partition"
            )
        if isinstance(self.next, list) and (not self.next or self.next[-1].when is not None):
            raise ValueError(
                f"step {self.name!r}: the last branch of `next` needs no `when`, "
                "so that every ticket has somewhere to go"
            )
        self._check_inference_fields()
        self._check_branches()
        return self

    def _check_inference_fields(self) -> None:
        if self.type != "inference_call" and (self.version or self.cascade):
            raise ValueError(f"step {self.name!r}: `version` and `cascade` need inference_call")
        if self.version and self.cascade:
            raise ValueError(
                f"step {self.name!r}: a cascade names its versions; drop `version` or `cascade`"
            )

    def _check_branches(self) -> None:
        if self.type != "parallel":
            if self.branches:
                raise ValueError(f"step {self.name!r}: only a parallel step has `branches`")
            return
        if not self.branches:
            raise ValueError(f"step {self.name!r}: a parallel step needs at least one branch")
        names = [b.name for b in self.branches]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"step {self.name!r}: duplicate branch names {dupes}")
        for b in self.branches:
            where = f"step {self.name!r}, branch {b.name!r}"
            if b.type not in BRANCH_TYPES:
                allowed = sorted(BRANCH_TYPES)
                raise ValueError(
                    f"{where}: a branch cannot be of type {b.type} (allowed: {allowed})"
                )
            # a branch runs inside its group's agent: retries and what follows are the group's
            if b.next is not None or b.retry is not None or b.retry_on or b.concurrency != 1:
                raise ValueError(
                    f"{where}: `next`, `retry`, `retry_on` and `concurrency` belong to the "
                    "parallel step, not to a branch"
                )

    def policy_for(self, code: str) -> RetryPolicy | None:
        # retry_on is keyed by RetryableCode, a Literal of str; any other code finds no entry
        # (read only, so its keys may be seen as plain str)
        return cast(dict[str, RetryPolicy], self.retry_on).get(code, self.retry)

    def targets(self) -> list[str]:
        if self.next is None:
            return []
        return [self.next] if isinstance(self.next, str) else [b.step for b in self.next]


class WorkflowDefinition(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: StepName
    version: int = Field(ge=1)
    deadline_ms: int = Field(2000, ge=10, le=3_600_000)
    on_deadline: Literal["degrade", "dead_letter"] = "degrade"
    steps: list[Step] = Field(min_length=1)
    # Optional step fusion: each group is a run of consecutive steps that one agent carries
    # in memory, without a hop through Kafka. Every step keeps its topic (retries and
    # branches still enter there) and its audit entry; the default is no fusion.
    fuse: list[list[StepName]] = Field(default_factory=list)

    @model_validator(mode="after")
    def _graph(self) -> WorkflowDefinition:
        names = [s.name for s in self.steps]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"steps: duplicate step names {dupes}")
        routers = [s.name for s in self.steps if s.type == "router"]
        if len(routers) != 1:  # one router: one completion ledger keeps results single
            raise ValueError(f"steps: a workflow has exactly one router, found {routers}")
        if self.steps[0].type != "validator":
            raise ValueError("steps[0]: the first step must be of type validator")
        for s in self.steps:
            for target in s.targets():
                if target not in names:
                    raise ValueError(f"steps.{s.name}.next: unknown step {target!r}")
        self._check_reachable_acyclic()
        self._check_fusion()
        return self

    def _check_fusion(self) -> None:
        names = {s.name for s in self.steps}
        seen: set[str] = set()
        for i, group in enumerate(self.fuse):
            where = f"fuse.{i}"
            if len(group) < 2:
                raise ValueError(f"{where}: a fused group needs at least two steps")
            for name in group:
                if name not in names:
                    raise ValueError(f"{where}: unknown step {name!r}")
                if name in seen:
                    raise ValueError(f"{where}: step {name!r} is in more than one group")
                seen.add(name)
            for a, b in itertools.pairwise(group):
                if b not in self.successors(a):
                    raise ValueError(f"{where}: {b!r} cannot follow {a!r}, so cannot fuse")
            if self.step(group[0]).type == "validator":
                # before its first hop a ticket sits on the partition the producer chose,
                # not its ticket_id's: only stateless steps may run there
                stateful = [n for n in group[1:] if self.step(n).type != "processor"]
                if stateful:
                    raise ValueError(
                        f"{where}: only processor steps can fuse with the validator, "
                        f"not {stateful} (their state is partitioned by ticket_id)"
                    )
            elif any(self.step(n).type == "validator" for n in group):
                raise ValueError(f"{where}: the validator can only start a group")
            # a group runs in its first step's agent, so that step's concurrency is the
            # group's; with the router in the group it must be one (see Step.concurrency)
            if any(self.step(n).type == "router" for n in group):
                parallel = [n for n in group if self.step(n).concurrency != 1]
                if parallel:
                    raise ValueError(
                        f"{where}: steps fused with the router run one batch at a time, "
                        f"but {parallel} ask for concurrency above 1"
                    )

    def fused(self, current: str, nxt: str) -> bool:
        """Whether `nxt` runs in the same agent right after `current` (no hop)."""
        return (current, nxt) in self._fused_pairs

    @functools.cached_property
    def _fused_pairs(self) -> frozenset[tuple[str, str]]:
        return frozenset(pair for group in self.fuse for pair in itertools.pairwise(group))

    def successors(self, name: str) -> list[str]:
        step = self.step(name)
        if step.next is not None:
            return step.targets()
        if step.type == "router":
            return []
        index = self._index[name]
        return [self.steps[index + 1].name] if index + 1 < len(self.steps) else []

    @functools.cached_property
    def _index(self) -> dict[str, int]:
        # by name: `steps.index(step)` compared pydantic models field by field on every hop
        index: dict[str, int] = {}
        for i, s in enumerate(self.steps):
            index.setdefault(s.name, i)  # a duplicate (refused by _graph): the first, as a scan
        return index

    def _check_reachable_acyclic(self) -> None:
        seen: set[str] = set()

        def visit(name: str, path: list[str]) -> None:
            if name in path:
                raise ValueError(f"steps: cycle {' -> '.join([*path, name])}")
            if name in seen:
                return
            seen.add(name)
            for nxt in self.successors(name):
                visit(nxt, [*path, name])
            if not self.successors(name) and self.step(name).type != "router":
                raise ValueError(f"steps.{name}: a workflow must end in a router")

        visit(self.steps[0].name, [])
        unreachable = [s.name for s in self.steps if s.name not in seen]
        if unreachable:
            raise ValueError(f"steps: unreachable steps {unreachable}")

    def step(self, name: str) -> Step:
        return self.steps[self._index[name]]

    def next_step(self, name: str, context: Any = None) -> Step | None:
        """The step after `name` for a ticket with this context, or None after a router."""
        step = self.step(name)
        if isinstance(step.next, list):
            for branch in step.next:
                if branch.when is None or branch.when.holds(context):
                    return self.step(branch.step)
        successors = self.successors(name)
        return self.step(successors[0]) if successors else None

    @property
    def routes(self) -> list[str]:
        return sorted({r for s in self.steps if s.type == "router" for r in s.routes})
