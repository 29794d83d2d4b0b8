"""Negation scope for the refund-intent head: the Latin words after a negation cue, up to the
end of the clause, are rewritten as words of their own (`refund` -> `nonrefund`).

A linear model over n-grams weighs "refund" the same in "refund please" and in "I'm not after
a refund, I just need a receipt"; marking the scope (Das and Chen 2001, Pang et al. 2002) gives
the negated words weights of their own, while their char 3-grams still overlap the plain
word's. Chinese needs no marking: its negation sits next to the verb, inside the char 1-3-grams
(不用退, 不要退). A Chinese cue before Latin words ("不要 refund") opens a scope as an English
one does. Numpy-free and stdlib-only; the head's training and serving both call `mark`.
"""

from __future__ import annotations

import re

VERSION = 1
PREFIX = "non"
MAX_SCOPE = 5  # words; a scope also ends at punctuation or at a word of CLAUSE
# with the words that end in n't
_CUES = frozenset(
    ["not", "no", "never", "nothing", "without", "nor", "neither", "dont", "doesnt", "didnt",
     "isnt", "wasnt", "wont", "cant", "arent"]
)  # fmt: skip
_ZH_CUES = ("不要", "不用", "不是", "不需要", "不想", "没有", "无需", "别", "不")
_CLAUSE = frozenset(
    ["but", "just", "only", "instead", "rather", "please", "i", "i'm", "im", "all", "so",
     "because"]
)  # fmt: skip
# a word, a run of CJK, or one break of the clause (punctuation and dashes)
_PIECE = re.compile(
    r"(?P<word>[^\W\d_\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]+(?:['\u2019][^\W\d_]+)?)"
    r"|(?P<cjk>[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]+)"
    r"|(?P<stop>[.,;:!?\u2014\u2013()\[\]\"\u3002\uff0c\uff1b\uff1a\uff01\uff1f\u3001]|\s-\s)"
)


def mark(text: str) -> str:
    """`text` with the words in a negation's scope prefixed by PREFIX; the rest unchanged."""
    out: list[str] = []
    last = 0
    left = 0  # words still in the open scope
    for m in _PIECE.finditer(text):
        out.append(text[last : m.start()])
        last = m.end()
        piece = m.group()
        if m.lastgroup == "stop":
            left = 0
        elif m.lastgroup == "cjk":
            left = MAX_SCOPE if piece.endswith(_ZH_CUES) else 0
        else:
            word = piece.lower().replace("\u2019", "'")
            if word in _CUES or word.endswith("n't"):
                left = MAX_SCOPE
            elif left and word in _CLAUSE:
                left = 0
            elif left:
                left -= 1
                piece = PREFIX + piece
        out.append(piece)
    out.append(text[last:])
    return "".join(out)
