"""How customers spell the request words: slang spelled out and typos of refund, return,
exchange, replace and reimburse corrected, so that refund_words' patterns see the words they
know ("gimme my money back", "i wnat to retrun this", "swap em?")."""

from __future__ import annotations

import re

# Slang spelled out, so that the patterns above see the words they know
_SLANG = {
    "gimme": "give me",
    "wanna": "want to",
    "lemme": "let me",
    "em": "them",
    "'em": "them",
    "pls": "please",
    "plz": "please",
    "dont": "don't",
    "wont": "won't",
}
_SLANG_RE = re.compile(r"(?<![\w'])(?:" + "|".join(map(re.escape, _SLANG)) + r")\b", re.I)
# Typos of the request words (one letter dropped, doubled, swapped or wrong) are read as the
# word; real words one edit away from one are not ("rerun" is no "return")
_KEYWORDS = (
    "refund",
    "refunded",
    "return",
    "returned",
    "returning",
    "exchange",
    "exchanged",
    "replace",
    "replaced",
    "replacement",
    "reimburse",
    "reimbursed",
)
_NOT_TYPOS = frozenset({"rerun", "reruns", "retune", "returns", "refunds", "exchanges"})
_LATIN = re.compile(r"[A-Za-z]{5,13}")


def _one_edit(a: str, b: str) -> bool:
    """Whether `a` is `b` with one letter dropped, added, changed, or two neighbours swapped."""
    if abs(len(a) - len(b)) > 1 or a == b:
        return False
    if len(a) == len(b):
        diff = [i for i in range(len(a)) if a[i] != b[i]]
        swapped = len(diff) == 2 and diff[1] == diff[0] + 1 and a[diff[0]] == b[diff[1]]
        return len(diff) == 1 or (swapped and a[diff[1]] == b[diff[0]])
    short, long = (a, b) if len(a) < len(b) else (b, a)
    return any(long[:i] + long[i + 1 :] == short for i in range(len(long)))


def _spell(word: str) -> str:
    low = word.lower()
    if low in _NOT_TYPOS or low in _KEYWORDS:
        return word
    return next((k for k in _KEYWORDS if _one_edit(low, k)), word)


def normalise(text: str) -> str:
    """Slang spelled out and typos of the request words corrected (the words are read on this)."""
    text = _SLANG_RE.sub(lambda m: _SLANG[m[0].lower()], text)
    return _LATIN.sub(lambda m: _spell(m[0]), text)
