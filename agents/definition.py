"""Loading a workflow definition: YAML to a validated `WorkflowDefinition`, names checked."""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import ValidationError

from agents.steps.handlers import KNOWN_RULES, PROCESSORS
from feature_jobs.views import VIEWS
from schemas.workflow import WorkflowDefinition


class DefinitionError(ValueError):
    """A definition that cannot run; the message names the file and the field."""


def load_definition(path: Path | str) -> WorkflowDefinition:
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise DefinitionError(f"{path}: cannot read: {exc}") from exc
    return parse_definition(data, source=str(path))


def parse_definition(data: object, source: str = "<definition>") -> WorkflowDefinition:
    try:
        definition = WorkflowDefinition.model_validate(data)
    except ValidationError as exc:
        lines = [f"  {_loc(data, e['loc'])}: {e['msg']}" for e in exc.errors()]
        raise DefinitionError(
            f"{source}: invalid workflow definition\n" + "\n".join(lines)
        ) from exc
    problems = list(_unknown_names(definition))
    if problems:
        raise DefinitionError(f"{source}: invalid workflow definition\n" + "\n".join(problems))
    return definition


def _unknown_names(definition: WorkflowDefinition):
    for s in definition.steps:
        where = f"  steps.{s.name}"
        if s.type == "processor" and s.handler not in PROCESSORS:
            yield f"{where}.handler: unknown handler {s.handler!r} (known: {sorted(PROCESSORS)})"
        for rule in s.rules:
            if rule not in KNOWN_RULES:
                yield f"{where}.rules: unknown rule {rule!r} (known: {sorted(KNOWN_RULES)})"
        for view in s.views:
            if view not in VIEWS:
                yield f"{where}.views: unknown feature view {view!r} (known: {sorted(VIEWS)})"


def _loc(data: object, loc: tuple) -> str:
    """`steps.3.retry.max_attempts` rendered with the step's name: `steps.infer.retry...`."""
    parts = []
    for i, part in enumerate(loc):
        if i == 1 and loc[0] == "steps" and isinstance(part, int) and isinstance(data, dict):
            steps = data.get("steps") or []
            name = (
                steps[part].get("name")
                if part < len(steps) and isinstance(steps[part], dict)
                else None
            )
            parts.append(str(name or part))
        else:
            parts.append(str(part))
    return ".".join(parts) or "<root>"


def load_earlier_versions(current: WorkflowDefinition, directory: Path) -> list[WorkflowDefinition]:
    """Earlier versions of `current` kept in `directory`, for the tickets still in flight.

    A step keeps its type across versions (its agent and topic are shared by them).
    """
    earlier = []
    for path in sorted(directory.glob("*.yaml")) if directory.is_dir() else []:
        d = load_definition(path)
        if d.name != current.name or d.version >= current.version:
            continue
        for step in d.steps:
            if step.name in {s.name for s in current.steps}:
                now = current.step(step.name)
                if now.type != step.type:
                    raise DefinitionError(
                        f"{path}: steps.{step.name}.type: {step.type} in version {d.version} "
                        f"but {now.type} in version {current.version}"
                    )
        earlier.append(d)
    return earlier
