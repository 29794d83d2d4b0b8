"""Launch helpers of the CPU tritonserver; the end-to-end test runs the real binary (~3 s)."""

from __future__ import annotations

import socket
import sys
import sysconfig
from pathlib import Path

import numpy as np
import pytest

from inference_gateway import triton_server as ts

WEIGHTS = ts.DEFAULT_MODEL_REPOSITORY / "ticket_classifier" / "1" / "weights.npz"


def test_backend_dir_links_this_pythons_stub(tmp_path: Path) -> None:
    dest = ts.prepare_backend_dir(tmp_path / "be")
    assert ts.prepare_backend_dir(tmp_path / "be") == dest  # idempotent
    stub = (dest / "python" / "triton_python_backend_stub").resolve()
    assert stub.parent.name == f"{sys.version_info.major}.{sys.version_info.minor}"
    assert (dest / "python" / "libtriton_python.so").exists()
    assert (dest / "python" / "triton_python_backend_utils.py").exists()


def test_command(tmp_path: Path) -> None:
    cmd = ts.tritonserver_command(tmp_path, 9001, 9000, 9002, backend_dir=tmp_path / "be")
    assert Path(cmd[0]).name == "tritonserver" and Path(cmd[0]).exists()
    assert f"--model-repository={tmp_path.resolve()}" in cmd
    assert f"--backend-directory={tmp_path / 'be'}" in cmd
    for flag in ("--grpc-port=9001", "--http-port=9000", "--metrics-port=9002"):
        assert flag in cmd
    # explicit model control, every model loaded at start (ticketflow model deploy adds more)
    for flag in ("--model-control-mode=explicit", "--load-model=*", "--log-verbose=0"):
        assert flag in cmd


def test_env_puts_this_interpreter_first() -> None:
    env = ts.tritonserver_env({"PATH": "/usr/bin", "LD_LIBRARY_PATH": "/x", "PYTHONHOME": "/p"})
    assert env["PATH"].split(":")[:2] == [str(Path(sys.executable).parent), "/usr/bin"]
    assert "PYTHONHOME" not in env
    if sysconfig.get_config_var("INSTSONAME"):
        assert env["LD_LIBRARY_PATH"].split(":") == [sysconfig.get_config_var("LIBDIR"), "/x"]


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


@pytest.mark.skipif(not WEIGHTS.exists(), reason="run `python -m training.train`")
def test_real_tritonserver_classifies(tmp_path: Path) -> None:
    import tritonclient.grpc as grpcclient

    grpc, http, metrics = _free_ports(3)
    texts = [
        "我要退款，耳机坏了",
        "Where is my package? Tracking has not moved.",
        "忘记密码登录不上",
    ]
    with (
        ts.running(
            grpc_port=grpc,
            http_port=http,
            metrics_port=metrics,
            log_path=tmp_path / "triton.log",
            timeout_s=30,
        ),
        grpcclient.InferenceServerClient(f"127.0.0.1:{grpc}") as client,
    ):
        inp = grpcclient.InferInput("TEXT", [len(texts), 1], "BYTES")
        inp.set_data_from_numpy(np.array([[t.encode()] for t in texts], dtype=object))
        scores = client.infer("ticket_classifier", [inp]).as_numpy("SCORES")
    assert scores.shape == (3, 6)
    np.testing.assert_allclose(scores.sum(axis=1), 1.0, rtol=1e-5)
    assert scores.argmax(axis=1).tolist() == [1, 4, 3]  # after_sales, shipping, account
