"""A circuit breaker around the inference gateway (>50 % errors in 10 s opens it:
docs/architecture.md).

Outcomes are counted in one-second buckets over a rolling window; with enough volume and
an error rate above the threshold the breaker opens, and tickets degrade at once instead
of waiting on a dependency that is down. After the cool-down one probe call is let
through (half-open): success closes the breaker, failure opens it again.
"""

from __future__ import annotations

import time
from collections import deque
from enum import IntEnum

from agents import metrics


class State(IntEnum):
    CLOSED = 0
    HALF_OPEN = 1
    OPEN = 2


class CircuitBreaker:
    def __init__(
        self,
        target: str,
        window_s: float = 10.0,
        threshold: float = 0.5,
        min_calls: int = 10,
        cooldown_s: float = 5.0,
        clock=time.monotonic,
    ) -> None:
        self.target = target
        self.window_s, self.threshold, self.min_calls = window_s, threshold, min_calls
        self.cooldown_s = cooldown_s
        self._clock = clock
        self._buckets: deque[list[float]] = deque()  # [second, ok, failed]
        self.state = State.CLOSED
        self._opened_at = 0.0
        self._probing = False
        self._probe_at = 0.0
        self._publish()

    def refresh(self) -> None:
        """Move from open to half-open once the cool-down is over, calls or not (so the
        state metric tells the truth while no ticket arrives)."""
        if self.state == State.OPEN and self._clock() - self._opened_at >= self.cooldown_s:
            self._move(State.HALF_OPEN)

    def allow(self) -> bool:
        """May a call go out now? In half-open, only one probe at a time."""
        self.refresh()
        if self.state == State.OPEN:
            return False
        if self.state == State.HALF_OPEN:
            if self._probing and self._clock() - self._probe_at < self.cooldown_s:
                return False  # one probe at a time (a lost one is replaced after a cool-down)
            self._probing, self._probe_at = True, self._clock()
        return True

    def record(self, ok: bool, n: int = 1) -> None:
        if self.state == State.HALF_OPEN:
            self._probing = False
            self._move(State.CLOSED if ok else State.OPEN)
            if ok:
                self._buckets.clear()
            return
        self._count(ok, n)
        if self.state == State.CLOSED and self._tripped():
            self._move(State.OPEN)

    def _count(self, ok: bool, n: int) -> None:
        now = self._clock()
        second = float(int(now))
        if not self._buckets or self._buckets[-1][0] != second:
            self._buckets.append([second, 0, 0])
        self._buckets[-1][1 if ok else 2] += n
        while self._buckets and self._buckets[0][0] <= now - self.window_s:
            self._buckets.popleft()

    def _tripped(self) -> bool:
        ok = sum(b[1] for b in self._buckets)
        failed = sum(b[2] for b in self._buckets)
        total = ok + failed
        return total >= self.min_calls and failed / total > self.threshold

    def _move(self, state: State) -> None:
        if state == State.OPEN:
            self._opened_at = self._clock()
        self.state = state
        self._publish()

    def _publish(self) -> None:
        metrics.BREAKER.labels(self.target).set(int(self.state))
