"""The topic registry: every topic name the system uses, with the deployment's prefix."""

from __future__ import annotations

from dataclasses import dataclass

AUDIT_RETENTION_MS = 180 * 24 * 3600 * 1000
# a dead letter is its record's bytes plus x-dlq-* headers: the dead-letter topics take
# records well past the broker's default limit, which is what any input topic allows
DLQ_MAX_MESSAGE_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True)
class Topics:
    prefix: str = ""

    def _name(self, name: str) -> str:
        return f"{self.prefix}{name}"

    @property
    def tickets_in(self) -> str:
        return self._name("tickets.in")

    def step(self, step: str) -> str:
        return self._name(f"tickets.step.{step}")

    def retry(self, delay_ms: int) -> str:
        return self._name(f"tickets.retry.{delay_ms}")

    def carries_envelopes(self, topic: str) -> bool:
        """A step or retry topic: written by our producers only, never compacted."""
        return topic.startswith((self._name("tickets.step."), self._name("tickets.retry.")))

    @property
    def state(self) -> str:
        """State moves made by pool workers, applied by the home worker (agents/remote_state.py)."""
        return self._name("tickets.state")

    def written_by_workers(self, topic: str) -> bool:
        """Written by our idempotent producers only, never transactionally, never compacted:
        every offset is a record, so a jump in what is read is records dropped."""
        return self.carries_envelopes(topic) or topic == self.state

    def out(self, route: str) -> str:
        return self._name(f"tickets.out.{route}")

    @property
    def dlq(self) -> str:
        return self._name("tickets.dlq")

    @property
    def dlq_parked(self) -> str:
        return self._name("tickets.dlq.parked")

    @property
    def completed(self) -> str:
        """Compacted: one record per ticket that has its result (the exactly-once ledger)."""
        return self._name("tickets.completed")

    @property
    def review_decisions(self) -> str:
        return self._name("tickets.review.decisions")

    @property
    def review_spot_checks(self) -> str:
        """Copies of sampled automatic decisions, for reviewers (schemas/review.py)."""
        return self._name("tickets.review.spot_checks")

    @property
    def review_outcomes(self) -> str:
        """Reviewers' decisions next to the model's: `ticketflow review stats` reads it."""
        return self._name("tickets.review.outcomes")

    @property
    def audit(self) -> str:
        return self._name("tickets.audit")

    @property
    def config_routing(self) -> str:
        return self._name("config.routing")

    @property
    def features_drift(self) -> str:
        return self._name("features.drift")
