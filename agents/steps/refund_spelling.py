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
# real words (and other forms of the request words) one edit from a request word
_NOT_TYPOS = frozenset(
    {
        "rerun", "reruns", "retune", "retuned", "retunes", "retuning", "returns", "returner",
        "refunds", "refind", "refinds", "exchanges", "exchanger", "replaces", "replacer",
        "replayed", "replacements", "reimburses",
    }
)  # fmt: skip
_LATIN = re.compile(r"[A-Za-z]{5,13}")


def _one_edit_variants(word: str) -> set[str]:
    """Every string one letter dropped, added, changed, or two neighbours swapped from `word`."""
    letters = "abcdefghijklmnopqrstuvwxyz"
    splits = [(word[:i], word[i:]) for i in range(len(word) + 1)]
    dropped = {a + b[1:] for a, b in splits if b}
    swapped = {a + b[1] + b[0] + b[2:] for a, b in splits if len(b) > 1}
    changed = {a + c + b[1:] for a, b in splits if b for c in letters}
    added = {a + c + b for a, b in splits for c in letters}
    return (dropped | swapped | changed | added) - {word}


# typo -> request word, built once: a dictionary lookup per word instead of edit distances
_TYPOS = {v: k for k in reversed(_KEYWORDS) for v in _one_edit_variants(k)}
for _word in (*_KEYWORDS, *_NOT_TYPOS):
    _TYPOS.pop(_word, None)


def normalise(text: str) -> str:
    """Slang spelled out and typos of the request words corrected (the words are read on this)."""
    text = _SLANG_RE.sub(lambda m: _SLANG[m[0].lower()], text)
    return _LATIN.sub(lambda m: _TYPOS.get(m[0].lower(), m[0]), text)
