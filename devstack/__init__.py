"""The local stack: Kafka (KRaft, one node), Redis, Triton and Prometheus, as detached processes.

    up(settings, parts=None)        start what is not healthy yet (idempotent)
    down(settings, parts=None)      stop what `up` started; leaves anything else alone
    status(settings)                one PartStatus per part
    start_part / stop_part          one part, e.g. to restart the broker in a fault test

Everything lives in `settings.state_dir`: pid files in `run/`, logs in `logs/`, the Kafka jars,
configuration and data in `kafka/`, Redis's data in `redis/`, Prometheus's configuration and
data in `prometheus/`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType

from streams.settings import Settings

from . import kafka, kafka_secure, prometheus, redis_secure, redis_server, triton
from .process import (
    PartStatus,
    PidRecord,
    StackError,
    exit_code,
    format_status,
    live_record,
    log_tail,
    pid_path,
    port_open,
    record_alive,
    remove_pid_file,
    signal_record,
    spawn,
    stack_lock,
    stop_record,
)

__all__ = [
    "PARTS",
    "SECURE_PARTS",
    "PartStatus",
    "StackError",
    "down",
    "format_status",
    "part_status",
    "signal_part",
    "start_part",
    "status",
    "stop_part",
    "up",
]

# start order; `down` goes the other way
# (Prometheus last: it scrapes the others, and `down` stops it first)
PARTS: tuple[str, ...] = ("kafka", "redis", "triton", "prometheus")
# `stack up --secure`: the SASL_SSL broker (docs/security.md) instead of the plain one; both
# may run side by side, on their own ports and folders
# and the TLS-only Redis with ACL users (redis_secure.py) beside the plain one
SECURE_PARTS: tuple[str, ...] = ("kafka-secure", "redis", "redis-secure", "triton")
_ORDER: tuple[str, ...] = (
    "kafka",
    "kafka-secure",
    "redis",
    "redis-secure",
    "triton",
    "prometheus",
)
_MODULES: dict[str, ModuleType] = {
    "kafka": kafka,
    "kafka-secure": kafka_secure,
    "redis": redis_server,
    "redis-secure": redis_secure,
    "triton": triton,
    "prometheus": prometheus,
}

log = logging.getLogger("devstack")


def _module(name: str) -> ModuleType:
    try:
        return _MODULES[name]
    except KeyError:
        raise StackError(f"unknown stack part {name!r}; parts are {', '.join(_ORDER)}") from None


def _select(parts: Iterable[str] | None) -> list[str]:
    if parts is None:
        return list(PARTS)
    wanted = {p.strip().lower() for p in parts if p.strip()}
    for name in wanted:
        _module(name)
    return [p for p in _ORDER if p in wanted]


# --- status ----------------------------------------------------------------------------------


def part_status(settings: Settings, name: str) -> PartStatus:
    mod = _module(name)
    record = live_record(pid_path(settings, name))
    healthy = bool(mod.healthy(settings))
    detail = ""
    if record is not None and not healthy:
        detail = "process runs but does not answer"
    elif record is None and healthy:
        detail = "not started by ticketflow; left alone"
    return PartStatus(
        name=name,
        healthy=healthy,
        ports=tuple(mod.ports(settings)),
        pid=None if record is None else record.pid,
        ours=record is not None,
        log=mod.log_file(settings),
        detail=detail,
    )


def status(settings: Settings, *, secure: bool = False) -> list[PartStatus]:
    return [part_status(settings, name) for name in (SECURE_PARTS if secure else PARTS)]


# --- starting --------------------------------------------------------------------------------


def _busy_ports(settings: Settings, mod: ModuleType) -> list[int]:
    hosts = {mod.host(settings), "127.0.0.1"}
    return [p for p in mod.ports(settings) if any(port_open(h, p, 0.3) for h in hosts)]


def _launch(settings: Settings, name: str) -> PidRecord | None:
    """Start the part unless it is healthy; returns the record of the process to wait for."""
    mod = _module(name)
    pid_file = pid_path(settings, name)
    record = live_record(pid_file)
    if mod.healthy(settings):
        if record is not None:
            log.info("%s: already up (pid %d, started by ticketflow)", name, record.pid)
            refresh = getattr(mod, "refresh", None)
            if refresh is not None:  # Prometheus: read edited rules again
                refresh(settings)
        else:
            log.info("%s: already up, not started by ticketflow; leaving it alone", name)
        return None
    if record is not None:
        log.info("%s: pid %d (ours) runs but is not healthy yet; waiting for it", name, record.pid)
        return record
    busy = _busy_ports(settings, mod)
    if busy:
        raise StackError(
            f"{name}: port(s) {', '.join(map(str, busy))} are taken by something that is not a "
            f"healthy {name} and not started by ticketflow; stop it or change the TICKETFLOW_* "
            "settings"
        )
    mod.prepare(settings)
    argv, env = mod.command(settings)
    record = spawn(
        argv,
        log=mod.log_file(settings),
        pid_file=pid_file,
        env=env,
    )
    log.info("%s: started pid %d (log: %s)", name, record.pid, mod.log_file(settings))
    return record


def _await(settings: Settings, name: str, record: PidRecord, timeout_s: float) -> None:
    mod = _module(name)
    started = time.monotonic()
    deadline = started + timeout_s
    logfile = mod.log_file(settings)
    while not mod.healthy(settings):
        if not record_alive(record):
            rc = exit_code(record.pid)
            remove_pid_file(pid_path(settings, name))
            raise StackError(
                f"{name} exited during start-up (rc={rc}); see {logfile}:\n" + log_tail(logfile, 25)
            )
        if time.monotonic() >= deadline:
            stop_record(record, timeout_s=mod.STOP_TIMEOUT_S)
            remove_pid_file(pid_path(settings, name))
            raise StackError(
                f"{name} did not become healthy within {timeout_s:.0f}s (stopped it); "
                f"see {logfile}:\n" + log_tail(logfile, 25)
            )
        time.sleep(0.25)
    mod.after_start(settings, max(1.0, deadline - time.monotonic()))
    log.info("%s: up in %.1fs", name, time.monotonic() - started)


def _ensure_dirs(settings: Settings) -> None:
    root = Path(settings.state_dir)
    for sub in ("run", "logs"):
        (root / sub).mkdir(parents=True, exist_ok=True)


def up(
    settings: Settings, parts: Iterable[str] | None = None, *, timeout_s: float | None = None
) -> None:
    """Bring the parts (default: all) up; a healthy part, ours or not, is left as it is.

    All parts are launched first and then waited for, so they boot side by side. Raises
    StackError naming the log file of every part that failed.
    """
    names = _select(parts)
    _ensure_dirs(settings)
    errors: list[str] = []
    with stack_lock(settings):
        launched: dict[str, PidRecord] = {}
        for name in names:
            try:
                record = _launch(settings, name)
            except StackError as exc:
                errors.append(str(exc))
                continue
            if record is not None:
                launched[name] = record
        for name, record in launched.items():
            budget = timeout_s if timeout_s is not None else _module(name).DEFAULT_TIMEOUT_S
            try:
                _await(settings, name, record, budget)
            except StackError as exc:
                errors.append(str(exc))
    if errors:
        raise StackError("\n\n".join(errors))


def start_part(settings: Settings, name: str, *, timeout_s: float | None = None) -> PartStatus:
    """Start one part (no-op when healthy) and wait until it is; returns its status."""
    up(settings, [name], timeout_s=timeout_s)
    return part_status(settings, name)


# --- stopping --------------------------------------------------------------------------------


def stop_part(
    settings: Settings, name: str, *, timeout_s: float | None = None, kill: bool = False
) -> bool:
    """Stop one part if `up` started it: SIGTERM (SIGKILL when `kill`), wait, then SIGKILL.

    Returns True when a process was stopped; False when none of ours was running (a part
    started by someone else is never touched).
    """
    mod = _module(name)
    _ensure_dirs(settings)
    with stack_lock(settings):
        pid_file = pid_path(settings, name)
        record = live_record(pid_file)
        if record is None:
            if mod.healthy(settings):
                log.info("%s: not started by ticketflow; leaving it running", name)
            return False
        wait = timeout_s if timeout_s is not None else mod.STOP_TIMEOUT_S
        started = time.monotonic()
        stopped = stop_record(record, timeout_s=wait, kill=kill)
        remove_pid_file(pid_file)
        after_stop = getattr(mod, "after_stop", None)
        if after_stop is not None:
            after_stop(settings)
        if stopped:
            log.info("%s: stopped pid %d in %.1fs", name, record.pid, time.monotonic() - started)
        return stopped


def signal_part(settings: Settings, name: str, sig: int) -> bool:
    """Send a signal (SIGSTOP/SIGCONT to freeze and thaw, ...) to a part `up` started."""
    record = live_record(pid_path(settings, _module(name).NAME))
    return record is not None and signal_record(record, sig)


def down(
    settings: Settings, parts: Iterable[str] | None = None, *, timeout_s: float | None = None
) -> list[str]:
    """Stop the parts (default: all, the secured broker too) that `up` started, in reverse
    order; returns their names."""
    stopped = []
    for name in reversed(_select(parts) if parts is not None else list(_ORDER)):
        if stop_part(settings, name, timeout_s=timeout_s):
            stopped.append(name)
    return stopped
