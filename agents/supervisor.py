"""`ticketflow worker --processes N`: N worker processes on one host, under one parent.

Each child is the same command with `--processes 1`, so the per-process code is the one
worker (agents/worker.py): one member of the consumer group, exactly-once on its own. The
router's transactional ids name an input partition (`<app>-route-<n>`, agents/router.py),
so two children share one only while a partition moves between them, which is when the
new owner must fence the old one. What the children must not share is told apart here:
child i serves its web views on `worker_web_port + PORT_STEP * i` and, where a worker id
is set (static membership, KIP-345), is the member `<worker id>-p<i>`.

The parent only supervises: a child that dies is started again (after a pause that grows
while it keeps dying young), and SIGTERM or SIGINT to the parent stops every child with
SIGTERM, then SIGKILL after `stop_timeout_s`. A child dies with its parent (Linux's
parent-death signal), so a parent killed with SIGKILL leaves no worker behind.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

# child i's web port is the base port plus this times i: the base port + 1 is the feature
# job's (6067), so the children keep clear of the ports next to it
PORT_STEP = 10
# a child that ran this long before dying is restarted at once; one that died younger
# waits, twice as long each time, up to MAX_BACKOFF_S (a crash loop must not spin a core)
STABLE_S = 30.0
FIRST_BACKOFF_S = 1.0
MAX_BACKOFF_S = 30.0
_PR_SET_PDEATHSIG = 1


def cores_available() -> int:
    """The cores this process may run on (its affinity mask, as a container's cpuset)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def child_port(base_port: int, index: int) -> int:
    """Child `index`'s web port; 0 (pick a free one) stays 0 for every child."""
    return base_port + PORT_STEP * index if base_port else 0


def child_worker_id(worker_id: str | None, index: int) -> str | None:
    return f"{worker_id}-p{index}" if worker_id else None


def child_env(base_port: int, worker_id: str | None, index: int) -> dict[str, str]:
    """The settings that tell child `index` apart from its siblings."""
    env = {"TICKETFLOW_WORKER_WEB_PORT": str(child_port(base_port, index))}
    wid = child_worker_id(worker_id, index)
    env["TICKETFLOW_WORKER_ID"] = wid or ""  # empty is unset (env_ignore_empty)
    return env


def _die_with_parent() -> None:  # pragma: no cover - runs in the forked child
    # SIGTERM when the parent goes, however it goes: the child then leaves the group cleanly
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def popen(argv: Sequence[str], env: dict[str, str]) -> subprocess.Popen:
    """A child in the parent's process group (a group kill reaches it), dying with it."""
    preexec = _die_with_parent if sys.platform.startswith("linux") else None
    return subprocess.Popen(list(argv), env={**os.environ, **env}, preexec_fn=preexec)


@dataclass
class Child:
    index: int
    argv: list[str]
    env: dict[str, str]
    process: subprocess.Popen | None = None
    started_at: float = 0.0
    restarts: int = 0
    backoff_s: float = 0.0
    due_at: float | None = None  # when a dead child is started again


@dataclass
class Supervisor:
    children: list[Child]
    spawn: Callable[[Sequence[str], dict[str, str]], subprocess.Popen] = popen
    clock: Callable[[], float] = time.monotonic
    log: Callable[[str], None] = field(default=lambda m: print(m, file=sys.stderr, flush=True))
    stop_timeout_s: float = 50.0
    stopping: bool = False

    def start(self) -> None:
        for child in self.children:
            self._start(child)

    def _start(self, child: Child) -> None:
        child.process = self.spawn(child.argv, child.env)
        child.started_at, child.due_at = self.clock(), None
        self.log(f"worker process {child.index}: pid {child.process.pid}")

    def poll(self) -> None:
        """Restart the children that died and whose pause is over; note the newly dead."""
        now = self.clock()
        for child in self.children:
            if self.stopping:
                return
            if child.due_at is not None:
                if now >= child.due_at:
                    child.restarts += 1
                    self._start(child)
                continue
            code = child.process.poll() if child.process else None
            if code is not None:
                self._died(child, code, now)

    def _died(self, child: Child, code: int, now: float) -> None:
        young = now - child.started_at < STABLE_S
        child.backoff_s = (
            min(MAX_BACKOFF_S, max(FIRST_BACKOFF_S, child.backoff_s * 2)) if young else 0.0
        )
        child.due_at = now + child.backoff_s
        self.log(
            f"worker process {child.index} (pid {child.process and child.process.pid}) "
            f"exited with {code}; "
            f"restarting in {child.backoff_s:.0f} s"
        )

    def request_stop(self, *_: object) -> None:
        self.stopping = True

    def stop(self) -> int:
        """SIGTERM every live child, wait, SIGKILL what is left: 0 when all stopped cleanly."""
        self.stopping = True
        live = [c.process for c in self.children if c.process and c.process.poll() is None]
        for proc in live:
            proc.send_signal(signal.SIGTERM)
        deadline = self.clock() + self.stop_timeout_s
        clean = True
        for proc in live:
            try:
                proc.wait(max(0.1, deadline - self.clock()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
                clean = False
            clean = clean and proc.returncode in (0, -signal.SIGTERM)
        return 0 if clean else 1

    def run(self, interval_s: float = 0.5) -> int:
        """Start, supervise until SIGTERM or SIGINT, stop: the exit status."""
        signal.signal(signal.SIGTERM, self.request_stop)
        signal.signal(signal.SIGINT, self.request_stop)
        self.start()
        try:
            while not self.stopping:
                self.poll()
                time.sleep(interval_s)
        finally:
            code = self.stop()
        return code


def worker_children(
    processes: int, base_argv: list[str], base_port: int, worker_id: str | None
) -> list[Child]:
    """`processes` children running `base_argv` (a worker command with `--processes 1`)."""
    return [Child(i, list(base_argv), child_env(base_port, worker_id, i)) for i in range(processes)]
