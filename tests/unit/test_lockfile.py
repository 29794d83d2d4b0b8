"""The lockfiles (requirements/README.md) pin, with hashes, a version of every dependency
pyproject.toml declares that its specifier allows: a dependency changed without `make lock`
fails here, not on a fresh machine a month later."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser, under its older name
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s\\;]+)")
# the environment the locks are resolved for (Makefile: UV_COMPILE)
LOCKED_FOR = {"python_version": "3.11", "sys_platform": "linux", "platform_system": "Linux"}


def pins(name: str) -> dict[str, str]:
    """Name -> version, and each pin has at least one sha256 hash after it."""
    lines = (ROOT / "requirements" / name).read_text().splitlines()
    found: dict[str, str] = {}
    for i, line in enumerate(lines):
        match = PIN.match(line)
        if match:
            assert lines[i + 1].strip().startswith("--hash=sha256:"), f"{name}: {line} has no hash"
            found[canonicalize_name(match[1])] = match[2]
    return found


def declared(*extras: str) -> list[Requirement]:
    specs = list(PROJECT["dependencies"])
    for extra in extras:
        specs += PROJECT["optional-dependencies"][extra]
    reqs = [Requirement(s) for s in specs]
    return [r for r in reqs if r.marker is None or r.marker.evaluate(LOCKED_FOR)]


@pytest.mark.parametrize(
    ("lockfile", "extras"),
    [("lock.txt", ("train", "dev")), ("runtime.txt", ()), ("peer.txt", ())],
)
def test_every_declared_dependency_is_locked_at_a_version_it_allows(
    lockfile: str, extras: tuple[str, ...]
) -> None:
    locked = pins(lockfile)
    for req in declared(*extras):
        name = canonicalize_name(req.name)
        assert name in locked, f"{req.name} is not in requirements/{lockfile}: run `make lock`"
        assert req.specifier.contains(locked[name], prereleases=True), (
            f"requirements/{lockfile} pins {req.name}=={locked[name]}, outside {req.specifier}"
        )


def test_the_runtime_lock_agrees_with_the_full_one() -> None:
    full, runtime = pins("lock.txt"), pins("runtime.txt")
    assert {n: v for n, v in runtime.items() if full.get(n) != v} == {}


def test_the_build_lock_has_what_pyproject_builds_with() -> None:
    build = pins("build.txt")
    for spec in tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]["requires"]:
        req = Requirement(spec)
        assert req.specifier.contains(build[canonicalize_name(req.name)])
