"""`ticketflow stack down` stops the demo's detached services first, then the stack's parts;
`--secure` touches only the secured broker and Redis."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

import devstack as stack
from devstack import app_processes
from ticketflow import cli


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple]:
    seen: list[tuple] = []

    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("a unit test must not stop the real stack")

    # a safety net, should the command reach the real `down` some other way
    monkeypatch.setattr(stack, "stop_part", never)
    monkeypatch.setattr(app_processes, "stop_detached", lambda s: seen.append(("apps",)) or [])
    monkeypatch.setattr(stack, "down", lambda s, parts=None: seen.append(("stack", parts)) or [])
    return seen


def test_stack_down_stops_the_detached_services_first(calls: list[tuple]) -> None:
    result = CliRunner().invoke(cli.app, ["stack", "down"])
    assert result.exit_code == 0, result.output
    assert calls == [("apps",), ("stack", None)]


def test_stack_down_secure_leaves_the_services_alone(calls: list[tuple]) -> None:
    result = CliRunner().invoke(cli.app, ["stack", "down", "--secure"])
    assert result.exit_code == 0, result.output
    assert calls == [("stack", ["kafka-secure", "redis-secure"])]
