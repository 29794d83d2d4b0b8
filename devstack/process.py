"""Process bookkeeping for the local stack: pid files, detached starts, stops, probes.

A part the stack starts gets a pid file `<state>/run/<part>.pid` (JSON: pid, the process's
start time in clock ticks, argv, log file). The start time guards against pid reuse: a pid file
whose pid now belongs to another process counts as stale. Only processes with a live pid file are
ever signalled, so something started by someone else is never stopped.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shlex
import signal
import socket
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from streams.settings import Settings


class StackError(RuntimeError):
    """A part of the local stack could not be prepared, started or stopped."""


@dataclass(frozen=True)
class PartStatus:
    name: str
    healthy: bool
    ports: tuple[int, ...]
    pid: int | None = None
    # True when `up` started it (a live pid file of ours); False for a healthy part run elsewhere
    ours: bool = False
    log: Path | None = None
    detail: str = ""

    @property
    def state(self) -> str:
        return "up" if self.healthy else "down"

    def line(self) -> str:
        ports = ",".join(str(p) for p in self.ports)
        if self.pid is not None:
            owner = "started by ticketflow" if self.ours else "not ours"
        else:
            owner = "not started by ticketflow" if self.healthy else "-"
        pid = str(self.pid) if self.pid is not None else "-"
        text = f"{self.name:<7} {self.state:<5} pid={pid:<8} port={ports:<16} {owner}"
        if self.detail:
            text += f"  ({self.detail})"
        if self.log is not None and self.ours:
            text += f"  log={self.log}"
        return text


def format_status(statuses: Sequence[PartStatus]) -> str:
    return "\n".join(s.line() for s in statuses)


# --- paths -----------------------------------------------------------------------------------


def run_dir(settings: Settings) -> Path:
    return Path(settings.state_dir) / "run"


def logs_dir(settings: Settings) -> Path:
    return Path(settings.state_dir) / "logs"


def pid_path(settings: Settings, part: str) -> Path:
    return run_dir(settings) / f"{part}.pid"


def log_path(settings: Settings, part: str) -> Path:
    return logs_dir(settings) / f"{part}.log"


@contextlib.contextmanager
def stack_lock(settings: Settings) -> Iterator[None]:
    """Serialises `up`/`down`/start/stop between processes (an advisory flock)."""
    path = run_dir(settings) / "stack.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


# --- pid files -------------------------------------------------------------------------------


@dataclass(frozen=True)
class PidRecord:
    pid: int
    start_ticks: int | None
    argv: list[str] = field(default_factory=list)
    log: str | None = None
    started_at: str = ""

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    @classmethod
    def from_text(cls, text: str) -> PidRecord | None:
        text = text.strip()
        if not text:
            return None
        if text[0] != "{":  # a bare pid (e.g. written by hand or by a daemon's --pidfile)
            try:
                return cls(pid=int(text.split()[0]), start_ticks=None)
            except ValueError:
                return None
        try:
            data = json.loads(text)
            return cls(
                pid=int(data["pid"]),
                start_ticks=None if data.get("start_ticks") is None else int(data["start_ticks"]),
                argv=[str(a) for a in data.get("argv", [])],
                log=data.get("log"),
                started_at=str(data.get("started_at", "")),
            )
        except (ValueError, KeyError, TypeError):
            return None


def read_pid_file(path: Path) -> PidRecord | None:
    try:
        return PidRecord.from_text(path.read_text())
    except (FileNotFoundError, NotADirectoryError):
        return None


def write_pid_file(path: Path, record: PidRecord) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(record.to_json())
    tmp.replace(path)


def remove_pid_file(path: Path) -> None:
    path.unlink(missing_ok=True)


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """(state letter, start time in clock ticks) from /proc, or None when unavailable."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # the command name (field 2) may contain spaces and parentheses: split after the last ')'
    rest = raw[raw.rfind(")") + 2 :].split()
    try:
        return rest[0], int(rest[19])
    except (IndexError, ValueError):
        return None


def process_start_ticks(pid: int) -> int | None:
    stat = _proc_stat(pid)
    return None if stat is None else stat[1]


# exit codes of children of this interpreter, collected by _reap
_EXIT_CODES: dict[int, int] = {}


def _reap(pid: int) -> bool:
    """Collect our own exited child so it does not linger as a zombie; keep its exit code.

    True when there is nothing (more) to wait for: reaped now or before, or not our child.
    """
    try:
        done, status = os.waitpid(pid, os.WNOHANG)
    except (ChildProcessError, OSError):
        return True
    if done == pid:
        _EXIT_CODES[pid] = os.waitstatus_to_exitcode(status)
        return True
    return False


def pid_alive(pid: int, start_ticks: int | None = None) -> bool:
    """True when `pid` runs (not a zombie) and, if given, started at `start_ticks`."""
    if pid <= 0:
        return False
    _reap(pid)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, owned by someone else
    stat = _proc_stat(pid)
    if stat is None:
        return not Path("/proc/self/stat").exists()  # no procfs: trust kill(0)
    state, ticks = stat
    if state in ("Z", "X"):
        return False
    return start_ticks is None or ticks == start_ticks


def record_alive(record: PidRecord | None) -> bool:
    return record is not None and pid_alive(record.pid, record.start_ticks)


def live_record(path: Path) -> PidRecord | None:
    """The pid file's record when its process still runs; a stale file is removed."""
    record = read_pid_file(path)
    if record is None:
        if path.exists():
            remove_pid_file(path)
        return None
    if record_alive(record):
        return record
    remove_pid_file(path)
    return None


# --- starting and stopping -------------------------------------------------------------------


START_HEADER = "===== "


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def spawn(
    argv: Sequence[str],
    *,
    log: Path,
    pid_file: Path,
    env: Mapping[str, str] | None = None,
) -> PidRecord:
    """Start `argv` detached (own session, stdin /dev/null), stdout+stderr appended to `log`.

    posix_spawn rather than subprocess.Popen: the child is meant to outlive us, and a Popen
    object would warn about it (ResourceWarning) when collected.
    """
    if not argv:
        raise StackError("empty command")
    log.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, f"\n{START_HEADER}{_now()} starting: {shlex.join(argv)}\n".encode())
        try:
            pid = os.posix_spawnp(
                argv[0],
                list(argv),
                dict(os.environ if env is None else env),
                file_actions=[
                    (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                    (os.POSIX_SPAWN_DUP2, fd, 1),
                    (os.POSIX_SPAWN_DUP2, fd, 2),
                ],
                setsid=True,
            )
        except OSError as exc:
            raise StackError(f"could not run {argv[0]}: {exc}") from exc
    finally:
        os.close(fd)
    record = PidRecord(
        pid=pid,
        start_ticks=process_start_ticks(pid),
        argv=list(argv),
        log=str(log),
        started_at=_now(),
    )
    write_pid_file(pid_file, record)
    return record


def exit_code(pid: int) -> int | None:
    """The exit code of a child this interpreter spawned, once it has exited and been reaped."""
    _reap(pid)
    return _EXIT_CODES.get(pid)


def _signal_group(pid: int, sig: int) -> None:
    """Signal the process group we created for `pid` (it leads its own session), else `pid`."""
    try:
        if os.getpgid(pid) == pid:
            os.killpg(pid, sig)
            return
    except (ProcessLookupError, PermissionError):
        pass
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    # killpg(0) also succeeds for zombies; look for a member that still runs
    for stat_file in Path("/proc").glob("[0-9]*/stat"):
        try:
            raw = stat_file.read_text()
        except OSError:
            continue
        rest = raw[raw.rfind(")") + 2 :].split()
        if len(rest) > 2 and rest[2] == str(pgid) and rest[0] not in ("Z", "X"):
            return True
    return False


def stop_record(record: PidRecord, *, timeout_s: float = 30.0, kill: bool = False) -> bool:
    """SIGTERM the process (SIGKILL its group when `kill`), wait, then SIGKILL the group.

    Returns True when a live process was signalled.
    """
    if not record_alive(record):
        return False
    pid = record.pid
    try:
        leads_group = os.getpgid(pid) == pid
    except ProcessLookupError:
        return False
    if kill:
        _signal_group(pid, signal.SIGKILL)
    else:
        # SIGTERM to the server alone: it shuts its helpers down itself (Triton unloads its
        # models through the backend stubs), and whatever is left of the group is killed below
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        _signal_group(pid, signal.SIGCONT)  # a process frozen with SIGSTOP must see the SIGTERM
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and pid_alive(pid, record.start_ticks):
        time.sleep(0.1)
    if pid_alive(pid, record.start_ticks):
        _signal_group(pid, signal.SIGKILL)
        wait_until(lambda: not pid_alive(pid, record.start_ticks), timeout_s=10.0)
    # children left in the group (e.g. Triton backend stubs) go too
    if leads_group and _group_alive(pid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
    # a multi-threaded process shows as a zombie before all its threads are gone, and only
    # then can be reaped
    wait_until(lambda: _reap(pid), timeout_s=5.0, interval_s=0.05)
    return True


def signal_record(record: PidRecord, sig: int) -> bool:
    """Send `sig` (e.g. SIGSTOP/SIGCONT for fault tests) to a live recorded process."""
    if not record_alive(record):
        return False
    _signal_group(record.pid, sig)
    return True


# --- probes ----------------------------------------------------------------------------------


def port_open(host: str, port: int, timeout_s: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def wait_until(predicate: Callable[[], bool], *, timeout_s: float, interval_s: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout_s
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval_s)


def log_tail(
    path: Path | None, lines: int = 25, max_bytes: int = 64 * 1024, drop: Sequence[str] = ()
) -> str:
    """The last `lines` lines of a log file's latest run ("" when unreadable), leaving out
    blank lines and those that contain any of `drop`."""
    if path is None:
        return ""
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - max_bytes))
            data = fh.read()
    except OSError:
        return ""
    text = data.decode(errors="replace").rstrip("\n").splitlines()
    # only the latest run: from the last start header that spawn() wrote
    starts = [i for i, line in enumerate(text) if line.startswith(START_HEADER)]
    if starts:
        text = text[starts[-1] :]
    if drop:
        text = [line for line in text if line.strip() and not any(d in line for d in drop)]
    return "\n".join(text[-lines:])
