"""`ticketflow model build`: a new version of `ticket_classifier`, built into a staging folder.

A build learns from the corpus's training split (train.py's, so held-out accuracy compares with
versions 1 and 2) and the hand-written sets of earlier rounds (`earlier_sets.py`), as versions
1 and 2 do, plus reviewers' decisions (`feedback.Example`), each repeated `feedback_weight`
times: a decision is a ticket the deployed model got wrong or was unsure of, worth more than
one more template ticket. Three types:

- `v1`: hashed n-gram logistic regression (train.fit / export), seconds;
- `v2`: the e5 encoder of version 2 (copied from 2/ when built, else exported) + a new head;
- `v2-int8`: the INT8 encoder of quantize.py + a head trained on its own embeddings.

The staging folder is a complete version directory (model.py last, as train.py does) plus
`build.json` (read back by inference_gateway/model/repository.py); `rollout.deploy` copies it
into the repository under the next version number.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from inference_gateway.model.repository import BUILD_FILE, MODEL_DIR
from schemas.tickets import CATEGORIES

from . import earlier_sets
from .feedback import Example

if TYPE_CHECKING:
    from types import ModuleType

TYPES = ("v1", "v2", "v2-int8")
DEFAULT_FEEDBACK_WEIGHT = 3
V1_MODEL = MODEL_DIR / "1" / "model.py"  # version 1's serving code, tracked in git
INT8_MODEL = "triton_v2_int8.py"  # the serving package's, beside the v2 template


def _train() -> ModuleType:
    # scikit-learn and scipy load in ~1 s: only for a build, not for every `ticketflow` command
    from . import train

    return train


def _with_feedback(
    rows: list[dict], feedback: Sequence[Example], weight: int
) -> tuple[list[str], np.ndarray]:
    rows = earlier_sets.weighted(rows)
    texts = [r["text"] for r in rows] + [e.text for e in feedback] * weight
    cats = [r["category"] for r in rows] + [e.category for e in feedback] * weight
    return texts, np.array([CATEGORIES.index(c) for c in cats])


def build_v1(out: Path, feedback: Sequence[Example], weight: int) -> dict:
    from . import handwritten

    train = _train()
    train_rows, test_rows = train.split()
    texts, labels = _with_feedback(train_rows, feedback, weight)
    coef, intercept = train.fit(texts, list(labels))
    metrics = train.evaluate(coef, intercept, test_rows)
    metrics.pop("report")
    train.export(coef, intercept, out, [r["text"] for r in test_rows[:256]])
    hand = train.scipy_proba([t for t, _ in handwritten.TICKETS], coef, intercept)
    metrics["handwritten_accuracy"] = train.handwritten_accuracy(hand.argmax(axis=1))
    metrics.update(n_train=len(texts), n_test=len(test_rows), C=train.C)
    shutil.copyfile(V1_MODEL, out / "model.py")
    return metrics


def _encoder(out: Path, int8: bool) -> dict:
    """encoder.onnx and tokenizer.json into `out`: INT8 from quantize.py, else v2's."""
    train = _train()
    if int8:
        from . import quantize

        return quantize.export_int8(out)
    if all((train.V2_OUT / f).exists() for f in train.V2_ENCODER_FILES):
        for name in train.V2_ENCODER_FILES:
            shutil.copyfile(train.V2_OUT / name, out / name)
        return {"encoder": f"copied from {train.V2_OUT}"}
    from . import e5_export

    return e5_export.export(out)


def build_e5(out: Path, feedback: Sequence[Example], weight: int, *, int8: bool) -> dict:
    from inference_gateway.model import e5_runtime

    from . import handwritten

    train = _train()
    info = _encoder(out, int8)
    for name in train.V2_COPIED:
        shutil.copyfile(train.SERVING / name, out / name)
    encoder = e5_runtime.Encoder(out)
    if int8:
        from . import quantize

        encoder.max_chunk_rows = quantize.INT8_ROWS_PER_CALL  # as served: see triton_v2_int8
    train_rows, test_rows = train.split()
    texts, y = _with_feedback(train_rows[: train.V2_N_TRAIN], feedback, weight)
    coef, intercept, c = train.fit_head(train.embed_once(encoder, texts), y)
    y_test = np.array([CATEGORIES.index(r["category"]) for r in test_rows])
    y_pred = (encoder.embed([r["text"] for r in test_rows]) @ coef + intercept).argmax(axis=1)
    hand = encoder.embed([t for t, _ in handwritten.TICKETS]) @ coef + intercept
    train.save_head(out, coef, intercept)
    template = train.SERVING / train.V2_MODEL
    if int8:
        shutil.copyfile(template, out / "triton_v2.py")
    shutil.copyfile(train.SERVING / INT8_MODEL if int8 else template, out / "model.py")
    return {
        "accuracy": round(float((y_pred == y_test).mean()), 4),
        "handwritten_accuracy": train.handwritten_accuracy(hand.argmax(axis=1)),
        "n_train": len(texts),
        "n_test": len(test_rows),
        "C": c,
        "encoder": info,
    }


def build(
    kind: str,
    out: Path,
    feedback: Sequence[Example] = (),
    feedback_weight: int = DEFAULT_FEEDBACK_WEIGHT,
) -> dict:
    """Build a version of type `kind` into the empty folder `out`; returns its build.json."""
    if kind not in TYPES:
        raise ValueError(f"type must be one of {', '.join(TYPES)}")
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out} is not empty")
    train = _train()
    train.check_labels_file()
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    if kind == "v1":
        metrics = build_v1(out, feedback, feedback_weight)
    else:
        metrics = build_e5(out, feedback, feedback_weight, int8=kind == "v2-int8")
    record = {
        "type": kind,
        "feedback_examples": len(feedback),
        "feedback_weight": feedback_weight,
        "seed": train.SEED,
        "labels": list(CATEGORIES),
        **metrics,
        "build_seconds": round(time.perf_counter() - t0, 1),
    }
    (out / "metrics.json").write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    (out / BUILD_FILE).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return record
