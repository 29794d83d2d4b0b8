"""Triton's own failures, from a tritonserver this module starts (free ports, a temporary
model repository), so the shared one is never stopped or flooded:

- a full Triton queue and a Triton queue timeout both come as UNAVAILABLE, told apart by
  their messages: OVERLOADED (at once) and TIMEOUT;
- Triton killed under the gateway: MODEL_UNAVAILABLE (retryable), and recovery when it is
  back on the same port, without restarting the gateway.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from inference_gateway import triton_server
from inference_gateway.client import GatewayClient
from inference_gateway.config import GatewayConfig
from inference_gateway.errors import ErrorCode, GatewayError
from inference_gateway.server import GatewayServer
from inference_gateway.triton import TritonClient
from schemas.gateway import PredictInput

pytestmark = pytest.mark.integration

MODEL = "ticket_classifier"
SLOW_CONFIG = """
name: "slow"
backend: "python"
max_batch_size: 1
input [ { name: "TEXT", data_type: TYPE_STRING, dims: [ 1 ] } ]
output [ { name: "SCORES", data_type: TYPE_FP32, dims: [ 6 ] } ]
dynamic_batching {
  default_queue_policy {
    timeout_action: REJECT
    default_timeout_microseconds: 10000000
    allow_timeout_override: true
    max_queue_size: 2
  }
}
instance_group [ { count: 1, kind: KIND_CPU } ]
"""
SLOW_MODEL = """
import time
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            time.sleep(0.3)
            n = pb_utils.get_input_tensor_by_name(r, "TEXT").as_numpy().shape[0]
            scores = np.full((n, 6), 1 / 6, np.float32)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("SCORES", scores)]))
        return out
"""


def _ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@contextlib.contextmanager
def own_triton(repo: Path, ports: list[int], model: str, log: Path) -> Iterator[subprocess.Popen]:
    process = triton_server.start(triton_server.tritonserver_command(repo, *ports), log)
    try:
        triton_server.wait_ready(f"127.0.0.1:{ports[0]}", model, 60, process=process)
        yield process
    finally:
        triton_server.stop(process)
        for region in Path("/dev/shm").glob(f"ticketflow_{ports[0]}_*"):  # after a kill
            with contextlib.suppress(OSError):
                region.unlink()


@pytest.fixture
def slow_repo(tmp_path: Path) -> Path:
    (tmp_path / "repo" / "slow" / "1").mkdir(parents=True)
    (tmp_path / "repo" / "slow" / "config.pbtxt").write_text(SLOW_CONFIG, encoding="utf-8")
    (tmp_path / "repo" / "slow" / "1" / "model.py").write_text(SLOW_MODEL, encoding="utf-8")
    return tmp_path / "repo"


async def test_a_full_triton_queue_and_a_queue_timeout_are_told_apart(
    slow_repo: Path, tmp_path: Path
) -> None:
    ports = _ports(3)
    with own_triton(slow_repo, ports, "slow", tmp_path / "triton.log"):
        client = TritonClient(f"127.0.0.1:{ports[0]}", model="slow")

        async def call(timeout_s: float = 10.0) -> tuple[str, float]:
            started = time.monotonic()
            try:
                await client.infer(["x"], "v1", timeout_s)
                return "ok", time.monotonic() - started
            except GatewayError as error:
                return error.code.value, time.monotonic() - started

        try:
            # 1 executing + 2 queued fit; the others are refused at once
            results = await asyncio.gather(*(call() for _ in range(6)))
            overloaded = [t for code, t in results if code == "OVERLOADED"]
            assert len(overloaded) >= 2 and max(overloaded) < 0.2
            assert sum(code == "ok" for code, _ in results) >= 2

            # a request whose deadline passes while it waits behind a busy instance, on a
            # model that allows queue timeouts (ticket_classifier does not, see its config):
            # the client sends its deadline as the timeout; Triton rejects it
            # (the busy call goes first, so that the late one finds room in the queue
            # however slowly the busy one starts: one late call, never a full queue)
            busy = asyncio.ensure_future(call())
            await asyncio.sleep(0.15)
            late = await call(timeout_s=0.1)
            assert (await busy)[0] == "ok"
            assert late[0] == "TIMEOUT"
        finally:
            await client.close()


@pytest.fixture
def v1_repo(tmp_path: Path) -> Path:
    src = triton_server.DEFAULT_MODEL_REPOSITORY / MODEL
    if not (src / "1" / "weights.npz").exists():
        pytest.skip("v1 not built (python -m training.train)")
    dest = tmp_path / "repo" / MODEL
    dest.mkdir(parents=True)
    (dest / "1").symlink_to(src / "1", target_is_directory=True)
    for name in ("config.pbtxt", "labels.txt"):
        (dest / name).write_bytes((src / name).read_bytes())
    return tmp_path / "repo"


@pytest.fixture
async def gateway_client() -> AsyncIterator[tuple[GatewayClient, list[int]]]:
    ports = _ports(3)
    config = GatewayConfig(triton_url=f"127.0.0.1:{ports[0]}", port=0, shutdown_grace_s=2)
    async with GatewayServer(config) as server, GatewayClient(server.url) as client:
        yield client, ports


async def test_killing_triton_is_model_unavailable_then_it_recovers(
    v1_repo: Path, tmp_path: Path, gateway_client: tuple[GatewayClient, list[int]]
) -> None:
    client, ports = gateway_client
    ticket = [PredictInput(id="k-1", text="where is my parcel?")]
    with own_triton(v1_repo, ports, MODEL, tmp_path / "triton-1.log") as process:
        assert (await client.predict(MODEL, ticket, timeout_ms=3000)).version == "v1"
        process.kill()  # not a clean stop
        process.wait()

    started = time.monotonic()
    with pytest.raises(GatewayError) as caught:
        await client.predict(MODEL, [PredictInput(id="k-2", text="refund")], timeout_ms=3000)
    assert caught.value.code is ErrorCode.MODEL_UNAVAILABLE and caught.value.retryable
    assert time.monotonic() - started < 3.0  # refused connections are not waited out
    assert not await client.ready()

    with own_triton(v1_repo, ports, MODEL, tmp_path / "triton-2.log"):
        deadline = time.monotonic() + 30
        while True:  # the gateway's gRPC channel reconnects by itself
            try:
                answer = await client.predict(MODEL, ticket, timeout_ms=3000)
                break
            except GatewayError as error:
                assert error.code is ErrorCode.MODEL_UNAVAILABLE
                assert time.monotonic() < deadline, "no recovery within 30 s"
                await asyncio.sleep(0.5)
        assert answer.outputs[0].label == "shipping"
        while not await client.ready(timeout_ms=5000):  # /readyz follows, with a real probe
            assert time.monotonic() < deadline, "/readyz did not recover"
            await asyncio.sleep(0.5)
