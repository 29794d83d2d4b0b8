"""The synthetic ticket corpus the default classifier is trained on."""

from __future__ import annotations

import json
import random
import re
from collections import Counter

import pytest

from schemas.tickets import CATEGORIES
from training import corpus, phrases_en, phrases_zh, slots

CJK = re.compile(r"[\u4e00-\u9fff]")
LATIN = re.compile(r"[A-Za-z]{2,}")


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    return corpus.generate(1200, seed=7)


def test_deterministic_per_seed(rows: list[dict]) -> None:
    assert corpus.generate(1200, seed=7) == rows
    assert corpus.generate(1200, seed=8) != rows


def test_shape_and_balance(rows: list[dict]) -> None:
    assert all(set(r) == {"text", "category", "language"} and r["text"] for r in rows)
    counts = Counter(r["category"] for r in rows)
    assert tuple(sorted(counts, key=CATEGORIES.index)) == CATEGORIES
    assert set(counts.values()) == {200}
    assert len({r["text"] for r in rows}) == len(rows)


def test_languages(rows: list[dict]) -> None:
    by_lang: dict[str, list[str]] = {}
    for r in rows:
        by_lang.setdefault(r["language"], []).append(r["text"])
    assert set(by_lang) == {"en", "zh", "mixed"}
    assert all(len(texts) > 100 for texts in by_lang.values())
    assert not any(CJK.search(t) for t in by_lang["en"])
    assert all(CJK.search(t) for t in by_lang["zh"])
    assert all(CJK.search(t) and LATIN.search(t) for t in by_lang["mixed"])


def test_every_category_in_every_language(rows: list[dict]) -> None:
    pairs = {(r["category"], r["language"]) for r in rows}
    assert pairs == {(c, lang) for c in CATEGORIES for lang in corpus.LANGUAGES}


def test_banks_cover_categories_and_are_rich() -> None:
    blocks = 0
    for bank in (phrases_en, phrases_zh):
        assert tuple(bank.PHRASES) == CATEGORIES
        assert all(c in CATEGORIES for pair in bank.AMBIGUOUS for c in pair)
        blocks += len(bank.OPENERS) + len(bank.CLOSINGS)
        blocks += sum(len(v) for parts in bank.PHRASES.values() for v in parts.values())
        blocks += sum(len(v) for v in bank.AMBIGUOUS.values())
    assert blocks > 500


def test_every_template_fills() -> None:
    rng = random.Random(0)
    for bank in (phrases_en, phrases_zh):
        fragments = bank.OPENERS + bank.CLOSINGS
        fragments += [f for parts in bank.PHRASES.values() for v in parts.values() for f in v]
        fragments += [f for v in bank.AMBIGUOUS.values() for f in v]
        for fragment in fragments:
            assert "{" not in slots.fill(fragment, rng, "mixed"), fragment


def test_typos_touch_only_latin_words() -> None:
    rng = random.Random(3)
    text = "Please refund my order 退款 now"
    noisy = corpus._add_typos(text, rng, rate=1.0)
    words, noisy_words = text.split(), noisy.split()
    assert len(words) == len(noisy_words)
    for before, after in zip(words, noisy_words, strict=True):
        if len(before) >= 4 and before.isascii():
            assert after != before and abs(len(after) - len(before)) <= 1
        else:
            assert after == before


def test_cli_writes_jsonl(tmp_path) -> None:
    out = tmp_path / "c.jsonl"
    assert corpus.main(["--n", "30", "--seed", "1", "--out", str(out)]) == 0
    lines = out.read_text(encoding="utf-8").splitlines()
    assert [json.loads(line) for line in lines] == corpus.generate(30, 1)
