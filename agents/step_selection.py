"""Which steps a worker runs: every step (the default), the home set, or a pool.

`ticketflow worker --steps infer` (or `TICKETFLOW_WORKER_STEPS`) runs only some step agents,
so that a step can be scaled on its own. Some steps need the `ticket_state` table itself,
not just a way to send it a move: they are *kept* by the home worker, which owns the table.

- admission: the steps a ticket can reach first after validation read the table to drop a
  second publish of a ticket_id;
- the router: its completion ledger and transactional ids are named after the home app,
  and it settles the ticket in the table;
- any step fused before one of those, since a fused group runs in its first step's agent.

A worker whose steps include every kept step is the home worker: the Faust app id and table
as always, plus the retry tiers, reviewers' decisions and the pools' state records. A
worker whose steps include none is a pool: a consumer group of its own, named after its
steps (`ticketflow-pool-features-infer`), no table; its state moves go home as records
(`agents.remote_state`). Faust's assignor assumes every member of a group subscribes to
the same co-partitioned topics, which is why each step set gets its own group. Anything in
between is refused at start-up. See docs/workflow.md, "Scaling steps on their own".
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from agents.topology import Topology
from schemas.workflow import WorkflowDefinition

HOME_APP_ID = "ticketflow"
POOL_APP_PREFIX = "ticketflow-pool-"


class StepSetError(ValueError):
    """A step set a worker cannot run; the message says why and what would do."""


@dataclass(frozen=True)
class StepSet:
    steps: frozenset[str]
    home: bool
    app_id: str

    def runs(self, step: str) -> bool:
        return step in self.steps


def parse_steps(text: str | Iterable[str]) -> list[str]:
    """Step names from `infer, features` (or a list); empty items are ignored."""
    items = text.split(",") if isinstance(text, str) else list(text)
    return [name.strip() for name in items if name.strip()]


def every_step(topology: Topology) -> list[str]:
    """Every step of every version in flight, in the newest definition's order."""
    names: dict[str, None] = {}
    for definition in [topology.definition, *topology.versions.values()]:
        names.update(dict.fromkeys(s.name for s in definition.steps))
    return list(names)


def kept_steps(topology: Topology) -> dict[str, str]:
    """The steps only the home worker may run, each with the reason."""
    kept: dict[str, str] = {}
    for version in sorted(topology.versions):
        for name, why in _kept_in(topology.versions[version]).items():
            kept.setdefault(name, why)
    return kept


def _kept_in(definition: WorkflowDefinition) -> dict[str, str]:
    validator = definition.steps[0].name
    # the validator and the steps fused after it run before the first keyed hop
    front = next((g for g in definition.fuse if g[0] == validator), [validator])
    kept = {
        nxt: "admission: the first step after validation drops duplicate ticket_ids"
        for name in front
        for nxt in definition.successors(name)
        if not definition.fused(name, nxt)
    }
    for step in definition.steps:
        if step.type == "router":
            kept[step.name] = "the router: completion ledger and final state"
    for group in definition.fuse:
        for i in range(len(group) - 2, -1, -1):  # a group's agent runs every step after it
            later = group[i + 1]
            if later in kept and group[i] not in kept:
                kept[group[i]] = f"fused before {later}, which its agent runs"
    return kept


def step_set(requested: str | Iterable[str], topology: Topology) -> StepSet:
    """The worker's step set, or StepSetError: unknown steps, or kept steps in a pool."""
    every = every_step(topology)
    wanted = set(parse_steps(requested))
    if not wanted:
        return StepSet(frozenset(every), True, HOME_APP_ID)
    unknown = wanted - set(every)
    if unknown:
        raise StepSetError(
            f"--steps names unknown step(s) {sorted(unknown)}; the workflow's steps are "
            f"{', '.join(every)}"
        )
    kept = kept_steps(topology)
    if set(kept) <= wanted:
        return StepSet(frozenset(wanted), True, HOME_APP_ID)
    inside = [name for name in every if name in wanted and name in kept]
    if inside:
        raise StepSetError(_partial_home(every, wanted, kept, inside))
    ordered = [name for name in every if name in wanted]
    return StepSet(frozenset(wanted), False, POOL_APP_PREFIX + "-".join(ordered))


def _partial_home(
    every: list[str], wanted: set[str], kept: dict[str, str], inside: list[str]
) -> str:
    missing = [name for name in every if name in kept and name not in wanted]
    reasons = "; ".join(f"{name}: {kept[name]}" for name in every if name in kept)
    return (
        f"--steps {','.join(n for n in every if n in wanted)} mixes a pool with "
        f"state-keeping steps: {', '.join(inside)} need(s) the ticket_state table, so "
        f"only the home worker runs them, and it runs every state-keeping step ({reasons}). "
        f"Add {', '.join(missing)} to make this the home worker, or leave "
        f"{', '.join(inside)} out to make it a pool."
    )


def complement(steps: StepSet | Iterable[str], topology: Topology) -> list[str]:
    """The steps of the workflow not in `steps`, in order (e.g. the home worker's set)."""
    names = steps.steps if isinstance(steps, StepSet) else set(steps)
    return [name for name in every_step(topology) if name not in names]
