"""`ticketflow eval decisions`: v1, v2, the cascade and the refund-intent head, in process.

Per path: category accuracy and macro F1, refund recall and after_sales precision of the
route, the expected calibration error (ECE) of the model's confidence and of the intent
head's score, and the share of tickets routed to people (manual_review). A reliability plot
goes to docs/img/reliability.png.

The cascade's `below` and the intent band are chosen on the validation split only
(`--choose`): the corpus of another seed plus the hand-written fixtures of earlier rounds
(training/intent.py); `--fixture` measures another set with what was chosen
(the frozen blind set once, at the end).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated

import numpy as np
import typer

from agents.steps.refund_intent import IntentHead
from evaluation import after_sales as ev
from schemas.tickets import CATEGORIES
from schemas.workflow import Step

ROOT = ev.ROOT
PLOT = ROOT / "docs" / "img" / "reliability.png"
RESULT = ROOT / "bench" / "results" / "eval_decisions.json"
BANDS_PLOT = ROOT / "docs" / "img" / "band_crossfit.png"
CROSSFIT = ROOT / "bench" / "results" / "crossfit.json"  # `ticketflow eval crossfit` writes it
BANDS = [round(0.05 * i, 2) for i in range(1, 20)]  # 0.05 .. 0.95
MAX_MANUAL = 0.08  # the band's ceiling on the validation split (the target is 10 %)
# where no band meets the targets: a refund auto-classified costs 3, a ticket sent to
# after_sales wrongly 2, one handed to people 1
COST_FN, COST_FP, COST_MANUAL = 3.0, 2.0, 1.0


def validation_cases() -> list[ev.Case]:
    """The validation split: never the frozen blind set, never the training rows."""
    from training import corpus, intent, train

    train_texts = {r["text"] for r in train.split()[0]}
    out = [c for p in intent.VALIDATION_FIXTURES for c in ev.load_cases(p)]
    for i, r in enumerate(corpus.generate(intent.VAL_N, intent.VAL_SEED)):
        if r["text"] not in train_texts:
            route = "after_sales" if r["category"] == "after_sales" else "auto_classify"
            out.append(ev.Case(f"val-{i}", r["text"], route, r["category"], r["language"]))
    return out


def workflow_below() -> float:
    """The default workflow's cascade threshold (its infer step's `cascade.below`)."""
    for s in ev.load_definition_steps():
        if s.cascade is not None:
            return s.cascade.below
    raise ValueError("the default workflow has no cascade")


def ece(confidence: np.ndarray, correct: np.ndarray, bins: int = 10) -> float:
    """Expected calibration error over equal-width bins of the confidence."""
    idx = np.clip((confidence * bins).astype(int), 0, bins - 1)
    total = 0.0
    for b in range(bins):
        mask = idx == b
        if mask.any():
            total += mask.sum() * abs(confidence[mask].mean() - correct[mask].mean())
    return float(total / len(confidence))


def reliability(confidence: np.ndarray, correct: np.ndarray, bins: int = 10) -> list[list]:
    """[bin centre, mean confidence, observed frequency, count] of the non-empty bins."""
    idx = np.clip((confidence * bins).astype(int), 0, bins - 1)
    return [
        [(b + 0.5) / bins, float(confidence[idx == b].mean()), float(correct[idx == b].mean()),
         int((idx == b).sum())]
        for b in range(bins)
        if (idx == b).any()
    ]  # fmt: skip


def macro_f1(truth: Sequence[str], got: Sequence[str]) -> float:
    scores = []
    for c in CATEGORIES:
        tp = sum(t == c and g == c for t, g in zip(truth, got, strict=True))
        fp = sum(t != c and g == c for t, g in zip(truth, got, strict=True))
        fn = sum(t == c and g != c for t, g in zip(truth, got, strict=True))
        scores.append(2 * tp / (2 * tp + fp + fn) if tp else 0.0)
    return float(np.mean(scores))


def scored(
    version: str, below: float, texts: list[str], model_dir: Path = ev.MODEL_DIR
) -> tuple[np.ndarray, list[str]]:
    """Probabilities and the answering version per row, as the workflow reads the text."""
    from agents.steps.clean import clean_text
    from inference_gateway.cache import normalize_text

    model_texts = [normalize_text(clean_text(t) or t) for t in texts]
    if version == "cascade":
        score = ev.cascade_scorer(below, model_dir)
    else:
        score = ev.scorer(version, model_dir)
    proba = np.asarray(score(model_texts))
    return proba, getattr(score, "versions", None) or [version] * len(texts)


def intent_scores(
    cases: Sequence[ev.Case], proba: np.ndarray, versions: list[str], head: IntentHead
) -> np.ndarray:
    from agents.steps.clean import clean_text

    texts = [clean_text(c.text) or c.text for c in cases]
    return np.array([head.score(t, ev.prediction(row, v)).score
                     for t, row, v in zip(texts, proba, versions, strict=True)])  # fmt: skip


def _outcomes(cases, proba, versions, step: Step, scores: np.ndarray | None, name: str) -> list:
    from agents.steps.clean import clean_text
    from agents.steps.refund_intent import IntentScore
    from agents.steps.rules import RuleInput, apply_rules
    from schemas.tickets import Context

    outs = []
    for i, (c, row, v) in enumerate(zip(cases, proba, versions, strict=True)):
        text = clean_text(c.text) or c.text
        pred = ev.prediction(row, v)
        data = RuleInput(
            text, Context(clean_text=text, prediction=pred), step.threshold,
            step.after_sales_threshold,
            intent=IntentScore(float(scores[i]), name) if scores is not None else None,
            intent_band=step.intent_band if scores is not None else None,
        )  # fmt: skip
        outs.append(apply_rules(step.rules, data))
    return outs


def measure(
    cases: Sequence[ev.Case],
    proba: np.ndarray,
    versions: list[str],
    step: Step,
    scores: np.ndarray | None,
    name: str = "",
) -> dict:
    """One path's figures on `cases`: the rules of `step`, with the intent head's `scores`
    where given (None: the rules without the head)."""
    outs = _outcomes(cases, proba, versions, step, scores, name)
    rep = ev.report(cases, outs)
    truth = [c.category for c in cases]
    top = [CATEGORIES[i] for i in proba.argmax(axis=1)]
    conf = proba.max(axis=1)
    right = np.array([t == g for t, g in zip(truth, top, strict=True)], float)
    got = [o.category.value for o in outs]
    per_category = {
        c: round(float(np.mean([g == c for g, t in zip(got, truth, strict=True) if t == c])), 4)
        for c in CATEGORIES
        if c in truth
    }
    figures = {
        "n": len(cases),
        "accuracy": round(rep.category_accuracy, 4),
        "accuracy_per_category": per_category,
        "macro_f1": round(macro_f1(truth, got), 4),
        "refund_recall": round(rep.recall, 4),
        "after_sales_precision": round(rep.precision, 4),
        "manual_review_share": round(rep.manual_review / len(cases), 4),
        "tp_fp_fn": [rep.tp, rep.fp, rep.fn],
        "ece_model": round(ece(conf, right), 4),
        "reliability_model": reliability(conf, right),
        "misses": [list(m) for m in rep.misses],
    }
    if scores is not None:
        y = np.array([c.route == "after_sales" for c in cases], float)
        figures["ece_intent"] = round(ece(scores, y), 4)
        figures["reliability_intent"] = reliability(scores, y)
    return figures


def choose_band(
    cases: Sequence[ev.Case], proba: np.ndarray, versions: list[str], step: Step, scores
) -> tuple[tuple[float, float], list[dict]]:
    """The band chosen on the validation split: of the bands that meet the targets there
    (refund recall >= 0.98, after_sales precision >= 0.95) with at most MAX_MANUAL of the
    tickets to people, the one that sends the fewest to people; where none meets them,
    the least cost (COST_*). Ties go to the narrower band, then the lower; a band is at
    least one step of the grid wide."""
    # the routes of the other rules (the ones refund_intent leaves a ticket to), once; then
    # refund_intent's part per band, vectorised: it depends on the score and the model's top
    rest = step.model_copy(update={"rules": [r for r in step.rules if r != "refund_intent"]})
    base = np.array([o.route for o in _outcomes(cases, proba, versions, rest, None, "")])
    y = np.array([c.route == "after_sales" for c in cases])
    first = proba.argmax(axis=1) == CATEGORIES.index("after_sales")
    n = len(cases)
    curve = []
    for low in BANDS:
        for high in (h for h in BANDS if h >= low):
            to_as = scores >= high
            to_people = ((scores >= low) & ~to_as) | ((scores < low) & first)
            left = ~to_as & ~to_people
            routed_as = to_as | (left & (base == "after_sales"))
            people = to_people | (left & (base == "manual_review"))
            manual = float(people.mean())
            tp, fp = int((routed_as & y).sum()), int((routed_as & ~y).sum())
            # a refund handed to people is not lost: it costs what any ticket to people costs
            fn = int((y & ~routed_as & ~people).sum())
            cost = COST_FN * fn + COST_FP * fp + COST_MANUAL * manual * n
            meets = tp / max(1, int(y.sum())) >= 0.98 and tp / max(1, tp + fp) >= 0.95
            curve.append({"band": [low, high], "cost": round(cost, 1), "fn": fn, "fp": fp,
                          "manual_review_share": round(manual, 4),
                          "recall": tp / max(1, int(y.sum())),
                          "precision": tp / max(1, tp + fp),
                          "meets_targets": meets})  # fmt: skip
    # a band of zero width would take the uncertain band, which the workflow promises, away
    allowed = [
        p for p in curve if p["manual_review_share"] <= MAX_MANUAL and p["band"][1] > p["band"][0]
    ]
    feasible = [p for p in allowed if p["meets_targets"]]

    def width(p: dict) -> tuple[float, float]:
        return (p["band"][1] - p["band"][0], p["band"][0])

    if feasible:
        best = min(feasible, key=lambda p: (p["manual_review_share"], *width(p)))
    else:
        best = min(allowed, key=lambda p: (p["cost"], *width(p)))
    return (best["band"][0], best["band"][1]), curve


def band_on_crossfit(
    step: Step, path: Path | None = None, below: float | None = None
) -> tuple[tuple[float, float], list[dict]]:
    """The band `choose_band` picks on the out-of-fold decisions of `ticketflow eval
    crossfit` (hand-written tickets that the models deciding them never saw), and its curve.
    `below`: the cascade's threshold the band is for; the decisions must have been made at it."""
    cases, proba, versions, scores, at = load_crossfit(path or CROSSFIT)
    if below is not None and at != below:
        raise ValueError(f"the out-of-fold decisions are the cascade's at {at}, not {below}")
    return choose_band(cases, proba, versions, step, scores)


def load_crossfit(
    path: Path = CROSSFIT,
) -> tuple[list[ev.Case], np.ndarray, list[str], np.ndarray, float]:
    """The out-of-fold cases, the cascade's probabilities, versions and intent scores."""
    from training import earlier_sets

    data = json.loads(path.read_text())
    by_id = {}
    for name in data["folds"]:
        for c in ev.load_cases(earlier_sets.FIXTURES / f"{name}.jsonl"):
            by_id[(name, c.id)] = c
    rows = data["rows"]
    cases = [by_id[(r["set"], r["id"])] for r in rows]
    proba = np.array([r["proba"] for r in rows])
    return (
        cases,
        proba,
        [r["version"] for r in rows],
        np.array([r["intent"] for r in rows]),
        data["below"],
    )


def plot_bands(curves: dict[str, list[dict]], chosen: tuple[float, float], path: Path) -> None:
    """Refund recall and after_sales precision of the bands [top - 0.05, top), per set."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for (name, curve), colour in zip(curves.items(), ("tab:blue", "tab:orange"), strict=False):
        pts = sorted((p for p in curve if round(p["band"][1] - p["band"][0], 2) == 0.05),
                     key=lambda p: p["band"][1])  # fmt: skip
        tops = [p["band"][1] for p in pts]
        ax.plot(tops, [p["recall"] for p in pts], "-o", ms=3, color=colour,
                label=f"refund recall, {name}")  # fmt: skip
        ax.plot(tops, [p["precision"] for p in pts], "--s", ms=3, color=colour,
                label=f"after_sales precision, {name}")  # fmt: skip
    ax.axhline(0.98, color="grey", lw=0.6)
    ax.axhline(0.95, color="grey", lw=0.6, ls=":")
    ax.axvline(chosen[1], color="k", lw=0.8, label=f"chosen band {list(chosen)}")
    ax.set_xlabel("band top (band = [top - 0.05, top); at or above the top: after_sales)")
    ax.set_ylim(0.85, 1.0)
    ax.set_title("the cascade with the intent head: where the band is chosen")
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4.2))
    for name, f in results["paths"].items():
        pts = np.array(f["reliability_model"])
        left.plot(pts[:, 1], pts[:, 2], marker="o", label=f"{name} (ECE {f['ece_model']:.3f})")
        if "reliability_intent" in f:
            pts = np.array(f["reliability_intent"])
            label = f"intent head on {name} (ECE {f['ece_intent']:.3f})"
            right.plot(pts[:, 1], pts[:, 2], marker="o", label=label)
    for ax, title in ((left, "category: top-1 confidence"), (right, "refund intent score")):
        ax.plot([0, 1], [0, 1], "k--", lw=0.8)
        ax.set_xlabel("predicted probability")
        ax.set_ylabel("observed frequency")
        ax.set_title(title)
        ax.legend(fontsize=7)
    fig.suptitle(f"reliability on {results['set']} ({results['n']} tickets)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def run(
    cases: list[ev.Case],
    step: Step,
    head: IntentHead | None,
    below: float,
    choose: bool,
    model_dir: Path = ev.MODEL_DIR,
    choose_below: bool = True,
) -> dict:
    """`choose`: the band is chosen on `cases`, and `below` too unless `choose_below` is
    False (a `below` given on the command line is kept)."""
    texts = [c.text for c in cases]
    v1, v2 = scored("v1", below, texts, model_dir), scored("v2", below, texts, model_dir)
    chosen = {}
    if choose and choose_below:
        from evaluation.report import pick_threshold

        truth = [c.category for c in cases]
        ok1 = [CATEGORIES[i] == t for i, t in zip(v1[0].argmax(axis=1), truth, strict=True)]
        ok2 = [CATEGORIES[i] == t for i, t in zip(v2[0].argmax(axis=1), truth, strict=True)]
        below, _ = pick_threshold(list(v1[0].max(axis=1)), ok1, ok2)
        chosen["cascade_below"] = below
    casc = (v1[0].copy(), list(v1[1]))
    ask = v1[0].max(axis=1) < below
    casc[0][ask] = v2[0][ask]
    casc = (casc[0], ["v2" if a else "v1" for a in ask])
    paths = {"v1": v1, "v2": v2, "cascade": casc}
    results = {"paths": {}, "cascade_below": below, "share_to_v2": round(float(ask.mean()), 4)}
    for name, (proba, versions) in paths.items():
        at = step
        scores = intent_scores(cases, proba, versions, head) if head is not None else None
        if choose and scores is not None:
            band, _ = choose_band(cases, proba, versions, step, scores)
            chosen[f"intent_band_{name}"] = band
            at = step.model_copy(update={"intent_band": band})
        with_head = scores if at.intent_band is not None else None
        f = measure(cases, proba, versions, at, with_head, head.name if head else "")
        f["intent_band"] = at.intent_band
        bare = measure(cases, proba, versions, at, None)
        keep = ("accuracy", "refund_recall", "after_sales_precision", "manual_review_share")
        f["without_intent_head"] = {k: bare[k] for k in keep}
        results["paths"][name] = f
    results["chosen_on_this_set"] = chosen
    return results


app = typer.Typer()


@app.command("decisions")
def decisions(
    fixture: Annotated[
        Path | None, typer.Option(help="a JSONL set to measure (default: the validation split)")
    ] = None,
    choose: Annotated[
        bool,
        typer.Option(help="choose the band, and the cascade's below unless given, on this set"),
    ] = False,
    below: Annotated[
        float | None, typer.Option(help="the cascade's threshold (default: the workflow's)")
    ] = None,
    model_dir: Annotated[
        Path, typer.Option(help="ticket_classifier's folder (1/, 2/)")
    ] = ev.MODEL_DIR,
    intent: Annotated[Path, typer.Option(help="the intent head's intent.npz")] = (
        ev.INTENT_WEIGHTS
    ),
    out: Annotated[Path, typer.Option(help="the JSON result")] = RESULT,
    plot_to: Annotated[Path, typer.Option(help="the reliability plot")] = PLOT,
    on: Annotated[
        str,
        typer.Option(
            help="--choose's band on: validation, or crossfit (`ticketflow eval "
            "crossfit`'s out-of-fold decisions on the spent blind sets)"
        ),
    ] = "validation",
) -> None:
    """v1, v2, the cascade and the intent head: accuracy, macro F1, refund recall,
    after_sales precision, ECE, share to people."""
    step = ev.rules_step()
    head = ev.intent_head(intent)
    if choose and fixture is not None:
        typer.echo("--choose is for the validation split only")
        raise typer.Exit(2)
    if on not in ("validation", "crossfit"):
        typer.echo("--on is validation or crossfit")
        raise typer.Exit(2)
    cases = ev.load_cases(fixture) if fixture else validation_cases()
    at = workflow_below() if below is None else below
    oof_band = None
    if choose and on == "crossfit":
        if not CROSSFIT.exists():
            typer.echo(f"no {CROSSFIT}: run `ticketflow eval crossfit` first")
            raise typer.Exit(2)
        try:
            oof_band, oof_curve = band_on_crossfit(step, CROSSFIT, at)
        except ValueError as exc:
            typer.echo(f"{exc}: run `ticketflow eval crossfit --below {at}` first")
            raise typer.Exit(2) from None
        proba, versions = scored("cascade", at, [c.text for c in cases], model_dir)
        if head is not None:
            scores = intent_scores(cases, proba, versions, head)
            _, val_curve = choose_band(cases, proba, versions, step, scores)
            curves = {"out of fold (hand-written)": oof_curve, "validation split": val_curve}
            plot_bands(curves, oof_band, BANDS_PLOT)
        step, choose = step.model_copy(update={"intent_band": oof_band}), False
    results = run(cases, step, head, at, choose, model_dir, choose_below=below is None)
    if oof_band is not None:
        results["chosen_on_this_set"] = {"intent_band_cascade (crossfit)": oof_band}
    results.update(set=fixture.name if fixture else "the validation split", n=len(cases))
    results["intent_head"] = head.name if head else None
    out.parent.mkdir(parents=True, exist_ok=True)
    slim = {**results, "paths": {k: {i: j for i, j in v.items() if i != "intent_scores"}
                                 for k, v in results["paths"].items()}}  # fmt: skip
    out.write_text(json.dumps(slim, indent=1) + "\n")
    plot(results, plot_to)
    for name, f in results["paths"].items():
        typer.echo(
            f"{name:<8} acc {f['accuracy']:.3f} macroF1 {f['macro_f1']:.3f} "
            f"refund recall {f['refund_recall']:.3f} as-precision {f['after_sales_precision']:.3f} "
            f"manual {f['manual_review_share']:.3f} ECE model {f['ece_model']:.3f} "
            f"intent {f.get('ece_intent', float('nan')):.3f} band {f['intent_band']}"
        )
        typer.echo(f"         per category {f['accuracy_per_category']}")
        typer.echo(f"         without the head {f['without_intent_head']}")
    typer.echo(f"cascade below {results['cascade_below']}: {results['share_to_v2']:.1%} to v2")
    if results["chosen_on_this_set"]:
        typer.echo(f"chosen: {results['chosen_on_this_set']}")
    typer.echo(f"wrote {out} and {plot_to}")
