"""A fake Triton backend, for tests of the gateway and of its callers (no Triton needed).

app = create_app(GatewayConfig(), backend=FakeBackend())
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from inference_gateway.errors import GatewayError
from schemas.tickets import CATEGORIES


def fake_scores(texts: Sequence[str]) -> np.ndarray:
    """Deterministic probabilities: each text's label is CATEGORIES[len(text) % 6] at 0.75."""
    k = len(CATEGORIES)
    scores = np.full((len(texts), k), 0.05, dtype=np.float32)
    for row, text in enumerate(texts):
        scores[row, len(text) % k] = 0.75
    return scores


@dataclass
class FakeBackend:
    """`TritonClient`'s interface: records calls, can be slow, failing or not ready."""

    delay_s: float = 0.0
    error: GatewayError | None = None
    is_ready: bool = True
    calls: list[tuple[str | None, str, list[str]]] = field(default_factory=list)
    ready_calls: int = 0
    closed: bool = False

    async def infer(
        self, texts: Sequence[str], version: str, timeout_s: float, *, model: str | None = None
    ) -> np.ndarray:
        self.calls.append((model, version, list(texts)))
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if self.error is not None:
            raise self.error
        return fake_scores(texts)

    async def ready(self, model: str | None = None, version: str = "v1") -> bool:
        self.ready_calls += 1
        return self.is_ready

    async def close(self) -> None:
        self.closed = True
