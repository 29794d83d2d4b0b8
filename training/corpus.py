"""Deterministic synthetic corpus of labelled customer-support tickets (English, Chinese, mixed).

A ticket is composed from fragments: [opener] problem [details] [ask] [closing], slots filled
with fresh values, then noised (typos, casing, punctuation). Mixed tickets take fragments from
both languages and swap terms ("我要 refund"). Hard cases keep the task from being trivially
separable: about one ticket in ten carries a detail of another category, some problems are
short or borrow other classes' words, and ~8% draw their problem from pools shared by two
classes (`AMBIGUOUS`), labelled with either.

    python -m training.corpus --n 6000 --out tickets.jsonl
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
from pathlib import Path

from schemas.tickets import CATEGORIES

from . import hard_negatives, phrases_en, phrases_zh, slots

LANGUAGES = ("en", "zh", "mixed")
_LANG_WEIGHTS = (0.42, 0.40, 0.18)
_BANKS = {"en": phrases_en, "zh": phrases_zh}
_P_AMBIGUOUS = 0.08
_LATIN_WORD = re.compile(r"[A-Za-z]{4,}")
_CJK_CHAR = re.compile(r"[\u4e00-\u9fff]")
_SHORTHAND = [("please", "pls"), ("you", "u"), ("thanks", "thx"), ("because", "bc"), ("are", "r")]


def _typo(word: str, rng: random.Random) -> str:
    i = rng.randrange(1, len(word) - 1)
    op = rng.randrange(3)
    if op == 0:  # swap neighbours
        return word[:i] + word[i + 1] + word[i] + word[i + 2 :]
    if op == 1:  # drop
        return word[:i] + word[i + 1 :]
    return word[:i] + word[i] + word[i:]  # double


def _add_typos(text: str, rng: random.Random, rate: float) -> str:
    return _LATIN_WORD.sub(lambda m: _typo(m[0], rng) if rng.random() < rate else m[0], text)


def _noise_latin(text: str, rng: random.Random) -> str:
    if rng.random() < 0.3:
        text = _add_typos(text, rng, rate=rng.uniform(0.05, 0.2))
    if rng.random() < 0.15:
        for long, short in _SHORTHAND:
            text = re.sub(rf"\b{long}\b", short, text, flags=re.IGNORECASE)
    if rng.random() < 0.25:
        text = text.lower()
    elif rng.random() < 0.03:
        text = text.upper()
    if rng.random() < 0.1:
        text = re.sub(r"[.,!?](?=\s|$)", "", text)
    return text


def _noise_cjk(text: str, rng: random.Random) -> str:
    if rng.random() < 0.15:
        text = re.sub(r"[，。！？、]", rng.choice(["", " ", ","]), text)
    if rng.random() < 0.1:
        text = text.rstrip("。！？") + rng.choice(["！！", "？？", "。。。", "!!!"])
    return text


def _code_switch(text: str, base: str, rng: random.Random) -> str:
    """Swap some terms into the other language, the way bilingual customers write."""
    for en, zh in slots.TERMS:
        if rng.random() < 0.6:
            if base == "zh" and zh in text:
                text = text.replace(zh, f" {en} ", 1)
            elif base == "en":
                text = re.sub(rf"\b{re.escape(en)}\b", zh, text, count=1, flags=re.IGNORECASE)
    return " ".join(text.split())


def _ensure_mixed(text: str, base: str, rng: random.Random) -> str:
    """A mixed ticket must show both scripts; prefix an opener of the other language if not."""
    other = "zh" if base == "en" else "en"
    has_other = _CJK_CHAR.search(text) if other == "zh" else _LATIN_WORD.search(text)
    if has_other:
        return text
    return f"{rng.choice(_BANKS[other].OPENERS)} {text}"


def _problem(category: str, base: str, rng: random.Random) -> tuple[str, str]:
    """The main issue, and the class whose details and asks should follow it."""
    hard = hard_negatives.BANKS[base].get(category)
    if hard and rng.random() < hard_negatives.P_HARD:
        return rng.choice(hard), category
    pools = [(pair, p) for pair, p in _BANKS[base].AMBIGUOUS.items() if category in pair]
    if pools and rng.random() < _P_AMBIGUOUS:
        pair, pool = rng.choice(pools)
        # Context from either class of the pair, so it does not give the label away.
        return rng.choice(pool), rng.choice(pair)
    return rng.choice(_BANKS[base].PHRASES[category]["problem"]), category


def _sentences(category: str, base: str, lang: str, rng: random.Random) -> list[str]:
    bank = _BANKS[base].PHRASES
    other = _BANKS["zh" if base == "en" else "en"].PHRASES
    problem, context = _problem(category, base, rng)
    parts = [problem]
    n_details = rng.choice((0, 0, 1, 1, 1, 2))
    parts += rng.sample(bank[context]["detail"], n_details)
    if rng.random() < 0.1:  # a hard case: context that belongs to another class
        distractor = rng.choice([c for c in CATEGORIES if c != category])
        parts.insert(rng.randint(1, len(parts)), rng.choice(bank[distractor]["detail"]))
    if rng.random() < 0.5:
        source = other if lang == "mixed" and rng.random() < 0.5 else bank
        parts.append(rng.choice(source[context]["ask"]))
    return parts


def _frame(parts: list[str], base: str, lang: str, rng: random.Random) -> list[str]:
    def bank() -> object:
        if lang == "mixed" and rng.random() < 0.5:
            return _BANKS["zh" if base == "en" else "en"]
        return _BANKS[base]

    if rng.random() < 0.55:
        parts = [rng.choice(bank().OPENERS), *parts]
    if rng.random() < 0.45:
        parts = [*parts, rng.choice(bank().CLOSINGS)]
    return parts


def ticket(category: str, lang: str, rng: random.Random) -> str:
    base = rng.choice(("en", "zh")) if lang == "mixed" else lang
    parts = _frame(_sentences(category, base, lang, rng), base, lang, rng)
    sep = " " if base == "en" else rng.choice(("", "", " "))
    text = sep.join(slots.fill(p, rng, lang) for p in parts)
    if lang == "mixed":
        text = _ensure_mixed(_code_switch(text, base, rng), base, rng)
    if base == "en" or lang == "mixed":
        text = _noise_latin(text, rng)
    if base == "zh":
        text = _noise_cjk(text, rng)
    return text.strip()


def generate(n: int, seed: int) -> list[dict]:
    """`n` distinct tickets, classes balanced, as dicts with text, category, language."""
    rng = random.Random(seed)
    categories = [CATEGORIES[i % len(CATEGORIES)] for i in range(n)]
    rng.shuffle(categories)
    seen: set[str] = set()
    out = []
    for category in categories:
        lang = rng.choices(LANGUAGES, _LANG_WEIGHTS)[0]
        for _ in range(10):  # short fragments repeat; retry for a distinct text
            text = ticket(category, lang, rng)
            if text not in seen:
                break
        seen.add(text)
        out.append({"text": text, "category": category, "language": lang})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=6000)
    ap.add_argument("--seed", type=int, default=13)
    ap.add_argument("--out", type=Path, help="JSONL file; stdout when omitted")
    args = ap.parse_args(argv)
    lines = (json.dumps(t, ensure_ascii=False) + "\n" for t in generate(args.n, args.seed))
    if args.out is None:
        sys.stdout.writelines(lines)
    else:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        with args.out.open("w", encoding="utf-8") as f:
            f.writelines(lines)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
