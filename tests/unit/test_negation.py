"""The refund-intent head's negation scopes (agents/steps/negation.py)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from agents.steps import negation
from agents.steps.refund_intent import IntentHead, read_head
from inference_gateway.model import featurize


@pytest.mark.parametrize(
    ("text", "marked"),
    [
        ("I'm not after a refund, I just need a receipt.",
         "I'm not nonafter nona nonrefund, I just need a receipt."),
        ("Don't want my money back — the invoice is wrong.",
         "Don't nonwant nonmy nonmoney nonback — the invoice is wrong."),
        ("不要 refund，just want my parcel", "不要 nonrefund，just want my parcel"),
        ("No refund needed but where is it", "No nonrefund nonneeded but where is it"),
        ("it doesn\u2019t work, refund please", "it doesn\u2019t nonwork, refund please"),
    ],
)  # fmt: skip
def test_a_scope_runs_from_the_cue_to_the_end_of_its_clause(text: str, marked: str) -> None:
    assert negation.mark(text) == marked


@pytest.mark.parametrize(
    "text",
    ["I want my money back for order 123.", "不用退款，开张发票就行", "退款", "", "refund!!!"],
)
def test_text_without_a_latin_scope_is_unchanged(text: str) -> None:
    assert negation.mark(text) == text


def test_a_scope_is_at_most_max_scope_words_long() -> None:
    marked = negation.mark("not a b c d e f g").split()
    assert sum(w.startswith(negation.PREFIX) for w in marked) == negation.MAX_SCOPE


@given(st.text(max_size=200))
def test_marking_only_prefixes_words(text: str) -> None:
    # whatever the input, the marked text is the original with PREFIX inserted before words
    marked = negation.mark(text)
    assert marked.replace(negation.PREFIX, "") == text.replace(negation.PREFIX, "")


def _head(negation_version: int) -> IntentHead:
    coef = np.zeros(featurize.N_FEATURES, np.float32)
    # the negated word's own feature only (its char 3-grams overlap the plain word's)
    coef[featurize._hash("w:" + negation.PREFIX + "refund", featurize.N_FEATURES)] = -5.0
    return IntentHead(coef, 0.0, {"*": [1.0, 0.0, 0.0, 0.0]}, "refund_intent/1", "0" * 64,
                      negation=negation_version)  # fmt: skip


def test_the_head_reads_marked_words_only_when_trained_with_them() -> None:
    text = "not refund"
    assert _head(1).ngram_logit(text) < -1.0
    assert _head(0).ngram_logit(text) == pytest.approx(0.0, abs=1e-6)


def test_a_saved_head_says_which_marking_it_was_trained_with(tmp_path) -> None:
    path = tmp_path / "intent.npz"
    common = {
        "coef": np.zeros(4, np.float32),
        "intercept": np.float64(0.0),
        "stack": np.array('{"*": [1, 0, 0, 0]}'),
        "version": np.array("refund_intent/1"),
    }
    np.savez(path, **common)
    assert read_head(path).negation == 0  # a head built before the marking
    np.savez(path, **common, negation_version=np.int64(negation.VERSION))
    assert read_head(path).negation == negation.VERSION
