"""The `text_cleaner` processor: normalise ticket text the way the model was trained on."""

from __future__ import annotations

import html
import re
import unicodedata

_TAG = re.compile(r"<[^>]{0,200}>")
_INVISIBLE = re.compile(r"[\u200b-\u200f\u2060\ufeff\u00ad]")
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
_SPACE = re.compile(r"\s+")


def clean_text(text: str) -> str:
    """NFKC, markup and entities removed, invisible and control characters dropped, one space."""
    text = html.unescape(_TAG.sub(" ", text))
    text = unicodedata.normalize("NFKC", text)
    text = _CONTROL.sub(" ", _INVISIBLE.sub("", text))
    return _SPACE.sub(" ", text).strip()
