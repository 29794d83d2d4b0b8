"""The rollout's logic without Kafka or Triton: canary weights, version directories, the
load config, the history behind rollback, and what deploy/retire refuse
(inference_gateway.model.rollout)."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest

from inference_gateway import triton_server
from inference_gateway.model import rollout
from schemas.routing import RoutingConfig
from training import builds

MODEL = "ticket_classifier"


def cfg(default: str = "v1", **weights: int) -> RoutingConfig:
    return RoutingConfig(name=MODEL, versions=weights, default=default)


# ---- canary weights -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("before", "weight", "after"),
    [
        (cfg(v1=100), 10, {"v1": 90, "v3": 10}),
        (cfg(v1=90, v2=10), 20, {"v1": 70, "v2": 10, "v3": 20}),  # from the largest first
        (cfg(v1=50, v2=50), 80, {"v1": 0, "v2": 20, "v3": 80}),
        (cfg(v1=70, v3=30), 10, {"v1": 90, "v3": 10}),  # shrinking: back to the default
        (cfg(v1=100), 0, {"v1": 100, "v3": 0}),
        (cfg(v1=100), 100, {"v1": 0, "v3": 100}),
    ],
)
def test_a_canary_takes_its_weight_and_the_config_stays_valid(before, weight, after) -> None:
    new = rollout.with_canary(before, "v3", weight)
    assert new.versions == after and new.default == "v1" and sum(new.versions.values()) == 100


def test_a_canary_weight_past_100_is_refused() -> None:
    with pytest.raises(rollout.RolloutError, match="0-100"):
        rollout.with_canary(cfg(v1=100), "v3", 101)


def test_promotion_sends_everything_to_the_version_and_makes_it_the_default() -> None:
    assert rollout.promoted(cfg(v1=90, v3=10), "v3") == cfg("v3", v3=100)


# ---- version directories --------------------------------------------------------------------


def _version(model_dir: Path, name: str, complete: bool = True) -> None:
    (model_dir / name).mkdir(parents=True)
    if complete:
        (model_dir / name / "model.py").write_text("# model\n")


def test_the_next_version_is_past_every_numbered_folder_and_never_below_3(tmp_path) -> None:
    _version(tmp_path, "1")
    assert rollout.next_version(tmp_path) == 3  # 2 is train.py's even when not built
    _version(tmp_path, "7", complete=False)  # half-written: its number is taken all the same
    _version(tmp_path, ".incoming-9")
    assert rollout.next_version(tmp_path) == 8
    assert rollout.disk_versions(tmp_path) == [1]


def test_install_copies_the_build_in_whole_under_the_next_number(tmp_path) -> None:
    model_dir, staging = tmp_path / "m", tmp_path / "staging"
    _version(model_dir, "1")
    staging.mkdir()
    (staging / "weights.npz").write_bytes(b"w")
    (staging / "model.py").write_text("# model\n")
    (staging / "__pycache__").mkdir()
    assert rollout.install(staging, model_dir) == 3
    assert sorted(p.name for p in (model_dir / "3").iterdir()) == ["model.py", "weights.npz"]
    assert not list(model_dir.glob(".incoming-*"))
    assert rollout.disk_versions(model_dir) == [1, 3]


def test_an_incomplete_build_is_not_installed(tmp_path) -> None:
    (tmp_path / "staging").mkdir()
    with pytest.raises(rollout.RolloutError, match="not a complete build"):
        rollout.install(tmp_path / "staging", tmp_path)


def test_the_load_config_is_config_pbtxt_serving_exactly_the_listed_versions() -> None:
    config = json.loads(rollout.load_config(builds.MODEL_DIR, [3, 1, 3]))
    assert config["versionPolicy"] == {"specific": {"versions": ["1", "3"]}}
    assert config["name"] == MODEL and config["maxBatchSize"] == 64
    assert config["backend"] == "python" and "dynamicBatching" in config
    assert [o["name"] for o in config["output"]] == ["SCORES"]


# ---- deploy, promote, rollback, retire against in-memory Kafka and Triton --------------------


class Fakes:
    """The routing topics as dicts (latest record per key) and Triton as a set of versions."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, model_dir: Path) -> None:
        self.topics: dict[str, dict[str, bytes]] = {}
        self.served: list[int] = [1]
        self.fail_load = False
        self.model_dir = model_dir
        monkeypatch.setattr(rollout, "read_configs", self.read_configs)
        monkeypatch.setattr(rollout, "publish", self.publish)
        monkeypatch.setattr(rollout, "publish_record", self.publish_record)
        monkeypatch.setattr(rollout, "scan", self.scan)
        monkeypatch.setattr(rollout, "loaded", lambda _t: list(self.served))
        monkeypatch.setattr(rollout, "load_versions", self.load_versions)
        monkeypatch.setattr(rollout, "smoke_test", lambda _t, _v: [1.0])
        monkeypatch.setattr(rollout, "wait_quiet", lambda _t, _v: None)

    def publish_record(self, topic: str, key: str, value: bytes, _bootstrap: str) -> None:
        self.topics.setdefault(topic, {})[key] = value

    def publish(self, config: RoutingConfig, _bootstrap: str, topic: str) -> None:
        self.publish_record(topic, config.name, config.model_dump_json().encode(), "")

    def read_configs(self, _bootstrap: str, topic: str) -> dict:
        return {
            k: RoutingConfig.model_validate_json(v) for k, v in self.topics.get(topic, {}).items()
        }

    def scan(self, _bootstrap: str, topic: str, _timeout: float):
        yield from ((k.encode(), v) for k, v in self.topics.get(topic, {}).items())

    def load_versions(self, _target: rollout.Target, versions: list[int]) -> None:
        if self.fail_load:
            raise RuntimeError("load failed")
        self.served = sorted(versions)


@pytest.fixture
def fakes(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Fakes:
    _version(tmp_path / "repo" / MODEL, "1")
    return Fakes(monkeypatch, tmp_path / "repo" / MODEL)


@pytest.fixture
def target(tmp_path: Path) -> rollout.Target:
    return rollout.Target(tmp_path / "repo", "triton:1", "kafka:1", "p.")


@pytest.fixture
def staging(tmp_path: Path) -> Path:
    folder = tmp_path / "staging"
    folder.mkdir()
    (folder / "model.py").write_text("# model\n")
    (folder / builds.BUILD_FILE).write_text(json.dumps({"type": "v1", "accuracy": 0.96}))
    (folder / "metrics.json").write_text(json.dumps({"accuracy": 0.96}))
    return folder


def test_deploy_promote_and_rollback_walk_the_history_back(fakes, target, staging) -> None:
    done = rollout.deploy(target, staging, canary=25)
    assert done.version == 3 and fakes.served == [1, 3]
    assert rollout.current(target) == cfg(v1=75, v3=25)
    assert rollout.promote(target) == cfg("v3", v3=100)
    assert rollout.history(target) == [cfg(v1=100), cfg(v1=75, v3=25)]
    assert rollout.rollback(target) == cfg(v1=75, v3=25)
    assert rollout.current(target) == cfg(v1=75, v3=25)
    assert rollout.rollback(target) == cfg(v1=100)
    assert rollout.history(target) == []
    with pytest.raises(rollout.RolloutError, match="only 0 earlier"):
        rollout.rollback(target)
    assert set(fakes.topics) == {"p.config.routing", "p.config.routing.history"}


def test_a_version_that_fails_to_load_is_removed_and_nothing_is_published(
    fakes, target, staging
) -> None:
    fakes.fail_load = True
    with pytest.raises(rollout.RolloutError, match=r"v3 did not load; Triton keeps \[1\]"):
        rollout.deploy(target, staging)
    assert not (fakes.model_dir / "3").exists() and fakes.served == [1]
    assert fakes.topics == {}


def test_retire_refuses_a_version_with_traffic_then_unloads_and_removes_it(
    fakes, target, staging
) -> None:
    rollout.deploy(target, staging, canary=10)
    with pytest.raises(rollout.RolloutError, match="still takes traffic"):
        rollout.retire(target, 3)
    rollout.rollback(target)
    assert rollout.retire(target, 3) == [1]
    assert fakes.served == [1] and not (fakes.model_dir / "3").exists()
    with pytest.raises(rollout.RolloutError, match="retire only built"):
        rollout.retire(target, 1)


def test_promote_refuses_a_version_triton_does_not_serve(fakes, target) -> None:
    with pytest.raises(rollout.RolloutError, match="not loaded"):
        rollout.promote(target, "v4")


def test_listing_joins_disk_triton_and_traffic(fakes, target, staging) -> None:
    rollout.deploy(target, staging, canary=10)
    rows = rollout.listing(target, states=lambda: {1: "READY", 3: "READY", 4: "UNAVAILABLE"})
    got = [(r.version, r.kind, r.on_disk, r.state, r.share, r.accuracy) for r in rows]
    assert got == [
        (1, "v1", True, "READY", 90, None),
        (3, "v1", True, "READY", 10, 0.96),
        (4, "?", False, "UNAVAILABLE", 0, None),
    ]


# ---- Triton's command line and the INT8 serving wrapper --------------------------------------


def test_triton_runs_under_explicit_control_loading_everything_present(tmp_path) -> None:
    cmd = triton_server.tritonserver_command(tmp_path, 1, 2, 3, backend_dir=tmp_path / "b")
    assert "--model-control-mode=explicit" in cmd and "--load-model=*" in cmd
    some = triton_server.tritonserver_command(
        tmp_path, 1, 2, 3, backend_dir=tmp_path / "b", load_models=("a", "b")
    )
    assert "--load-model=a" in some and "--load-model=b" in some
    none = triton_server.tritonserver_command(
        tmp_path, 1, 2, 3, backend_dir=tmp_path / "b", model_control="none"
    )
    assert "--model-control-mode=none" in none and not any("--load-model" in a for a in none)
    with pytest.raises(ValueError, match="only --load-model"):
        triton_server.tritonserver_command(tmp_path, 1, 2, 3, load_models=("*", "a"))


def test_the_int8_version_encodes_one_ticket_per_call(monkeypatch) -> None:
    class Base:
        def initialize(self, args: dict) -> None:
            encoder = types.SimpleNamespace(max_chunk_rows=16)
            self.classifier = types.SimpleNamespace(encoder=encoder)

    monkeypatch.setitem(sys.modules, "triton_v2", types.SimpleNamespace(TritonPythonModel=Base))
    monkeypatch.delitem(sys.modules, "inference_gateway.model.triton_v2_int8", raising=False)
    from inference_gateway.model import triton_v2_int8

    model = triton_v2_int8.TritonPythonModel()
    model.initialize({})
    assert model.classifier.encoder.max_chunk_rows == 1


def test_listing_without_triton_still_shows_disk_and_traffic(fakes, target) -> None:
    def down() -> dict[int, str]:
        raise ConnectionError("refused")

    rows = rollout.listing(target, states=down)
    assert [(r.version, r.state, r.share) for r in rows] == [(1, "unreachable", 100)]


def test_a_triton_without_explicit_control_is_named_as_the_cause(
    fakes, target, staging, monkeypatch
) -> None:
    def refuse(_target, _versions) -> None:
        raise RuntimeError("explicit model load / unload is not allowed if polling is enabled")

    monkeypatch.setattr(rollout, "load_versions", refuse)
    with pytest.raises(rollout.RolloutError, match="without explicit model control"):
        rollout.deploy(target, staging)
    assert not (fakes.model_dir / "3").exists()
