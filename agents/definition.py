"""Loading workflow definitions: YAML to validated `WorkflowDefinition`s, names checked.

One definition, or, with a selector (`agents/workflows/selector.yaml`), every definition of
its folder plus the earlier versions in `archive/`: `load_workflows`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import yaml
from pydantic import ValidationError

from agents.steps.handlers import KNOWN_RULES, PROCESSORS
from agents.steps.rules import SAMPLE
from feature_jobs.views import VIEWS
from schemas.selection import WorkflowSelector
from schemas.workflow import WorkflowDefinition

SELECTOR_FILE = "selector.yaml"
ARCHIVE_DIR = "archive"


class DefinitionError(ValueError):
    """A definition that cannot run; the message names the file and the field."""


def _read_yaml(path: Path) -> object:
    try:
        return yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise DefinitionError(f"{path}: cannot read: {exc}") from exc


def load_definition(path: Path | str) -> WorkflowDefinition:
    path = Path(path)
    return parse_definition(_read_yaml(path), source=str(path))


def parse_definition(data: object, source: str = "<definition>") -> WorkflowDefinition:
    try:
        definition = WorkflowDefinition.model_validate(data)
    except ValidationError as exc:
        lines = [f"  {_loc(data, e['loc'])}: {e['msg']}" for e in exc.errors()]
        raise DefinitionError(
            f"{source}: invalid workflow definition\n" + "\n".join(lines)
        ) from exc
    problems = [*_unknown_names(definition), *_sample_problems(definition)]
    if problems:
        raise DefinitionError(f"{source}: invalid workflow definition\n" + "\n".join(problems))
    return definition


def _with_branches(definition: WorkflowDefinition):
    """Every step and every branch of a parallel step, with where it is in the file."""
    for s in definition.steps:
        yield s, f"  steps.{s.name}"
        for b in s.branches:
            yield b, f"  steps.{s.name}.branches.{b.name}"


def _unknown_names(definition: WorkflowDefinition):
    for s, where in _with_branches(definition):
        if s.type == "processor" and s.handler not in PROCESSORS:
            yield f"{where}.handler: unknown handler {s.handler!r} (known: {sorted(PROCESSORS)})"
        for rule in s.rules:
            if rule not in KNOWN_RULES:
                yield f"{where}.rules: unknown rule {rule!r} (known: {sorted(KNOWN_RULES)})"
        for view in s.views:
            if view not in VIEWS:
                yield f"{where}.views: unknown feature view {view!r} (known: {sorted(VIEWS)})"


def _sample_problems(definition: WorkflowDefinition):
    """`sample` keeps a decision as automatic: it must come after every rule that could
    route the ticket elsewhere, and a share without it would sample nothing."""
    for s, where in _with_branches(definition):
        if SAMPLE in s.rules and s.rules[-1] != SAMPLE:
            yield f"{where}.rules: `{SAMPLE}` must be the last rule (it samples what is left)"
        if s.sample_share > 0 and SAMPLE not in s.rules:
            yield f"{where}.sample_share: set, but `{SAMPLE}` is not one of the step's rules"


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


# ---- several workflows at once ----------------------------------------------------------------


@dataclass(frozen=True)
class Workflows:
    """What a worker runs: every definition loaded, and how a new ticket picks one.

    `definitions` holds each (name, version) once: the current file of every workflow and
    the earlier versions still finishing their tickets. `selector` is None in the
    one-definition mode (no selector file), where every new ticket takes `default`.
    """

    default: WorkflowDefinition
    selector: WorkflowSelector | None
    definitions: tuple[WorkflowDefinition, ...]

    def others(self) -> list[WorkflowDefinition]:
        """Every definition but the default: `Topology(default, others, selector)`."""
        return [d for d in self.definitions if d is not self.default]


def selector_path(workflow_file: Path, selector_file: Path | None = None) -> Path | None:
    """The selector in use: the one given, else `selector.yaml` beside the workflow file
    when there is one, else None (one workflow, as before selectors existed)."""
    if selector_file is not None:
        return Path(selector_file)
    beside = Path(workflow_file).parent / SELECTOR_FILE
    return beside if beside.is_file() else None


def load_workflows(workflow_file: Path, selector_file: Path | None = None) -> Workflows:
    """The definitions a worker runs, checked each alone and against each other.

    With a selector, every `*.yaml` of its folder is loaded and validated, referenced by
    the selector or not: a definition the selector no longer names may still have tickets
    in flight, and those finish on it. Unreferenced definitions get no new tickets.
    """
    path = selector_path(workflow_file, selector_file)
    if path is None:
        current = load_definition(workflow_file)
        earlier = load_earlier_versions(current, Path(workflow_file).parent / ARCHIVE_DIR)
        return _checked(current, None, [current, *earlier])
    selector = load_selector(path)
    folder = path.parent
    currents = _current_definitions(p for p in sorted(folder.glob("*.yaml")) if p != path)
    unknown = [n for n in selector.names() if n not in currents]
    if unknown:
        raise DefinitionError(
            f"{path}: selector names workflow(s) {unknown} that no file in {folder} defines "
            f"(defined: {sorted(currents)})"
        )
    definitions = list(currents.values())
    for d in currents.values():
        definitions.extend(load_earlier_versions(d, folder / ARCHIVE_DIR))
    return _checked(currents[selector.default], selector, definitions)


def load_selector(path: Path | str) -> WorkflowSelector:
    path = Path(path)
    data = _read_yaml(path)
    try:
        return WorkflowSelector.model_validate(data)
    except ValidationError as exc:
        lines = [f"  {'.'.join(map(str, e['loc'])) or '<root>'}: {e['msg']}" for e in exc.errors()]
        raise DefinitionError(f"{path}: invalid workflow selector\n" + "\n".join(lines)) from exc


def _current_definitions(paths: Iterable[Path]) -> dict[str, WorkflowDefinition]:
    found: dict[str, tuple[Path, WorkflowDefinition]] = {}
    for path in paths:
        d = load_definition(path)
        if d.name in found:
            raise DefinitionError(
                f"{path}: workflow {d.name} is also defined by {found[d.name][0]}: one file "
                f"per workflow here, earlier versions go to {ARCHIVE_DIR}/"
            )
        found[d.name] = (path, d)
    return {name: d for name, (_, d) in found.items()}


def _checked(
    default: WorkflowDefinition,
    selector: WorkflowSelector | None,
    definitions: list[WorkflowDefinition],
) -> Workflows:
    problems = list(shared_step_problems(definitions))
    if problems:
        raise DefinitionError("workflow definitions do not fit together\n" + "\n".join(problems))
    return Workflows(default, selector, tuple(definitions))


def shared_step_problems(definitions: Iterable[WorkflowDefinition]):
    """Why these definitions cannot run side by side in one worker, one line each.

    A step name is one agent and one topic, so it has one type everywhere; every ticket
    enters through one validator (it picks the workflow) and leaves through one router
    (one completion ledger keeps its result single).
    """
    seen: dict[str, tuple[str, str]] = {}  # step name -> (type, where)
    definitions = list(definitions)
    for d in definitions:
        where = f"{d.name} v{d.version}"
        for step in d.steps:
            if step.name not in seen:
                seen[step.name] = (step.type, where)
            elif seen[step.name][0] != step.type:
                kind, first = seen[step.name]
                yield (
                    f"  steps.{step.name}.type: {kind} in {first} but {step.type} in {where}: "
                    "a step name is one agent and one topic for every workflow; rename one"
                )
    for role, pick in (("validator", _validator), ("router", _router)):
        names = {pick(d) for d in definitions}
        if len(names) > 1:
            each = ", ".join(f"{d.name} v{d.version}: {pick(d)}" for d in definitions)
            yield f"  every workflow needs the same {role} step, found {each}"


def _validator(d: WorkflowDefinition) -> str:
    return d.steps[0].name


def _router(d: WorkflowDefinition) -> str:
    return next(s.name for s in d.steps if s.type == "router")
