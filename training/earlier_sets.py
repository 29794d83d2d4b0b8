"""Hand-written tickets of earlier rounds, learned from as reviewers' decisions are.

The frozen blind sets `blind5` to `blind14` were each measured once (docs/blind5.md to
docs/blind14.md) and are spent as test sets. Their ~2,540 labelled tickets are the only
wording in the training data that a person wrote freely, so both category models and the
refund-intent head (training/intent.py) learn from them, each repeated `WEIGHT` times
beside the ~6,400 template tickets, as `ticketflow model build` weighs a reviewer's decision
(training/builds.py).

Cross-fitted, each set measured with models trained on the others (docs/models.md, "The
third round" to "The sixth round"): every set added raised the cascade's accuracy on the
one left out (blind6: 0.894 with none, 0.903 with blind5, 0.911 with the other four), and
the head learning from them raised after_sales precision on all five. Weights of 15 and 40
measured no better than 5.

The intent head's validation fixtures (`intent.VALIDATION_FIXTURES`) are not read here: the
head's calibration and the band are chosen on them, so the models must not have seen them.
The newest frozen set (blind15) is never read here.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from . import dataset

HERE = Path(__file__).resolve().parent
FIXTURES = HERE.parent / "tests" / "fixtures"
SETS = tuple(f"blind{n}_frozen" for n in range(5, 15))
WEIGHT = 5


def paths() -> list[Path]:
    return [FIXTURES / f"{name}.jsonl" for name in SETS]


def rows() -> list[dict]:
    """Each ticket once, as corpus rows: text, category, language."""
    keep = ("text", "category", "language")
    return [{k: case[k] for k in keep} for p in paths() for case in dataset.fixture_cases(p)]


def weighted(rows_: list[dict]) -> list[dict]:
    """`rows_` followed by the earlier sets' tickets, each `WEIGHT` times."""
    return [*rows_, *(rows() * WEIGHT)]


@contextlib.contextmanager
def leaving_out(name: str) -> Iterator[None]:
    """Within the block, the earlier sets without `name` (evaluation/crossfit.py's folds)."""
    global SETS
    kept = SETS
    SETS = tuple(s for s in kept if s != name)
    try:
        yield
    finally:
        SETS = kept
