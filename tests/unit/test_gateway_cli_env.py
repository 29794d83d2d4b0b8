"""`ticketflow gateway`: options not given leave the gateway's TICKETFLOW_GATEWAY_* settings be."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from inference_gateway import server
from inference_gateway.config import GatewayConfig
from ticketflow.cli import app


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> list[GatewayConfig]:
    """The configs the gateway would have served with (nothing is started)."""
    configs: list[GatewayConfig] = []

    async def serve(config: GatewayConfig, backend: object = None) -> None:
        configs.append(config)

    monkeypatch.setattr(server, "serve", serve)
    for var in ("TICKETFLOW_GATEWAY_MAX_BATCH_SIZE", "TICKETFLOW_GATEWAY_MAX_QUEUE_DELAY_US"):
        monkeypatch.delenv(var, raising=False)
    return configs


def test_the_environment_is_read_when_no_option_is_given(
    served: list[GatewayConfig], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TICKETFLOW_GATEWAY_MAX_BATCH_SIZE", "16")
    monkeypatch.setenv("TICKETFLOW_GATEWAY_MAX_QUEUE_DELAY_US", "500")
    result = CliRunner().invoke(app, ["gateway"])
    assert result.exit_code == 0, result.output
    assert (served[0].max_batch_size, served[0].max_queue_delay_us) == (16, 500)


def test_an_option_given_wins_over_the_environment(
    served: list[GatewayConfig], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TICKETFLOW_GATEWAY_MAX_BATCH_SIZE", "16")
    result = CliRunner().invoke(app, ["gateway", "--max-batch-size", "8"])
    assert result.exit_code == 0, result.output
    assert (served[0].max_batch_size, served[0].max_queue_delay_us) == (8, 2000)


def test_without_either_the_gateway_defaults_hold(served: list[GatewayConfig]) -> None:
    result = CliRunner().invoke(app, ["gateway"])
    assert result.exit_code == 0, result.output
    defaults = GatewayConfig()
    assert served[0].max_batch_size == defaults.max_batch_size
    assert served[0].max_queue_delay_us == defaults.max_queue_delay_us
