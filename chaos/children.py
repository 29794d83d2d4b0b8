"""The campaign's child processes: its gateway and each round's workers, started, killed,
frozen and restarted with the campaign's settings."""

from __future__ import annotations

import signal
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from devstack import app_processes
from streams.settings import Settings


def child_env(s: Settings) -> dict[str, str]:
    """The settings a worker or gateway child must share with the campaign."""
    env = {
        "TICKETFLOW_KAFKA_BOOTSTRAP": s.kafka_bootstrap,
        "TICKETFLOW_TOPIC_PREFIX": s.topic_prefix,
        "TICKETFLOW_PARTITIONS": str(s.partitions),
        "TICKETFLOW_REDIS_URL": s.redis_url.get_secret_value(),
        "TICKETFLOW_TRITON_GRPC": s.triton_grpc,
        "TICKETFLOW_GATEWAY_URL": s.gateway_url,
        "TICKETFLOW_STATE_DIR": str(s.state_dir),
        "TICKETFLOW_WORKER_WEB_PORT": str(s.worker_web_port),
    }
    if s.redis_ca_file:
        env["TICKETFLOW_REDIS_CA_FILE"] = str(s.redis_ca_file)
    if s.worker_id:
        env["TICKETFLOW_WORKER_ID"] = s.worker_id
    return env


@dataclass
class Child:
    """A worker or the gateway: a process of the campaign's own, killed, frozen, restarted."""

    name: str
    settings: Settings
    args: list[str]
    ready: Callable[[], bool]
    service: app_processes.Service | None = None
    down: bool = False  # killed by us and not started again yet

    def spawn(self) -> None:
        env = child_env(self.settings)
        self.service = app_processes.start(self.name, self.args, self.settings, env, self.name)
        self.down = False

    def await_ready(self, timeout_s: float) -> None:
        assert self.service is not None
        app_processes.wait_until(self.ready, self.service, timeout_s, "ready")

    def kill(self) -> None:
        self.down = True
        if self.service is not None:
            self.service.kill()

    def signal(self, sig: int) -> None:
        if self.service is not None and self.service.process.poll() is None:
            self.service.process.send_signal(sig)

    def exit_code(self) -> int | None:
        """The exit code of a process that ended without our kill; None while it runs."""
        if self.down or self.service is None:
            return None
        return self.service.process.poll()

    def stop(self) -> None:
        self.signal(signal.SIGCONT)  # a frozen process must wake to see its SIGTERM
        if self.service is not None:
            self.service.stop()


def spawn_all(children: Sequence[Child], timeout_s: float) -> None:
    """Start side by side, then wait for each: a restart of all is one start-up, not N."""
    for child in children:
        child.spawn()
    for child in children:
        child.await_ready(timeout_s)
