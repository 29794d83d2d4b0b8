"""CPU used by the local Triton, for `ticketflow eval models`: /proc and Triton's metrics.

Triton's Python backend runs each model version in a stub process of its own, child of
`tritonserver`: the CPU of a version is its stub's. Other callers may use the same Triton
during a measurement, so besides the raw CPU the counters of inferences per version
(`nv_inference_count`) are read: CPU per inference = the stub's CPU / all its inferences,
which others' traffic does not bias (beyond their texts' lengths).
"""

from __future__ import annotations

import os
import re
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

PROC = Path("/proc")
TICKS = os.sysconf("SC_CLK_TCK")
# the stub's command line names the model file: .../ticket_classifier/<n>/model.py
_STUB_VERSION = re.compile(r"/([A-Za-z0-9_.-]+)/(\d+)/model\.py")
_COUNT = re.compile(r'^nv_inference_count\{model="([^"]+)",version="(\d+)"\} (\S+)$', re.M)


@dataclass
class Sample:
    """CPU seconds of Triton's processes and inference counts, at one moment."""

    server_s: float = 0.0  # tritonserver itself (gRPC, scheduling)
    stubs_s: dict[str, float] = field(default_factory=dict)  # "v1" -> the stub's CPU
    inferences: dict[str, float] = field(default_factory=dict)  # "v1" -> inputs inferred
    pids: frozenset[int] = frozenset()

    def minus(self, before: Sample) -> Sample:
        return Sample(
            self.server_s - before.server_s,
            {v: s - before.stubs_s.get(v, 0.0) for v, s in self.stubs_s.items()},
            {v: n - before.inferences.get(v, 0.0) for v, n in self.inferences.items()},
            self.pids,
        )


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU of one process, or None when it is gone."""
    try:
        fields = (PROC / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime (fields 14, 15)


def started_at(pid: int) -> float | None:
    """When a process started, in seconds since the epoch (stat's starttime + boot time)."""
    try:
        ticks = int((PROC / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[19])
        boot = next(
            int(line.split()[1])
            for line in (PROC / "stat").read_text().splitlines()
            if line.startswith("btime ")
        )
    except (OSError, ValueError, IndexError, StopIteration):
        return None
    return boot + ticks / TICKS


def _cmdline(pid: int) -> str:
    try:
        return (PROC / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _ppid(pid: int) -> int | None:
    try:
        return int((PROC / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def triton_processes(model: str, grpc_port: int) -> tuple[int | None, dict[str, int]]:
    """The tritonserver serving gRPC on `grpc_port` (others may run on the machine, a
    test's own) and its stubs of `model` by version ("v1" -> pid)."""
    pids = [int(e.name) for e in PROC.iterdir() if e.name.isdigit()]
    commands = {pid: _cmdline(pid) for pid in pids}
    servers = [
        pid
        for pid, cmd in commands.items()
        if "tritonserver --model-repository" in cmd and f"--grpc-port={grpc_port} " in f"{cmd} "
    ]
    if not servers:
        return None, {}
    server, stubs = servers[0], {}
    for pid, cmd in commands.items():
        match = _STUB_VERSION.search(cmd) if "triton_python_backend_stub" in cmd else None
        if match and match.group(1) == model and _ppid(pid) == server:
            stubs[f"v{match.group(2)}"] = pid
    return server, stubs


def inference_counts(metrics_url: str, model: str) -> dict[str, float]:
    try:
        with urllib.request.urlopen(metrics_url, timeout=5) as resp:
            text = resp.read().decode()
    except OSError:
        return {}
    return {f"v{v}": float(n) for m, v, n in _COUNT.findall(text) if m == model}


def sample(model: str, metrics_url: str, grpc_port: int) -> Sample:
    server, stubs = triton_processes(model, grpc_port)
    stubs_s = {v: cpu_seconds(pid) for v, pid in stubs.items()}
    return Sample(
        server_s=(cpu_seconds(server) or 0.0) if server else 0.0,
        stubs_s={v: s for v, s in stubs_s.items() if s is not None},
        inferences=inference_counts(metrics_url, model),
        pids=frozenset([*([server] if server else []), *stubs.values()]),
    )
