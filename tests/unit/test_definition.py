import copy

import pytest
import yaml

from agents.definition import DefinitionError, load_definition, parse_definition
from streams.settings import Settings

DEFAULT = Settings().workflow_file


def base():
    return yaml.safe_load(DEFAULT.read_text())


def test_the_default_workflow_loads():
    d = load_definition(DEFAULT)
    assert [s.name for s in d.steps] == ["validate", "clean", "features", "infer", "rules", "route"]
    assert d.routes == ["after_sales", "auto_classify", "manual_review"]
    assert d.step("infer").retry.max_attempts == 3 and d.deadline_ms == 2000


def mutate(fn):
    data = copy.deepcopy(base())
    fn(data)
    return data


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d["steps"][1].update(type="teleport"), "steps.clean.type"),
        (lambda d: d["steps"][1].update(handler="nope"), "unknown handler 'nope'"),
        (lambda d: d["steps"][4].update(rules=["refund_check", "magic"]), "unknown rule 'magic'"),
        (lambda d: d["steps"][2].update(views=["nope"]), "unknown feature view 'nope'"),
        (lambda d: d["steps"][3]["retry"].update(max_attempts=9), "steps.infer.retry.max_attempts"),
        (lambda d: d["steps"][3]["retry"].update(max_attempts=0), "steps.infer.retry.max_attempts"),
        (lambda d: d["steps"][4].update(threshold=1.5), "steps.rules.threshold"),
        (lambda d: d["steps"][3].update(timeout_ms=-1), "steps.infer.timeout_ms"),
        (lambda d: d["steps"][3].pop("model"), "needs `model`"),
        (lambda d: d["steps"][2].update(next="clean"), "cycle"),
        (lambda d: d["steps"][1].update(next="infer"), "unreachable steps ['features']"),
        (lambda d: d["steps"][1].update(next="nowhere"), "unknown step 'nowhere'"),
        (
            lambda d: d["steps"].append(
                {"name": "clean", "type": "processor", "handler": "text_cleaner"}
            ),
            "duplicate",
        ),
        (lambda d: d.update(deadline_ms="soon"), "deadline_ms"),
        (lambda d: d["steps"][3].update(concurrency=0), "steps.infer.concurrency"),
        (lambda d: d["steps"][3].update(concurrency=17), "steps.infer.concurrency"),
        (lambda d: d["steps"][5].update(concurrency=2), "a router runs one batch at a time"),
    ],
)
def test_bad_definitions_are_refused_naming_the_field(change, message):
    with pytest.raises(DefinitionError) as err:
        parse_definition(mutate(change))
    assert message in str(err.value)


def test_unreadable_file(tmp_path):
    bad = tmp_path / "wf.yaml"
    bad.write_text("steps: [")
    with pytest.raises(DefinitionError, match="cannot read"):
        load_definition(bad)


def branching(next_):
    data = base()
    data["steps"].insert(
        5, {"name": "escalate", "type": "rule_engine", "rules": ["refund_check"], "next": "route"}
    )
    data["steps"][4]["next"] = next_
    return data


def test_a_step_can_branch_on_the_context():
    from schemas.tickets import Category, Context, Prediction

    d = parse_definition(
        branching(
            [
                {
                    "when": {"field": "prediction.confidence", "op": "lt", "value": 0.3},
                    "step": "escalate",
                },
                {"step": "route"},
            ]
        )
    )
    low = Context(
        prediction=Prediction(
            category=Category.billing, confidence=0.2, model_name="m", model_version="v1"
        )
    )
    high = low.model_copy(
        update={"prediction": low.prediction.model_copy(update={"confidence": 0.9})}
    )
    assert d.next_step("rules", low).name == "escalate"
    assert d.next_step("rules", high).name == "route"
    assert d.next_step("rules", Context()).name == "route"  # no prediction: the default
    assert d.next_step("escalate", low).name == "route"


@pytest.mark.parametrize(
    ("next_", "message"),
    [
        ([{"when": {"field": "degraded", "value": True}, "step": "escalate"}], "last branch"),
        ([{"step": "nowhere"}], "unknown step 'nowhere'"),
        (
            [{"when": {"field": "degraded", "value": True}, "step": "clean"}, {"step": "route"}],
            "cycle",
        ),
        (
            [{"when": {"field": "Bad Path", "value": 1}, "step": "route"}, {"step": "route"}],
            "field",
        ),
    ],
)
def test_bad_branches_are_refused(next_, message):
    with pytest.raises(DefinitionError, match=message):
        parse_definition(branching(next_))


def test_retry_policies_per_error_class():
    data = base()
    data["steps"][3]["retry_on"] = {"OVERLOADED": {"max_attempts": 5, "backoff_ms": 400}}
    infer = parse_definition(data).step("infer")
    assert infer.policy_for("OVERLOADED").max_attempts == 5
    assert infer.policy_for("TIMEOUT").max_attempts == 3  # falls back to `retry`
    data["steps"][3]["retry_on"] = {"INVALID_INPUT": {"max_attempts": 2}}
    with pytest.raises(DefinitionError, match="retry_on"):
        parse_definition(data)


def test_earlier_versions_are_loaded_for_tickets_in_flight(tmp_path):
    from agents.definition import load_earlier_versions

    current = load_definition(DEFAULT)
    old = base()
    old["version"] = 1
    newer = base()
    newer["version"] = 2
    newer_def = parse_definition(newer)
    (tmp_path / "v1.yaml").write_text(yaml.safe_dump(old))
    assert load_earlier_versions(newer_def, tmp_path)[0].version == 1
    assert load_earlier_versions(current, tmp_path) == []  # not earlier than itself
    old["steps"][4]["type"] = "processor"
    old["steps"][4]["handler"] = "text_cleaner"
    (tmp_path / "v1.yaml").write_text(yaml.safe_dump(old))
    with pytest.raises(DefinitionError, match=r"steps\.rules\.type"):
        load_earlier_versions(newer_def, tmp_path)


def test_one_router_only():
    data = base()
    data["steps"].insert(5, {"name": "route2", "type": "router", "routes": ["manual_review"]})
    with pytest.raises(DefinitionError, match="exactly one router"):
        parse_definition(data)


def fused(groups):
    return mutate(lambda d: d.update(fuse=groups))


def test_fused_groups_say_which_steps_run_without_a_hop():
    d = parse_definition(fused([["validate", "clean"], ["features", "infer", "rules", "route"]]))
    assert d.fused("validate", "clean") and d.fused("infer", "rules") and d.fused("rules", "route")
    assert not d.fused("clean", "features")  # between groups: a hop through the topic
    assert not parse_definition(base()).fused("validate", "clean")  # default: no fusion


@pytest.mark.parametrize(
    ("groups", "message"),
    [
        ([["clean"]], "at least two steps"),
        ([["clean", "nope"]], "unknown step 'nope'"),
        ([["clean", "infer"]], "'infer' cannot follow 'clean'"),
        ([["clean", "features"], ["features", "infer"]], "more than one group"),
        ([["validate", "clean", "features"]], "only processor steps can fuse with the validator"),
        ([["rules", "route", "validate"]], "cannot follow"),
    ],
)
def test_bad_fusion_is_refused(groups, message):
    with pytest.raises(DefinitionError) as err:
        parse_definition(fused(groups))
    assert message in str(err.value)


def test_a_step_waiting_on_a_service_may_run_several_batches_at_once():
    d = parse_definition(mutate(lambda d: d["steps"][3].update(concurrency=4)))
    assert d.step("infer").concurrency == 4
    assert parse_definition(base()).step("features").concurrency == 1  # the default


def test_steps_fused_with_the_router_keep_to_one_batch_at_a_time():
    data = fused([["features", "infer", "rules", "route"]])
    data["steps"][2]["concurrency"] = 2  # features starts the group, so runs the router
    with pytest.raises(DefinitionError, match=r"fused with the router .*\['features'\]"):
        parse_definition(data)
    data["fuse"] = [["validate", "clean"]]  # unfused, features may run two batches at once
    assert parse_definition(data).step("features").concurrency == 2
