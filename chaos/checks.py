"""The checks of a round: exactly one result per ticket, and how the flow of results
stalled and came back around each fault. Pure functions of what the watcher saw."""

from __future__ import annotations

import bisect
import itertools
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from chaos.report import FaultRecord

AFTER_HEALED_S = 10.0  # how long after a fault is healed its stall is still looked for


@dataclass(frozen=True)
class Tally:
    """Results counted against what was published."""

    lost: list[str]  # published, no result
    doubled: dict[str, int]  # more than one result
    unexpected: list[str]  # a result for a ticket never (knowingly) published

    @property
    def exact(self) -> bool:
        return not self.lost and not self.doubled


def check_exactly_once(
    expected: Iterable[str], result_keys: Iterable[str], maybe: Iterable[str] = ()
) -> Tally:
    """Exactly one result per expected ticket id; `maybe` are ids whose publish is unknown
    (no delivery report), whose results are neither required nor unexpected."""
    counts = Counter(result_keys)
    wanted = set(expected)
    lost = sorted(wanted - set(counts))
    doubled = {k: n for k, n in sorted(counts.items()) if n > 1}
    unexpected = sorted(set(counts) - wanted - set(maybe))
    return Tally(lost, doubled, unexpected)


def time_to_flow(times: Sequence[float], healed_at: float) -> float | None:
    """Seconds from `healed_at` to the first result seen after it (None: none came)."""
    i = bisect.bisect_left(times, healed_at)
    return None if i == len(times) else round(times[i] - healed_at, 2)


def longest_stall(times: Sequence[float], start: float, end: float) -> float:
    """The longest time without a result within [start, end] (`times` sorted)."""
    inside = [t for t in times[bisect.bisect_left(times, start) :] if t <= end]
    edges = [start, *inside, end]
    return round(max(b - a for a, b in itertools.pairwise(edges)), 2)


def per_second(times: Iterable[float], t0: float, seconds: int) -> list[int]:
    """Results per second since `t0`, for the flow plot."""
    counts = [0] * max(seconds, 0)
    for t in times:
        i = int(t - t0)
        if 0 <= i < len(counts):
            counts[i] += 1
    return counts


def flow_figures(f: FaultRecord, times: Sequence[float], t0: float, until: float) -> None:
    """Fill in the fault's time to flow again and its longest stall (results at `times`)."""
    if f.started_at_s is None or f.ended_at_s is None:
        return
    f.time_to_flow_s = time_to_flow(times, t0 + f.ended_at_s)
    # a restarted worker's rejoin stops the whole group a while after it is healed: the
    # stall is looked for until AFTER_HEALED_S past healthy, within the publishing time
    healed = f.healthy_at_s if f.healthy_at_s is not None else f.ended_at_s
    end = min(t0 + healed + AFTER_HEALED_S, until)
    f.stall_s = longest_stall(times, t0 + f.started_at_s, max(end, t0 + f.started_at_s))
