"""The Prometheus part of the local stack: its generated configuration, command and targets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

import devstack as stack
from devstack import prometheus
from devstack.process import StackError
from streams.settings import Settings


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(
        state_dir=tmp_path,
        prometheus_port=19090,
        triton_grpc="127.0.0.1:18001",
        triton_metrics_port=18002,
        gateway_url="http://127.0.0.1:18088",
        worker_web_port=16066,
    )


def _jobs(settings: Settings) -> dict[str, dict]:
    prometheus.prepare(settings)
    config = yaml.safe_load(prometheus.config_path(settings).read_text())
    return {job["job_name"]: job for job in config["scrape_configs"]}


def test_every_local_service_is_scraped_on_the_settings_ports(settings: Settings) -> None:
    jobs = _jobs(settings)
    targets = {name: job["static_configs"][0]["targets"] for name, job in jobs.items()}
    assert targets == {
        "prometheus": ["127.0.0.1:19090"],
        "triton": ["127.0.0.1:18002"],
        "gateway": ["127.0.0.1:18088"],
        "worker": ["127.0.0.1:16066"],
        "features": ["127.0.0.1:6067"],
        "ingest": ["127.0.0.1:8090"],
    }


def test_short_intervals_so_that_a_fault_alerts_within_two_minutes(settings: Settings) -> None:
    prometheus.prepare(settings)
    config = yaml.safe_load(prometheus.config_path(settings).read_text())
    assert config["global"]["scrape_interval"] == "5s"
    assert config["global"]["evaluation_interval"] == "5s"
    assert config["rule_files"] == [str(prometheus.RULES_DIR / "*.rules.yml")]
    assert list(prometheus.RULES_DIR.glob("*.rules.yml"))


def test_service_jobs_also_read_their_file_sd_folder(settings: Settings) -> None:
    jobs = _jobs(settings)
    for name in prometheus.SERVICE_JOBS:
        [sd] = jobs[name]["file_sd_configs"]
        assert sd["files"] == [str(prometheus.targets_dir(settings) / f"{name}--*.json")]
    assert "file_sd_configs" not in jobs["triton"]


def test_a_registered_target_is_a_file_sd_file_until_unregistered(settings: Settings) -> None:
    path = prometheus.register_target(settings, "worker", "127.0.0.1:41234", "it-abc")
    assert path.parent == prometheus.targets_dir(settings)
    assert path.match("worker--*.json")
    assert json.loads(path.read_text()) == [{"targets": ["127.0.0.1:41234"]}]
    assert not list(path.parent.glob("*.tmp"))
    prometheus.unregister_target(path)
    assert not path.exists()
    prometheus.unregister_target(path)  # twice is fine


@pytest.mark.parametrize(
    ("job", "name"), [("triton", "x"), ("worker", "../etc"), ("worker", ""), ("worker", "a b")]
)
def test_register_target_refuses_other_jobs_and_unsafe_names(
    settings: Settings, job: str, name: str
) -> None:
    with pytest.raises(ValueError):
        prometheus.register_target(settings, job, "127.0.0.1:1", name)


def test_write_config_says_whether_it_changed(settings: Settings) -> None:
    assert prometheus.write_config(settings) is True
    assert prometheus.write_config(settings) is False
    other = settings.model_copy(update={"worker_web_port": 16067})
    assert prometheus.write_config(other) is True


def test_server_args(settings: Settings) -> None:
    argv = prometheus.server_args(settings, "/usr/bin/prometheus")
    assert argv[0] == "/usr/bin/prometheus"
    assert f"--config.file={prometheus.config_path(settings)}" in argv
    assert f"--storage.tsdb.path={settings.state_dir / 'prometheus' / 'data'}" in argv
    assert "--web.listen-address=127.0.0.1:19090" in argv
    assert "--web.enable-lifecycle" in argv
    assert prometheus.ports(settings) == (19090,)


def test_a_missing_binary_names_the_install_and_the_flag(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(prometheus, "find_prometheus", lambda: None)
    with pytest.raises(StackError, match="apt-get install -y prometheus") as err:
        prometheus.command(settings)
    assert "--no-prometheus" in str(err.value)


def test_not_healthy_when_nothing_listens(settings: Settings) -> None:
    assert prometheus.healthy(settings.model_copy(update={"prometheus_port": 1})) is False


def test_it_is_a_stack_part_started_last_and_stopped_first() -> None:
    assert stack.PARTS[-1] == "prometheus"
    assert stack._select(None)[-1] == "prometheus"
    assert stack._module("prometheus") is prometheus


def test_a_failed_reload_on_stack_up_is_a_warning(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(prometheus, "reload", lambda s: False)
    with caplog.at_level("WARNING", logger="devstack"):
        prometheus.refresh(settings)
    assert "reloading the rules failed" in caplog.text
    caplog.clear()
    monkeypatch.setattr(prometheus, "reload", lambda s: True)
    prometheus.refresh(settings)
    assert caplog.text == ""
