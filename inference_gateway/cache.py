"""The response cache: scores by (model, version, normalised text), LRU with a TTL.

The gateway normalises every input once (`normalize_text`: Unicode NFKC, whitespace runs to
one space, stripped) and sends the *normalised* text to Triton too, so a cache hit returns
exactly what the model would have answered for that input: both versions are deterministic
per text (v2's encoder quantises activations per row, never per batch). Keys hold a 128-bit
BLAKE2b digest of the text, not the text, so a cache of many long tickets stays small and
holds no ticket text.

Entries live `ttl_s` at most (a model reloaded under the same version number is picked up
within that time) and the least recently used go first past `max_entries`.
"""

from __future__ import annotations

import functools
import hashlib
import re
import time
import unicodedata
from collections import OrderedDict
from collections.abc import Callable

import numpy as np

from schemas.gateway import MAX_TEXT_CHARS

Key = tuple[str, str, bytes]


# Input characters per NFKC call: NFKC grows a text at most 18-fold (U+FDFA), so one call makes
# at most ~18k characters (under a millisecond) and a thread normalising a batch lets go of
# the GIL between calls: the event loop is never held for a whole text.
_SLICE = 1024
# Combining marks in a row kept before NFKC (UAX #15's stream-safe limit is 30). Canonical
# reordering is quadratic in a run: 20,000 mixed marks took ~290 ms in one NFKC call.
_MAX_MARKS = 30


@functools.cache
def _tables() -> tuple[re.Pattern[str], frozenset[str]]:
    """(runs of non-starters longer than _MAX_MARKS, characters that compose with a preceding
    character): from the running Python's Unicode database, once, ~0.2 s."""
    marks: list[str] = []
    second: set[str] = {chr(c) for c in (*range(0x1161, 0x1176), *range(0x11A8, 0x11C3))}
    for cp in range(0x110000):
        char = chr(cp)
        if unicodedata.combining(char):
            marks.append(char)
            continue
        decomposition = unicodedata.decomposition(char)
        if not decomposition:
            continue
        if unicodedata.combining(unicodedata.normalize("NFKD", char)[0]):
            marks.append(char)  # a starter that decomposes into a leading mark (U+0F73)
        parts = decomposition.split()
        if not decomposition.startswith("<") and len(parts) == 2:
            second.add(chr(int(parts[1], 16)))
    klass = "".join(re.escape(m) for m in marks)
    runs = re.compile(f"([{klass}]{{{_MAX_MARKS}}})[{klass}]+")
    return runs, frozenset(second)


def build_tables() -> None:
    """Build the normalisation tables now (else the first long text does)."""
    _tables()


def _boundary_before(char: str) -> bool:
    """True when NFKC(a + char + b) == NFKC(a) + NFKC(char + b) for any a, b: `char` starts
    with a starter that nothing before it can reorder across or compose with."""
    if char < "\x80":
        return True
    first = unicodedata.normalize("NFKD", char)[0]
    return not unicodedata.combining(first) and first not in _tables()[1]


def normalize_text(text: str, limit: int = MAX_TEXT_CHARS) -> str:
    """What the models see: NFKC (full-width Latin and digits folded), whitespace collapsed,
    at most `limit` characters.

    NFKC can lengthen a text up to 18 times (U+FDFA): an input the API accepted must not
    become one that no model should be sent, so the model reads its first `limit`
    characters, as it would of an input that long to begin with. The work is bounded too:
    runs of combining marks are cut to 30 (stream-safe), and a long text is normalised in
    slices cut where NFKC cannot join them, stopping once `limit` characters are known.
    """
    text = _tables()[0].sub(r"\1", text)
    if len(text) <= _SLICE:
        text = " ".join(unicodedata.normalize("NFKC", text).split())
        return text if len(text) <= limit else text[:limit].rstrip()
    parts: list[str] = []
    kept = start = 0
    while start < len(text) and kept < limit:
        end = min(start + _SLICE, len(text))
        while end < len(text) and not _boundary_before(text[end]):
            end += 1
        part = unicodedata.normalize("NFKC", text[start:end])
        parts.append(part)
        kept += sum(len(word) for word in part.split())  # what survives the collapse
        start = end
    # the prefix normalised so far holds >= `limit` visible characters (or is the whole
    # text), so collapsing it gives the same first `limit` characters as collapsing all
    text = " ".join("".join(parts).split())
    return text if len(text) <= limit else text[:limit].rstrip()


def text_digest(normalized: str) -> bytes:
    return hashlib.blake2b(normalized.encode("utf-8"), digest_size=16).digest()


def cache_key(model: str, version: str, normalized: str) -> Key:
    return (model, version, text_digest(normalized))


class ResponseCache:
    """A bounded LRU of score rows with a TTL; `max_entries` 0 disables it."""

    def __init__(
        self,
        max_entries: int = 10_000,
        ttl_s: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_entries = max_entries
        self.ttl_s = ttl_s
        self._clock = clock
        self._entries: OrderedDict[Key, tuple[float, np.ndarray]] = OrderedDict()
        self.hits = 0
        self.misses = 0

    @property
    def enabled(self) -> bool:
        return self.max_entries > 0 and self.ttl_s > 0

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: Key) -> np.ndarray | None:
        if not self.enabled:
            return None
        entry = self._entries.get(key)
        if entry is None:
            self.misses += 1
            return None
        expires, row = entry
        if expires <= self._clock():
            del self._entries[key]
            self.misses += 1
            return None
        self._entries.move_to_end(key)
        self.hits += 1
        return row

    def put(self, key: Key, row: np.ndarray) -> None:
        if not self.enabled:
            return
        self._entries[key] = (self._clock() + self.ttl_s, row)
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    @property
    def hit_ratio(self) -> float:
        total = self.hits + self.misses
        return self.hits / total if total else 0.0

    def clear(self) -> None:
        self._entries.clear()
