"""The quix-streams peer's steps (variant e of `ticketflow bench pipeline`), without quix:
the step functions are plain, so they run here on fakes of Redis and the gateway."""

import orjson
import pytest

from agents.errors import BadRecord
from benchmarks import peer
from schemas.tickets import TicketResult

FEATURES = {"tickets_1h": {"value": 3, "is_fallback": False}}


def raw(text: str, ticket_id: str = "t-1") -> bytes:
    ticket = {"ticket_id": ticket_id, "text": text, "user_id": "u1", "created_at": "2026-12-01"}
    return orjson.dumps(ticket)


def answer(label: str, confidence: float) -> dict:
    out = {"id": "t-1", "label": label, "confidence": confidence, "scores": {}, "version": "v1"}
    return {"model": "ticket_classifier", "version": "v1", "outputs": [out], "latency_ms": 2.0}


class State:
    def __init__(self) -> None:
        self.values: dict[str, str] = {}

    def set(self, key: str, value: str) -> None:
        self.values[key] = value


def through_all(value: bytes, predict: peer.Predictor) -> tuple[dict, list[State]]:
    """The six steps in order, each as the stateful apply quix runs, then the result."""
    work = {
        "validate": lambda v: peer.validate(v, 64 * 1024),
        "clean": peer.clean,
        "features": lambda r: peer.features(r, lambda user: FEATURES),
        "infer": lambda r: peer.infer(r, predict),
        "rules": peer.rules,
        "route": peer.route,
    }
    states = [State() for _ in peer.STEPS]
    rec = value
    for step, state in zip(peer.STEPS, states, strict=True):
        rec = peer.timed(step, work[step])(rec, state)
        rec = orjson.loads(orjson.dumps(rec))  # a hop: what the next step reads is JSON
    return peer.result(rec), states


def test_a_confident_ticket_is_auto_classified_with_its_whole_path():
    result, states = through_all(
        raw("<p>My  app crashes on login</p>"), lambda tid, text: answer("technical", 0.9)
    )
    TicketResult.model_validate(result)
    assert (result["route"], result["category"], result["model_version"]) == (
        "auto_classify",
        "technical",
        "v1",
    )
    assert [e["step"] for e in result["decision_path"]] == list(peer.STEPS)
    assert result["features"] == FEATURES and result["latency_ms"] >= 0
    assert [s.values["status"] for s in states] == list(peer.STEPS)


def test_the_model_reads_the_cleaned_text():
    seen = []
    through_all(
        raw("<b>Where is my parcel?</b>"), lambda tid, t: seen.append(t) or answer("shipping", 0.9)
    )
    assert seen == ["Where is my parcel?"]


def test_a_refund_goes_to_after_sales_and_a_doubtful_one_to_review():
    refund, _ = through_all(raw("I want a refund"), lambda tid, t: answer("billing", 0.99))
    doubtful, _ = through_all(raw("hmm, something"), lambda tid, t: answer("general", 0.3))
    assert refund["route"] == "after_sales"
    assert doubtful["route"] == "manual_review"


def test_without_the_gateway_the_ticket_is_degraded_to_review():
    def down(ticket_id: str, text: str) -> dict:
        raise peer.GatewayDown("ConnectError")

    result, _ = through_all(raw("app crashes"), down)
    assert result["route"] == "manual_review" and result["degraded"]
    assert result["model_version"] is None and "ConnectError" in result["degraded_reason"]


def test_a_bad_record_is_refused_as_the_validate_step_refuses_it():
    with pytest.raises(BadRecord):
        peer.validate(b"not json", 64 * 1024)
