"""The data both versions and the intent head learn from: the corpus, its one split and
the hashed n-gram features of `featurize.py` as a sparse matrix."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from scipy import sparse
from sklearn.model_selection import train_test_split

from inference_gateway.model import featurize

from . import corpus

N_TICKETS = 8000
SEED = 13


def to_csr(texts: list[str]) -> sparse.csr_matrix:
    indptr, indices, values = featurize.featurize_batch(texts)
    shape = (len(texts), featurize.N_FEATURES)
    return sparse.csr_matrix((values, indices, indptr), shape=shape, dtype=np.float64)


def split(n: int = N_TICKETS, seed: int = SEED) -> tuple[list[dict], list[dict]]:
    """The corpus and its stratified 80/20 split: the same for every version."""
    rows = corpus.generate(n, seed)
    strata = [f"{r['category']}/{r['language']}" for r in rows]
    train_rows, test_rows = train_test_split(
        rows, test_size=0.2, random_state=seed, stratify=strata
    )
    return train_rows, test_rows


def fixture_cases(path: Path) -> list[dict]:
    """The labelled tickets of a hand-written JSONL fixture (tests/fixtures), one dict each."""
    lines = path.read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]
