"""Prometheus, scraping every local service and evaluating deploy/alerts/*.rules.yml.

Debian's `prometheus` binary, run detached like the other parts; its configuration is
generated into `<state>/prometheus/prometheus.yml` from the settings' ports (so a
TICKETFLOW_* port change is followed), its data lives in `<state>/prometheus/data`.

Each service job has a static target on its default port and a file_sd folder,
`<state>/prometheus/targets/`: a worker or gateway on another port (a test's, a second
worker) is scraped once `register_target` has written a file there, and forgotten when
`unregister_target` removes it. Prometheus watches that folder, so no reload is needed.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlparse

import yaml

from streams.settings import REPO_ROOT, Settings

from .process import StackError, log_path

NAME = "prometheus"
DEFAULT_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 20.0
APT_INSTALL = "apt-get update && apt-get install -y prometheus"
# short, so that a fault fires its alert (for: 30 s to 1 m) well within two minutes
SCRAPE_INTERVAL = "5s"
EVALUATION_INTERVAL = "5s"
RETENTION = "2d"
RULES_DIR = REPO_ROOT / "deploy" / "alerts"
# the services each get a job; the stack's own parts (Triton, Prometheus) are static only
SERVICE_JOBS: tuple[str, ...] = ("gateway", "worker", "features", "ingest")
_SAFE_NAME = re.compile(r"^[A-Za-z0-9._-]{1,100}$")

log = logging.getLogger("devstack")


def prometheus_dir(settings: Settings) -> Path:
    return Path(settings.state_dir) / "prometheus"


def config_path(settings: Settings) -> Path:
    return prometheus_dir(settings) / "prometheus.yml"


def targets_dir(settings: Settings) -> Path:
    return prometheus_dir(settings) / "targets"


def host(settings: Settings) -> str:
    return "127.0.0.1"


def ports(settings: Settings) -> tuple[int, ...]:
    return (settings.prometheus_port,)


def base_url(settings: Settings) -> str:
    return f"http://127.0.0.1:{settings.prometheus_port}"


def find_prometheus() -> str | None:
    found = shutil.which("prometheus")
    if found:
        return found
    candidate = "/usr/bin/prometheus"
    return candidate if os.access(candidate, os.X_OK) else None


# --- configuration ---------------------------------------------------------------------------


def _loopback(hostname: str | None) -> str:
    # a service bound to every interface is scraped on loopback
    return "127.0.0.1" if hostname in (None, "", "0.0.0.0") else hostname


def default_targets(settings: Settings) -> dict[str, str]:
    """host:port of each job on the settings' ports (where `ticketflow <service>` listens)."""
    triton_host = _loopback(settings.triton_grpc_host_port[0])
    gateway_host, gateway_port = settings.gateway_host_port
    ingest = urlparse(f"http://{settings.ingest.host}:{settings.ingest.port}")
    return {
        "prometheus": f"127.0.0.1:{settings.prometheus_port}",
        "triton": f"{triton_host}:{settings.triton_metrics_port}",
        "gateway": f"{_loopback(gateway_host)}:{gateway_port}",
        "worker": f"127.0.0.1:{settings.worker_web_port or 6066}",
        "features": f"127.0.0.1:{settings.features.web_port}",
        "ingest": f"{_loopback(ingest.hostname)}:{ingest.port}",
    }


def rule_files() -> list[str]:
    return [str(RULES_DIR / "*.rules.yml")]


def config(settings: Settings) -> dict:
    """The local scrape configuration, as a dict (written as YAML by `write_config`)."""
    jobs = []
    for job, target in default_targets(settings).items():
        entry: dict = {"job_name": job, "static_configs": [{"targets": [target]}]}
        if job in SERVICE_JOBS:
            pattern = str(targets_dir(settings) / f"{job}--*.json")
            entry["file_sd_configs"] = [{"files": [pattern], "refresh_interval": "5s"}]
        jobs.append(entry)
    return {
        "global": {
            "scrape_interval": SCRAPE_INTERVAL,
            "scrape_timeout": "4s",
            "evaluation_interval": EVALUATION_INTERVAL,
            "external_labels": {"deployment": "local"},
        },
        "rule_files": rule_files(),
        "scrape_configs": jobs,
    }


def write_config(settings: Settings) -> bool:
    """Write the configuration; True when it changed (a running server needs a reload)."""
    path = config_path(settings)
    text = yaml.safe_dump(config(settings), sort_keys=False)
    if path.exists() and path.read_text() == text:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(path)
    return True


def reload(settings: Settings, timeout_s: float = 5.0) -> bool:
    """Ask a running server to read its configuration and rules again."""
    request = urllib.request.Request(base_url(settings) + "/-/reload", method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError):
        return False


# --- extra targets (file_sd) -----------------------------------------------------------------


def register_target(settings: Settings, job: str, address: str, name: str) -> Path:
    """Have Prometheus scrape `address` (host:port) as one more instance of `job`."""
    if job not in SERVICE_JOBS:
        raise ValueError(f"job must be one of {', '.join(SERVICE_JOBS)}")
    if not _SAFE_NAME.match(name):
        raise ValueError("name must be 1-100 characters of [A-Za-z0-9._-]")
    path = targets_dir(settings) / f"{job}--{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")  # not matched by the *.json pattern
    # no extra labels: the same address as a static target is then the same target, once
    tmp.write_text(json.dumps([{"targets": [address]}]))
    tmp.replace(path)
    return path


def unregister_target(path: Path) -> None:
    path.unlink(missing_ok=True)


# --- the stack part interface ----------------------------------------------------------------


def prepare(settings: Settings) -> None:
    (prometheus_dir(settings) / "data").mkdir(parents=True, exist_ok=True)
    targets_dir(settings).mkdir(parents=True, exist_ok=True)
    write_config(settings)


def server_args(settings: Settings, binary: str = "prometheus") -> list[str]:
    return [
        binary,
        f"--config.file={config_path(settings)}",
        f"--storage.tsdb.path={prometheus_dir(settings) / 'data'}",
        f"--storage.tsdb.retention.time={RETENTION}",
        f"--web.listen-address=127.0.0.1:{settings.prometheus_port}",
        # POST /-/reload after `write_config` changed the file
        "--web.enable-lifecycle",
    ]


def command(settings: Settings) -> tuple[list[str], dict[str, str] | None]:
    binary = find_prometheus()
    if binary is None:
        raise StackError(
            f"prometheus is not installed; `make setup` installs it, or `{APT_INSTALL}`; "
            "`ticketflow stack up --no-prometheus` starts the stack without it"
        )
    return server_args(settings, binary), None


def log_file(settings: Settings) -> Path:
    return log_path(settings, NAME)


def healthy(settings: Settings, timeout_s: float = 1.0) -> bool:
    try:
        with urllib.request.urlopen(base_url(settings) + "/-/ready", timeout=timeout_s) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def after_start(settings: Settings, timeout_s: float) -> None:
    return None


def refresh(settings: Settings) -> None:
    """Have a running server (ours) read the rules files again, on `stack up`.

    The configuration is not rewritten here: a test session's `stack up` runs with a port of
    its own for its worker, and must not take the default worker's target away. Its worker is
    a registered target instead; a changed port is followed on the next start.
    """
    if not reload(settings):
        # Prometheus keeps the rules it had: a broken edit must not go unnoticed
        log.warning(
            "prometheus: reloading the rules failed; `promtool check rules %s/*.rules.yml`",
            RULES_DIR,
        )
