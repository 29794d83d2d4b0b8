"""The HTTP client of the gateway, for the workflow's `infer` step.

    async with GatewayClient("http://127.0.0.1:8088") as gateway:
        response = await gateway.predict("ticket_classifier", inputs, timeout_ms=300)

Every failure is a `GatewayError(code, message, retryable)`: the error body the gateway sent,
TIMEOUT when no answer came in time, MODEL_UNAVAILABLE (retryable) when the gateway could
not be reached. One `aiohttp.ClientSession` is kept for the client's life, so connections
are pooled and kept alive between calls.

With TICKETFLOW_GATEWAY_TOKEN set (or `token=`), every predict carries
`Authorization: Bearer <token>`; a 401 is MODEL_UNAVAILABLE, not retryable (a retry would
send the same token), so the infer step degrades the ticket instead of dead-lettering it.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping, Sequence
from typing import Any

import aiohttp
import orjson
from pydantic import SecretStr, ValidationError

from inference_gateway import tracing
from inference_gateway.config import DEFAULT_GATEWAY_URL, TOKEN_ENV, gateway_token
from inference_gateway.errors import ErrorCode, GatewayError
from schemas.gateway import ErrorResponse, PredictInput, PredictResponse

# an error status whose body is not ours (a proxy's, say) -> the code it most likely means
_STATUS_CODES = {
    400: ErrorCode.INVALID_INPUT,
    404: ErrorCode.INVALID_INPUT,
    413: ErrorCode.INVALID_INPUT,
    429: ErrorCode.OVERLOADED,
    502: ErrorCode.MODEL_UNAVAILABLE,
    503: ErrorCode.MODEL_UNAVAILABLE,
    504: ErrorCode.TIMEOUT,
}


class GatewayClient:
    def __init__(
        self,
        base_url: str | None = None,
        *,
        session: aiohttp.ClientSession | None = None,
        max_connections: int = 100,
        grace_ms: int = 50,
        token: str | SecretStr | None = None,
    ) -> None:
        """`base_url` defaults to TICKETFLOW_GATEWAY_URL, `token` to TICKETFLOW_GATEWAY_TOKEN
        (unset: no Authorization header); a given `session` is not closed here.

        `grace_ms`: how much longer than `timeout_ms` to wait for the gateway's answer, so its
        own TIMEOUT (which says where the time went) normally arrives before ours.
        """
        self.base_url = base_url or os.environ.get("TICKETFLOW_GATEWAY_URL", DEFAULT_GATEWAY_URL)
        self.base_url = self.base_url.rstrip("/")
        self._session = session
        self._owns_session = session is None
        self._max_connections = max_connections
        self._grace_ms = grace_ms
        if token is None:
            token = gateway_token()
        self._token = SecretStr(token) if isinstance(token, str) else token

    def _http(self) -> aiohttp.ClientSession:
        # created lazily: a ClientSession belongs to the event loop it is created on
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(limit=self._max_connections, keepalive_timeout=30)
            self._session = aiohttp.ClientSession(connector=connector)
            self._owns_session = True
        return self._session

    async def predict(
        self,
        model: str,
        inputs: Sequence[PredictInput],
        timeout_ms: int,
        version: str | None = None,
        *,
        headers: Mapping[str, str] | None = None,
    ) -> PredictResponse:
        """Classify `inputs` with `model`; `version` pins one, else the routing config picks
        per input (each output's `version` says which answered it).

        `headers` travel with the request. With tracing on, the call is a span of the
        inputs' traces (inference_gateway/tracing.py), carried by a `traceparent` header
        unless `headers` has one.
        """
        payload: dict[str, Any] = {
            "inputs": [item.model_dump(mode="json") for item in inputs],
            "timeout_ms": timeout_ms,
        }
        if version is not None:
            payload["version"] = version
        try:
            data = orjson.dumps(payload)
        except TypeError as error:  # a feature value JSON cannot carry (an int past 64 bits)
            raise GatewayError(ErrorCode.INVALID_INPUT, f"inputs are not JSON: {error}") from None
        path = f"/v1/models/{model}/predict"
        with tracing.client_span(model, inputs) as traced:
            status, body = await self._post(path, data, timeout_ms, {**traced, **(headers or {})})
            if status != 200:
                raise error_from_response(status, body)
        try:
            return PredictResponse.model_validate_json(body)
        except ValidationError as error:
            raise GatewayError(ErrorCode.INTERNAL, f"malformed gateway answer: {error}") from None

    async def _post(
        self, path: str, data: bytes, timeout_ms: int, headers: Mapping[str, str] | None
    ) -> tuple[int, bytes]:
        timeout = aiohttp.ClientTimeout(total=(timeout_ms + self._grace_ms) / 1000)
        all_headers = {"Content-Type": "application/json", **(headers or {})}
        if self._token is not None:
            all_headers["Authorization"] = f"Bearer {self._token.get_secret_value()}"
        url = self.base_url + path
        try:
            async with self._http().post(url, data=data, headers=all_headers, timeout=timeout) as r:
                return r.status, await r.read()
        except asyncio.TimeoutError:
            # before ClientError: aiohttp's own timeouts are both
            raise GatewayError(
                ErrorCode.TIMEOUT, f"no answer from the gateway within {timeout_ms} ms"
            ) from None
        except aiohttp.ClientError as error:
            # refused, reset, disconnected: the gateway is down or restarting; another try may work
            raise GatewayError(
                ErrorCode.MODEL_UNAVAILABLE,
                f"gateway at {self.base_url} unreachable: {error}",
                retryable=True,
            ) from None

    async def ready(self, timeout_ms: int = 2000) -> bool:
        """Does the gateway's /readyz pass? Never raises."""
        timeout = aiohttp.ClientTimeout(total=timeout_ms / 1000)
        try:
            async with self._http().get(self.base_url + "/readyz", timeout=timeout) as r:
                return r.status == 200
        except (asyncio.TimeoutError, aiohttp.ClientError):
            return False

    async def close(self) -> None:
        if self._session is not None and self._owns_session:
            await self._session.close()
        self._session = None

    async def __aenter__(self) -> GatewayClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


def error_from_response(status: int, body: bytes) -> GatewayError:
    """The `GatewayError` of an error answer: its body's, or one guessed from the status."""
    if status in (401, 403):
        return GatewayError(
            ErrorCode.MODEL_UNAVAILABLE,
            f"the gateway refused our credentials (HTTP {status}): check {TOKEN_ENV}",
            retryable=False,
        )
    try:
        error = ErrorResponse.model_validate(orjson.loads(body)).error
        return GatewayError(error.code, error.message, error.retryable)
    except (orjson.JSONDecodeError, ValidationError):
        code = _STATUS_CODES.get(status, ErrorCode.INTERNAL)
        snippet = body[:200].decode("utf-8", "replace")
        return GatewayError(code, f"gateway answered HTTP {status}: {snippet}")
