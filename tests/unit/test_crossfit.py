"""`ticketflow eval crossfit`, one fold, with the built models (CI's short version: ~1 min)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from evaluation import after_sales as ev
from schemas.tickets import CATEGORIES
from ticketflow.cli import app
from training import earlier_sets


def test_one_fold_decides_its_set_with_models_that_never_saw_it(tmp_path) -> None:
    if not {"v1", "v2"} <= set(ev.built_versions()) or ev.intent_head() is None:
        pytest.skip("v1, v2 and the intent head are not built")
    name = earlier_sets.SETS[-1]
    out = tmp_path / "crossfit.json"
    served = [ev.INTENT_WEIGHTS, *(ev.MODEL_DIR / v for v in ("1/weights.npz", "2/head.npz"))]
    before = [p.read_bytes() for p in served]
    result = CliRunner().invoke(app, ["eval", "crossfit", "--set", name, "--out", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    cases = ev.load_cases(earlier_sets.FIXTURES / f"{name}.jsonl")
    assert data["folds"] == [name] and [r["id"] for r in data["rows"]] == [c.id for c in cases]
    assert all(0.0 <= r["intent"] <= 1.0 and r["version"] in ("v1", "v2") for r in data["rows"])
    # out of fold, and still far better than chance: a model trained without the set works
    right = sum(
        CATEGORIES[max(range(len(CATEGORIES)), key=r["proba"].__getitem__)] == c.category
        for r, c in zip(data["rows"], cases, strict=True)
    )
    assert right / len(cases) > 0.8
    # a fold trains in a folder of its own: the served models and head are untouched
    assert [p.read_bytes() for p in served] == before


def test_a_fold_must_be_a_spent_set() -> None:
    result = CliRunner().invoke(app, ["eval", "crossfit", "--set", "blind15_frozen"])
    assert result.exit_code != 0
