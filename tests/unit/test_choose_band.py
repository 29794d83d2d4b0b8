"""`choose_band` (evaluation/decisions.py) on a made-up validation set: the band it picks
is never empty, even where an empty one would cost least."""

import numpy as np

from evaluation import after_sales as ev
from evaluation.decisions import choose_band
from schemas.tickets import CATEGORIES


def _case(i: int, refund: bool) -> ev.Case:
    category = "after_sales" if refund else "billing"
    route = "after_sales" if refund else "auto_classify"
    return ev.Case(id=str(i), text=f"ticket {i}", route=route, category=category)


def test_the_chosen_band_has_a_width_even_when_none_would_cost_least():
    # refunds score 0.9 and the rest 0.1: a threshold anywhere between is perfect, so an
    # empty band would send nobody to people and cost nothing
    cases = [_case(i, refund=i % 2 == 0) for i in range(40)]
    proba = np.full((40, len(CATEGORIES)), 0.02)
    for i, c in enumerate(cases):
        proba[i, CATEGORIES.index(c.category)] = 0.9
    scores = np.array([0.9 if c.route == "after_sales" else 0.1 for c in cases])
    band, curve = choose_band(cases, proba, ["v1"] * 40, ev.rules_step(), scores)
    low, high = band
    assert high > low
    assert any(p["band"][0] == p["band"][1] and p["cost"] == 0 for p in curve)
    assert all(s >= high or s < low for s in scores)  # and it still splits the set cleanly
