"""Hand-written tickets of earlier rounds, learned from as reviewers' decisions are.

The frozen blind sets `blind5` to `blind8` were each measured once (docs/blind5.md to
docs/blind8.md) and are spent as test sets. Their ~980
labelled tickets are the only wording in the training data that a person wrote freely, so
both category models learn from them, each repeated `WEIGHT` times beside the ~6,400
template tickets, as `ticketflow model build` weighs a reviewer's decision
(training/builds.py).

Measured on the set left out (docs/models.md, "The third round" and "The fourth round"):
trained with blind5, the cascade's accuracy on blind6 went from 0.894 to 0.903, and with
blind5 and blind7 to 0.911; trained with blind6, on blind5 from 0.928 to 0.946, and with
blind6 and blind7 to 0.969. Weights of 15 and 40 measured no better than 5.

The intent head's validation fixtures (`intent.VALIDATION_FIXTURES`) are not read here: the
head's calibration and the band are chosen on them, so the models must not have seen them.
The newest frozen set (blind9) is never read here.
"""

from __future__ import annotations

from pathlib import Path

from . import dataset

HERE = Path(__file__).resolve().parent
FIXTURES = HERE.parent / "tests" / "fixtures"
SETS = ("blind5_frozen", "blind6_frozen", "blind7_frozen", "blind8_frozen")
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
