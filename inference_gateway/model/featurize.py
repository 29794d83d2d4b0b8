"""The one featurizer of the ticket classifier, shared by training and the Triton model.

Stdlib + numpy only: training/train.py copies this file next to the served `model.py`, so the
model repository stays self-contained (it runs as-is in the NGC Triton image, without this
package).

A text becomes hashed, log-scaled, L2-normalised counts of:
- Latin words (unigrams + bigrams) and their char 3-grams, which survive typos;
- CJK char 1-3-grams, since Chinese has no spaces to split words on.
Digit runs collapse to one token: order numbers and amounts carry no class signal.
"""

from __future__ import annotations

import functools
import itertools
import math
import re
import unicodedata
import zlib
from collections import Counter
from collections.abc import Iterable, Sequence

import numpy as np

VERSION = 1
N_FEATURES = 2**18

# CJK ideographs (basic + ext A + compatibility); kana/hangul are rare in our traffic.
_CJK = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
_LETTER = rf"[^\W\d_{_CJK}]"
_TOKEN = re.compile(rf"[{_CJK}]+|{_LETTER}+(?:'{_LETTER}+)?|\d+")
_CJK_RUN = re.compile(rf"[{_CJK}]+")


def params() -> dict[str, int]:
    """What a trained model must agree on with the featurizer that serves it."""
    return {"version": VERSION, "n_features": N_FEATURES}


def normalize(text: str) -> str:
    # NFKC folds full-width Latin/digits (common in Chinese input methods) to ASCII.
    text = unicodedata.normalize("NFKC", text).lower().replace("\u2019", "'")
    return " ".join(text.split())


def _cjk_grams(run: str) -> Iterable[str]:
    for n in (1, 2, 3):
        for i in range(len(run) - n + 1):
            yield "h:" + run[i : i + n]


def _latin_grams(word: str) -> Iterable[str]:
    yield "w:" + word
    if len(word) > 3:
        padded = f"<{word}>"
        for i in range(len(padded) - 2):
            yield "c:" + padded[i : i + 3]


def _bigram(a: str, b: str) -> str:
    return "b:" + a + " " + b


def tokens(text: str) -> list[str]:
    """Normalised word tokens; a CJK run stays one token, digit runs become `0`."""
    out = []
    for tok in _TOKEN.findall(normalize(text)):
        out.append("0" if tok.isdigit() else tok)
    return out


def features(text: str) -> Counter[str]:
    """Raw feature strings with counts (before hashing); useful for debugging."""
    counts: Counter[str] = Counter()
    toks = tokens(text)
    for tok in toks:
        counts.update(_cjk_grams(tok) if _CJK_RUN.fullmatch(tok) else _latin_grams(tok))
    # Bigrams across the whole token sequence: a CJK run next to a Latin word is a signal too
    # in mixed-language tickets ("申请 refund").
    for a, b in itertools.pairwise(toks):
        counts[_bigram(a, b)] += 1
    return counts


def _hash(feature: str, n_features: int) -> int:
    # crc32 is stable across processes and platforms, unlike hash() with PYTHONHASHSEED.
    return zlib.crc32(feature.encode("utf-8")) % n_features


# A token's features are the same in every text: its hashed buckets are kept, most recent
# first. Words repeat across tickets, so most of a text's tokens and bigrams are found here
# and not hashed again (features and values are identical either way).
_CACHED = 1 << 16


@functools.lru_cache(maxsize=_CACHED)
def _token_buckets(tok: str, n_features: int) -> tuple[int, ...]:
    grams = _cjk_grams(tok) if _CJK_RUN.fullmatch(tok) else _latin_grams(tok)
    return tuple(_hash(g, n_features) for g in grams)


@functools.lru_cache(maxsize=_CACHED)
def _bigram_bucket(a: str, b: str, n_features: int) -> int:
    return _hash(_bigram(a, b), n_features)


def _buckets(text: str, n_features: int) -> dict[int, int]:
    """Bucket -> count of `features(text)`, hashed."""
    buckets: dict[int, int] = {}
    toks = tokens(text)
    for tok in toks:
        for idx in _token_buckets(tok, n_features):
            buckets[idx] = buckets.get(idx, 0) + 1
    for a, b in itertools.pairwise(toks):
        idx = _bigram_bucket(a, b, n_features)
        buckets[idx] = buckets.get(idx, 0) + 1
    return buckets


def featurize(text: str, n_features: int = N_FEATURES) -> tuple[np.ndarray, np.ndarray]:
    """Sparse feature vector of one text: sorted unique int32 indices, float32 values, |v|=1."""
    buckets = _buckets(text, n_features)
    if not buckets:
        return np.zeros(0, np.int32), np.zeros(0, np.float32)
    keys = sorted(buckets)  # Python ints: a dict lookup by a numpy scalar costs ~10x
    indices = np.array(keys, np.int32)
    values = np.array([1.0 + math.log(buckets[i]) for i in keys], np.float64)
    values /= np.linalg.norm(values)
    return indices, values.astype(np.float32)


def featurize_batch(
    texts: Sequence[str], n_features: int = N_FEATURES
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """CSR parts (indptr, indices, values) of a batch, rows in the order of `texts`."""
    rows = [featurize(t, n_features) for t in texts]
    indptr = np.zeros(len(rows) + 1, np.int64)
    indptr[1:] = np.cumsum([len(idx) for idx, _ in rows])
    if not rows:
        return indptr, np.zeros(0, np.int32), np.zeros(0, np.float32)
    indices = np.concatenate([idx for idx, _ in rows])
    values = np.concatenate([val for _, val in rows])
    return indptr, indices, values


def softmax(logits: np.ndarray) -> np.ndarray:
    z = logits - logits.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


def predict_proba(texts: Sequence[str], coef: np.ndarray, intercept: np.ndarray) -> np.ndarray:
    """Class probabilities [len(texts), n_classes] of a linear model, coef [n_features, C]."""
    indptr, indices, values = featurize_batch(texts, coef.shape[0])
    rows = np.repeat(np.arange(len(texts)), np.diff(indptr))
    logits = np.tile(intercept.astype(np.float32), (len(texts), 1))
    # Sparse x dense without scipy: gather the touched rows of coef, scatter-add per text.
    np.add.at(logits, rows, coef[indices] * values[:, None])
    return softmax(logits).astype(np.float32)
