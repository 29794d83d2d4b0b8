"""Triton Inference Server serving `inference_gateway/model_repository`.

How to run `tritonserver` (binary, flags, environment) belongs to `inference_gateway.triton_server`;
this module only prepares the model, starts it detached and watches it. That module is imported
lazily, so Kafka and Redis work without it.

The server runs under explicit model control: every version on disk loads at start, and
`ticketflow model deploy|retire` load and unload versions later without a restart.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import ModuleType

from streams.settings import REPO_ROOT, Settings

from .process import StackError, log_path, log_tail, logs_dir

NAME = "triton"
DEFAULT_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 30.0
MODEL_NAME = "ticket_classifier"
TRITON_SERVER_MODULE = "inference_gateway.triton_server"
TRAIN_MODULE = "training.train"

log = logging.getLogger("devstack")


def model_repository() -> Path:
    return REPO_ROOT / "inference_gateway" / "model_repository"


def weights_path() -> Path:
    return model_repository() / MODEL_NAME / "1" / "weights.npz"


def ports(settings: Settings) -> tuple[int, ...]:
    return (
        settings.triton_grpc_host_port[1],
        settings.triton_http_port,
        settings.triton_metrics_port,
    )


def host(settings: Settings) -> str:
    host = settings.triton_grpc_host_port[0]
    return "127.0.0.1" if host in ("0.0.0.0", "") else host


def server_module() -> ModuleType:
    try:
        return importlib.import_module(TRITON_SERVER_MODULE)
    except ImportError as exc:
        raise StackError(
            f"cannot start Triton: {TRITON_SERVER_MODULE} is not importable ({exc})"
        ) from exc


def ensure_model(settings: Settings) -> None:
    """Build the models (idempotent: under a second when every version is up to date).

    Always run, not only when v1's weights are missing: a stale checkout would otherwise
    start Triton without a version that its sources now define.
    """
    train_log = logs_dir(settings) / "model-train.log"
    train_log.parent.mkdir(parents=True, exist_ok=True)
    log.info("triton: building the models (`python -m %s`)", TRAIN_MODULE)
    with train_log.open("ab") as fh:
        rc = subprocess.run(
            [sys.executable, "-m", TRAIN_MODULE],
            cwd=REPO_ROOT,
            stdin=subprocess.DEVNULL,
            stdout=fh,
            stderr=subprocess.STDOUT,
            check=False,
        ).returncode
    if rc != 0 or not weights_path().exists():
        raise StackError(
            f"`python -m {TRAIN_MODULE}` failed (rc={rc}); see {train_log}:\n"
            + log_tail(train_log, 15)
        )


def prepare(settings: Settings) -> None:
    server_module()
    ensure_model(settings)


def command(settings: Settings) -> tuple[list[str], dict[str, str] | None]:
    mod = server_module()
    argv = list(
        mod.tritonserver_command(
            model_repository(),
            settings.triton_grpc_host_port[1],
            settings.triton_http_port,
            settings.triton_metrics_port,
        )
    )
    env = {**os.environ, **{str(k): str(v) for k, v in dict(mod.tritonserver_env()).items()}}
    return argv, env


def log_file(settings: Settings) -> Path:
    return log_path(settings, NAME)


def healthy(settings: Settings, timeout_s: float = 2.0) -> bool:
    """True when the server is ready and so is the ticket classifier (HTTP health API)."""
    base = f"http://{host(settings)}:{settings.triton_http_port}/v2"
    for url in (f"{base}/health/ready", f"{base}/models/{MODEL_NAME}/ready"):
        try:
            with urllib.request.urlopen(url, timeout=timeout_s) as resp:
                if resp.status != 200:
                    return False
        except (urllib.error.URLError, OSError, ValueError):
            return False
    return True


def after_stop(settings: Settings) -> None:
    """Remove the Python backend's shared-memory regions a killed server leaves behind.

    The regions are named `ticketflow_<grpc port>_*` (the shm-region-prefix-name that
    inference_gateway.triton_server passes); the server on that port was ours and is gone.
    """
    shm = Path("/dev/shm")
    for region in shm.glob(f"ticketflow_{settings.triton_grpc_host_port[1]}_*"):
        with contextlib.suppress(OSError):
            region.unlink()


def after_start(settings: Settings, timeout_s: float) -> None:
    """The gateway's own readiness check over gRPC, as the clients will connect."""
    mod = server_module()
    start = time.monotonic()
    grpc_url = f"{host(settings)}:{settings.triton_grpc_host_port[1]}"
    try:
        ready = mod.wait_ready(grpc_url, MODEL_NAME, max(5.0, timeout_s))
    except Exception as exc:
        raise StackError(f"Triton is not ready on gRPC {grpc_url}: {exc}") from exc
    if ready is False:
        raise StackError(
            f"Triton did not become ready on gRPC {grpc_url} within {time.monotonic() - start:.0f}s"
        )
