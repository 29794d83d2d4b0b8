"""Envelopes this worker wrote to a step partition it reads itself, handed over in memory.

Every hop still goes through the broker: the record is written, read back and committed as
before, so a crash, a rebalance or another process reading the partition sees exactly what
it would have seen. What is saved is the parse. When the record this worker reads is,
byte for byte, one it wrote a moment ago, the envelope it encoded is the envelope the bytes
decode to, so the reader takes that object instead of validating the bytes again. Anything
else (a record from another process, one evicted here, a hand-written one, a second read of
the same bytes after a retry or a bisect) is decoded and validated as always.

Taking an envelope removes it: a batch that is run again reads the record's bytes afresh,
never an object an earlier run has changed. Only envelopes whose decode is known to give
back an equal object are kept (`plain`): the free-form feature values and the model's
scores must be JSON's own values, since a NaN or a tuple would come back as null or a list.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from schemas.tickets import Envelope

# a step whose reader lags more than this far behind loses its oldest entries (they are
# decoded instead); ~10 KB an envelope, so a few tens of MB at most
LIMIT = 4096
_INT64 = 2**63


class Handoff:
    def __init__(self, limit: int = LIMIT) -> None:
        self._limit = limit
        self._kept: dict[bytes, Envelope] = {}
        self._read: frozenset[tuple[str, int]] = frozenset()
        self.taken = 0  # envelopes handed over so far

    def reading(self, partitions: Iterable[tuple[str, int]]) -> None:
        """The (topic, partition) pairs this worker reads now; nothing else is kept."""
        self._read = frozenset(partitions)

    def reads(self, topic: str, partition: int) -> bool:
        return (topic, partition) in self._read

    def keep(self, value: bytes, env: Envelope) -> None:
        """`value` is `env`, encoded, on its way to a partition this worker reads."""
        if not plain(env):
            return
        kept = self._kept
        kept[value] = env
        if len(kept) > self._limit:
            del kept[next(iter(kept))]  # the oldest: dicts keep insertion order

    def take(self, value: object) -> Envelope | None:
        """The envelope that `value` is, when this worker wrote exactly these bytes."""
        if not self._kept or not isinstance(value, bytes):
            return None
        env = self._kept.pop(value, None)
        self.taken += env is not None
        return env

    def __len__(self) -> int:
        return len(self._kept)


def plain(env: Envelope) -> bool:
    """Whether decoding `env`'s JSON gives back an equal envelope: its free-form values
    (features, scores) are JSON's own: finite floats, 64-bit integers, strings, booleans,
    null, and lists and string-keyed dicts of them."""
    for feature in env.context.features.values():
        if not _json(feature.value, 4):
            return False
    pred = env.context.prediction
    return pred is None or all(_finite(s) for s in pred.scores.values())


def _json(value: object, depth: int) -> bool:
    kind = type(value)
    if kind is str or kind is bool or value is None:
        return True
    if kind is float:
        return _finite(value)
    if kind is int:
        return -_INT64 <= value < _INT64  # type: ignore[operator]
    if depth == 0:
        return False
    if kind is list:
        return all(_json(v, depth - 1) for v in value)  # type: ignore[attr-defined]
    if kind is dict:
        return all(
            type(k) is str and _json(v, depth - 1)
            for k, v in value.items()  # type: ignore[attr-defined]
        )
    return False


def _finite(value: object) -> bool:
    return type(value) is float and math.isfinite(value)
