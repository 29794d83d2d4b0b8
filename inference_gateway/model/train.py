"""Train the default `ticket_classifier` (version 1) and write it into the model repository.

Multinomial logistic regression on the hashed features of `featurize.py`, learned from the
synthetic corpus of `corpus.py`; evaluated on a stratified 20% held-out split.

    python -m inference_gateway.model.train [--out-dir DIR] [--force]

Writes into DIR (default: the repository's ticket_classifier/1/): weights.npz, metrics.json and
a copy of featurize.py, so that the served model needs nothing from this package. Skips the work
when weights.npz is newer than every source it was built from, unless --force.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np
from scipy import sparse
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import accuracy_score, classification_report, f1_score
from sklearn.model_selection import train_test_split

from schemas.tickets import CATEGORIES

from . import corpus, featurize

HERE = Path(__file__).resolve().parent
MODEL_DIR = HERE.parent / "model_repository" / "ticket_classifier"
DEFAULT_OUT = MODEL_DIR / "1"
SOURCES = [HERE / f for f in ("corpus.py", "featurize.py", "phrases_en.py", "phrases_zh.py")]
SOURCES += [HERE / "slots.py", HERE / "train.py"]

N_TICKETS = 8000
SEED = 13
# Inverse regularisation. Accuracy barely moves for C in 2..100 (< 1 point on a validation
# split); 20 gave the best held-out log-loss and calibration (ECE ~0.01), which matters because
# the gateway routes on the confidence.
C = 20.0


def is_fresh(out_dir: Path) -> bool:
    weights = out_dir / "weights.npz"
    if not weights.exists() or not (out_dir / "featurize.py").exists():
        return False
    return weights.stat().st_mtime > max(src.stat().st_mtime for src in SOURCES)


def to_csr(texts: list[str]) -> sparse.csr_matrix:
    indptr, indices, values = featurize.featurize_batch(texts)
    shape = (len(texts), featurize.N_FEATURES)
    return sparse.csr_matrix((values, indices, indptr), shape=shape, dtype=np.float64)


def fit(texts: list[str], labels: list[int], c: float = C) -> tuple[np.ndarray, np.ndarray]:
    """coef [n_features, n_classes] and intercept [n_classes] of a multinomial LR."""
    x = to_csr(texts)
    # Only a fraction of the hashed columns occur in training; the others keep weight 0 under
    # L2 anyway, so fitting on the used ones gives the same model several times faster.
    used = np.unique(x.indices)
    clf = LogisticRegression(C=c, max_iter=500, tol=1e-5).fit(x[:, used], labels)
    coef = np.zeros((featurize.N_FEATURES, len(CATEGORIES)), np.float32)
    coef[used] = clf.coef_.T
    return coef, clf.intercept_.astype(np.float32)


def scipy_proba(texts: list[str], coef: np.ndarray, intercept: np.ndarray) -> np.ndarray:
    """Reference scoring with scipy, to check the numpy-only path that serving uses."""
    return featurize.softmax(np.asarray(to_csr(texts) @ coef) + intercept)


def evaluate(coef: np.ndarray, intercept: np.ndarray, rows: list[dict]) -> dict:
    y_true = np.array([CATEGORIES.index(r["category"]) for r in rows])
    y_pred = scipy_proba([r["text"] for r in rows], coef, intercept).argmax(axis=1)
    by_lang = {}
    for lang in corpus.LANGUAGES:
        mask = np.array([r["language"] == lang for r in rows])
        by_lang[lang] = round(float(accuracy_score(y_true[mask], y_pred[mask])), 4)
    report = classification_report(
        y_true, y_pred, labels=range(len(CATEGORIES)), target_names=CATEGORIES, digits=3
    )
    return {
        "accuracy": round(float(accuracy_score(y_true, y_pred)), 4),
        "macro_f1": round(float(f1_score(y_true, y_pred, average="macro")), 4),
        "accuracy_by_language": by_lang,
        "report": report,
    }


def export(coef: np.ndarray, intercept: np.ndarray, out_dir: Path, probe: list[str]) -> None:
    # The served path is featurize.predict_proba: it must agree with the scipy reference.
    drift = np.abs(
        featurize.predict_proba(probe, coef, intercept) - scipy_proba(probe, coef, intercept)
    )
    if drift.max() > 1e-4:
        raise RuntimeError(f"numpy scoring disagrees with scipy by {drift.max():.2e}")
    out_dir.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(
        out_dir / "weights.npz",
        coef=coef,
        intercept=intercept,
        labels=np.array(CATEGORIES),
        featurizer_version=np.int64(featurize.VERSION),
        n_features=np.int64(featurize.N_FEATURES),
    )
    shutil.copyfile(HERE / "featurize.py", out_dir / "featurize.py")


def check_labels_file() -> None:
    labels = (MODEL_DIR / "labels.txt").read_text(encoding="utf-8").split()
    if tuple(labels) != CATEGORIES:
        raise RuntimeError(f"labels.txt {labels} is not the category order {CATEGORIES}")


def train(out_dir: Path, n: int = N_TICKETS, seed: int = SEED) -> dict:
    check_labels_file()
    t0 = time.perf_counter()
    rows = corpus.generate(n, seed)
    strata = [f"{r['category']}/{r['language']}" for r in rows]
    train_rows, test_rows = train_test_split(
        rows, test_size=0.2, random_state=seed, stratify=strata
    )
    labels = [CATEGORIES.index(r["category"]) for r in train_rows]
    coef, intercept = fit([r["text"] for r in train_rows], labels)
    metrics = evaluate(coef, intercept, test_rows)
    export(coef, intercept, out_dir, [r["text"] for r in test_rows[:256]])
    metrics.update(
        n_train=len(train_rows),
        n_test=len(test_rows),
        seed=seed,
        C=C,
        n_features=featurize.N_FEATURES,
        featurizer_version=featurize.VERSION,
        labels=list(CATEGORIES),
        train_seconds=round(time.perf_counter() - t0, 2),
    )
    report = metrics.pop("report")
    (out_dir / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n", encoding="utf-8")
    print(report)
    return metrics


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out-dir", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--n", type=int, default=N_TICKETS)
    ap.add_argument("--seed", type=int, default=SEED)
    ap.add_argument("--force", action="store_true", help="retrain even when weights are fresh")
    args = ap.parse_args(argv)
    if not args.force and is_fresh(args.out_dir):
        print(f"{args.out_dir / 'weights.npz'} is up to date; --force to retrain")
        return 0
    m = train(args.out_dir, args.n, args.seed)
    langs = ", ".join(f"{k} {v:.3f}" for k, v in m["accuracy_by_language"].items())
    print(f"held-out accuracy {m['accuracy']:.4f} (macro F1 {m['macro_f1']:.4f}; {langs})")
    print(f"n_train={m['n_train']} n_test={m['n_test']} in {m['train_seconds']}s -> {args.out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
