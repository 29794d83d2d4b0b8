"""`ticketflow worker --processes N`'s parent: what tells children apart, restarts, stopping.

Fake processes and a fake clock for the restart policy; real `sleep` children for the
signals (SIGTERM to the parent, SIGKILL of the parent, a killed child)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from agents import supervisor
from agents.supervisor import (
    MAX_BACKOFF_S,
    STABLE_S,
    Child,
    Supervisor,
    child_env,
    cores_available,
    worker_children,
)

SLEEPER = [sys.executable, "-c", "import time; time.sleep(120)"]


class FakeProcess:
    _next_pid = 1000

    def __init__(self) -> None:
        FakeProcess._next_pid += 1
        self.pid = FakeProcess._next_pid
        self.returncode: int | None = None
        self.signals: list[int] = []

    def poll(self) -> int | None:
        return self.returncode

    def send_signal(self, sig: int) -> None:
        self.signals.append(sig)
        self.returncode = -sig

    def wait(self, timeout: float | None = None) -> int:
        assert self.returncode is not None
        return self.returncode

    def kill(self) -> None:
        self.returncode = -signal.SIGKILL


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def fake_supervisor(n: int) -> tuple[Supervisor, list[FakeProcess], Clock]:
    spawned: list[FakeProcess] = []

    def spawn(argv, env):
        spawned.append(FakeProcess())
        return spawned[-1]

    clock = Clock()
    children = worker_children(n, ["worker", "--processes", "1"], 6066, "w")
    return Supervisor(children, spawn=spawn, clock=clock, log=lambda m: None), spawned, clock


def test_children_get_ports_clear_of_the_feature_job_and_member_ids_of_their_own():
    envs = [child_env(6066, "worker-0", i) for i in range(3)]
    ports = [e["TICKETFLOW_WORKER_WEB_PORT"] for e in envs]
    assert ports == ["6066", "6076", "6086"]  # 6067 is the feature job's
    ids = [e["TICKETFLOW_WORKER_ID"] for e in envs]
    assert ids == ["worker-0-p0", "worker-0-p1", "worker-0-p2"]


def test_without_a_worker_id_membership_stays_dynamic_and_port_0_stays_free_for_each():
    env = child_env(0, None, 1)
    assert env["TICKETFLOW_WORKER_ID"] == "" and env["TICKETFLOW_WORKER_WEB_PORT"] == "0"


def test_the_default_is_the_cores_this_process_may_run_on():
    assert cores_available() == len(os.sched_getaffinity(0))


def test_a_dead_child_is_restarted_at_once_when_it_had_run_a_while():
    sup, spawned, clock = fake_supervisor(2)
    sup.start()
    assert len(spawned) == 2
    clock.now += STABLE_S + 1
    spawned[1].returncode = -signal.SIGKILL
    sup.poll()  # noticed, due now
    sup.poll()
    assert len(spawned) == 3 and sup.children[1].process is spawned[2]
    assert sup.children[1].restarts == 1 and sup.children[0].process is spawned[0]


def test_a_child_that_keeps_dying_young_waits_longer_each_time_up_to_a_limit():
    sup, spawned, clock = fake_supervisor(1)
    sup.start()
    waits = []
    for _ in range(8):
        spawned[-1].returncode = 1
        sup.poll()
        child = sup.children[0]
        waits.append(child.backoff_s)
        before = len(spawned)
        clock.now = child.due_at - 0.01
        sup.poll()
        assert len(spawned) == before  # not before its pause is over
        clock.now = child.due_at
        sup.poll()
        assert len(spawned) == before + 1
    assert waits[:4] == [1.0, 2.0, 4.0, 8.0] and waits[-1] == MAX_BACKOFF_S
    # one that then ran a while starts again at once after its next death
    clock.now += STABLE_S + 1
    spawned[-1].returncode = 1
    sup.poll()
    assert sup.children[0].backoff_s == 0.0


def test_stop_terminates_every_child_and_restarts_nothing_after():
    sup, spawned, _clock = fake_supervisor(3)
    sup.start()
    spawned[0].returncode = 1  # died just before the stop
    assert sup.stop() == 0
    assert [p.signals for p in spawned] == [[], [signal.SIGTERM], [signal.SIGTERM]]
    sup.poll()
    assert len(spawned) == 3


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def _wait(check, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.05)
    return False


def test_a_real_child_killed_is_replaced_and_stop_ends_them_all():
    children = [Child(i, SLEEPER, {}) for i in range(2)]
    clock = Clock()
    sup = Supervisor(children, log=lambda m: None, stop_timeout_s=5, clock=clock)
    sup.start()
    try:
        first = [c.process.pid for c in children]
        clock.now += STABLE_S + 1  # it had run a while: restarted at once
        os.kill(first[1], signal.SIGKILL)
        assert _wait(lambda: children[1].process.poll() is not None)
        sup.poll()
        sup.poll()
        assert children[1].process.pid != first[1] and _alive(children[1].process.pid)
        assert children[0].process.pid == first[0]
    finally:
        assert sup.stop() == 0
    assert not any(_alive(c.process.pid) for c in children)


PARENT = textwrap.dedent(
    """
    import sys
    from agents.supervisor import Child, Supervisor
    argv = [sys.executable, "-c", "import time; time.sleep(120)"]
    sup = Supervisor([Child(i, argv, {}) for i in range(2)], stop_timeout_s=5,
                     log=lambda m: print(m, flush=True))
    sys.exit(sup.run(interval_s=0.05))
    """
)


def _parent() -> tuple[subprocess.Popen, list[int]]:
    proc = subprocess.Popen(
        [sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True, cwd=Path.cwd()
    )
    pids = [int(proc.stdout.readline().rsplit(" ", 1)[1]) for _ in range(2)]
    return proc, pids


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_sigterm_to_the_parent_stops_every_child_cleanly(sig):
    proc, pids = _parent()
    assert all(_alive(p) for p in pids)
    proc.send_signal(sig)
    assert proc.wait(15) == 0
    assert not any(_alive(p) for p in pids)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parent-death signal")
def test_a_parent_killed_outright_leaves_no_child_behind():
    proc, pids = _parent()
    proc.kill()
    proc.wait(5)
    assert _wait(lambda: not any(_alive(p) for p in pids))


def test_the_worker_command_supervises_children_of_one_process_each(monkeypatch):
    seen = {}

    def run(self):
        seen["children"] = self.children
        return 0

    monkeypatch.setattr(supervisor.Supervisor, "run", run)
    from typer.testing import CliRunner

    from ticketflow import cli

    monkeypatch.setenv("TICKETFLOW_WORKER_WEB_PORT", "7000")
    monkeypatch.setenv("TICKETFLOW_TOPIC_PREFIX", "unit-sup.")
    result = CliRunner().invoke(cli.app, ["worker", "--processes", "3", "--steps", "infer"])
    assert result.exit_code == 0, result.output
    children = seen["children"]
    assert len(children) == 3
    argv = children[0].argv
    assert argv[argv.index("--processes") + 1] == "1" and argv[-2:] == ["--steps", "infer"]
    assert [c.env["TICKETFLOW_WORKER_WEB_PORT"] for c in children] == ["7000", "7010", "7020"]
