"""up/down/status/start_part/stop_part of devstack, against a fake part (a sleeper)."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

import devstack as stack
from devstack import process
from streams.settings import Settings

SLEEPER = "import pathlib, sys, time; pathlib.Path(sys.argv[1]).touch(); time.sleep(60)"


def _fake_part(tmp_path: Path, *, crash: bool = False) -> types.ModuleType:
    """A part that is healthy while the flag file exists (touched by the process it starts)."""
    flag = tmp_path / "healthy.flag"
    mod = types.ModuleType("fake")
    mod.NAME = "kafka"
    mod.DEFAULT_TIMEOUT_S = 10.0
    mod.STOP_TIMEOUT_S = 5.0
    mod.flag = flag
    mod.prepared = 0
    mod.after = 0

    def prepare(settings: Settings) -> None:
        mod.prepared += 1

    def command(settings: Settings) -> tuple[list[str], None]:
        code = "raise SystemExit(7)" if crash else SLEEPER
        return [sys.executable, "-c", code, str(flag)], None

    def healthy(settings: Settings) -> bool:
        return flag.exists()

    def after_start(settings: Settings, timeout_s: float) -> None:
        mod.after += 1

    mod.prepare = prepare
    mod.command = command
    mod.healthy = healthy
    mod.after_start = after_start
    mod.host = lambda settings: "127.0.0.1"
    mod.ports = lambda settings: (1,)  # nothing listens on port 1
    mod.log_file = lambda settings: process.log_path(settings, "kafka")
    return mod


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(state_dir=tmp_path / "state")


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    mod = _fake_part(tmp_path)
    monkeypatch.setitem(stack._MODULES, "kafka", mod)
    return mod


def test_select_orders_and_validates() -> None:
    assert stack._select(None) == ["kafka", "redis", "triton", "prometheus"]
    assert stack._select(["triton", "Kafka "]) == ["kafka", "triton"]
    with pytest.raises(stack.StackError, match="unknown stack part"):
        stack._select(["zookeeper"])


def test_up_is_idempotent_and_down_stops_ours(settings: Settings, fake: types.ModuleType) -> None:
    stack.up(settings, ["kafka"])
    first = stack.part_status(settings, "kafka")
    assert first.healthy and first.ours and first.pid
    assert fake.prepared == 1 and fake.after == 1

    stack.up(settings, ["kafka"])  # healthy: left alone
    assert fake.prepared == 1
    assert stack.part_status(settings, "kafka").pid == first.pid

    fake.flag.unlink()  # the process runs but stops answering: a second up waits for it
    assert stack.down(settings, ["kafka"]) == ["kafka"]
    assert not process.pid_path(settings, "kafka").exists()
    after = stack.part_status(settings, "kafka")
    assert not after.healthy and after.pid is None
    assert stack.down(settings, ["kafka"]) == []


def test_a_part_not_started_by_us_is_left_alone(settings: Settings, fake: types.ModuleType) -> None:
    fake.flag.touch()  # "healthy", but no pid file of ours
    stack.up(settings, ["kafka"])
    assert fake.prepared == 0
    st = stack.part_status(settings, "kafka")
    assert st.healthy and not st.ours and st.pid is None
    assert not stack.stop_part(settings, "kafka")
    assert stack.down(settings, ["kafka"]) == []
    assert fake.flag.exists()


def test_stop_and_start_part(settings: Settings, fake: types.ModuleType) -> None:
    st = stack.start_part(settings, "kafka")
    assert st.healthy and st.ours
    fake.flag.unlink()
    assert stack.stop_part(settings, "kafka", kill=True)
    assert not stack.stop_part(settings, "kafka")
    again = stack.start_part(settings, "kafka")
    assert again.healthy and again.pid != st.pid
    assert stack.stop_part(settings, "kafka")


def test_crash_during_start_names_the_log(
    settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(stack._MODULES, "kafka", _fake_part(tmp_path, crash=True))
    with pytest.raises(stack.StackError, match=r"exited during start-up \(rc=7\).*kafka\.log"):
        stack.up(settings, ["kafka"])
    assert not process.pid_path(settings, "kafka").exists()


def test_timeout_stops_the_process(settings: Settings, fake: types.ModuleType) -> None:
    fake.healthy = lambda settings: False
    with pytest.raises(stack.StackError, match="did not become healthy within"):
        stack.up(settings, ["kafka"], timeout_s=0.5)
    assert not process.pid_path(settings, "kafka").exists()


def test_busy_port_is_a_clear_error(
    settings: Settings, fake: types.ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(stack, "port_open", lambda host, port, timeout_s=0.5: True)
    with pytest.raises(stack.StackError, match="taken by something"):
        stack.up(settings, ["kafka"])
    assert fake.prepared == 0


def test_status_lists_every_part(
    settings: Settings, fake: types.ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("redis", "triton", "prometheus"):
        other = _fake_part(settings.state_dir / name)
        other.NAME = name
        monkeypatch.setitem(stack._MODULES, name, other)
    names = [s.name for s in stack.status(settings)]
    assert names == ["kafka", "redis", "triton", "prometheus"]
