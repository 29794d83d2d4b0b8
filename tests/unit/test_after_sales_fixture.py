"""The hand-written after-sales fixture and the targets of issue 14 on it.

The default workflow (its rules step, its model version) must send the fixture's refund,
return and exchange requests to after_sales (recall >= 0.98) without sending much else
there (precision >= 0.9), and keep category accuracy >= 0.95 on train.py's held-out split.
The model is the built one when it is up to date, else version 1 is trained here (seconds).
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

from evaluation import after_sales as ev
from inference_gateway.routing import DEFAULT_CONFIG
from schemas.tickets import CATEGORIES
from training import train

CASES = ev.load_cases()
FIXTURES = sorted(ev.FIXTURE.parent.glob("after_sales_*.jsonl"))
# written after the first round of fixes, before the second (docs/workflow.md)
BLIND2 = ev.load_cases(ev.FIXTURE.parent / "after_sales_blind2.jsonl")


def _plain(text: str) -> str:
    return re.sub(r"\W+", "", text.lower())


def test_fixture_is_large_varied_and_consistent() -> None:
    assert len(CASES) >= 120
    assert len({c.id for c in CASES}) == len({c.text for c in CASES}) == len(CASES)
    assert set(Counter(c.category for c in CASES)) == set(CATEGORIES)
    assert {c.language for c in CASES} == {"en", "zh", "mixed"}
    assert {"colloquial", "indirect", "negated", "near_miss"} <= {c.kind for c in CASES}
    for c in CASES:
        assert c.route in {"after_sales", "auto_classify"}
        assert (c.route == "after_sales") == (c.category == "after_sales"), c.id
    negated = [c for c in CASES if c.kind == "negated"]
    assert {c.route for c in negated} == {"after_sales", "auto_classify"}  # both outcomes


@pytest.mark.parametrize("fixture", FIXTURES, ids=lambda p: p.stem)
def test_fixtures_stay_out_of_training(fixture: Path) -> None:
    # no fixture text in the corpus, up to case and punctuation
    train_rows, test_rows = train.split()
    corpus_texts = {_plain(r["text"]) for r in train_rows + test_rows}
    cases = ev.load_cases(fixture)
    assert not [c.id for c in cases if _plain(c.text) in corpus_texts]
    sources = Path(train.__file__).parent
    for name in ("train.py", "corpus.py", "handwritten.py"):
        assert fixture.name not in (sources / name).read_text(encoding="utf-8")


def test_blind2_is_varied_and_consistent() -> None:
    assert len(BLIND2) >= 80
    assert len({c.id for c in BLIND2}) == len({c.text for c in BLIND2}) == len(BLIND2)
    assert {c.language for c in BLIND2} == {"en", "zh", "mixed"}
    assert set(Counter(c.category for c in BLIND2)) == set(CATEGORIES)
    for c in BLIND2:
        assert (c.route == "after_sales") == (c.category == "after_sales"), c.id


def test_default_workflow_uses_the_model_probability() -> None:
    step = ev.rules_step()
    assert "refund_intent" in step.rules
    assert step.after_sales_threshold is not None


@pytest.fixture(scope="module")
def default_model(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, ev.Scorer]:
    """The version the gateway serves by default, as built, or v1 trained afresh."""
    version = DEFAULT_CONFIG.default
    if version == "v1":
        if train.is_fresh(train.DEFAULT_OUT):
            return version, ev.scorer(version)
        out = tmp_path_factory.mktemp("model") / "1"
        train.train(out)
        return version, ev.scorer(version, out.parent)
    if version not in ev.built_versions():
        pytest.skip(f"default version {version} is not built")
    return version, ev.scorer(version)


@pytest.mark.parametrize(
    "cases",
    [CASES, BLIND2],
    ids=["handwritten", "blind2"],
)
def test_after_sales_targets(cases: list, default_model: tuple[str, ev.Scorer]) -> None:
    version, score = default_model
    outcomes = ev.decide([c.text for c in cases], score, ev.rules_step(), version)
    rep = ev.report(cases, outcomes)
    # issue 24: a request in the intent head's uncertain band goes to people, not lost; the
    # strict recall (manual_review counted as a miss) is reported by `ticketflow eval
    # decisions`, docs/blind5.md
    lost = [
        c.id
        for c, o in zip(cases, outcomes, strict=True)
        if c.route == "after_sales" and o.route == "auto_classify"
    ]
    requests = sum(c.route == "after_sales" for c in cases)
    assert 1 - len(lost) / requests >= 0.95, rep.misses
    assert rep.manual_review <= 0.1 * len(cases), rep.misses
    assert rep.precision >= ev.TARGET_PRECISION, rep.misses


def test_category_accuracy_on_the_held_out_split(default_model: tuple[str, ev.Scorer]) -> None:
    version, score = default_model
    cases = ev.held_out_cases()
    rep = ev.report(cases, ev.decide([c.text for c in cases], score, ev.rules_step(), version))
    assert rep.category_accuracy >= 0.95


def test_report_counts_and_threshold_choice() -> None:
    from schemas.tickets import Category, RuleOutcome

    cases = [
        ev.Case("a", "x", "after_sales", "after_sales"),
        ev.Case("b", "y", "after_sales", "after_sales"),
        ev.Case("c", "z", "auto_classify", "billing"),
    ]
    outs = [
        RuleOutcome(route="after_sales", category=Category.after_sales),
        RuleOutcome(route="auto_classify", category=Category.billing),
        RuleOutcome(route="after_sales", category=Category.after_sales),
    ]
    rep = ev.report(cases, outs)
    assert (rep.tp, rep.fp, rep.fn, rep.correct_category) == (1, 1, 1, 1)
    assert rep.precision == rep.recall == 0.5
    assert [m[0] for m in rep.misses] == ["b", "c"]
    # equal F2: the lower threshold (recall's margin); otherwise the best F2
    same, worse = ev.Report(n=2, tp=2, fp=0, fn=0), ev.Report(n=2, tp=1, fp=0, fn=1)
    assert ev.best_threshold({None: worse, 0.2: same, 0.3: same, 0.4: worse}) == 0.2
    assert ev.best_threshold({0.2: worse, 0.3: same}) == 0.3


def test_a_joined_version_scores_the_mean(monkeypatch: pytest.MonkeyPatch) -> None:
    import numpy as np

    fake = {
        "v1": lambda _dir: lambda texts: np.array([[1.0, 0.0]] * len(texts)),
        "v2": lambda _dir: lambda texts: np.array([[0.0, 1.0]] * len(texts)),
    }
    monkeypatch.setattr(ev, "SCORERS", fake)
    assert ev.scorer("v1+v2")(["a", "b"]).tolist() == [[0.5, 0.5], [0.5, 0.5]]
    assert ev.scorer("v2")(["a"]).tolist() == [[0.0, 1.0]]


def test_the_integration_tests_unsure_ticket_goes_to_people() -> None:
    # the review tests (test_workflow, test_poison) need one ticket the served models are
    # unsure of; a retrain that makes them sure of it should fail here, saying so
    from evaluation.decisions import workflow_below
    from tests.integration.kafka_helpers import UNSURE_TEXT

    if not {"v1", "v2"} <= set(ev.built_versions()):
        pytest.skip("v1 and v2 are not built")
    score = ev.cascade_scorer(workflow_below())
    (outcome,) = ev.decide([UNSURE_TEXT], score, ev.rules_step(), "cascade")
    assert outcome.route == "manual_review", outcome
