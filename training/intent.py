"""The refund-intent head: P(the ticket asks for a refund, return, exchange or other remedy).

A binary logistic regression on v1's hashed n-grams (`featurize.py`, so no download and ~0.2
ms a ticket on a CPU), the words in a negation's scope marked as words of their own
(`agents/steps/negation.py`: "not after a refund" is not "refund"), trained on train.py's
training split (the corpus with its hard negatives, `hard_negatives.py`) and the spent blind
sets (`earlier_sets.py`, weighted as the category models weigh them; cross-fitted in
docs/models.md, "The sixth round"), then calibrated on a separate validation split by a
stacked Platt scaling per serving model version: sigmoid(w0 * n-gram logit + w1 * the
model's after_sales logit + w2 * [the model ranks after_sales first] + b), so the score
reads the words and the model it is served beside ("*": the n-gram logit alone, for a
version without its own). The validation split:

- the corpus generated again with another seed (`VAL_SEED`), none of its texts in training;
- the hand-written fixtures of earlier rounds (`VALIDATION_FIXTURES`), never trained on.

The newest frozen blind set (blind15) is not read here. Served in
process by `agents/steps/refund_intent.py` from `intent.npz`; its version and the digest of
that file go into the rule step's audit detail.

    python -m training.intent [--force]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

import numpy as np

from agents.steps import negation
from agents.steps.refund_intent import WEIGHTS
from inference_gateway.model import featurize
from inference_gateway.model.repository import MODEL_DIR
from schemas.tickets import CATEGORIES

from . import dataset, earlier_sets

HERE = Path(__file__).resolve().parent
OUT_DIR = WEIGHTS.parent  # where agents/steps/refund_intent.py serves it from
VERSION = "refund_intent/1"
FIXTURES = HERE.parent / "tests" / "fixtures"
VALIDATION_FIXTURES = tuple(
    FIXTURES / f"after_sales_{name}.jsonl"
    for name in ("handwritten", "blind", "blind2", "blind3", "blind4")
)
VAL_SEED = 29
VAL_N = 1200  # v2 embeds them for its stacking: ~12 ms a text on 2 cores
# inverse regularisation, the best validation log-loss of these
C_GRID = (1.0, 4.0, 16.0)
POSITIVE = "after_sales"
_EPS = 1e-4  # as agents/steps/refund_intent.py clips the model's probability
SOURCES = [HERE / f for f in ("intent.py", "hard_negatives.py", "corpus.py", "phrases_en.py")]
SOURCES += [HERE / f for f in ("phrases_zh.py", "slots.py", "train.py", "dataset.py")]
SOURCES += [HERE / "earlier_sets.py", *earlier_sets.paths()]
SOURCES += [Path(featurize.__file__).resolve(), Path(negation.__file__).resolve()]


def is_fresh(out_dir: Path = OUT_DIR, model_dir: Path | None = None) -> bool:
    """Newer than its sources and than the models it is stacked on."""
    weights = out_dir / "intent.npz"
    if not weights.exists():
        return False
    folder = model_dir or MODEL_DIR
    models = [p for p in (folder / "1" / "weights.npz", folder / "2" / "head.npz") if p.exists()]
    return weights.stat().st_mtime > max(s.stat().st_mtime for s in [*SOURCES, *models])


def validation_rows(train_texts: set[str]) -> list[dict]:
    """Generated rows of another seed (none seen in training) plus the earlier fixtures."""
    from . import corpus

    rows = [
        {"text": r["text"], "y": int(r["category"] == POSITIVE), "source": "generated"}
        for r in corpus.generate(VAL_N, VAL_SEED)
        if r["text"] not in train_texts
    ]
    for path in VALIDATION_FIXTURES:
        rows += [
            {"text": case["text"], "y": int(case["route"] == POSITIVE), "source": path.stem}
            for case in dataset.fixture_cases(path)
        ]
    return rows


def head_words(texts: list[str]) -> list[str]:
    """The texts as the head's n-grams read them, negation scopes marked (as served)."""
    return [negation.mark(t) for t in texts]


def raw_logit(texts: list[str], coef: np.ndarray, intercept: float) -> np.ndarray:
    """The uncalibrated log-odds, numpy only (as served)."""
    indptr, indices, values = featurize.featurize_batch(head_words(texts), coef.shape[0])
    rows = np.repeat(np.arange(len(texts)), np.diff(indptr))
    out = np.full(len(texts), intercept, np.float64)
    np.add.at(out, rows, coef[indices].astype(np.float64) * values)
    return out


def stack_inputs(z: np.ndarray, proba: np.ndarray | None) -> np.ndarray:
    """[n, 3]: the n-gram logit, the model's after_sales logit, whether it ranks it first."""
    if proba is None:
        return np.stack([z, np.zeros_like(z), np.zeros_like(z)], axis=1)
    k = CATEGORIES.index(POSITIVE)
    p = np.clip(proba[:, k], _EPS, 1 - _EPS)
    first = (proba.argmax(axis=1) == k).astype(np.float64)
    return np.stack([z, np.log(p / (1 - p)), first], axis=1)


def platt(x: np.ndarray, y: np.ndarray) -> list[float]:
    """Stacked Platt scaling: [w0, w1, w2, b] of sigmoid(x @ w + b), maximum likelihood
    (columns that are all zero get weight 0)."""
    from sklearn.linear_model import LogisticRegression

    used = np.abs(x).sum(axis=0) > 0
    clf = LogisticRegression(C=1e4, max_iter=2000).fit(x[:, used], y)
    w = np.zeros(x.shape[1])
    w[used] = clf.coef_[0]
    return [*map(float, w), float(clf.intercept_[0])]


def stacked(x: np.ndarray, w: list[float]) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-(x @ np.asarray(w[:3]) + w[3])))


def version_scorers(model_dir: Path) -> dict:
    """The built versions of ticket_classifier, each as texts -> probabilities."""
    scorers = {}
    v1 = model_dir / "1" / "weights.npz"
    if v1.exists():
        with np.load(v1, allow_pickle=False) as w:
            coef, intercept = np.ascontiguousarray(w["coef"]), w["intercept"].astype(np.float32)
        scorers["v1"] = lambda texts: featurize.predict_proba(texts, coef, intercept)
    if (model_dir / "2" / "head.npz").exists():
        from inference_gateway.model import e5_runtime

        classifier = e5_runtime.Classifier(model_dir / "2")
        scorers["v2"] = classifier.predict_proba
    return scorers


def model_text(text: str) -> str:
    """What the model reads in the workflow: the cleaner's text, the gateway's normalisation."""
    from agents.steps.clean import clean_text
    from inference_gateway.cache import normalize_text

    return normalize_text(clean_text(text) or text)


def ece(p: np.ndarray, y: np.ndarray, bins: int = 10) -> float:
    """Expected calibration error of P(positive) over equal-width bins."""
    edges = np.linspace(0, 1, bins + 1)
    idx = np.clip(np.digitize(p, edges[1:-1]), 0, bins - 1)
    total = 0.0
    for b in range(bins):
        mask = idx == b
        if mask.any():
            total += mask.sum() * abs(p[mask].mean() - y[mask].mean())
    return float(total / len(p))


def _fit(train_texts: list[str], y: np.ndarray, val_texts: list[str], val_y: np.ndarray):
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import log_loss

    x, x_val = dataset.to_csr(head_words(train_texts)), dataset.to_csr(head_words(val_texts))
    used = np.unique(x.indices)
    best = None
    for c in C_GRID:
        clf = LogisticRegression(C=c, max_iter=1000, tol=1e-5).fit(x[:, used], y)
        loss = log_loss(val_y, clf.predict_proba(x_val[:, used])[:, 1], labels=[0, 1])
        if best is None or loss < best[0]:
            best = (loss, c, clf)
    _, c, clf = best
    coef = np.zeros(featurize.N_FEATURES, np.float32)
    coef[used] = clf.coef_[0]
    return coef, float(clf.intercept_[0]), c


def train_intent(out_dir: Path = OUT_DIR, model_dir: Path | None = None) -> dict:
    t0 = time.perf_counter()
    train_rows, test_rows = dataset.split()
    train_rows = earlier_sets.weighted(train_rows)
    texts = [r["text"] for r in train_rows]
    y = np.array([int(r["category"] == POSITIVE) for r in train_rows])
    val = validation_rows(set(texts))
    val_texts = [model_text(r["text"]) for r in val]
    val_y = np.array([r["y"] for r in val])
    coef, intercept, c = _fit(texts, y, val_texts, val_y)
    z_val = raw_logit(val_texts, coef, intercept)
    stack = {"*": platt(stack_inputs(z_val, None), val_y)}
    eces = {}
    for version, score in version_scorers(model_dir or MODEL_DIR).items():
        x = stack_inputs(z_val, score(val_texts))
        stack[version] = platt(x, val_y)
        eces[version] = round(ece(stacked(x, stack[version]), val_y), 4)
    out_dir.mkdir(parents=True, exist_ok=True)
    weights = out_dir / "intent.npz"
    np.savez_compressed(
        weights,
        coef=coef,
        intercept=np.float64(intercept),
        stack=np.array(json.dumps(stack)),
        featurizer_version=np.int64(featurize.VERSION),
        negation_version=np.int64(negation.VERSION),
        version=np.array(VERSION),
    )
    p_val = stacked(stack_inputs(z_val, None), stack["*"])
    test_texts = [r["text"] for r in test_rows]
    y_test = np.array([int(r["category"] == POSITIVE) for r in test_rows])
    p_test = stacked(stack_inputs(raw_logit(test_texts, coef, intercept), None), stack["*"])
    hand = np.array([r["source"] != "generated" for r in val])
    metrics = {
        "version": VERSION,
        "sha256": hashlib.sha256(weights.read_bytes()).hexdigest(),
        "C": c,
        "stack": {k: [round(v, 4) for v in w] for k, w in stack.items()},
        "ece_validation_stacked": eces,
        "n_train": len(texts),
        "n_validation": len(val),
        "n_validation_handwritten": int(hand.sum()),
        "ece_validation": round(ece(p_val, val_y), 4),
        "ece_validation_handwritten": round(ece(p_val[hand], val_y[hand]), 4),
        "ece_held_out": round(ece(p_test, y_test), 4),
        "accuracy_held_out_at_0.5": round(float(((p_test >= 0.5) == y_test).mean()), 4),
        "train_seconds": round(time.perf_counter() - t0, 2),
    }
    (out_dir / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n", encoding="utf-8")
    return metrics


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out-dir", type=Path, default=OUT_DIR)
    ap.add_argument("--model-dir", type=Path, help="ticket_classifier's folder")
    ap.add_argument("--force", action="store_true", help="retrain even when up to date")
    args = ap.parse_args(argv)
    if not args.force and is_fresh(args.out_dir, args.model_dir):
        print(f"intent: {args.out_dir / 'intent.npz'} is up to date; --force to retrain")
        return 0
    metrics = train_intent(args.out_dir, args.model_dir)
    print(f"intent: {json.dumps(metrics)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
