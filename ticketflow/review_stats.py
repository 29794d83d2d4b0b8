"""Reviewers' agreement with the model, per model version, from `tickets.review.outcomes`.

Pure: the command line reads the topic and prints these rows. Each ticket counts once (a
redelivered outcome is the same decision); outcomes of tickets no model answered measure
no model and are counted apart.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from schemas.review import ReviewKind, ReviewOutcome

KINDS: tuple[ReviewKind, ...] = ("spot_check", "manual")


@dataclass(frozen=True)
class Agreement:
    model_version: str
    kind: ReviewKind | None  # None: both kinds together
    decisions: int
    agreed: int

    @property
    def rate(self) -> float:
        return self.agreed / self.decisions if self.decisions else 0.0


@dataclass(frozen=True)
class Stats:
    rows: list[Agreement]
    without_model: int  # decisions on tickets no model answered (degraded): not counted


def latest_per_ticket(outcomes: Iterable[ReviewOutcome]) -> list[ReviewOutcome]:
    by_ticket: dict[str, ReviewOutcome] = {}
    for outcome in outcomes:
        by_ticket[outcome.ticket_id] = outcome
    return list(by_ticket.values())


def agreement(outcomes: Iterable[ReviewOutcome]) -> Stats:
    """Per model version: a row per kind reviewed, then both kinds together."""
    counts: dict[tuple[str, ReviewKind], list[int]] = defaultdict(lambda: [0, 0])
    without_model = 0
    for outcome in latest_per_ticket(outcomes):
        if outcome.model_version is None:
            without_model += 1
            continue
        tally = counts[(outcome.model_version, outcome.kind)]
        tally[0] += 1
        tally[1] += int(outcome.agreed)
    rows = []
    for version in sorted({v for v, _ in counts}, key=_version_order):
        mine = [(k, counts[(version, k)]) for k in KINDS if (version, k) in counts]
        rows += [Agreement(version, k, n, a) for k, (n, a) in mine]
        rows.append(
            Agreement(version, None, sum(n for _, (n, _) in mine), sum(a for _, (_, a) in mine))
        )
    return Stats(rows, without_model)


def _version_order(version: str) -> tuple[int, str]:
    digits = version.lstrip("v")
    return (int(digits), "") if digits.isdigit() else (1 << 30, version)
