"""An asyncio client for the Triton model server over gRPC, speaking `GatewayError`.

One `tritonclient.grpc.aio.InferenceServerClient` (one HTTP/2 channel) is reused for every
call: gRPC multiplexes concurrent requests over it, so there is nothing to pool.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Sequence

import grpc
import numpy as np
from tritonclient.grpc import InferInput, InferRequestedOutput
from tritonclient.grpc.aio import InferenceServerClient
from tritonclient.utils import InferenceServerException

from inference_gateway import tracing
from inference_gateway.errors import ErrorCode, GatewayError, redact
from inference_gateway.routing import triton_version

log = logging.getLogger(__name__)

DEFAULT_MODEL = "ticket_classifier"
INPUT_NAME = "TEXT"
OUTPUT_NAME = "SCORES"

# Phrases in Triton's and gRPC's messages, lower-cased. Triton answers several distinct
# failures with the same gRPC status (UNAVAILABLE), so the message is what tells them apart.
# Checked against tritonserver 2.x (tests/integration/test_gateway_triton_errors.py): a full
# queue is UNAVAILABLE "Exceeds maximum queue size", at once; a queue timeout is UNAVAILABLE
# "Request timeout expired"; a stopped server is UNAVAILABLE "failed to connect to all
# addresses ... Connection refused"; an unknown version is "Request for unknown model ...".
_OVERLOAD_PHRASES = ("exceeds maximum queue size", "queue is full", "queue full")
_TIMEOUT_PHRASES = ("timeout", "timed out", "deadline")
_REFUSED_PHRASES = ("connection refused", "failed to connect", "unreachable")
_NOT_SERVING_PHRASES = ("unknown model", "not ready", "no available version", "not found")


# gRPC's status names: the only part of a Triton failure a caller is shown (as the class)
_GRPC_STATUSES = frozenset(status.name for status in grpc.StatusCode)


def map_triton_error(status: str | None, message: str) -> GatewayError:
    """Translate a Triton/gRPC failure (`status` as "StatusCode.X") into a `GatewayError`.

    The caller sees a fixed sentence and the gRPC status class, never Triton's own words:
    they name model files, paths, backends and library internals, and can repeat input.
    The full text goes to the gateway's log (redacted) for the operator.
    """
    code = (status or "").rsplit(".", 1)[-1]
    text = message.lower()
    error = _classify(code, text)
    shown = code if code in _GRPC_STATUSES else "no status"
    log.warning("Triton failure [%s] answered as %s: %s", shown, error.code.value, redact(message))
    return GatewayError(error.code, f"{error.message} [triton {shown}]", error.retryable)


def _classify(code: str, text: str) -> GatewayError:
    if code == "DEADLINE_EXCEEDED":
        return GatewayError(ErrorCode.TIMEOUT, "Triton did not answer in time")
    if code == "INVALID_ARGUMENT":
        return GatewayError(ErrorCode.INVALID_INPUT, "Triton refused the input")
    if re.search(r"out of memory|failed to allocate|bad_alloc|\boom\b", text):
        # the same batch would fail the same way: not retryable, whatever the status says
        return GatewayError(ErrorCode.INTERNAL, "Triton ran out of memory", False)
    if code == "RESOURCE_EXHAUSTED" or _has(text, _OVERLOAD_PHRASES):
        return GatewayError(ErrorCode.OVERLOADED, "Triton is overloaded")
    if code in ("UNAVAILABLE", "CANCELLED", "") and _has(text, _TIMEOUT_PHRASES):
        # Triton's queue timeout ("Request timeout expired") comes as UNAVAILABLE; a model
        # that failed with some "timeout" in its message (INTERNAL) is not a TIMEOUT
        return GatewayError(ErrorCode.TIMEOUT, "Triton timed the request out")
    if _has(text, _REFUSED_PHRASES):
        return GatewayError(ErrorCode.MODEL_UNAVAILABLE, "Triton unreachable")
    if code in ("UNAVAILABLE", "NOT_FOUND") or _has(text, _NOT_SERVING_PHRASES):
        return GatewayError(ErrorCode.MODEL_UNAVAILABLE, "model version not served by Triton")
    return GatewayError(ErrorCode.INTERNAL, "Triton failed")


def is_connection_refused(error: InferenceServerException) -> bool:
    """True when the request never reached Triton, so sending it again is safe."""
    code = (error.status() or "").rsplit(".", 1)[-1]
    return code == "UNAVAILABLE" and _has((error.message() or "").lower(), _REFUSED_PHRASES)


def _has(text: str, phrases: Sequence[str]) -> bool:
    return any(p in text for p in phrases)


def encode_texts(texts: Sequence[str]) -> np.ndarray:
    """The `TEXT` input: TYPE_STRING dims [1], so an object array [n, 1] of UTF-8 bytes."""
    array = np.empty((len(texts), 1), dtype=np.object_)
    array[:, 0] = [t.encode("utf-8") for t in texts]
    return array


class TritonClient:
    """`infer` and `ready` for one Triton server, with Triton's errors as `GatewayError`s."""

    def __init__(
        self,
        url: str,
        model: str = DEFAULT_MODEL,
        *,
        connect_retries: int = 2,
        retry_backoff_s: float = 0.05,
    ) -> None:
        self.url = url
        self.model = model
        self._connect_retries = connect_retries
        self._retry_backoff_s = retry_backoff_s
        self._client: InferenceServerClient | None = None

    def _grpc(self) -> InferenceServerClient:
        # created lazily: the grpc.aio channel binds to the event loop it is first used on
        if self._client is None:
            self._client = InferenceServerClient(self.url)
        return self._client

    async def infer(
        self, texts: Sequence[str], version: str, timeout_s: float, *, model: str | None = None
    ) -> np.ndarray:
        """Scores [n, n_classes] (float32) for `texts` from gateway version `version` ("v1")."""
        model = model or self.model
        inputs = [InferInput(INPUT_NAME, [len(texts), 1], "BYTES")]
        inputs[0].set_data_from_numpy(encode_texts(texts))
        outputs = [InferRequestedOutput(OUTPUT_NAME)]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        for attempt in range(self._connect_retries + 1):
            try:
                left_s = max(deadline - loop.time(), 0.001)
                with tracing.triton_span(model, version, len(texts)):
                    result = await self._grpc().infer(
                        model,
                        inputs,
                        model_version=triton_version(version),
                        outputs=outputs,
                        # Triton's queue timeout (µs), for a model config that allows one
                        # (ours does not: see its config.pbtxt); else ignored by Triton
                        timeout=int(left_s * 1e6),
                        client_timeout=left_s,
                    )
                return _scores(result.as_numpy(OUTPUT_NAME), len(texts))
            except InferenceServerException as error:
                if not self._may_retry(error, attempt, deadline - loop.time()):
                    raise map_triton_error(error.status(), error.message() or str(error)) from None
                log.warning("Triton at %s refused the connection; retrying", self.url)
                await asyncio.sleep(self._retry_backoff_s * (attempt + 1))
        raise AssertionError("unreachable")  # the loop returns or raises

    def _may_retry(self, error: InferenceServerException, attempt: int, left_s: float) -> bool:
        # only a refused connection: the request never ran, and there is time for another try
        backoff = self._retry_backoff_s * (attempt + 1)
        return (
            attempt < self._connect_retries
            and is_connection_refused(error)
            and left_s > backoff + 0.001
        )

    async def ready(self, model: str | None = None, version: str = "v1") -> bool:
        """Is the server ready and this model version loaded? Never raises."""
        try:
            client = self._grpc()
            return bool(
                await client.is_server_ready(client_timeout=2.0)
                and await client.is_model_ready(
                    model or self.model, triton_version(version), client_timeout=2.0
                )
            )
        except (InferenceServerException, GatewayError) as error:
            log.info("Triton at %s not ready: %s", self.url, redact(str(error)))
            return False

    async def close(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            await client.close()


def _scores(array: np.ndarray | None, n: int) -> np.ndarray:
    if array is None or array.ndim != 2 or array.shape[0] != n:
        shape = None if array is None else array.shape
        raise GatewayError(
            ErrorCode.INTERNAL, f"Triton returned SCORES of shape {shape}, not [{n}, k]"
        )
    return array.astype(np.float32, copy=False)
