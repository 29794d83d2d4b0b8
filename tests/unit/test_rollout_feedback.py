"""Reviewers' decisions as training rows (training.feedback, builds), and the
`ticketflow model` commands' output, without Kafka or Triton."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
from typer.testing import CliRunner

from inference_gateway.model import rollout
from schemas.tickets import CATEGORIES, DecisionStep, StepStatus, TicketResult
from ticketflow import model_cli
from training import builds, earlier_sets, feedback


def reviewed(ticket_id: str, category: str) -> bytes:
    return (
        TicketResult(
            ticket_id=ticket_id,
            route="reviewed",
            category=category,
            confidence=1.0,
            model_name="ticket_classifier",
            model_version="v1",
            decision_path=[DecisionStep(step="review", status=StepStatus.ok, latency_ms=3.0)],
            latency_ms=3.0,
            completed_at=datetime.now(timezone.utc),
        )
        .model_dump_json()
        .encode()
    )


def ticket(ticket_id: str, text: str) -> bytes:
    return f'{{"ticket_id": "{ticket_id}", "text": "{text}"}}'.encode()


def test_the_latest_decision_per_ticket_joined_with_its_text() -> None:
    topics = {
        "reviewed": [
            (b"t1", reviewed("t1", "billing")),
            (b"t2", reviewed("t2", "shipping")),
            (b"t1", reviewed("t1", "after_sales")),  # decided again: the latest counts
            (b"x", b"not a result"),
        ],
        "in": [
            (b"t1", ticket("t1", "money back please")),
            (b"t3", ticket("t3", "never reviewed")),
            (b"bad", b"\xff\xfe"),
            (b"t2", ticket("t2", "  ")),  # no text to learn from
        ],
    }
    examples = feedback.read_reviewed("kafka", "reviewed", "in", lambda _b, t: iter(topics[t]))
    assert examples == [feedback.Example("t1", "money back please", "after_sales")]


def test_no_decisions_means_the_tickets_topic_is_not_read() -> None:
    read: list[str] = []

    def scanner(_bootstrap: str, topic: str):
        read.append(topic)
        return iter([])

    assert feedback.read_reviewed("kafka", "reviewed", "in", scanner) == []
    assert read == ["reviewed"]


def test_feedback_rows_count_weight_times() -> None:
    rows = [{"text": "a", "category": "billing"}]
    texts, labels = builds._with_feedback(rows, [feedback.Example("t", "b", "after_sales")], 3)
    # the corpus rows, the earlier hand-written sets as versions 1 and 2 learn them, then
    # each reviewer's decision `weight` times
    earlier = [r["text"] for r in earlier_sets.rows()] * earlier_sets.WEIGHT
    assert texts == ["a", *earlier, "b", "b", "b"] and len(labels) == len(texts)
    assert labels[0] == CATEGORIES.index("billing")
    assert list(labels[-3:]) == [CATEGORIES.index("after_sales")] * 3


def test_an_unknown_build_type_and_a_used_folder_are_refused(tmp_path) -> None:
    with pytest.raises(ValueError, match="v1, v2, v2-int8"):
        builds.build("v9", tmp_path / "x")
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "f").write_text("x")
    with pytest.raises(FileExistsError):
        builds.build("v1", tmp_path / "used")


def test_ls_fits_an_80_column_terminal(monkeypatch) -> None:
    rows = [
        rollout.Row(1, "v1", True, "READY", 90, 0.9519),
        rollout.Row(3, "v2-int8", True, "UNAVAILABLE", 10, 0.9381),
        rollout.Row(12, "?", False, "not loaded", 0, None),
    ]
    monkeypatch.setattr(rollout, "listing", lambda _target: rows)
    result = CliRunner().invoke(model_cli.model_app, ["ls"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert any("v2-int8" in line and "10 %" in line and "0.9381" in line for line in lines)
    assert any("v12" in line and "not loaded" in line for line in lines)


def test_a_refused_step_exits_1_with_the_reason(monkeypatch) -> None:
    def refuse(_target, _steps):
        raise rollout.RolloutError("only 0 earlier config(s) in p.config.routing.history")

    monkeypatch.setattr(rollout, "rollback", refuse)
    result = CliRunner().invoke(model_cli.model_app, ["rollback"])
    assert result.exit_code == 1 and "only 0 earlier" in result.output


def test_a_malformed_version_is_refused_without_repeating_it() -> None:
    result = CliRunner().invoke(model_cli.model_app, ["retire", "v3;rm -rf"])
    assert result.exit_code == 1 and "rm -rf" not in result.output
