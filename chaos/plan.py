"""The fault plan: which faults and hostile records a campaign draws, when, and for how long.

Everything here is pure and seeded: a seed and a round's index give the same round on any
machine, so a failed round can be replayed alone (docs/chaos.md). `Options` holds what a
campaign was asked for.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

FAULT_KINDS: tuple[str, ...] = (
    "worker_kill",  # SIGKILL one worker, restart it after the hold
    "workers_kill",  # SIGKILL every worker at once, restart them all
    "worker_pause",  # SIGSTOP one worker past its session timeout, then SIGCONT: a zombie
    "broker_kill",  # SIGKILL the broker (no clean shutdown), start it again
    "broker_restart",  # SIGTERM the broker (clean shutdown), start it again
    "triton_kill",
    "redis_kill",
    "gateway_kill",
)
# how long a fault holds before it is healed, (min, max) seconds
HOLD_S: dict[str, tuple[float, float]] = {
    "worker_kill": (1.0, 5.0),
    "workers_kill": (1.0, 5.0),
    # Faust's session timeout is 6 s (streams/app.py): frozen for longer, the group moves
    # the worker's partitions on while it still believes it owns them
    "worker_pause": (9.0, 12.0),
    "broker_kill": (1.0, 5.0),
    "broker_restart": (1.0, 5.0),
    # long enough for the worker's breaker to see its 10 s window of errors
    "triton_kill": (5.0, 15.0),
    "redis_kill": (3.0, 10.0),
    "gateway_kill": (3.0, 10.0),
}
WORKER_FAULTS = frozenset({"worker_kill", "worker_pause"})  # those with one target
STACK_PARTS = {
    "broker_kill": "kafka",
    "broker_restart": "kafka",
    "triton_kill": "triton",
    "redis_kill": "redis",
}
HOSTILE_KINDS: tuple[str, ...] = (
    "bad_json",
    "not_utf8",
    "schema",
    "too_large",
    "bad_replay_count",  # not JSON, and an x-replay-count of 'abc'
    "bad_header_bytes",  # not JSON, and headers that are not UTF-8
)


@dataclass(frozen=True)
class FaultPlan:
    kind: str
    at_s: float  # from the start of publishing
    hold_s: float  # how long before it is healed
    target: int | None = None  # the worker, for a fault on one worker


@dataclass(frozen=True)
class RoundPlan:
    index: int
    seed: int
    static_members: bool  # workers get TICKETFLOW_WORKER_ID (static group membership)
    faults: tuple[FaultPlan, ...]
    hostile: tuple[tuple[float, str], ...]  # (at_s, kind)


def parse_faults(text: str | None) -> tuple[str, ...]:
    """The fault kinds of a comma list; every kind when empty. Unknown names are refused."""
    names = [n.strip() for n in (text or "").split(",") if n.strip()]
    unknown = sorted(set(names) - set(FAULT_KINDS))
    if unknown:
        raise ValueError(f"unknown fault(s) {', '.join(unknown)}; known: {', '.join(FAULT_KINDS)}")
    return tuple(dict.fromkeys(names)) or FAULT_KINDS


def parse_hostile(text: str | None) -> tuple[str, ...]:
    """The hostile record kinds of a comma list: every kind when empty, none for `none`."""
    if (text or "").strip().lower() == "none":
        return ()
    names = [n.strip() for n in (text or "").split(",") if n.strip()]
    unknown = sorted(set(names) - set(HOSTILE_KINDS))
    if unknown:
        known = ", ".join(HOSTILE_KINDS)
        raise ValueError(f"unknown hostile kind(s) {', '.join(unknown)}; known: {known}, none")
    return tuple(dict.fromkeys(names)) or HOSTILE_KINDS


def round_seed(seed: int, index: int) -> int:
    # an int, not a string: str hashes are salted per process and would break replays
    return seed * 1_000_003 + index


def max_faults(round_s: float) -> int:
    """One fault per 20 s of round, 1 to 3: each needs time to heal and to be seen healed."""
    return max(1, min(3, int(round_s // 20)))


def draw_round(
    seed: int,
    index: int,
    round_s: float,
    workers: int,
    allowed: Sequence[str],
    hostile_kinds: Sequence[str] = HOSTILE_KINDS,
) -> RoundPlan:
    """A round's faults, one after another in the first 3/4 of the round, and its hostiles.

    Every hostile kind gets its time drawn, even those left out: the faults of a seed are
    the same whichever hostile records go with them."""
    rs = round_seed(seed, index)
    rng = random.Random(rs)
    n = rng.randint(1, max_faults(round_s))
    start, end = max(3.0, 0.15 * round_s), 0.75 * round_s
    slot = (end - start) / n
    faults = []
    for i in range(n):
        kind = rng.choice(list(allowed))
        at = start + i * slot + rng.uniform(0, slot / 2)
        hold = rng.uniform(*HOLD_S[kind])
        target = rng.randrange(workers) if kind in WORKER_FAULTS else None
        faults.append(FaultPlan(kind, round(at, 1), round(hold, 1), target))
    times = [(round(rng.uniform(0.05, 0.95) * round_s, 1), k) for k in HOSTILE_KINDS]
    hostile = sorted((at, k) for at, k in times if k in hostile_kinds)
    static = rng.random() < 0.5
    return RoundPlan(index, rs, static, tuple(faults), tuple(hostile))


def draw_campaign(
    seed: int,
    rounds: int,
    round_s: float,
    workers: int,
    allowed: Sequence[str],
    hostile_kinds: Sequence[str] = HOSTILE_KINDS,
) -> list[RoundPlan]:
    return [
        draw_round(seed, i, round_s, workers, allowed, hostile_kinds) for i in range(1, rounds + 1)
    ]


@dataclass(frozen=True)
class Options:
    """What `ticketflow chaos` was asked for: the plan's inputs and the campaign's waits."""

    rounds: int = 5
    workers: int = 2
    rate: float = 100.0  # valid tickets a second
    round_s: float = 60.0  # publishing time of a round (longer when its faults run over)
    seed: int = 0
    faults: tuple[str, ...] = FAULT_KINDS
    hostile: tuple[str, ...] = HOSTILE_KINDS
    drain_s: float = 120.0  # the most a round waits for its results once publishing stops
    settle_s: float = 5.0  # then this long for duplicates to show
    tail_s: float = 5.0  # publishing goes on at least this long after the last fault healed
    ready_s: float = 90.0  # the most a (re)started worker or gateway may take to serve
