"""The newest frozen blind set is a test set: no model, head or threshold may read it."""

from __future__ import annotations

import re

from training import earlier_sets, intent


def _newest_frozen() -> str:
    numbers = [
        int(m.group(1))
        for p in earlier_sets.FIXTURES.glob("blind*_frozen.jsonl")
        if (m := re.fullmatch(r"blind(\d+)_frozen\.jsonl", p.name))
    ]
    return f"blind{max(numbers)}_frozen"


def test_the_newest_frozen_set_is_not_learned_from():
    newest = _newest_frozen()
    assert newest not in earlier_sets.SETS
    assert all(p.exists() for p in earlier_sets.paths())
    assert newest not in {p.stem for p in intent.VALIDATION_FIXTURES}


def test_the_intent_head_learns_from_the_earlier_sets():
    rows = [{"text": "t", "category": "billing", "language": "en"}]
    learned = earlier_sets.weighted(rows)
    assert learned[0] == rows[0]
    assert len(learned) == 1 + len(earlier_sets.rows()) * earlier_sets.WEIGHT
    # the head's training is rebuilt when a set changes, as the category models' is
    assert set(earlier_sets.paths()) <= set(intent.SOURCES)
