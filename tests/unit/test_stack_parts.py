"""Command lines of the Redis and Triton parts of devstack (nothing is started)."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

from devstack import redis_server, triton
from devstack.process import StackError
from streams.settings import REPO_ROOT, Settings


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(
        state_dir=tmp_path,
        redis_url="redis://127.0.0.1:16379/2",
        triton_grpc="127.0.0.1:18001",
        triton_http_port=18000,
        triton_metrics_port=18002,
    )


def _arg(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_redis_args(settings: Settings) -> None:
    argv = redis_server.server_args(settings, "/usr/bin/redis-server")
    assert argv[0] == "/usr/bin/redis-server"
    assert _arg(argv, "--port") == "16379"
    assert _arg(argv, "--bind") == "127.0.0.1"
    assert _arg(argv, "--dir") == str(settings.state_dir / "redis")
    assert _arg(argv, "--daemonize") == "no"
    assert _arg(argv, "--save") == ""
    assert redis_server.ports(settings) == (16379,)


def test_redis_missing_without_root_names_the_apt_command(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(redis_server, "find_redis_server", lambda: None)
    monkeypatch.setattr(redis_server.os, "geteuid", lambda: 1000)
    with pytest.raises(StackError, match="apt-get install -y redis-server"):
        redis_server.ensure_redis_server(settings)


def test_triton_paths_and_ports(settings: Settings) -> None:
    assert triton.model_repository() == REPO_ROOT / "inference_gateway" / "model_repository"
    assert triton.weights_path().parts[-3:] == ("ticket_classifier", "1", "weights.npz")
    assert triton.ports(settings) == (18001, 18000, 18002)


def test_triton_command_uses_the_gateway_module(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = []
    fake = types.ModuleType(triton.TRITON_SERVER_MODULE)

    def tritonserver_command(repo: Path, grpc: int, http: int, metrics: int) -> list[str]:
        calls.append((repo, grpc, http, metrics))
        return ["tritonserver", f"--model-repository={repo}"]

    fake.tritonserver_command = tritonserver_command
    fake.tritonserver_env = lambda: {"TRITON_TEST": "1"}
    monkeypatch.setitem(sys.modules, triton.TRITON_SERVER_MODULE, fake)
    argv, env = triton.command(settings)
    assert argv[0] == "tritonserver"
    assert calls == [(triton.model_repository(), 18001, 18000, 18002)]
    assert env is not None and env["TRITON_TEST"] == "1" and "PATH" in env


def test_triton_module_missing_is_a_stack_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, triton.TRITON_SERVER_MODULE, None)  # import fails
    with pytest.raises(StackError, match="not importable"):
        triton.server_module()


def test_triton_wait_ready_false_is_an_error(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = types.ModuleType(triton.TRITON_SERVER_MODULE)
    fake.wait_ready = lambda url, model, timeout_s: False
    monkeypatch.setitem(sys.modules, triton.TRITON_SERVER_MODULE, fake)
    with pytest.raises(StackError, match="did not become ready"):
        triton.after_start(settings, 1.0)


def test_triton_not_healthy_when_nothing_listens(tmp_path: Path) -> None:
    s = Settings(state_dir=tmp_path, triton_http_port=1)
    assert not triton.healthy(s, timeout_s=0.5)
