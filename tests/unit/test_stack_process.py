"""devstack.process: pid files, detached starts and stops, probes (sleep processes only)."""

from __future__ import annotations

import os
import socket
import sys
import time
from pathlib import Path

import pytest

from devstack import process
from devstack.process import PartStatus, PidRecord
from streams.settings import Settings


def test_pid_record_round_trip() -> None:
    rec = PidRecord(pid=42, start_ticks=7, argv=["a", "b c"], log="/x.log", started_at="t")
    assert PidRecord.from_text(rec.to_json()) == rec


@pytest.mark.parametrize(
    ("text", "pid"),
    [("123\n", 123), ("  77  ", 77), ("", None), ("abc", None), ("{not json", None), ("{}", None)],
)
def test_pid_record_from_text(text: str, pid: int | None) -> None:
    rec = PidRecord.from_text(text)
    assert (rec.pid if rec else None) == pid


def test_write_read_remove(tmp_path: Path) -> None:
    path = tmp_path / "run" / "x.pid"
    assert process.read_pid_file(path) is None
    rec = PidRecord(pid=os.getpid(), start_ticks=process.process_start_ticks(os.getpid()))
    process.write_pid_file(path, rec)
    assert process.read_pid_file(path) == rec
    process.remove_pid_file(path)
    process.remove_pid_file(path)  # twice is fine
    assert not path.exists()


def test_pid_alive_checks_start_time() -> None:
    me = os.getpid()
    ticks = process.process_start_ticks(me)
    assert process.pid_alive(me)
    assert process.pid_alive(me, ticks)
    if ticks is not None:  # procfs: a reused pid (other start time) is not our process
        assert not process.pid_alive(me, ticks + 1)
    assert not process.pid_alive(0)
    assert not process.pid_alive(-5)


def _dead_pid() -> int:
    pid = os.posix_spawnp("true", ["true"], dict(os.environ))
    os.waitpid(pid, 0)
    return pid


def test_dead_pid_is_not_alive() -> None:
    assert not process.pid_alive(_dead_pid())


def test_live_record_removes_stale_files(tmp_path: Path) -> None:
    stale = tmp_path / "stale.pid"
    process.write_pid_file(stale, PidRecord(pid=_dead_pid(), start_ticks=None))
    assert process.live_record(stale) is None
    assert not stale.exists()
    garbage = tmp_path / "garbage.pid"
    garbage.write_text("not a pid")
    assert process.live_record(garbage) is None
    assert not garbage.exists()
    mine = tmp_path / "mine.pid"
    rec = PidRecord(pid=os.getpid(), start_ticks=process.process_start_ticks(os.getpid()))
    process.write_pid_file(mine, rec)
    assert process.live_record(mine) == rec


def test_spawn_and_stop(tmp_path: Path) -> None:
    log = tmp_path / "logs" / "sleeper.log"
    pid_file = tmp_path / "run" / "sleeper.pid"
    rec = process.spawn(
        [sys.executable, "-c", "print('hello', flush=True); import time; time.sleep(60)"],
        log=log,
        pid_file=pid_file,
    )
    assert process.read_pid_file(pid_file) == rec
    assert process.record_alive(rec)
    assert os.getpgid(rec.pid) == rec.pid  # its own session and group
    assert process.wait_until(lambda: "hello" in log.read_text(), timeout_s=10)
    assert "===== " in log.read_text()  # the start header
    assert process.stop_record(rec, timeout_s=5)
    assert not process.record_alive(rec)
    assert not process.stop_record(rec)  # already gone


def test_stop_escalates_to_sigkill(tmp_path: Path) -> None:
    code = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print('ready', flush=True); time.sleep(60)"
    )
    log = tmp_path / "stubborn.log"
    rec = process.spawn([sys.executable, "-c", code], log=log, pid_file=tmp_path / "s.pid")
    assert process.wait_until(lambda: "ready" in log.read_text(), timeout_s=10)
    started = time.monotonic()
    assert process.stop_record(rec, timeout_s=0.5)
    assert not process.record_alive(rec)
    assert time.monotonic() - started < 8


def test_spawn_exit_code(tmp_path: Path) -> None:
    rec = process.spawn(
        [sys.executable, "-c", "raise SystemExit(3)"],
        log=tmp_path / "x.log",
        pid_file=tmp_path / "x",
    )
    assert process.wait_until(lambda: process.exit_code(rec.pid) is not None, timeout_s=10)
    assert process.exit_code(rec.pid) == 3


def test_spawn_missing_binary_is_stack_error(tmp_path: Path) -> None:
    with pytest.raises(process.StackError, match="could not run"):
        process.spawn(["/nonexistent/binary"], log=tmp_path / "x.log", pid_file=tmp_path / "x")


def test_port_open() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        assert process.port_open("127.0.0.1", port)
    assert not process.port_open("127.0.0.1", port)


def test_log_tail(tmp_path: Path) -> None:
    log = tmp_path / "a.log"
    log.write_text("".join(f"line {i}\n" for i in range(100)))
    assert process.log_tail(log, 3) == "line 97\nline 98\nline 99"
    with log.open("a") as fh:
        fh.write(f"\n{process.START_HEADER}now starting: x\nonly this\n")
    assert process.log_tail(log, 5) == f"{process.START_HEADER}now starting: x\nonly this"
    assert process.log_tail(tmp_path / "missing.log") == ""
    assert process.log_tail(None) == ""
    log.write_text("kept 1\nHeartbeat failed\n\nkept 2\nConnect to ipv4 x\n")
    assert process.log_tail(log, 5, drop=("Heartbeat", "Connect to")) == "kept 1\nkept 2"


def test_paths(tmp_path: Path) -> None:
    s = Settings(state_dir=tmp_path)
    assert process.pid_path(s, "kafka") == tmp_path / "run" / "kafka.pid"
    assert process.log_path(s, "kafka") == tmp_path / "logs" / "kafka.log"


def test_part_status_line() -> None:
    ours = PartStatus("kafka", True, (9092, 9093), pid=10, ours=True, log=Path("/s/kafka.log"))
    assert "up" in ours.line()
    assert "pid=10" in ours.line()
    assert "9092,9093" in ours.line()
    assert "started by ticketflow" in ours.line()
    other = PartStatus("redis", True, (6379,), detail="not started by ticketflow; left alone")
    assert "not started by ticketflow" in other.line()
    down = PartStatus("triton", False, (8001, 8000, 8002))
    assert down.state == "down"
    assert process.format_status([ours, other, down]).count("\n") == 2


def test_stop_takes_the_whole_process_group(tmp_path: Path) -> None:
    helper_pid = tmp_path / "helper.pid"
    code = (
        "import subprocess, sys, time; "
        "p = subprocess.Popen(['sleep', '60']); "
        f"open({str(helper_pid)!r}, 'w').write(str(p.pid)); time.sleep(60)"
    )
    rec = process.spawn(
        [sys.executable, "-c", code], log=tmp_path / "g.log", pid_file=tmp_path / "g"
    )
    assert process.wait_until(lambda: helper_pid.exists() and helper_pid.read_text(), timeout_s=10)
    helper = int(helper_pid.read_text())
    assert process.pid_alive(helper)
    assert process.stop_record(rec, timeout_s=5)
    assert process.wait_until(lambda: not process.pid_alive(helper), timeout_s=5)
