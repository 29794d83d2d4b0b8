"""Which model version serves an input: canary weights from a `RoutingConfig`, sticky per id.

An id's bucket is `crc32(utf-8 id) % 100`, stable across processes and restarts (unlike
Python's salted `hash()`), so every gateway and worker sends an id to the same version.
Versions own consecutive bucket ranges in version-number order (v1, v2, ..., v10): with
`{"v1": 90, "v2": 10}`, buckets 0-89 go to v1 and 90-99 to v2. Growing the canary to
`{"v1": 80, "v2": 20}` keeps every id that was on v2 there.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Sequence

from inference_gateway import metrics
from inference_gateway.errors import ErrorCode, GatewayError
from schemas.routing import RoutingConfig

DEFAULT_CONFIG = RoutingConfig(name="ticket_classifier", versions={"v1": 100}, default="v1")

# fullmatch, not `$`: "v1\n" would pass `$` and reach Triton and the metric labels
_VERSION = re.compile(r"v([1-9][0-9]{0,8})")


def triton_version(version: str) -> str:
    """Gateway version "vN" -> Triton's model_version "N"; anything else is INVALID_INPUT."""
    match = _VERSION.fullmatch(version)
    if match is None:
        # the caller's string is not repeated: it may be anything, of any length
        raise GatewayError(ErrorCode.INVALID_INPUT, "version is not of the form vN (v1, v2, ...)")
    return match.group(1)


def bucket_of(input_id: str) -> int:
    """The id's stable bucket, 0-99."""
    return zlib.crc32(input_id.encode("utf-8")) % 100


def pick_version(config: RoutingConfig, input_id: str) -> str:
    """The version `config` sends `input_id` to."""
    return _pick(_ranges(config), config.default, input_id)


def _ranges(config: RoutingConfig) -> list[tuple[int, str]]:
    """(exclusive upper bucket, version) in version order: each version's bucket range."""
    ranges, upper = [], 0
    for version in sorted(config.versions, key=_version_order):
        upper += config.versions[version]
        ranges.append((upper, version))
    return ranges


def _pick(ranges: list[tuple[int, str]], default: str, input_id: str) -> str:
    bucket = bucket_of(input_id)
    for upper, version in ranges:
        if bucket < upper:
            return version
    return default  # not reached while the weights sum to 100


def _version_order(version: str) -> tuple[int, str]:
    # numeric order, so v10 comes after v9; names not of the form vN sort last, by name
    match = _VERSION.fullmatch(version)
    return (int(match.group(1)) if match else 1 << 40, version)


class Router:
    """The routing configs by model name; `update` swaps one in, effective for the next call."""

    def __init__(self, configs: list[RoutingConfig] | None = None) -> None:
        self._configs: dict[str, RoutingConfig] = {}
        for config in configs if configs is not None else [DEFAULT_CONFIG]:
            self.update(config)

    def update(self, config: RoutingConfig) -> None:
        """Adopt `config` for model `config.name` (as published on `config.routing`).

        The mapping is replaced, never changed in place (copy on write), so a request routed
        while the watcher's thread updates sees the old configs or the new ones, never a mix.
        """
        for version in config.versions:
            triton_version(version)  # refuse a version Triton could not be asked for
        old = self._configs.get(config.name)
        self._configs = {**self._configs, config.name: config}
        for version in old.versions if old else ():
            if version not in config.versions:
                metrics.ROUTING_WEIGHT.labels(config.name, version).set(0)
        for version, weight in config.versions.items():
            metrics.ROUTING_WEIGHT.labels(config.name, version).set(weight)

    def remove(self, model: str) -> None:
        """Forget `model`'s config (a tombstone on `config.routing`): it becomes unknown."""
        old = self._configs.get(model)
        self._configs = {k: v for k, v in self._configs.items() if k != model}
        for version in old.versions if old else ():
            metrics.ROUTING_WEIGHT.labels(model, version).set(0)

    def config(self, model: str) -> RoutingConfig | None:
        return self._configs.get(model)

    @property
    def models(self) -> list[str]:
        return sorted(self._configs)

    def choose(self, model: str, input_id: str, requested: str | None = None) -> str:
        """The version for `input_id`: an explicit `requested` version wins over the weights."""
        return self.choose_each(model, [input_id], requested)[0]

    def choose_each(
        self, model: str, input_ids: Sequence[str], requested: str | None = None
    ) -> list[str]:
        """The version of each id, all read from one config (an update mid-request cannot mix
        two); an explicit `requested` version applies to every id."""
        config = self._configs.get(model)
        if config is None:
            known = ", ".join(self.models) or "none"
            raise GatewayError(ErrorCode.INVALID_INPUT, f"unknown model (known: {known})")
        if requested is not None:
            triton_version(requested)
            return [requested] * len(input_ids)
        ranges = _ranges(config)  # sorted once, not once per id
        return [_pick(ranges, config.default, i) for i in input_ids]
