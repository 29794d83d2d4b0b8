"""The alert rules: valid for promtool, each one unit-tested, labelled and actionable.

`promtool` comes with Debian's prometheus package (`make setup`).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from devstack import prometheus
from streams.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
ALERTS = ROOT / "deploy" / "alerts"
RULES = ALERTS / "ticketflow.rules.yml"
TESTS = sorted((ALERTS / "tests").glob("*.yml"))
LAYERS = {"access", "workflow", "inference", "data"}

PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool missing: `make setup` installs Debian's prometheus"
)


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=120)


def _alerts() -> list[dict]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def _rule_tests() -> list[dict]:
    """Every alert_rule_test entry of every test file."""
    out = []
    for path in TESTS:
        doc = yaml.safe_load(path.read_text())
        assert doc["rule_files"] == ["../ticketflow.rules.yml"], path
        for test in doc["tests"]:
            out.extend(test.get("alert_rule_test", []))
    return out


@needs_promtool
def test_promtool_checks_the_rules() -> None:
    proc = _promtool("check", "rules", str(RULES))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(_alerts())} rules found" in proc.stdout


@needs_promtool
def test_promtool_rule_unit_tests_pass() -> None:
    assert TESTS, "no rule tests in deploy/alerts/tests"
    proc = _promtool("test", "rules", *map(str, TESTS))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("SUCCESS") == len(TESTS)


def test_every_rule_is_an_alert_with_a_firing_and_a_silent_test() -> None:
    names = [rule.get("alert") for rule in _alerts()]
    assert None not in names, "a recording rule: give it a promql_expr_test and handle it here"
    assert len(names) == len(set(names))
    tests = _rule_tests()
    firing = {t["alertname"] for t in tests if t["exp_alerts"]}
    silent = {t["alertname"] for t in tests if not t["exp_alerts"]}
    assert set(names) - firing == set(), "alerts without a test where they fire"
    assert set(names) - silent == set(), "alerts without a test where they stay silent"
    assert {t["alertname"] for t in tests} <= set(names), "a test of an alert that is gone"


def test_every_alert_names_its_severity_layer_and_what_to_do() -> None:
    for rule in _alerts():
        labels, notes = rule["labels"], rule["annotations"]
        assert labels["severity"] in {"critical", "warning"}, rule["alert"]
        assert labels["layer"] in LAYERS, rule["alert"]
        assert notes["summary"].strip() and len(notes["action"]) > 20, rule["alert"]


def test_the_seed_thresholds_are_the_ones_alerted_on() -> None:
    expr = {rule["alert"]: " ".join(rule["expr"].split()) for rule in _alerts()}
    assert expr["FeatureCoverageLow"].endswith("< 0.9")  # seed 001 §5.4
    assert expr["FeatureCacheHitRatioLow"].endswith("< 0.95")  # §5.1
    assert expr["WorkflowLatencyP99High"].endswith("> 2")  # the workflow's 2 s deadline
    assert expr["InferenceLatencyP99High"].endswith("> 0.3")  # the infer step's 300 ms
    assert expr["FeatureFetchP99High"].endswith("> 0.8")  # the features step's 800 ms
    assert expr["AccessLatencyP99High"].endswith("> 0.2")  # §1: p99 within 200 ms
    layers = {rule["labels"]["layer"] for rule in _alerts() if "LatencyP99" in rule["alert"]}
    assert layers == {"access", "workflow", "inference"}  # and data: FeatureFetchP99High


def test_every_service_and_dependency_has_a_down_alert() -> None:
    expr = {rule["alert"]: rule["expr"] for rule in _alerts()}
    for alert, job in [
        ("TritonDown", "triton"),
        ("GatewayDown", "gateway"),
        ("WorkerDown", "worker"),
        ("FeatureJobDown", "features"),
        ("IngestDown", "ingest"),
    ]:
        assert expr[alert] == f'up{{job="{job}"}} == 0'
    for alert, dep in [("RedisDown", "redis"), ("KafkaDown", "kafka")]:
        assert expr[alert] == f'workflow_dependency_up{{dependency="{dep}"}} == 0'


@needs_promtool
def test_the_local_config_is_valid_and_loads_the_rules(tmp_path: Path) -> None:
    settings = Settings(state_dir=tmp_path)
    prometheus.prepare(settings)
    config = yaml.safe_load(prometheus.config_path(settings).read_text())
    assert [Path(p).parent for p in config["rule_files"]] == [ALERTS]
    proc = _promtool("check", "config", str(prometheus.config_path(settings)))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ticketflow.rules.yml" in proc.stdout  # the glob found the rules file


def test_compose_prometheus_loads_the_same_rules() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    volumes = compose["services"]["prometheus"]["volumes"]
    assert "./deploy/alerts:/etc/prometheus/alerts:ro" in volumes
    config = yaml.safe_load((ROOT / "deploy" / "prometheus.yml").read_text())
    assert config["rule_files"] == ["/etc/prometheus/alerts/*.rules.yml"]
    jobs = {job["job_name"] for job in config["scrape_configs"]}
    assert {"triton", "gateway", "worker", "features", "ingest"} <= jobs
