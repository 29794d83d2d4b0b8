"""Run the `tritonserver` of the nvidia-pytriton wheel as a subprocess, on the CPU.

The wheel ships the server, its libraries and the Python backend, with one backend stub per
Python version (`python_backend_stubs/3.X/`). What pytriton itself does, and we copy:
- a backend directory whose `python/` holds libtriton_python.so, triton_python_backend_utils.py
  and the stub of *this* interpreter's version (pytriton copies the whole tree; links suffice);
- this interpreter's bin/ first on PATH: the stub embeds Python and finds its prefix by looking
  up `python3` on PATH, which is how it gets the venv's site-packages (numpy, our package).
And one thing pytriton does not: the stub links `libpython3.X.so.1.0` by soname, which finds the
system's libpython before pyenv's, so LD_LIBRARY_PATH must start with this interpreter's LIBDIR.

Model control is **explicit** (`--model-control-mode=explicit`): every model present at start
is loaded (`--load-model=*`, which Triton wants as the only --load-model), and later versions are
loaded through the repository API without a restart (`inference_gateway.model.rollout`,
docs/inference.md "Rolling out a model version"). Pass `model_control="none"` for a server
that must not accept load/unload requests.

    python -m inference_gateway.triton_server [--model-repository DIR] [--grpc-port 8001]
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib.util
import os
import subprocess
import sys
import sysconfig
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

DEFAULT_MODEL_REPOSITORY = Path(__file__).resolve().parent / "model_repository"
_BACKEND_FILES = ("libtriton_python.so", "triton_python_backend_utils.py")


def dist_dir() -> Path:
    """The wheel's tritonserver/ tree, found without importing pytriton (slow, noisy)."""
    spec = importlib.util.find_spec("pytriton")
    if spec is None or spec.origin is None:
        raise RuntimeError("nvidia-pytriton is not installed: it carries the tritonserver binary")
    return Path(spec.origin).parent / "tritonserver"


def _py_version() -> str:
    return f"{sys.version_info.major}.{sys.version_info.minor}"


def _default_backend_dir() -> Path:
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    key = hashlib.sha256(f"{dist_dir()}|{_py_version()}".encode()).hexdigest()[:12]
    return cache / "ticketflow" / "triton-backends" / key


def prepare_backend_dir(dest: Path | None = None) -> Path:
    """A --backend-directory whose python/ backend uses this interpreter's stub; idempotent."""
    dest = dest or _default_backend_dir()
    src = dist_dir()
    stub = src / "python_backend_stubs" / _py_version() / "triton_python_backend_stub"
    if not stub.exists():
        raise RuntimeError(f"pytriton ships no Python backend stub for Python {_py_version()}")
    links = {name: src / "backends" / "python" / name for name in _BACKEND_FILES}
    links["triton_python_backend_stub"] = stub
    python_dir = dest / "python"
    python_dir.mkdir(parents=True, exist_ok=True)
    for name, target in links.items():
        link = python_dir / name
        if link.is_symlink() and link.readlink() == target:
            continue
        link.unlink(missing_ok=True)
        link.symlink_to(target)
    return dest


def tritonserver_command(
    model_repository: Path = DEFAULT_MODEL_REPOSITORY,
    grpc_port: int = 8001,
    http_port: int = 8000,
    metrics_port: int = 8002,
    *,
    host: str = "127.0.0.1",
    backend_dir: Path | None = None,
    log_verbose: int = 0,
    model_control: str = "explicit",
    load_models: Sequence[str] = ("*",),
) -> list[str]:
    """argv of a CPU tritonserver serving every model (and version) of `model_repository`.

    Under explicit control only `load_models` are loaded at start ("*": all, and then alone);
    the rest waits for a load request. Under "none" every model loads and none can be added.
    """
    if model_control not in ("explicit", "none"):
        raise ValueError("model_control must be 'explicit' or 'none'")
    if "*" in load_models and len(load_models) > 1:
        raise ValueError("--load-model=* must be the only --load-model (Triton refuses to start)")
    dist = dist_dir()
    loads = [f"--load-model={m}" for m in load_models] if model_control == "explicit" else []
    return [
        str(dist / "bin" / "tritonserver"),
        f"--model-repository={Path(model_repository).resolve()}",
        f"--backend-directory={prepare_backend_dir(backend_dir)}",
        f"--cache-directory={dist / 'caches'}",
        f"--model-control-mode={model_control}",
        *loads,
        f"--grpc-address={host}",
        f"--grpc-port={grpc_port}",
        f"--http-address={host}",
        f"--http-port={http_port}",
        f"--metrics-address={host}",
        f"--metrics-port={metrics_port}",
        "--allow-metrics=true",
        # No GPU here: DCGM/NVML would only log errors.
        "--allow-gpu-metrics=false",
        f"--log-verbose={log_verbose}",
        "--strict-readiness=true",
        "--exit-timeout-secs=10",
        # Python-backend shared-memory regions are named by prefix; make two servers on one host
        # (tests next to the local stack) not collide.
        f"--backend-config=python,shm-region-prefix-name=ticketflow_{grpc_port}_",
    ]


def tritonserver_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment for the server so that the Python-backend stub runs this interpreter."""
    env = dict(os.environ if base is None else base)
    env.pop("PYTHONHOME", None)  # would override the prefix the stub derives from PATH
    bin_dir = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join(p for p in (bin_dir, env.get("PATH")) if p)
    libdir = sysconfig.get_config_var("LIBDIR")
    ldlibrary = sysconfig.get_config_var("INSTSONAME") or ""
    # Only a shared-library build has a libpython to prefer; else the stub keeps the system's.
    if libdir and (Path(libdir) / ldlibrary).exists():
        env["LD_LIBRARY_PATH"] = os.pathsep.join(
            p for p in (libdir, env.get("LD_LIBRARY_PATH")) if p
        )
    return env


def wait_ready(
    grpc_url: str,
    model: str,
    timeout_s: float = 60.0,
    *,
    process: subprocess.Popen | None = None,
) -> None:
    """Block until the server and `model` are ready; raise TimeoutError, or RuntimeError
    as soon as `process` (the server) has exited."""
    import tritonclient.grpc as grpcclient  # heavy; only for callers that wait
    from tritonclient.utils import InferenceServerException

    deadline = time.monotonic() + timeout_s
    with grpcclient.InferenceServerClient(grpc_url) as client:
        while True:
            if process is not None and process.poll() is not None:
                raise RuntimeError(f"tritonserver exited with {process.returncode} before ready")
            with contextlib.suppress(InferenceServerException):  # refused while starting
                if client.is_server_ready(client_timeout=2) and client.is_model_ready(
                    model, client_timeout=2
                ):
                    return
            if time.monotonic() > deadline:
                raise TimeoutError(f"{model} not ready at {grpc_url} after {timeout_s:.0f}s")
            time.sleep(0.2)


def start(command: Sequence[str], log_path: Path | None = None) -> subprocess.Popen:
    """Start the server; its log goes to `log_path` (appended) or is inherited."""
    log = open(log_path, "ab") if log_path else None  # noqa: SIM115 - owned by the child
    try:
        return subprocess.Popen(
            list(command), env=tritonserver_env(), stdout=log, stderr=subprocess.STDOUT
        )
    finally:
        if log:
            log.close()


def stop(process: subprocess.Popen, timeout_s: float = 15.0) -> int:
    """SIGTERM (Triton drains in-flight requests and unloads models), SIGKILL if it hangs."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    return process.returncode


@contextlib.contextmanager
def running(
    model_repository: Path = DEFAULT_MODEL_REPOSITORY,
    grpc_port: int = 8001,
    http_port: int = 8000,
    metrics_port: int = 8002,
    *,
    model: str = "ticket_classifier",
    timeout_s: float = 60.0,
    log_path: Path | None = None,
) -> Iterator[subprocess.Popen]:
    """A server that is ready for `model` inside the block and stopped after it."""
    cmd = tritonserver_command(model_repository, grpc_port, http_port, metrics_port)
    process = start(cmd, log_path)
    try:
        wait_ready(f"127.0.0.1:{grpc_port}", model, timeout_s, process=process)
        yield process
    finally:
        stop(process)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Run tritonserver in the foreground.")
    ap.add_argument("--model-repository", type=Path, default=DEFAULT_MODEL_REPOSITORY)
    ap.add_argument("--grpc-port", type=int, default=8001)
    ap.add_argument("--http-port", type=int, default=8000)
    ap.add_argument("--metrics-port", type=int, default=8002)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--model-control", choices=("explicit", "none"), default="explicit")
    ap.add_argument("--print", action="store_true", help="print the env and argv, do not run")
    args = ap.parse_args(argv)
    cmd = tritonserver_command(
        args.model_repository,
        args.grpc_port,
        args.http_port,
        args.metrics_port,
        host=args.host,
        model_control=args.model_control,
    )
    env = tritonserver_env()
    if args.print:
        for key in ("PATH", "LD_LIBRARY_PATH"):
            print(f"{key}={env.get(key, '')}")
        print(" ".join(cmd))
        return 0
    os.execve(cmd[0], cmd, env)  # foreground: signals go straight to tritonserver


if __name__ == "__main__":
    sys.exit(main())
