"""A workflow per ticket: the selector, loading several definitions, the topology's keys."""

from datetime import datetime, timezone
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from agents.definition import DefinitionError, load_workflows, selector_path
from agents.topology import Topology
from schemas.selection import WorkflowSelector
from schemas.tickets import Envelope, Ticket
from streams.settings import Settings

SHIPPED = Settings().workflow_file
NOW = datetime(2026, 12, 4, tzinfo=timezone.utc)


def ticket(**fields) -> Ticket:
    return Ticket(ticket_id=fields.pop("ticket_id", "t-1"), text="hi", created_at=NOW, **fields)


def envelope(workflow: str, version: int = 1, step: str = "rules") -> Envelope:
    return Envelope(
        ticket=ticket(),
        workflow=workflow,
        workflow_version=version,
        step=step,
        trace_id="a" * 32,
        arrival="0:1",
        started_at=NOW,
    )


SELECTOR = WorkflowSelector.model_validate(
    {
        "default": "plain",
        "rules": [
            {"when": {"field": "metadata.tier", "value": "vip"}, "workflow": "vip"},
            {"when": {"field": "channel", "value": "chat"}, "workflow": "chat"},
            {
                "when": [
                    {"field": "language", "op": "in", "value": ["en", "fr"]},
                    {"field": "channel", "op": "ne", "value": "phone"},
                ],
                "workflow": "western",
            },
        ],
    }
)


def test_the_first_matching_rule_wins_and_the_rest_take_the_default():
    assert SELECTOR.select(ticket(metadata={"tier": "vip"}, channel="chat")) == ("vip", 0)
    assert SELECTOR.select(ticket(channel="chat")) == ("chat", 1)
    assert SELECTOR.select(ticket(language="fr", channel="web")) == ("western", 2)
    assert SELECTOR.select(ticket(language="fr", channel="phone")) == ("plain", None)
    assert SELECTOR.select(ticket(metadata={"tier": "gold"})) == ("plain", None)


def test_a_field_the_ticket_lacks_never_matches_not_even_ne():
    selector = WorkflowSelector.model_validate(
        {
            "default": "a",
            "rules": [{"when": {"field": "language", "op": "ne", "value": "zh"}, "workflow": "b"}],
        }
    )
    assert selector.select(ticket()) == ("a", None)
    assert selector.select(ticket(language="en")) == ("b", 0)


@pytest.mark.parametrize(
    "rule",
    [
        {"when": {"field": "text", "value": "x"}, "workflow": "b"},  # not a selector field
        {"when": {"field": "channel", "op": "in", "value": "chat"}, "workflow": "b"},  # not a list
        {"when": {"field": "channel", "value": ["chat"]}, "workflow": "b"},  # eq of a list
        {"when": [], "workflow": "b"},
        {"when": {"field": "channel", "value": "chat"}, "workflow": "Bad-Name"},
        {"when": {"field": "channel", "value": "chat"}, "workflow": "b", "extra": 1},
    ],
)
def test_malformed_rules_are_refused(rule):
    with pytest.raises(ValidationError):
        WorkflowSelector.model_validate({"default": "a", "rules": [rule]})


def test_the_shipped_selector_loads_every_workflow_of_its_folder():
    workflows = load_workflows(SHIPPED)
    names = {d.name for d in workflows.definitions}
    assert {"ticket_classify", "ticket_classify_vip", "ticket_classify_chat"} <= names
    assert workflows.default.name == "ticket_classify"
    topology = Topology(workflows.default, workflows.others(), workflows.selector)
    assert (
        topology.choose(ticket(metadata={"tier": "vip"})).definition.name == "ticket_classify_vip"
    )
    assert topology.choose(ticket(channel="chat")).definition.name == "ticket_classify_chat"
    plain = topology.choose(ticket(channel="email"))
    assert plain.definition.name == "ticket_classify" and "default" in plain.reason
    chat = topology.definition_of(envelope("ticket_classify_chat"))
    assert chat.deadline_ms < workflows.default.deadline_ms
    vip = topology.definition_of(envelope("ticket_classify_vip"))
    assert vip.step("route").routes == ["manual_review"]  # always ends in human review
    assert "manual_review" in topology.routes and "after_sales" in topology.routes


def write(folder: Path, name: str, data: dict) -> Path:
    path = folder / name
    path.write_text(yaml.safe_dump(data))
    return path


def definition(name: str, version: int = 1, rules=("score_threshold",), deadline=2000) -> dict:
    return {
        "name": name,
        "version": version,
        "deadline_ms": deadline,
        "steps": [
            {"name": "validate", "type": "validator"},
            {"name": "clean", "type": "processor", "handler": "text_cleaner"},
            {"name": "rules", "type": "rule_engine", "rules": list(rules)},
            {"name": "route", "type": "router", "routes": ["auto_classify", "manual_review"]},
        ],
    }


def folder_with(tmp_path: Path, *definitions: dict, default: str = "a", rules=()) -> Path:
    for d in definitions:
        write(tmp_path, f"{d['name']}.yaml", d)
    write(tmp_path, "selector.yaml", {"default": default, "rules": list(rules)})
    return tmp_path / f"{default}.yaml"


def test_a_step_name_with_two_types_is_refused_naming_both(tmp_path):
    other = definition("b")
    other["steps"][1] = {"name": "clean", "type": "rule_engine", "rules": ["score_threshold"]}
    main = folder_with(tmp_path, definition("a"), other)
    with pytest.raises(DefinitionError) as err:
        load_workflows(main)
    text = str(err.value)
    assert "steps.clean.type" in text and "processor in a v1" in text
    assert "rule_engine in b v1" in text and "one agent and one topic" in text


def test_a_file_the_selector_does_not_name_still_loads_and_is_validated(tmp_path):
    main = folder_with(tmp_path, definition("a"), definition("spare"))
    workflows = load_workflows(main)
    assert {d.name for d in workflows.definitions} == {"a", "spare"}  # finishes its tickets
    write(tmp_path, "broken.yaml", {"name": "broken", "version": 1, "steps": []})
    with pytest.raises(DefinitionError, match=r"broken\.yaml"):
        load_workflows(main)


def test_a_selector_naming_an_unknown_workflow_is_refused(tmp_path):
    rules = [{"when": {"field": "channel", "value": "chat"}, "workflow": "nowhere"}]
    main = folder_with(tmp_path, definition("a"), rules=rules)
    with pytest.raises(DefinitionError, match=r"\['nowhere'\]"):
        load_workflows(main)


def test_two_current_files_of_one_workflow_are_refused(tmp_path):
    main = folder_with(tmp_path, definition("a"))
    write(tmp_path, "a_again.yaml", definition("a", version=2))
    with pytest.raises(DefinitionError, match="one file per workflow"):
        load_workflows(main)


def test_every_workflow_shares_one_router(tmp_path):
    other = definition("b")
    other["steps"][3]["name"] = "route_b"
    main = folder_with(tmp_path, definition("a"), other)
    with pytest.raises(DefinitionError, match="same router step"):
        load_workflows(main)


def test_earlier_versions_of_each_workflow_come_from_the_archive(tmp_path):
    main = folder_with(tmp_path, definition("a", version=2), definition("b", version=3))
    (tmp_path / "archive").mkdir()
    write(tmp_path / "archive", "a.v1.yaml", definition("a", version=1, deadline=500))
    write(tmp_path / "archive", "b.v2.yaml", definition("b", version=2))
    workflows = load_workflows(main)
    keys = sorted((d.name, d.version) for d in workflows.definitions)
    assert keys == [("a", 1), ("a", 2), ("b", 2), ("b", 3)]
    topology = Topology(workflows.default, workflows.others(), workflows.selector)
    # a ticket finishes on its own workflow and version; new ones start on the newest
    assert topology.deadline_ms(envelope("a", 1)) == 500
    assert topology.definition_of(envelope("b", 2)).version == 2
    assert topology.choose(ticket()).definition.version == 2
    assert topology.knows_workflow(envelope("b", 2)) and not topology.knows_workflow(envelope("c"))


def test_without_a_selector_one_workflow_runs_as_before(tmp_path):
    alone = write(tmp_path, "wf.yaml", definition("a"))
    write(tmp_path, "other.yaml", definition("b"))  # ignored: no selector here
    assert selector_path(alone) is None
    workflows = load_workflows(alone)
    assert [d.name for d in workflows.definitions] == ["a"] and workflows.selector is None
    topology = Topology(workflows.default, workflows.others())
    assert topology.choose(ticket(channel="chat")).definition.name == "a"


def test_tickets_of_workflows_with_different_step_settings_are_run_apart(tmp_path):
    vip = definition("b", rules=("refund_check", "score_threshold"))
    main = folder_with(tmp_path, definition("a"), vip)
    workflows = load_workflows(main)
    topology = Topology(workflows.default, workflows.others(), workflows.selector)
    a, b = envelope("a"), envelope("b")
    assert topology.variant(a, "rules") != topology.variant(b, "rules")
    assert topology.variant(a, "clean") == topology.variant(b, "clean")  # one call for both
    assert topology.step_of(b, "rules").rules == ["refund_check", "score_threshold"]


def test_config_validate_checks_a_selector_with_its_folder(tmp_path):
    from typer.testing import CliRunner

    from ticketflow.cli import app

    folder_with(tmp_path, definition("a"), definition("b"))
    run = CliRunner().invoke(app, ["config", "validate", str(tmp_path / "selector.yaml")])
    assert run.exit_code == 0 and "default a" in run.output and "b v1" in run.output
    write(tmp_path, "selector.yaml", {"default": "missing"})
    run = CliRunner().invoke(app, ["config", "validate", str(tmp_path / "selector.yaml")])
    assert run.exit_code == 1 and "['missing']" in run.output


def test_the_runner_runs_each_step_configuration_apart(tmp_path):
    import asyncio

    from agents.runner import StepRunner
    from streams.topics import Topics
    from tests.unit.test_workflow_layer import FakeEmitter, FakeStates

    main = folder_with(
        tmp_path, definition("a"), definition("b", rules=("refund_check", "score_threshold"))
    )
    workflows = load_workflows(main)
    topology = Topology(workflows.default, workflows.others(), workflows.selector)
    calls: list[tuple[list[str], list[str]]] = []

    class Handler:
        async def run_batch(self, envs, step):
            calls.append(([env.workflow for env in envs], list(step.rules)))
            return [None] * len(envs)

    handlers = {"rule_engine": Handler(), "processor": Handler()}
    runner = StepRunner(topology, handlers, FakeEmitter(), FakeStates(), Topics("p."))
    items = [(None, envelope(w)) for w in ("a", "b", "a", "b")]
    step = workflows.default.step("rules")
    done = asyncio.run(runner.run(step, items, True))
    # one call per variant, each with its own workflow's configuration of the step
    assert sorted(calls) == [
        (["a", "a"], ["score_threshold"]),
        (["b", "b"], ["refund_check", "score_threshold"]),
    ]
    assert sorted(env.workflow for _, env in done) == ["a", "a", "b", "b"]
    calls.clear()
    asyncio.run(runner.run(workflows.default.step("clean"), items, True))
    assert len(calls) == 1  # configured alike: one call for all four


def test_vip_and_chat_keep_the_default_workflows_rules():
    # they differ from ticket_classify on purpose only in routes and timing: a threshold
    # measured for the default must not be left behind in them
    current = {d.name: d for d in load_workflows(SHIPPED).definitions}
    default = current["ticket_classify"].step("rules")
    chat = current["ticket_classify_chat"].step("rules")
    vip = current["ticket_classify_vip"].step("rules")
    assert chat.model_dump() == default.model_dump()
    assert vip.rules == [r for r in default.rules if r != "sample"]
    assert (vip.threshold, vip.after_sales_threshold, vip.intent_band) == (
        default.threshold,
        default.after_sales_threshold,
        default.intent_band,
    )
