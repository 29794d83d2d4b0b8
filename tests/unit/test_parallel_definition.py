"""Issue 14 part 1 and 4: `parallel` steps and cascades in a definition, and what is refused."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from agents.definition import DefinitionError, load_definition, parse_definition

ENSEMBLE = (
    Path(__file__).resolve().parents[2] / "agents" / "workflows" / "ticket_classify_ensemble.yaml"
)


def workflow(middle: dict) -> dict:
    return {
        "name": "w",
        "version": 1,
        "steps": [
            {"name": "validate", "type": "validator"},
            middle,
            {"name": "route", "type": "router", "routes": ["auto_classify"]},
        ],
    }


def group(*branches: dict, **extra) -> dict:
    return {"name": "both", "type": "parallel", "branches": list(branches), **extra}


V1 = {"name": "v1", "type": "inference_call", "model": "m", "version": "v1", "timeout_ms": 300}
V2 = {"name": "v2", "type": "inference_call", "model": "m", "version": "v2", "timeout_ms": 600}


def refused(data: dict) -> str:
    with pytest.raises(DefinitionError) as err:
        parse_definition(data)
    return str(err.value)


def test_the_shipped_ensemble_runs_v1_and_v2_at_once_and_merges_their_scores():
    d = load_definition(ENSEMBLE)
    [step] = [s for s in d.steps if s.type == "parallel"]
    assert [(b.name, b.version) for b in step.branches] == [("v1", "v1"), ("v2", "v2")]
    assert step.merge == "mean" and step.join in ("all", "best_available")
    assert all(b.timeout_ms for b in step.branches)


def test_a_group_with_branches_of_each_kind_parses():
    clean = {"name": "tidy", "type": "processor", "handler": "text_cleaner"}
    feats = {"name": "stats", "type": "feature_lookup", "views": ["user_ticket_stats"]}
    d = parse_definition(workflow(group(V1, clean, feats, join="best_available")))
    assert [b.type for b in d.step("both").branches] == [
        "inference_call",
        "processor",
        "feature_lookup",
    ]


@pytest.mark.parametrize(
    ("middle", "words"),
    [
        (group(), ["both", "at least one branch"]),
        (group(V1, dict(V1)), ["both", "duplicate branch names", "v1"]),
        (group(V1, {"name": "r", "type": "router", "routes": ["x"]}), ["branch 'r'", "router"]),
        (group(V1, {"name": "x", "type": "validator"}), ["branch 'x'", "validator"]),
        (group(V1, group(V2)), ["branch 'both'", "parallel"]),
        (group(V1, V2, join="first"), ["both.join", "'all' or 'best_available'"]),
        (group(V1, V2, merge="vote"), ["both.merge"]),
        (group({**V1, "next": "route"}), ["branch 'v1'", "`next`"]),
        (group({**V1, "retry": {"max_attempts": 2}}), ["branch 'v1'", "`retry`"]),
        ({**V1, "name": "solo", "branches": [V2]}, ["solo", "only a parallel step"]),
    ],
)
def test_malformed_groups_are_refused_naming_the_field(middle, words):
    message = refused(workflow(middle))
    for word in words:
        assert word in message, message


def test_an_unknown_handler_inside_a_branch_is_named_with_its_path():
    bad = {"name": "tidy", "type": "processor", "handler": "no_such_cleaner"}
    message = refused(workflow(group(V1, bad)))
    assert "steps.both.branches.tidy.handler: unknown handler 'no_such_cleaner'" in message


def test_unknown_rules_and_views_inside_a_branch_are_refused():
    rules = {"name": "r", "type": "rule_engine", "rules": ["nope"]}
    views = {"name": "f", "type": "feature_lookup", "views": ["nope_view"]}
    message = refused(workflow(group(rules, views)))
    assert "steps.both.branches.r.rules" in message
    assert "steps.both.branches.f.views" in message


def test_a_cascade_parses_and_names_two_versions():
    infer = {"name": "infer", "type": "inference_call", "model": "m"}
    d = parse_definition(
        workflow({**infer, "cascade": {"first": "v1", "then": "v2", "below": 0.8}})
    )
    assert d.step("infer").cascade.then == "v2"


@pytest.mark.parametrize(
    ("cascade", "extra", "words"),
    [
        ({"first": "v1", "then": "v1", "below": 0.8}, {}, ["different versions"]),
        ({"first": "v1", "then": "v2", "below": 0}, {}, ["cascade.below"]),
        ({"first": "v1", "then": "v2", "below": 1.5}, {}, ["cascade.below"]),
        ({"first": "v1", "then": "v2"}, {}, ["cascade.below", "Field required"]),
        ({"first": "v1", "then": "v2", "below": 0.8}, {"version": "v1"}, ["drop `version`"]),
        ({"first": "v 1", "then": "v2", "below": 0.8}, {}, ["cascade.first"]),
        ({"first": "v1", "then": "latest", "below": 0.8}, {}, ["cascade.then"]),
        ({"first": "v1", "then": "v0", "below": 0.8}, {}, ["cascade.then"]),
    ],
)
def test_malformed_cascades_are_refused(cascade, extra, words):
    infer = {"name": "infer", "type": "inference_call", "model": "m", "cascade": cascade, **extra}
    message = refused(workflow(infer))
    for word in words:
        assert word in message, message


def test_a_cascade_or_version_on_another_step_type_is_refused():
    clean = {"name": "tidy", "type": "processor", "handler": "text_cleaner", "version": "v1"}
    assert "need inference_call" in refused(workflow(clean))


def test_the_ensemble_keeps_every_shared_step_name_of_the_default_workflow_s_type():
    # a step name is one agent and one topic for every workflow loaded at once
    default = load_definition(ENSEMBLE.with_name("ticket_classify.yaml"))
    ensemble = load_definition(ENSEMBLE)
    types = {s.name: s.type for s in default.steps}
    clashes = [s.name for s in ensemble.steps if s.name in types and types[s.name] != s.type]
    assert not clashes
    data = copy.deepcopy(ensemble.model_dump(mode="json"))
    assert parse_definition(data) == ensemble  # what it dumps, it reads back
