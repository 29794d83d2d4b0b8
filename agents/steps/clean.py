"""The `text_cleaner` processor: normalise ticket text the way the model was trained on."""

from __future__ import annotations

import html
import re
import unicodedata

from schemas.tickets import MAX_TEXT_CHARS

_TAG = re.compile(r"<[^>]{0,200}>")
_INVISIBLE = re.compile(r"[\u200b-\u200f\u2060\ufeff\u00ad]")
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
_SPACE = re.compile(r"\s+")


def clean_text(text: str, limit: int = MAX_TEXT_CHARS) -> str:
    """NFKC, markup and entities removed, invisible and control characters dropped, one
    space; at most `limit` characters.

    NFKC can lengthen a text up to 18 times (U+FDFA, say), so an accepted ticket could
    otherwise come out longer than any step after this one takes: the model sees the
    first `limit` characters, as it would of a ticket that long to begin with.
    """
    text = html.unescape(_TAG.sub(" ", text))
    text = unicodedata.normalize("NFKC", text)
    text = _SPACE.sub(" ", _CONTROL.sub(" ", _INVISIBLE.sub("", text))).strip()
    return text if len(text) <= limit else text[:limit].rstrip()
