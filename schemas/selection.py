"""Which workflow a new ticket takes: the selector (`agents/workflows/selector.yaml`).

Rules are tried in order; the first whose conditions all hold names the workflow, and a
ticket no rule matches takes `default`. A rule looks only at what the producer sent:
`channel`, `language` or `metadata.<key>`. A field the ticket lacks never matches (not even
`ne`), so a rule cannot catch tickets by what they leave out.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from schemas.tickets import Ticket

WorkflowName = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[a-z][a-z0-9_]*$")]
# metadata keys are free-form strings in a Ticket; the selector takes the usual identifiers
SelectorField = Annotated[
    str, Field(pattern=r"^(channel|language|metadata\.[A-Za-z0-9_][A-Za-z0-9_.-]{0,63})$")
]
SelectorOp = Literal["eq", "ne", "in", "not_in"]


class Match(BaseModel):
    """One test of a ticket field: `{field: metadata.tier, op: eq, value: vip}`."""

    model_config = ConfigDict(extra="forbid")

    field: SelectorField
    op: SelectorOp = "eq"
    value: str | list[str]

    @model_validator(mode="after")
    def _value_fits_op(self) -> Match:
        listed = self.op in ("in", "not_in")
        if listed != isinstance(self.value, list):
            want = "a list of strings" if listed else "one string"
            raise ValueError(f"`{self.op}` on {self.field} needs {want} as `value`")
        return self

    def holds(self, ticket: Ticket) -> bool:
        actual = field_of(ticket, self.field)
        if actual is None:
            return False
        if self.op == "eq":
            return actual == self.value
        if self.op == "ne":
            return actual != self.value
        if self.op == "in":
            return actual in self.value
        return actual not in self.value


class SelectionRule(BaseModel):
    """Tickets for which every `when` holds take `workflow`."""

    model_config = ConfigDict(extra="forbid")

    when: list[Match] = Field(min_length=1)
    workflow: WorkflowName

    @model_validator(mode="before")
    @classmethod
    def _one_match_as_list(cls, data: object) -> object:
        # `when: {field: channel, value: chat}` reads better than a list of one
        if isinstance(data, dict) and isinstance(data.get("when"), dict):
            return {**data, "when": [data["when"]]}
        return data

    def matches(self, ticket: Ticket) -> bool:
        return all(m.holds(ticket) for m in self.when)


class WorkflowSelector(BaseModel):
    model_config = ConfigDict(extra="forbid")

    default: WorkflowName
    rules: list[SelectionRule] = Field(default_factory=list)

    def select(self, ticket: Ticket) -> tuple[str, int | None]:
        """The workflow for `ticket`, and the index of the rule that chose it (None: default)."""
        for i, rule in enumerate(self.rules):
            if rule.matches(ticket):
                return rule.workflow, i
        return self.default, None

    def names(self) -> list[str]:
        """Every workflow the selector can pick, the default first."""
        return list(dict.fromkeys([self.default, *(r.workflow for r in self.rules)]))


def field_of(ticket: Ticket, field: str) -> str | None:
    """A selector field's value for `ticket` as text, or None when the ticket has none."""
    if field == "channel":
        return ticket.channel.value if ticket.channel is not None else None
    if field == "language":
        return ticket.language
    return ticket.metadata.get(field.removeprefix("metadata."))
