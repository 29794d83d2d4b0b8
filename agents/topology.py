"""The shape of the workflow: its versions, their steps, what follows what, and fusion.

Pure: no Kafka, no Faust. Tickets in flight finish on the version they started with, so
every question is asked of a ticket's own version.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from schemas.tickets import Envelope
from schemas.workflow import Step, WorkflowDefinition


@dataclass(frozen=True)
class Hop:
    """Where a ticket goes after a step: the next step, run in the same agent when fused."""

    step: Step
    fused: bool


class Topology:
    def __init__(
        self, definition: WorkflowDefinition, earlier: Sequence[WorkflowDefinition] = ()
    ) -> None:
        self.definition = definition  # new tickets start on this version
        self.versions = {d.version: d for d in [*earlier, definition]}
        self.first = definition.steps[0]
        self.router = next(s for s in definition.steps if s.type == "router")
        # what a record on a step or retry topic may name: computed once, read per record
        self.later_names = frozenset(s.name for s in self.later_steps())
        self.version_numbers = frozenset(self.versions)

    def later_steps(self) -> list[Step]:
        """Every step after validation, of every version in flight (the newest config)."""
        steps: dict[str, Step] = {}
        for version in sorted(self.versions):
            steps.update({s.name: s for s in self.versions[version].steps[1:]})
        return list(steps.values())

    def definition_of(self, env: Envelope) -> WorkflowDefinition:
        return self.versions.get(env.workflow_version, self.definition)

    def deadline_ms(self, env: Envelope) -> int:
        return self.definition_of(env).deadline_ms

    def step_of(self, env: Envelope, name: str) -> Step:
        """The step as the ticket's own version defines it (else the newest one)."""
        try:
            return self.definition_of(env).step(name)
        except KeyError:
            return next(s for s in self.later_steps() if s.name == name)

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
