"""`config validate|route-test` of inference_gateway.cli (no Kafka needed for these)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from inference_gateway.cli import config_app
from inference_gateway.routing import bucket_of
from inference_gateway.routing_store import RoutingFileError, parse_routing

runner = CliRunner()


def write(tmp_path: Path, config: object) -> Path:
    path = tmp_path / "routing.json"
    path.write_text(json.dumps(config), encoding="utf-8")
    return path


def test_a_valid_config_passes(tmp_path: Path) -> None:
    path = write(tmp_path, {"name": "ticket_classifier", "versions": {"v1": 90, "v2": 10},
                            "default": "v1"})  # fmt: skip
    result = runner.invoke(config_app, ["validate", str(path)])
    assert result.exit_code == 0, result.output
    assert "ok" in result.output


@pytest.mark.parametrize(
    ("config", "field"),
    [
        ({"name": "t", "versions": {"v1": "50", "v2": 50}, "default": "v1"}, "versions.v1"),
        ({"name": "t", "versions": {"v1": 90, "v2": 20}, "default": "v1"}, "versions"),
        ({"name": "t", "versions": {"v1": 100}, "default": "v2"}, "default"),
        ({"name": "t", "versions": {"v1": 101}, "default": "v1"}, "versions.v1"),
        ({"versions": {"v1": 100}, "default": "v1"}, "name"),
        ({"name": "t", "versions": {"v1": 100}, "default": "v1", "extra": 1}, "extra"),
    ],
)
def test_an_invalid_config_is_refused_naming_the_field(
    tmp_path: Path, config: dict, field: str
) -> None:
    result = runner.invoke(config_app, ["validate", str(write(tmp_path, config))])
    assert result.exit_code == 1
    assert f"{field}:" in result.output
    with pytest.raises(RoutingFileError) as caught:
        parse_routing(json.dumps(config))
    assert f"{field}:" in str(caught.value)


def test_a_string_weight_is_refused_not_read_as_a_number() -> None:
    with pytest.raises(RoutingFileError, match=r"versions\.v2"):
        parse_routing('{"name": "t", "versions": {"v1": 50, "v2": "50"}, "default": "v1"}')


def test_set_refuses_an_invalid_config_before_touching_kafka(tmp_path: Path) -> None:
    path = write(tmp_path, {"name": "t", "versions": {"v1": "100"}, "default": "v1"})
    result = runner.invoke(config_app, ["set", str(path), "--bootstrap", "127.0.0.1:1"])
    assert result.exit_code == 1
    assert "not published" in result.output and "versions.v1" in result.output


def test_route_test_names_each_ids_version(tmp_path: Path) -> None:
    path = write(tmp_path, {"name": "ticket_classifier", "versions": {"v1": 50, "v2": 50},
                            "default": "v1"})  # fmt: skip
    ids = ["ticket-1", "ticket-2", "ticket-3"]
    result = runner.invoke(config_app, ["route-test", *ids, "--file", str(path)])
    assert result.exit_code == 0, result.output
    for input_id in ids:
        expected = "v1" if bucket_of(input_id) < 50 else "v2"
        line = next(line for line in result.output.splitlines() if input_id in line)
        assert expected in line and str(bucket_of(input_id)) in line


def test_a_yaml_file_is_not_a_routing_config(tmp_path: Path) -> None:
    path = tmp_path / "workflow.yaml"
    path.write_text("name: x\n", encoding="utf-8")
    result = runner.invoke(config_app, ["validate", str(path)])
    assert result.exit_code == 2
