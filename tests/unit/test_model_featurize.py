"""The featurizer shared by training and the Triton model."""

from __future__ import annotations

import zlib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inference_gateway.model import featurize

REPO_VERSION_DIR = (
    Path(featurize.__file__).resolve().parents[1] / "model_repository" / "ticket_classifier" / "1"
)


def _dense(text: str) -> np.ndarray:
    indices, values = featurize.featurize(text)
    out = np.zeros(featurize.N_FEATURES, np.float32)
    out[indices] = values
    return out


def test_deterministic_and_stable_hash() -> None:
    a = featurize.featurize("My refund never arrived")
    b = featurize.featurize("My refund never arrived")
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
    # crc32, not hash(): the same index in every process, whatever PYTHONHASHSEED is.
    assert zlib.crc32(b"w:refund") % featurize.N_FEATURES in set(a[0].tolist())


@pytest.mark.parametrize("text", ["refund please", "我要退款", "我要 refund 谢谢", "x"])
def test_sparse_sorted_unique_normalised(text: str) -> None:
    indices, values = featurize.featurize(text)
    assert indices.dtype == np.int32 and values.dtype == np.float32
    assert np.all(np.diff(indices) > 0)
    assert np.all((indices >= 0) & (indices < featurize.N_FEATURES))
    assert np.all(values > 0)
    assert np.linalg.norm(values) == pytest.approx(1.0, abs=1e-6)


def test_cjk_char_ngrams_and_latin_words() -> None:
    feats = featurize.features("申请退款 refund now")
    assert {"h:申", "h:申请", "h:申请退", "h:退款"} <= set(feats)
    assert "h:申请退款" not in feats  # CJK n-grams stop at 3
    assert {"w:refund", "w:now", "b:refund now", "b:申请退款 refund"} <= set(feats)
    assert "c:<re" in feats and "c:nd>" in feats  # char 3-grams of longer words


def test_normalisation_nfkc_lowercase_digits() -> None:
    assert featurize.tokens("ＲＥＦＵＮＤ  Order #12345") == ["refund", "order", "0"]
    assert np.array_equal(_dense("order 12345"), _dense("ORDER 99"))
    assert featurize.tokens("don’t") == ["don't"]


def test_typos_keep_similarity() -> None:
    # Char 3-grams make a misspelt word still look like the word.
    assert float(_dense("refund") @ _dense("refnud")) > 0.2
    assert float(_dense("refund") @ _dense("shipping")) == 0.0


def test_empty_text() -> None:
    indices, values = featurize.featurize("  !!! ")
    assert indices.size == 0 and values.size == 0


def test_batch_is_csr_of_rows() -> None:
    texts = ["hello there", "", "退货"]
    indptr, indices, values = featurize.featurize_batch(texts)
    assert indptr.tolist()[0] == 0 and indptr[-1] == len(indices) == len(values)
    for i, text in enumerate(texts):
        idx, val = featurize.featurize(text)
        assert np.array_equal(indices[indptr[i] : indptr[i + 1]], idx)
        assert np.array_equal(values[indptr[i] : indptr[i + 1]], val)


def test_predict_proba_matches_dense_math() -> None:
    rng = np.random.default_rng(0)
    coef = rng.normal(size=(featurize.N_FEATURES, 6)).astype(np.float32)
    intercept = rng.normal(size=6).astype(np.float32)
    texts = ["I was charged twice", "包裹没收到", ""]
    probs = featurize.predict_proba(texts, coef, intercept)
    dense = np.stack([_dense(t) for t in texts]) @ coef + intercept
    assert probs.shape == (3, 6) and probs.dtype == np.float32
    np.testing.assert_allclose(probs, featurize.softmax(dense), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=1e-5)


def test_served_copy_is_not_stale() -> None:
    copy = REPO_VERSION_DIR / "featurize.py"
    if not copy.exists():
        pytest.skip("model not trained yet")
    source = Path(featurize.__file__).read_text(encoding="utf-8")
    assert copy.read_text(encoding="utf-8") == source, "retrain: train.py copies featurize.py"


def _reference(text: str, n_features: int) -> dict[int, int]:
    """The buckets as defined: every feature string of `features()`, hashed, counts summed."""
    out: dict[int, int] = {}
    for feat, count in featurize.features(text).items():
        idx = zlib.crc32(feat.encode("utf-8")) % n_features
        out[idx] = out.get(idx, 0) + count
    return out


@given(st.text(alphabet=st.sampled_from("ab c'退款退货 x1,.Z\u4e00"), max_size=40))
@settings(max_examples=300, deadline=None)
def test_cached_buckets_equal_the_features_hashed(text: str) -> None:
    # the per-token cache must not change a single feature: the served weights depend on them
    for n in (featurize.N_FEATURES, 97):
        assert featurize._buckets(text, n) == _reference(text, n)


def test_cached_buckets_stay_right_for_a_token_seen_in_other_texts() -> None:
    first = featurize._buckets("refund refund please", featurize.N_FEATURES)
    assert featurize._buckets("please refund", featurize.N_FEATURES) == _reference(
        "please refund", featurize.N_FEATURES
    )
    assert first == _reference("refund refund please", featurize.N_FEATURES)
    assert featurize._token_buckets.cache_info().maxsize == featurize._CACHED
