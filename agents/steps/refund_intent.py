"""The refund-intent head, served in process: P(the ticket asks for a refund, return,
exchange or other remedy), calibrated, with the version and digest of its weights.

Trained by `python -m training.intent` (`make model`) into
inference_gateway/intent_model/refund_intent/1/intent.npz: a logistic regression on the
hashed n-grams of v1's featurizer (negated words marked, `negation.py`), stacked with the
serving model's own after_sales probability (per model version, fitted on the validation
split), so the score reads both the words and the model. Numpy only, ~0.2 ms a ticket; no
Triton call of its own.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from schemas.tickets import Category, Prediction

from . import negation

WEIGHTS = (
    Path(__file__).resolve().parents[2]
    / "inference_gateway"
    / "intent_model"
    / "refund_intent"
    / "1"
    / "intent.npz"
)
_EPS = 1e-4


@dataclass(frozen=True)
class IntentScore:
    score: float  # calibrated P(refund intent)
    model: str  # "refund_intent/1@<sha256[:12]>": what the audit records


@dataclass(frozen=True)
class IntentHead:
    coef: np.ndarray  # [n_features]
    intercept: float
    # per serving model version: [w_ngram, w_model_logit, w_model_first, bias]; "*" otherwise
    stack: dict[str, list[float]]
    version: str
    digest: str
    # the negation-scope marking it was trained with (agents/steps/negation.py); 0: none
    negation: int = 0

    @property
    def name(self) -> str:
        return f"{self.version}@{self.digest[:12]}"

    def words(self, text: str) -> str:
        """The text as the head's n-grams read it."""
        return negation.mark(text) if self.negation else text

    def ngram_logit(self, text: str) -> float:
        from inference_gateway.model import featurize

        indices, values = featurize.featurize(self.words(text), self.coef.shape[0])
        return self.intercept + float(np.dot(self.coef[indices], values))

    def score(self, text: str, pred: Prediction | None) -> IntentScore:
        z = self.ngram_logit(text)
        version = pred.model_version if pred else None
        w = self.stack.get(version or "", self.stack["*"])
        p = pred.scores.get(Category.after_sales.value, 0.0) if pred else 0.0
        first = float(pred is not None and pred.category == Category.after_sales)
        p = min(max(p, _EPS), 1 - _EPS)
        logit = w[0] * z + w[1] * math.log(p / (1 - p)) + w[2] * first + w[3]
        return IntentScore(1.0 / (1.0 + math.exp(-max(min(logit, 30.0), -30.0))), self.name)


def read_head(path: Path) -> IntentHead:
    raw = path.read_bytes()
    with np.load(path, allow_pickle=False) as w:
        return IntentHead(
            coef=np.ascontiguousarray(w["coef"], dtype=np.float32),
            intercept=float(w["intercept"]),
            stack=json.loads(str(w["stack"])),
            version=str(w["version"]),
            digest=hashlib.sha256(raw).hexdigest(),
            negation=int(w["negation_version"]) if "negation_version" in w else 0,
        )


@lru_cache(maxsize=4)
def load_head(path: Path = WEIGHTS) -> IntentHead | None:
    """The head, once per process; None where it was never built (the rules then fall back
    to the model's after_sales probability)."""
    return read_head(path) if path.exists() else None
