"""`ticketflow eval after-sales`: the after_sales route on the hand-written fixture, in process.

Each ticket goes through what the workflow does to it: the `text_cleaner` step, the
gateway's normalisation, a model version loaded the way its Triton model.py loads it, then
the rules of the definition's rule_engine step (`apply_rules`, with its threshold and
`after_sales_threshold`). The shared Triton is not used: it keeps serving the weights it
loaded at start, while this reads the ones on disk.

Printed per model version: precision and recall of the after_sales route, and category
accuracy. `--sweep` measures `after_sales_threshold` on the held-out split of train.py
(seed 13), never on the fixture, which must stay out of training and tuning.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

import numpy as np
import typer

from agents.steps.clean import clean_text
from agents.steps.refund_intent import WEIGHTS as INTENT_WEIGHTS
from agents.steps.refund_intent import IntentHead, read_head
from agents.steps.rules import RuleInput, apply_rules
from inference_gateway.cache import normalize_text
from schemas.tickets import CATEGORIES, Category, Context, Prediction, RuleOutcome
from schemas.workflow import Step

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests" / "fixtures" / "after_sales_handwritten.jsonl"
WORKFLOW = ROOT / "agents" / "workflows" / "ticket_classify.yaml"
MODEL_DIR = ROOT / "inference_gateway" / "model_repository" / "ticket_classifier"
AFTER_SALES = Category.after_sales.value
# the targets on the hand-written set
TARGET_RECALL = 0.98
TARGET_PRECISION = 0.9
# held-out thresholds tried by --sweep
SWEEP = (0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5)

Scorer = Callable[[Sequence[str]], np.ndarray]


@dataclass(frozen=True)
class Case:
    id: str
    text: str
    route: str
    category: str
    language: str = ""
    kind: str = ""


@dataclass
class Report:
    """After_sales route against the expected one, and the final category against truth."""

    n: int = 0
    tp: int = 0
    fp: int = 0
    fn: int = 0
    correct_category: int = 0
    manual_review: int = 0
    misses: list[tuple[str, str, str]] = field(default_factory=list)  # id, expected, got

    @property
    def precision(self) -> float:
        return self.tp / (self.tp + self.fp) if self.tp + self.fp else 1.0

    @property
    def recall(self) -> float:
        return self.tp / (self.tp + self.fn) if self.tp + self.fn else 1.0

    @property
    def category_accuracy(self) -> float:
        return self.correct_category / self.n if self.n else 0.0


def load_cases(path: Path = FIXTURE) -> list[Case]:
    with path.open(encoding="utf-8") as f:
        return [Case(**json.loads(line)) for line in f if line.strip()]


def rules_step(path: Path = WORKFLOW) -> Step:
    """The definition's rule_engine step: its rules and thresholds are what is evaluated."""
    from agents.definition import load_definition  # the engine's registry: slow to import

    steps = [s for s in load_definition(path).steps if s.type == "rule_engine"]
    if len(steps) != 1:
        raise ValueError(f"{path}: expected one rule_engine step, found {len(steps)}")
    return steps[0]


def load_definition_steps(path: Path = WORKFLOW) -> list[Step]:
    from agents.definition import load_definition

    return list(load_definition(path).steps)


def v1_scorer(version_dir: Path) -> Scorer:
    """Version 1 as its model.py serves it: weights.npz scored by the featurizer."""
    from inference_gateway.model import featurize

    weights = np.load(version_dir / "weights.npz", allow_pickle=False)
    if int(weights["featurizer_version"]) != featurize.VERSION:
        raise ValueError(f"{version_dir}: weights need another featurizer version")
    coef = np.ascontiguousarray(weights["coef"], dtype=np.float32)
    intercept = weights["intercept"].astype(np.float32)
    return lambda texts: featurize.predict_proba(list(texts), coef, intercept)


def v2_scorer(version_dir: Path) -> Scorer:
    """Version 2 as its model.py serves it: e5 embeddings and the linear head."""
    from inference_gateway.model import e5_runtime

    classifier = e5_runtime.Classifier(version_dir)
    return lambda texts: classifier.predict_proba(list(texts))


SCORERS: dict[str, Callable[[Path], Scorer]] = {"v1": v1_scorer, "v2": v2_scorer}
BUILT_BY = {"v1": "weights.npz", "v2": "head.npz"}


def built_versions(model_dir: Path = MODEL_DIR) -> list[str]:
    return [v for v, f in BUILT_BY.items() if (model_dir / v[1:] / f).exists()]


def scorer(version: str, model_dir: Path = MODEL_DIR) -> Scorer:
    """One version's scores, or the mean of several ("v1+v2": the ensemble workflow's merge)."""
    if "+" in version:
        parts = [scorer(v, model_dir) for v in version.split("+")]
        return lambda texts: np.mean([s(texts) for s in parts], axis=0)
    return SCORERS[version](model_dir / version[1:])


def cascade_scorer(below: float, model_dir: Path = MODEL_DIR) -> Scorer:
    """The cascade as the workflow runs it: v1, and v2 where v1's confidence is below
    `below`; `.versions` holds, after each call, which version answered each row."""
    first, then = scorer("v1", model_dir), scorer("v2", model_dir)

    def score(texts: Sequence[str]) -> np.ndarray:
        proba = np.array(first(texts))
        ask = np.flatnonzero(proba.max(axis=1) < below)
        if len(ask):
            proba[ask] = then([texts[i] for i in ask])
        score.versions = ["v2" if i in set(ask) else "v1" for i in range(len(texts))]
        return proba

    score.versions = []
    return score


def intent_head(path: Path | None = None) -> IntentHead | None:
    """The refund-intent head on disk (or at `path`), read afresh: None where not built."""
    path = path or INTENT_WEIGHTS
    return read_head(path) if path.exists() else None


def decide(
    texts: Sequence[str],
    score: Scorer,
    step: Step,
    version: str,
    head: IntentHead | None = None,
) -> list[RuleOutcome]:
    """The workflow's decisions: clean -> (gateway normalisation) -> model -> rules (with the
    refund-intent head where the step has an `intent_band`)."""
    cleaned = [clean_text(t) or t for t in texts]
    proba = score([normalize_text(t) for t in cleaned])
    versions = getattr(score, "versions", None) or [version] * len(texts)
    if head is None and step.intent_band is not None:
        head = intent_head()
    return [
        _rules(text, row, step, v, head)
        for text, row, v in zip(cleaned, proba, versions, strict=True)
    ]


def prediction(row: np.ndarray, version: str) -> Prediction:
    best = int(row.argmax())
    return Prediction(
        category=CATEGORIES[best],
        confidence=float(row[best]),
        scores=dict(zip(CATEGORIES, map(float, row), strict=True)),
        model_name="ticket_classifier",
        model_version=version,
    )


def _rules(
    text: str, row: np.ndarray, step: Step, version: str, head: IntentHead | None = None
) -> RuleOutcome:
    pred = prediction(row, version)
    context = Context(clean_text=text, prediction=pred)
    intent = head.score(text, pred) if head is not None else None
    data = RuleInput(
        text=text,
        context=context,
        threshold=step.threshold,
        after_sales_threshold=step.after_sales_threshold,
        intent=intent,
        intent_band=step.intent_band if head is not None else None,
    )
    return apply_rules(step.rules, data)


def report(cases: Sequence[Case], outcomes: Sequence[RuleOutcome]) -> Report:
    rep = Report(n=len(cases))
    for case, out in zip(cases, outcomes, strict=True):
        expected, got = case.route == AFTER_SALES, out.route == AFTER_SALES
        rep.tp += expected and got
        rep.fp += got and not expected
        rep.fn += expected and not got
        rep.manual_review += out.route == "manual_review"
        rep.correct_category += out.category.value == case.category
        if expected != got or out.category.value != case.category:
            rep.misses.append((case.id, f"{case.route}/{case.category}", _said(out)))
    return rep


def _said(out: RuleOutcome) -> str:
    said = f"{out.route}/{out.category.value} ({', '.join(out.fired) or 'model'}"
    return said + (f": {out.reason})" if out.reason else ")")


def held_out_cases() -> list[Case]:
    """The held-out split of train.py (seed 13): after_sales tickets should reach after_sales."""
    from training import train

    _, rows = train.split()
    return [
        Case(
            id=f"held-{i}",
            text=r["text"],
            route=AFTER_SALES if r["category"] == AFTER_SALES else "auto_classify",
            category=r["category"],
            language=r["language"],
        )
        for i, r in enumerate(rows)
    ]


def sweep(
    cases: Sequence[Case], score: Scorer, step: Step, version: str, thresholds: Sequence[float]
) -> dict[float | None, Report]:
    """Reports of the same rules at each after_sales_threshold (None: words only)."""
    cleaned = [clean_text(c.text) or c.text for c in cases]
    proba = score([normalize_text(t) for t in cleaned])
    out: dict[float | None, Report] = {}
    for t in (None, *thresholds):
        at = step.model_copy(update={"after_sales_threshold": t})
        outcomes = [
            _rules(text, row, at, version) for text, row in zip(cleaned, proba, strict=True)
        ]
        out[t] = report(cases, outcomes)
    return out


def _f2(rep: Report) -> float:
    p, r = rep.precision, rep.recall
    return 5 * p * r / (4 * p + r) if p + r else 0.0


def best_threshold(reports: dict[float | None, Report]) -> float:
    """The threshold of the best F2 (recall weighs four times precision: a refund request
    auto-classified is worse than a ticket after-sales hands on). Ties go to the lower:
    where the held-out set cannot tell thresholds apart, keep the margin for recall."""
    return max((t for t in reports if t is not None), key=lambda t: (round(_f2(reports[t]), 4), -t))


# ---- command line ---------------------------------------------------------------------------

app = typer.Typer(help="Offline evaluations of the workflow's decisions.", no_args_is_help=True)


def _row(label: str, rep: Report) -> str:
    return (
        f"{label:<10} n={rep.n:<5} after_sales precision {rep.precision:.3f} "
        f"recall {rep.recall:.3f} (tp {rep.tp}, fp {rep.fp}, fn {rep.fn})  "
        f"category accuracy {rep.category_accuracy:.3f}  manual_review {rep.manual_review}"
    )


@app.command("after-sales")
def after_sales(
    versions: Annotated[
        str,
        typer.Option(
            help="comma-separated model versions (v1+v2: their mean, as the ensemble "
            "workflow merges); default: every one built"
        ),
    ] = "",
    fixture: Annotated[Path, typer.Option(help="hand-written JSONL")] = FIXTURE,
    workflow: Annotated[Path, typer.Option(help="definition whose rules step is used")] = WORKFLOW,
    do_sweep: Annotated[
        bool,
        typer.Option("--sweep", help="measure after_sales_threshold on the held-out split"),
    ] = False,
    show_misses: Annotated[bool, typer.Option(help="list the fixture's misses")] = False,
    model_dir: Annotated[
        Path, typer.Option(help="model repository folder of ticket_classifier (1/, 2/)")
    ] = MODEL_DIR,
) -> None:
    """Precision and recall of the after_sales route, and category accuracy, per version."""
    step = rules_step(workflow)
    chosen = [v for v in versions.split(",") if v] or built_versions(model_dir)
    if not chosen:
        typer.echo("no model version built: run `python -m training.train`")
        raise typer.Exit(1)
    cases = load_cases(fixture)
    typer.echo(
        f"rules {step.rules}, threshold {step.threshold}, "
        f"after_sales_threshold {step.after_sales_threshold}; {fixture.name}: {len(cases)} tickets"
    )
    for version in chosen:
        score = scorer(version, model_dir)
        rep = report(cases, decide([c.text for c in cases], score, step, version))
        typer.echo(_row(f"{version} hand", rep))
        if show_misses:
            for miss in rep.misses:
                typer.echo(f"    {miss[0]}: expected {miss[1]}, got {miss[2]}")
        if do_sweep:
            _print_sweep(score, step, version)


def _print_sweep(score: Scorer, step: Step, version: str) -> None:
    reports = sweep(held_out_cases(), score, step, version, SWEEP)
    for t, rep in reports.items():
        typer.echo(_row(f"  T={t}", rep) + f"  F2 {_f2(rep):.3f}")
    typer.echo(f"  {version}: best held-out F2 at after_sales_threshold {best_threshold(reports)}")
