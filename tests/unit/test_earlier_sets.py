"""The newest frozen blind set is a test set: no model, head or threshold may read it."""

from __future__ import annotations

import re

import pytest

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


def test_a_crossfit_fold_leaves_one_set_out_and_only_within_its_block():
    every = earlier_sets.SETS
    left_out = every[0]
    with earlier_sets.leaving_out(left_out):
        assert every[1:] == earlier_sets.SETS
        assert earlier_sets.FIXTURES / f"{left_out}.jsonl" not in earlier_sets.paths()
    assert every == earlier_sets.SETS


def test_the_crossfit_band_is_chosen_on_out_of_fold_rows_only(tmp_path):
    import json

    import numpy as np

    from evaluation import after_sales as ev
    from evaluation.decisions import band_on_crossfit, load_crossfit
    from schemas.tickets import CATEGORIES

    name = earlier_sets.SETS[0]
    cases = ev.load_cases(earlier_sets.FIXTURES / f"{name}.jsonl")
    k = CATEGORIES.index("after_sales")
    rows = []
    for c in cases:
        request = c.route == "after_sales"
        proba = np.full(6, 0.02)
        proba[k if request else 0] = 0.9
        rows.append({"set": name, "id": c.id, "proba": proba.tolist(), "version": "v1",
                     "intent": 0.9 if request else 0.01})  # fmt: skip
    path = tmp_path / "crossfit.json"
    path.write_text(json.dumps({"below": 0.7, "folds": [name], "rows": rows}))
    loaded, proba, versions, scores, below = load_crossfit(path)
    assert [c.id for c in loaded] == [c.id for c in cases] and below == 0.7
    assert versions == ["v1"] * len(cases) and scores.shape == (len(cases),)
    # perfectly separated scores: a band between them, sending nobody to people
    (low, high), _ = band_on_crossfit(ev.rules_step(), path, 0.7)
    assert 0.01 < low < high <= 0.9
    # decisions made at another cascade threshold choose no band for this one
    with pytest.raises(ValueError, match=re.escape("at 0.7, not 0.8")):
        band_on_crossfit(ev.rules_step(), path, 0.8)
