"""Triton/gRPC failures -> contract error codes, and which of them are retried."""

from __future__ import annotations

import socket
import time

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from inference_gateway.errors import GatewayError
from inference_gateway.triton import TritonClient, encode_texts, map_triton_error
from schemas.gateway import HTTP_STATUS, ErrorCode

REFUSED = (
    "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:8001: "
    "Failed to connect to remote host: Connection refused"
)

# (gRPC status, message as Triton or gRPC words it, expected code)
CASES = [
    ("StatusCode.INVALID_ARGUMENT", "unexpected shape for input 'TEXT', got [2]", "INVALID_INPUT"),
    ("StatusCode.INVALID_ARGUMENT", "inference request batch-size must be <= 64", "INVALID_INPUT"),
    ("StatusCode.UNAVAILABLE", "Exceeds maximum queue size", "OVERLOADED"),
    ("StatusCode.RESOURCE_EXHAUSTED", "Received message larger than max", "OVERLOADED"),
    ("StatusCode.UNAVAILABLE", REFUSED, "MODEL_UNAVAILABLE"),
    ("StatusCode.UNAVAILABLE", "Socket closed", "MODEL_UNAVAILABLE"),
    ("StatusCode.DEADLINE_EXCEEDED", "Deadline Exceeded", "TIMEOUT"),
    ("StatusCode.UNAVAILABLE", "Request timeout expired", "TIMEOUT"),
    (
        "StatusCode.NOT_FOUND",
        "Request for unknown model: 'm' version 2 is not found",
        "MODEL_UNAVAILABLE",
    ),
    (
        "StatusCode.UNAVAILABLE",
        "Request for unknown model: 'm' has no available versions",
        "MODEL_UNAVAILABLE",
    ),
    ("StatusCode.INTERNAL", "Request for unknown model: 'm' is not ready", "MODEL_UNAVAILABLE"),
    (
        "StatusCode.INTERNAL",
        "Failed to process the request(s) for model 'm': ValueError",
        "INTERNAL",
    ),
    (None, "model version must be a string", "INTERNAL"),
    (
        "StatusCode.INTERNAL",
        "onnxruntime: Failed to allocate memory for requested buffer",
        "INTERNAL",
    ),
    ("StatusCode.RESOURCE_EXHAUSTED", "CUDA out of memory", "INTERNAL"),
    ("StatusCode.INTERNAL", "model.py raised TimeoutError: timed out reading", "INTERNAL"),
]


@pytest.mark.parametrize(("status", "message", "code"), CASES)
def test_triton_errors_map_to_contract_codes(status: str | None, message: str, code: str) -> None:
    error = map_triton_error(status, message)
    assert error.code is ErrorCode(code)
    # Triton's words stay in the log: the caller gets a fixed sentence and the status class
    assert message not in error.message
    assert error.message.endswith(f"[triton {(status or 'no status').rsplit('.', 1)[-1]}]")


@pytest.mark.parametrize("code", list(ErrorCode))
def test_an_error_body_follows_the_contract(code: ErrorCode) -> None:
    error = GatewayError(code, "something")
    body = error.to_body()
    assert body == {
        "error": {"code": code.value, "message": "something", "retryable": error.retryable}
    }
    assert error.http_status == HTTP_STATUS[code]
    assert error.retryable is (code not in (ErrorCode.INVALID_INPUT, ErrorCode.INTERNAL))


def test_out_of_memory_is_internal_and_not_retryable() -> None:
    error = map_triton_error("StatusCode.INTERNAL", "CUDA error: out of memory")
    assert (error.code, error.retryable) == (ErrorCode.INTERNAL, False)


def test_retryable_can_be_overridden() -> None:
    assert GatewayError(ErrorCode.INTERNAL, "x", retryable=True).retryable


def test_texts_are_encoded_as_an_object_array_of_utf8_bytes() -> None:
    array = encode_texts(["退款", "refund"])
    assert array.shape == (2, 1)
    assert array.dtype == np.object_
    assert array[0, 0] == "退款".encode()


class _Result:
    def __init__(self, n: int) -> None:
        self._n = n

    def as_numpy(self, name: str) -> np.ndarray:
        return np.full((self._n, 6), 1 / 6, dtype=np.float32)


class _FakeGrpc:
    """Stands in for tritonclient's aio client: fails with `errors` first, then answers."""

    def __init__(self, *errors: InferenceServerException) -> None:
        self.errors = list(errors)
        self.calls = 0
        self.versions: list[str] = []

    async def infer(
        self, model: str, inputs: list, model_version: str, **kwargs: object
    ) -> _Result:
        self.calls += 1
        self.versions.append(model_version)
        if self.errors:
            raise self.errors.pop(0)
        return _Result(inputs[0].shape()[0])

    async def close(self) -> None:
        pass


def client_with(fake: _FakeGrpc) -> TritonClient:
    client = TritonClient("127.0.0.1:1", retry_backoff_s=0.001)
    client._client = fake  # type: ignore[assignment]
    return client


async def test_a_refused_connection_is_retried() -> None:
    refused = InferenceServerException(REFUSED, status="StatusCode.UNAVAILABLE")
    fake = _FakeGrpc(refused, refused)
    scores = await client_with(fake).infer(["a", "b"], "v1", timeout_s=1.0)
    assert scores.shape == (2, 6)
    assert fake.calls == 3
    assert fake.versions == ["1", "1", "1"]  # "v1" is Triton's model_version "1"


async def test_retries_of_a_refused_connection_are_bounded() -> None:
    refused = InferenceServerException(REFUSED, status="StatusCode.UNAVAILABLE")
    fake = _FakeGrpc(refused, refused, refused, refused)
    with pytest.raises(GatewayError) as caught:
        await client_with(fake).infer(["a"], "v1", timeout_s=1.0)
    assert caught.value.code is ErrorCode.MODEL_UNAVAILABLE
    assert fake.calls == 3


@pytest.mark.parametrize(
    ("status", "message"),
    [
        ("StatusCode.INVALID_ARGUMENT", "unexpected shape"),
        ("StatusCode.UNAVAILABLE", "Exceeds maximum queue size"),
        ("StatusCode.UNAVAILABLE", "Socket closed"),  # may have run: not safe to send again
        ("StatusCode.DEADLINE_EXCEEDED", "Deadline Exceeded"),
    ],
)
async def test_other_failures_are_not_retried(status: str, message: str) -> None:
    fake = _FakeGrpc(InferenceServerException(message, status=status))
    with pytest.raises(GatewayError):
        await client_with(fake).infer(["a"], "v1", timeout_s=1.0)
    assert fake.calls == 1


async def test_a_real_refused_connection_is_model_unavailable_and_quick() -> None:
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    client = TritonClient(f"127.0.0.1:{port}", retry_backoff_s=0.01)
    started = time.monotonic()
    with pytest.raises(GatewayError) as caught:
        await client.infer(["a"], "v1", timeout_s=2.0)
    assert caught.value.code is ErrorCode.MODEL_UNAVAILABLE
    assert caught.value.retryable
    assert time.monotonic() - started < 2.0
    assert not await client.ready("ticket_classifier", "v1")
    await client.close()
