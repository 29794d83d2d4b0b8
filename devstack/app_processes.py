"""Starting the gateway and a worker as child processes, for the demo and the tests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from streams.settings import Settings


@dataclass
class Service:
    name: str
    process: subprocess.Popen
    log_path: Path

    def stop(self, timeout_s: float = 20) -> None:
        if self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(5)

    def kill(self) -> None:
        self.process.kill()
        self.process.wait(10)


def free_port() -> int:
    """A TCP port nobody listens on now (for a test's or benchmark's own worker)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def http_ok(url: str, timeout_s: float = 1.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return 200 <= resp.status < 300
    except (OSError, ValueError):
        return False


def start(
    name: str,
    args: list[str],
    settings: Settings,
    env: dict[str, str] | None = None,
    log_name: str | None = None,
) -> Service:
    logs = settings.state_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    log_path = logs / f"{log_name or name}.log"
    full_env = {**os.environ, **(env or {})}
    with log_path.open("ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "ticketflow.cli", *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=full_env,
            start_new_session=True,
        )
    return Service(name, proc, log_path)


def wait_until(check, service: Service, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        if service.process.poll() is not None:
            raise RuntimeError(
                f"{service.name} exited ({service.process.returncode}) before "
                f"{what}; see {service.log_path}"
            )
        time.sleep(0.2)
    raise TimeoutError(
        f"{service.name}: not {what} after {timeout_s:.0f} s; see {service.log_path}"
    )


def gateway_ready(settings: Settings) -> bool:
    return http_ok(settings.gateway_url.rstrip("/") + "/readyz")


def worker_ready(settings: Settings, processes: int = 1) -> bool:
    """Every process of the worker answers /ready (agents/supervisor.py's ports)."""
    from agents.supervisor import child_port

    return all(
        http_ok(f"http://127.0.0.1:{child_port(settings.worker_web_port, i)}/ready")
        for i in range(processes)
    )


def start_gateway(settings: Settings, env: dict[str, str] | None = None) -> Service:
    service = start("gateway", ["gateway"], settings, env)
    wait_until(lambda: gateway_ready(settings), service, 60, "ready")
    return service


def start_worker(
    settings: Settings,
    env: dict[str, str] | None = None,
    log_name: str = "worker",
    loglevel: str = "warning",
    steps: str | None = None,
    processes: int = 1,
) -> Service:
    """A worker of every step, or of `steps` only (the home worker's set, or a pool's), in
    `processes` processes (one by default: a test's kill or freeze then hits the worker)."""
    args = ["worker", "--loglevel", loglevel, "--processes", str(processes)]
    args += ["--steps", steps] if steps is not None else []
    service = start("worker", args, settings, env, log_name=log_name)
    wait_until(lambda: worker_ready(settings, processes), service, 90, "serving")
    return service


# ---- detached app services: the demo's gateway, feature job and worker ----------------------
#
# Like the stack's parts: started in their own session, a pid file in <state>/run/<name>.pid
# and a log in <state>/logs/<name>.log, so they outlive the command that started them and
# `ticketflow stack down` stops them. A service already answering (ours or someone else's)
# is left alone.


@dataclass(frozen=True)
class AppPart:
    name: str
    args: tuple[str, ...]
    timeout_s: float

    def ready_url(self, settings: Settings) -> str:
        if self.name == "gateway":
            return settings.gateway_url.rstrip("/") + "/readyz"
        if self.name == "ingest":
            host = settings.ingest.host if settings.ingest.host != "0.0.0.0" else "127.0.0.1"
            return f"http://{host}:{settings.ingest.port}/readyz"
        port = settings.features.web_port if self.name == "features" else settings.worker_web_port
        return f"http://127.0.0.1:{port}/ready"

    def ready(self, settings: Settings) -> bool:
        if self.name == "worker":  # one process per core by default: all of them
            from agents.supervisor import cores_available

            return worker_ready(settings, cores_available())
        return http_ok(self.ready_url(settings))


# start order: the worker needs the gateway; `stop_detached` goes the other way. Ingest too,
# so that the demo's Prometheus sees every service up (IngestDown fires otherwise)
APP_PARTS: tuple[AppPart, ...] = (
    AppPart("gateway", ("gateway",), 60),
    AppPart("ingest", ("ingest",), 60),
    AppPart("features", ("features", "run", "--loglevel", "warning"), 120),
    # a process per core (`--processes`' default), each a member of the one consumer group
    AppPart("worker", ("worker", "--loglevel", "warning"), 120),
)


def _part(name: str) -> AppPart:
    return next(p for p in APP_PARTS if p.name == name)


def start_detached(settings: Settings, name: str) -> str:
    """Start an app service detached unless it answers; wait until ready. Says what it did."""
    from devstack import process

    part = _part(name)
    if part.ready(settings):
        return f"{name}: already running"
    pid_file = process.pid_path(settings, name)
    with process.stack_lock(settings):
        record = process.live_record(pid_file)
        if record is None:
            argv = [sys.executable, "-m", "ticketflow.cli", *part.args]
            log = process.log_path(settings, name)
            record = process.spawn(argv, log=log, pid_file=pid_file, env=dict(os.environ))
    _await_detached(settings, part, record)
    return f"{name}: started, pid {record.pid}"


def _await_detached(settings: Settings, part: AppPart, record) -> None:
    from devstack import process

    log = process.log_path(settings, part.name)
    deadline = time.monotonic() + part.timeout_s
    while not part.ready(settings):
        if not process.record_alive(record):
            process.remove_pid_file(process.pid_path(settings, part.name))
            raise RuntimeError(f"{part.name} exited during start-up; see {log}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{part.name}: not ready after {part.timeout_s:.0f} s; see {log}")
        time.sleep(0.25)


def stop_detached(settings: Settings, timeout_s: float = 30) -> list[str]:
    """Stop the app services this module started (their pid files); returns their names."""
    from devstack import process

    stopped = []
    with process.stack_lock(settings):
        for part in reversed(APP_PARTS):
            pid_file = process.pid_path(settings, part.name)
            record = process.live_record(pid_file)
            if record is not None and process.stop_record(record, timeout_s=timeout_s):
                stopped.append(part.name)
            process.remove_pid_file(pid_file)
    return stopped


def detached_status(settings: Settings) -> list:
    """A PartStatus per app service that runs detached or answers (none when neither)."""
    from devstack import process

    out = []
    for part in APP_PARTS:
        pid_file = process.pid_path(settings, part.name)
        record = process.live_record(pid_file)
        healthy = part.ready(settings)
        if record is None and not healthy:
            continue
        port = int(part.ready_url(settings).rsplit(":", 1)[1].split("/", 1)[0])
        out.append(
            process.PartStatus(
                name=part.name,
                healthy=healthy,
                ports=(port,),
                pid=None if record is None else record.pid,
                ours=record is not None,
                log=process.log_path(settings, part.name) if record is not None else None,
                detail="" if healthy else "process runs but is not ready",
            )
        )
    return out
