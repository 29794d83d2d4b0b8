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


def worker_ready(settings: Settings) -> bool:
    return http_ok(f"http://127.0.0.1:{settings.worker_web_port}/ready")


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
) -> Service:
    """A worker of every step, or of `steps` only (the home worker's set, or a pool's)."""
    args = ["worker", "--loglevel", loglevel, *(["--steps", steps] if steps is not None else [])]
    service = start("worker", args, settings, env, log_name=log_name)
    wait_until(lambda: worker_ready(settings), service, 90, "serving")
    return service
