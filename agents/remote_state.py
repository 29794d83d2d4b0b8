"""Ticket state for a pool worker, which has no table: its moves go home as records.

A pool (agents/step_selection.py) runs steps without owning `ticket_state` partitions. Each state
move of its steps (running at the next step, waiting_retry, dead_lettered) becomes a small
`StateChange` record keyed by ticket_id on `tickets.state`. The home worker reads that
topic in the table's consumer group, so partition N of it is read by the owner of the
table's partition N, and applies each change with the rules of its own moves
(`agents.state.allowed`): never back from a settled ticket, never older than the last
move applied.

The records go through the pool's step producer, so the commit barrier delivers them with
the step's other outputs, before the inputs that made them are committed.
"""

from __future__ import annotations

from collections.abc import Set as AbstractSet
from typing import Any, Literal, Protocol, cast

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agents.decoding import MAX_ATTEMPT
from agents.errors import BadRecord
from agents.state import TicketStates, new_state
from agents.topology import Topology
from schemas.tickets import ErrorClass, TicketId
from schemas.workflow import StepName
from streams.codecs import encode
from streams.topics import Topics

REASON_LIMIT = 500


class Produce(Protocol):
    def produce(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: Any = None,
        partition: int | None = None,
    ) -> None: ...


class DeadLetter(Protocol):
    def dead_letter(
        self, event: Any, step: str, error_class: ErrorClass, reason: str, attempts: int
    ) -> None: ...


# where a pool moves a ticket to (agents.state.allowed)
MovedStatus = Literal["running", "waiting_retry", "dead_lettered", "degraded"]


class StateChange(BaseModel):
    """One move of a ticket made by a pool, for the home worker to apply."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ticket_id: TicketId
    arrival: str = Field(min_length=1, max_length=256)
    trace_id: str = Field(max_length=256)
    workflow: str = Field(min_length=1, max_length=64)
    workflow_version: int = Field(ge=1)
    status: MovedStatus
    step: StepName
    attempt: int = Field(1, ge=1, le=MAX_ATTEMPT)
    # decision-path entries of the envelope that made the move (agents.state.allowed)
    progress: int | None = Field(None, ge=0, le=100_000)

    def fresh(self) -> dict:
        """The state this change implies, for a ticket the table has none of."""
        state = new_state(
            self.ticket_id, self.arrival, self.trace_id, self.workflow, self.workflow_version
        )
        if self.progress is not None:
            state["progress"] = self.progress
        return state


class RemoteStates:
    """The `States` of a pool worker: it keeps none, and sends every move home."""

    def __init__(self, producer: Produce, topics: Topics) -> None:
        self._producer = producer
        self.topic = topics.state

    def at(self, event: Any) -> None:
        """Nothing to point at a partition: the record's key chooses it."""

    def admit(
        self, event: Any, ticket_id: str, arrival: str, trace_id: str, workflow: str, version: int
    ) -> bool:
        # a pool never runs an admitting step (agents.step_selection): whatever reaches it passed
        # the home worker's admission, or is a redelivery of what did
        return True

    def move(
        self, event: Any, fresh: dict, status: str, step: str, attempt: int = 1, **fields: Any
    ) -> None:
        if fields:  # only the router and the review agent write fields, both at home
            raise ValueError(f"a pool sends no state fields, got {sorted(fields)}")
        change = StateChange.model_construct(  # built from a validated envelope
            ticket_id=fresh["ticket_id"],
            arrival=fresh["arrival"],
            trace_id=fresh["trace_id"],
            workflow=fresh["workflow"],
            workflow_version=fresh["workflow_version"],
            status=cast(MovedStatus, status),  # the runner moves only to these four
            step=step,
            attempt=attempt,
            progress=fresh.get("progress"),
        )
        self._producer.produce(self.topic, change.ticket_id.encode(), encode(change))

    def flush_changelog(self) -> int:
        return 0  # every move is on the producer already, delivered with the outputs


def read_state_change(
    value: object, key: object, known_steps: AbstractSet[str], versions: AbstractSet[int]
) -> StateChange:
    """A `StateChange`, or BadRecord(INTERNAL, why): only workers write `tickets.state`.

    Refused as well as unreadable ones: a key that is not the ticket_id (the change would
    be applied on another partition than the ticket's state), a step or workflow version
    this worker does not know.
    """
    if not isinstance(value, (bytes, bytearray, memoryview)):
        raise BadRecord(ErrorClass.INTERNAL, f"a state record of type {type(value).__name__}")
    try:
        change = StateChange.model_validate_json(bytes(value))
    except ValidationError as exc:
        why = f"not a state change: {_summary(exc)}"
        raise BadRecord(ErrorClass.INTERNAL, _reason(why)) from None
    except Exception as exc:  # whatever else a validator raised: still this record's fault
        raise BadRecord(ErrorClass.INTERNAL, _reason(f"not a state change: {exc!r}")) from None
    if _key_text(key) != change.ticket_id:
        raise BadRecord(ErrorClass.INTERNAL, "record key is not the state change's ticket_id")
    if change.step not in known_steps:
        raise BadRecord(ErrorClass.INTERNAL, f"state change at unknown step {change.step!r}")
    if change.workflow_version not in versions:
        raise BadRecord(
            ErrorClass.INTERNAL, f"state change of workflow version {change.workflow_version}"
        )
    return change


class StateInbox:
    """The home worker's agent on `tickets.state`: each pool's move, applied to the table."""

    def __init__(self, states: TicketStates, topology: Topology, emitter: DeadLetter) -> None:
        self.states = states
        self.topology = topology
        self.emitter = emitter

    def handle(self, event: Any) -> None:
        msg = event.message
        try:
            change = read_state_change(
                msg.value, msg.key, self.topology.later_names, self.topology.version_numbers
            )
        except BadRecord as exc:
            self.emitter.dead_letter(event, "state", exc.error_class, exc.reason, 1)
            return
        self.states.apply(event, change.fresh(), change.status, change.step, change.attempt)


def _key_text(key: object) -> str | None:
    if isinstance(key, str):
        return key
    if isinstance(key, (bytes, bytearray, memoryview)):
        return bytes(key).decode("utf-8", "replace")
    return None


def _summary(exc: ValidationError) -> str:
    errors = exc.errors(include_url=False, include_input=False)
    return "; ".join(f"{'.'.join(map(str, e['loc'])) or '<root>'}: {e['msg']}" for e in errors[:5])


def _reason(text: str) -> str:
    # bounded and encodable: it goes into a dead letter's headers
    return text[:REASON_LIMIT].encode("utf-8", "replace").decode("utf-8")
