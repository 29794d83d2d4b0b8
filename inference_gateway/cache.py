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

import hashlib
import time
import unicodedata
from collections import OrderedDict
from collections.abc import Callable

import numpy as np

from schemas.gateway import MAX_TEXT_CHARS

Key = tuple[str, str, bytes]


def normalize_text(text: str, limit: int = MAX_TEXT_CHARS) -> str:
    """What the models see: NFKC (full-width Latin and digits folded), whitespace collapsed,
    at most `limit` characters.

    NFKC can lengthen a text up to 18 times (U+FDFA): an input the API accepted must not
    become one that no model should be sent, so the model reads its first `limit`
    characters, as it would of an input that long to begin with.
    """
    text = " ".join(unicodedata.normalize("NFKC", text).split())
    return text if len(text) <= limit else text[:limit].rstrip()


def cache_key(model: str, version: str, normalized: str) -> Key:
    return (model, version, hashlib.blake2b(normalized.encode("utf-8"), digest_size=16).digest())


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
