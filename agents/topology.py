"""The shape of the workflows: their versions, their steps, what follows what, and fusion.

Pure: no Kafka, no Faust. Several workflows run side by side (a selector picks one per new
ticket) and each may have earlier versions still in flight; a ticket finishes on the
workflow and version it started with, so every question is asked of its own definition,
found by the (name, version) its envelope carries.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from schemas.selection import WorkflowSelector
from schemas.tickets import Envelope, Ticket
from schemas.workflow import Step, WorkflowDefinition

WorkflowKey = tuple[str, int]  # (name, version), as an envelope names its definition


@dataclass(frozen=True)
class Hop:
    """Where a ticket goes after a step: the next step, run in the same agent when fused."""

    step: Step
    fused: bool


@dataclass(frozen=True)
class Choice:
    """The workflow a new ticket takes, and why (for its decision path)."""

    definition: WorkflowDefinition
    reason: str | None  # None when there is no choice (no selector)


class Topology:
    def __init__(
        self,
        definition: WorkflowDefinition,
        earlier: Sequence[WorkflowDefinition] = (),
        selector: WorkflowSelector | None = None,
    ) -> None:
        """`definition`: the default workflow; `earlier`: every other definition loaded
        (earlier versions of it, other workflows and their earlier versions), which
        agents.definition.load_workflows has checked to fit together."""
        self.definition = definition  # new tickets no selector rule matches start here
        self.selector = selector
        self.versions: dict[WorkflowKey, WorkflowDefinition] = {
            (d.name, d.version): d for d in [*earlier, definition]
        }
        self.current = _newest(self.versions.values())
        self.current[definition.name] = definition
        self.first = definition.steps[0]
        self.router = next(s for s in definition.steps if s.type == "router")
        # what a record on a step or retry topic may name: computed once, read per record
        self.later_names = frozenset(s.name for s in self.later_steps())
        self.version_numbers = frozenset(version for _, version in self.versions)
        self._variants = _variants(self.versions)

    def later_steps(self) -> list[Step]:
        """Every step after validation, of every definition in flight (one per name: the
        agent's settings come from the default workflow's newest version, else the last)."""
        steps: dict[str, Step] = {}
        for key in sorted(self.versions, key=self._default_last):
            steps.update({s.name: s for s in self.versions[key].steps[1:]})
        return list(steps.values())

    def _default_last(self, key: WorkflowKey) -> tuple[bool, bool, WorkflowKey]:
        return (key[0] == self.definition.name, key == _key(self.definition), key)

    @property
    def routes(self) -> list[str]:
        """Every route of every definition: each has its result topic."""
        return sorted({r for d in self.versions.values() for r in d.routes})

    def choose(self, ticket: Ticket) -> Choice:
        """The workflow a new ticket starts on: the selector's pick, newest version."""
        if self.selector is None:
            return Choice(self.definition, None)
        name, rule = self.selector.select(ticket)
        why = "default" if rule is None else f"selector rule {rule + 1}"
        return Choice(self.current[name], f"{name} v{self.current[name].version} ({why})")

    def knows_workflow(self, env: Envelope) -> bool:
        """Whether this worker has the envelope's own definition."""
        return (env.workflow, env.workflow_version) in self.versions

    def definition_of(self, env: Envelope) -> WorkflowDefinition:
        found = self.versions.get((env.workflow, env.workflow_version))
        return found or self.current.get(env.workflow, self.definition)

    def deadline_ms(self, env: Envelope) -> int:
        return self.definition_of(env).deadline_ms

    def step_of(self, env: Envelope, name: str) -> Step:
        """The step as the ticket's own definition has it (else the agent's)."""
        try:
            return self.definition_of(env).step(name)
        except KeyError:
            return next(s for s in self.later_steps() if s.name == name)

    def variant(self, env: Envelope, name: str) -> int:
        """Which of the step's distinct configurations the ticket runs: tickets of the same
        variant can share a handler call, whatever workflow or version they are on."""
        return self._variants.get((env.workflow, env.workflow_version, name), -1)

    def knows(self, env: Envelope) -> bool:
        """Whether this worker can run the envelope's current step."""
        return env.step in self.later_names

    def hop(self, env: Envelope, after: str) -> Hop:
        """The ticket's next step after `after`; only a router ends a workflow."""
        definition = self.definition_of(env)
        nxt = definition.next_step(after, env.context)
        if nxt is None:  # validation of the definition makes this unreachable
            raise RuntimeError(f"step {after} has no successor")
        return Hop(nxt, definition.fused(after, nxt.name))


def _key(definition: WorkflowDefinition) -> WorkflowKey:
    return definition.name, definition.version


def _newest(definitions) -> dict[str, WorkflowDefinition]:
    newest: dict[str, WorkflowDefinition] = {}
    for d in definitions:
        if d.name not in newest or d.version > newest[d.name].version:
            newest[d.name] = d
    return newest


def _variants(versions: dict[WorkflowKey, WorkflowDefinition]) -> dict[tuple[str, int, str], int]:
    """(workflow, version, step) -> an id shared by equal step configurations."""
    distinct: list[Step] = []
    out: dict[tuple[str, int, str], int] = {}
    for (name, version), d in versions.items():
        for step in d.steps:
            index = next((i for i, s in enumerate(distinct) if s == step), None)
            if index is None:
                distinct.append(step)
                index = len(distinct) - 1
            out[(name, version, step.name)] = index
    return out
