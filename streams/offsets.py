"""Which offset a partition may commit: a pure function, so it can be tested on its own.

Kafka's committed offset is the next record to read. It may move only over records that
were processed: the run of acknowledged offsets that starts exactly at the committed
offset, plus spans known to hold no record (transaction markers, records that retention
deleted). Faust's own rule lets the run start one past the head and checks nothing while
it does not know the head; both let a commit pass a record still in flight
(faust-streaming #606).
"""

from __future__ import annotations

from collections.abc import Iterable


def committable_offset(
    acked: Iterable[int], head: int, empty_spans: Iterable[tuple[int, int]] = ()
) -> tuple[int | None, list[int]]:
    """(the new offset to commit or None, the acknowledged offsets it covers).

    `head` is the committed offset; `empty_spans` are [begin, end) ranges holding no record.
    Offsets below the head were committed already and are covered without moving it.
    """
    done = set(acked)
    spans = sorted((b, e) for b, e in empty_spans if e > b)
    position = head
    while True:
        if position in done:
            position += 1
            continue
        jump = max((e for b, e in spans if b <= position < e), default=None)
        if jump is None:
            break
        position = jump
    covered = sorted(o for o in done if o < position)
    return (position if position > head else None), covered
