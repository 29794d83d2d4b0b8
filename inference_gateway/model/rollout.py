"""A new model version live without a restart: deploy, canary, promote, rollback, retire.

- **deploy** copies a staged build (training/builds.py) into the model repository as the next free
  version number, written whole under a hidden name, then renamed (Triton never sees half a
  version), loads it into the running Triton, checks it answers, and publishes a canary weight.
- **Loading.** Triton runs with explicit model control. The new version is a new directory,
  and the load request carries a config override whose `version_policy` lists the versions to
  serve (those loaded now plus the new one): Triton loads the new one and reloads the others
  beside the instances that keep serving, then swaps; nothing is modified in place (Triton's
  guidance is to unload a model before loading an *updated* version of it), and a half-copied
  or stray directory is never picked up. If the load fails, Triton keeps serving what it had
  and the new directory is removed (a restarted Triton, `version_policy: all`, would fail on it).
- **Routing** is the `RoutingConfig` on `config.routing` that every gateway follows. Before
  each change the config in force is appended to a history record on the compacted topic
  `config.routing.history` (one record per model, the last HISTORY_LIMIT configs), so any host
  can roll back; `rollback` publishes the latest of them again and drops it from the history.
- **retire** unloads a version that no config routes to and removes its directory.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from inference_gateway.routing import DEFAULT_CONFIG, triton_version
from inference_gateway.routing_store import publish, publish_record, read_configs
from inference_gateway.routing_watch import routing_topic
from inference_gateway.topic_scan import scan_topic
from schemas.routing import RoutingConfig

from .repository import read_build

MODEL = DEFAULT_CONFIG.name
HISTORY_LIMIT = 20
FIRST_BUILT_VERSION = 3  # 1 and 2 are training/train.py's, built at set-up
LOAD_TIMEOUT_S = 120.0
# what Triton answers a load request unless it runs with --model-control-mode=explicit
NOT_EXPLICIT = "load / unload is not allowed"
NOT_EXPLICIT_HINT = (
    " (this Triton was started without explicit model control; restart it with this"
    " version's `ticketflow stack down && ticketflow stack up`)"
)
QUIET_S = 2.0  # no request for this long before a version is unloaded (see wait_quiet)
SMOKE_TEXT = "I was charged twice for my order, please refund one payment"


class RolloutError(RuntimeError):
    """A rollout step that cannot be done; the message says why and what is unchanged."""


@dataclass(frozen=True)
class Target:
    """Where a rollout acts: a model repository, the Triton serving it, the routing topic."""

    repository: Path
    triton_url: str
    bootstrap: str
    prefix: str = ""
    model: str = MODEL

    @property
    def model_dir(self) -> Path:
        return self.repository / self.model

    @property
    def topic(self) -> str:
        return routing_topic(self.prefix)

    @property
    def history_topic(self) -> str:
        return routing_topic(self.prefix) + ".history"


# ---- the repository on disk -----------------------------------------------------------------


def disk_versions(model_dir: Path) -> list[int]:
    """Version numbers with a complete directory (its model.py is written last)."""
    found = [p for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit()]
    return sorted(int(p.name) for p in found if (p / "model.py").exists() and p.name[0] != "0")


def next_version(model_dir: Path) -> int:
    numbers = [int(p.name) for p in model_dir.iterdir() if p.name.isdigit()]
    return max([FIRST_BUILT_VERSION - 1, *numbers]) + 1


def install(staging: Path, model_dir: Path) -> int:
    """Copy a staged build in as the next version; the rename makes it appear whole."""
    if not (staging / "model.py").exists():
        raise RolloutError(f"{staging} is not a complete build (no model.py)")
    version = next_version(model_dir)
    # Triton ignores version directories whose name is not a number, so the copy is invisible
    incoming = model_dir / f".incoming-{version}"
    shutil.rmtree(incoming, ignore_errors=True)
    shutil.copytree(staging, incoming, ignore=shutil.ignore_patterns("__pycache__"))
    incoming.rename(model_dir / str(version))
    return version


# ---- Triton -------------------------------------------------------------------------------


def load_config(model_dir: Path, versions: Sequence[int]) -> str:
    """config.pbtxt as the JSON a load request takes, serving exactly `versions`."""
    from google.protobuf import json_format, text_format
    from tritonclient.grpc import model_config_pb2

    config = text_format.Parse(
        (model_dir / "config.pbtxt").read_text(encoding="utf-8"), model_config_pb2.ModelConfig()
    )
    config.version_policy.Clear()
    config.version_policy.specific.versions.extend(sorted(set(versions)))
    return json_format.MessageToJson(config)


def _client(target: Target) -> Any:
    import tritonclient.grpc as grpcclient

    return grpcclient.InferenceServerClient(target.triton_url)


def triton_states(client: Any, model: str) -> dict[int, str]:
    """version -> state (READY, UNAVAILABLE, ...) from Triton's repository index."""
    index = client.get_model_repository_index(as_json=True).get("models", [])
    return {
        int(m["version"]): m.get("state", "")
        for m in index
        if m.get("name") == model and str(m.get("version", "")).isdigit()
    }


def load_versions(target: Target, versions: Sequence[int]) -> None:
    """Have Triton serve exactly `versions` of the model (load, reload beside, or unload)."""
    client = _client(target)
    try:
        if versions:
            config = load_config(target.model_dir, versions)
            client.load_model(target.model, config=config, client_timeout=LOAD_TIMEOUT_S)
        else:
            client.unload_model(target.model)
    finally:
        client.close()


def smoke_test(target: Target, version: int) -> list[float]:
    """One inference on `version`: ready, and its scores are a distribution."""
    import numpy as np
    import tritonclient.grpc as grpcclient

    client = _client(target)
    try:
        if not client.is_model_ready(target.model, str(version)):
            raise RolloutError(f"Triton does not report {target.model} v{version} ready")
        text = grpcclient.InferInput("TEXT", [1, 1], "BYTES")
        text.set_data_from_numpy(np.array([[SMOKE_TEXT.encode()]], dtype=object))
        result = client.infer(target.model, [text], model_version=str(version))
        scores = result.as_numpy("SCORES")[0]
    finally:
        client.close()
    if not abs(float(scores.sum()) - 1.0) < 1e-3:
        raise RolloutError(f"v{version} answered scores that do not sum to 1")
    return [round(float(s), 4) for s in scores]


def loaded(target: Target) -> list[int]:
    client = _client(target)
    try:
        states = triton_states(client, target.model)
    finally:
        client.close()
    return sorted(v for v, state in states.items() if state == "READY")


# ---- routing and its history --------------------------------------------------------------


def with_canary(config: RoutingConfig, version: str, weight: int) -> RoutingConfig:
    """`config` with `version` at `weight` %, taken from the largest other weights first
    (handed back to the default when the canary shrinks)."""
    if not 0 <= weight <= 100:
        raise RolloutError("canary weight must be 0-100")
    others = {v: w for v, w in config.versions.items() if v != version}
    excess = sum(others.values()) - (100 - weight)
    for name in sorted(others, key=lambda v: -others[v]):
        take = min(max(excess, 0), others[name])
        others[name] -= take
        excess -= take
    if excess < 0:  # the canary shrank: the rest goes back to the default
        home = config.default if config.default in others else max(others, key=lambda v: others[v])
        others[home] -= excess
    return RoutingConfig(
        name=config.name, versions={**others, version: weight}, default=config.default
    )


def promoted(config: RoutingConfig, version: str) -> RoutingConfig:
    return RoutingConfig(name=config.name, versions={version: 100}, default=version)


def current(target: Target) -> RoutingConfig:
    """The config in force (the default, all to v1, when none valid is published)."""
    found = read_configs(target.bootstrap, target.topic).get(target.model)
    return found if isinstance(found, RoutingConfig) else DEFAULT_CONFIG


def scan(bootstrap: str, topic: str, timeout_s: float) -> Iterator[tuple[bytes, bytes]]:
    """(key, value) of every record of `topic` up to its end now, tombstones left out."""
    # the group the history was read under before rollout had a reader of its own
    for key, value in scan_topic(bootstrap, topic, "ticketflow-model-build", timeout_s):
        if value is not None:
            yield key, value


def history(target: Target) -> list[RoutingConfig]:
    """Earlier configs, oldest first (the last is what `rollback` restores)."""
    latest: bytes | None = None
    for key, value in scan(target.bootstrap, target.history_topic, 10.0):
        if key.decode("utf-8", "replace") == target.model:
            latest = value
    if latest is None:
        return []
    try:
        return [RoutingConfig.model_validate(c) for c in json.loads(latest)["configs"]]
    except (ValueError, KeyError, TypeError):
        raise RolloutError(f"{target.history_topic}: the history record is unreadable") from None


def _save_history(target: Target, configs: list[RoutingConfig]) -> None:
    body = {"name": target.model, "configs": [c.model_dump() for c in configs[-HISTORY_LIMIT:]]}
    publish_record(target.history_topic, target.model, json.dumps(body).encode(), target.bootstrap)


def switch(target: Target, new: RoutingConfig) -> RoutingConfig:
    """Publish `new`, the config in force going onto the history first; returns that one."""
    old = current(target)
    _save_history(target, [*history(target), old])
    publish(new, target.bootstrap, target.topic)
    return old


# ---- the commands ---------------------------------------------------------------------------


@dataclass
class Deployed:
    version: int
    loaded: list[int]
    routing: RoutingConfig
    scores: list[float] = field(default_factory=list)


def deploy(target: Target, staging: Path, canary: int = 10) -> Deployed:
    """Install `staging` as a new version, load it beside the others, publish a canary."""
    before = loaded(target)
    if not before:
        raise RolloutError(f"Triton at {target.triton_url} serves no version of {target.model}")
    version = install(staging, target.model_dir)
    try:
        load_versions(target, [*before, version])
        scores = smoke_test(target, version)
    except Exception as error:
        _undo(target, version, before)
        hint = NOT_EXPLICIT_HINT if NOT_EXPLICIT in str(error) else ""
        raise RolloutError(
            f"v{version} did not load; Triton keeps {before}: {error}{hint}"
        ) from None
    config = with_canary(current(target), f"v{version}", canary)
    switch(target, config)
    return Deployed(version, [*before, version], config, scores)


def _undo(target: Target, version: int, before: list[int]) -> None:
    try:
        if version in loaded(target):
            load_versions(target, before)
    finally:  # even when Triton is gone: a restarted one must not find a broken version
        shutil.rmtree(target.model_dir / str(version), ignore_errors=True)


def promote(target: Target, version: str | None = None) -> RoutingConfig:
    """All traffic to `version` (default: the newest version the config routes to)."""
    config = current(target)
    chosen = version or max(config.versions, key=lambda v: int(triton_version(v)))
    number = int(triton_version(chosen))
    if number not in loaded(target):
        raise RolloutError(f"{chosen} is not loaded in Triton; deploy it first")
    new = promoted(config, chosen)
    switch(target, new)
    return new


def rollback(target: Target, steps: int = 1) -> RoutingConfig:
    """Publish the config of `steps` changes ago again; the newer history is dropped."""
    past = history(target)
    if len(past) < steps:
        raise RolloutError(f"only {len(past)} earlier config(s) in {target.history_topic}")
    restored = past[-steps]
    serving = loaded(target)
    used = [v for v, w in restored.versions.items() if w > 0 or v == restored.default]
    missing = [v for v in used if int(triton_version(v)) not in serving]
    if missing:
        raise RolloutError(f"cannot restore a config routing to unloaded {missing}")
    publish(restored, target.bootstrap, target.topic)
    _save_history(target, past[:-steps])
    return restored


def retire(target: Target, version: int, *, keep_files: bool = False) -> list[int]:
    """Unload `version` (refused while the config in force routes to it), remove its folder."""
    if version < FIRST_BUILT_VERSION:
        raise RolloutError("versions 1 and 2 are train.py's; retire only built versions")
    config = current(target)
    if f"v{version}" in config.versions and (
        config.versions[f"v{version}"] > 0 or config.default == f"v{version}"
    ):
        raise RolloutError(f"v{version} still takes traffic: promote or roll back first")
    remaining = [v for v in loaded(target) if v != version]
    if version in loaded(target):
        wait_quiet(target, version)
    load_versions(target, remaining)
    if not keep_files:
        shutil.rmtree(target.model_dir / str(version), ignore_errors=True)
    return remaining


def inference_count(target: Target, version: int) -> int:
    """Requests Triton has executed on `version` (its statistics API)."""
    client = _client(target)
    try:
        stats = client.get_inference_statistics(target.model, str(version), as_json=True)
    finally:
        client.close()
    return sum(int(m.get("inference_count", 0)) for m in stats.get("model_stats", []))


def wait_quiet(
    target: Target, version: int, quiet_s: float = QUIET_S, timeout_s: float = 30.0
) -> None:
    """Return once `version` has served nothing for `quiet_s`: a gateway applies a routing
    change within ~0.5 s, and a request routed just before it must still find the version."""
    deadline = time.monotonic() + timeout_s
    count, since = inference_count(target, version), time.monotonic()
    while time.monotonic() - since < quiet_s:
        if time.monotonic() > deadline:
            raise RolloutError(f"v{version} still receives requests after {timeout_s:.0f} s")
        time.sleep(0.25)
        now = inference_count(target, version)
        if now != count:
            count, since = now, time.monotonic()


@dataclass
class Row:
    version: int
    kind: str
    on_disk: bool
    state: str
    share: int
    accuracy: float | None


def listing(target: Target, states: Callable[[], dict[int, str]] | None = None) -> list[Row]:
    """Every version on disk or known to Triton, with its type, state and traffic share."""
    unreachable: str | None
    try:
        found = (states or (lambda: _states(target)))()
    except Exception as error:  # disk and routing are still worth showing
        found, unreachable = {}, type(error).__name__
    else:
        unreachable = None
    config = current(target)
    on_disk = set(disk_versions(target.model_dir))
    rows = []
    for version in sorted(on_disk | set(found)):
        folder = target.model_dir / str(version)
        meta = _metrics(folder)
        kind = read_build(folder).get("type") or {1: "v1", 2: "v2"}.get(version, "?")
        share = config.versions.get(f"v{version}", 0)
        state = found.get(version, "not loaded") if unreachable is None else "unreachable"
        rows.append(Row(version, kind, version in on_disk, state, share, meta.get("accuracy")))
    return rows


def _states(target: Target) -> dict[int, str]:
    client = _client(target)
    try:
        return triton_states(client, target.model)
    finally:
        client.close()


def _metrics(folder: Path) -> dict:
    try:
        return json.loads((folder / "metrics.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
