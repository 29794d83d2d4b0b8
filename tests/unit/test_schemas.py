from datetime import datetime, timezone

import pytest
from pydantic import ValidationError

from schemas.export import json_schemas
from schemas.features import FeatureView
from schemas.routing import RoutingConfig
from schemas.tickets import CATEGORIES, Ticket, TicketResult

NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)


def ticket(**kw):
    return {"ticket_id": "t-1", "text": "hello", "created_at": NOW.isoformat(), **kw}


def test_ticket_accepts_the_contract_fields():
    t = Ticket.model_validate(
        ticket(user_id="u1", channel="email", language="en", metadata={"a": "b"})
    )
    assert t.channel.value == "email" and t.metadata == {"a": "b"}


@pytest.mark.parametrize(
    "bad",
    [
        {"ticket_id": ""},
        {"ticket_id": "has space"},
        {"ticket_id": "x" * 129},
        {"text": ""},
        {"text": "x" * 20_001},
        {"channel": "fax"},
        {"created_at": "yesterday"},
        {"metadata": {"a": 1}},
    ],
)
def test_ticket_refuses_bad_fields(bad):
    with pytest.raises(ValidationError):
        Ticket.model_validate(ticket(**bad))


def test_unknown_ticket_fields_are_ignored_for_forward_compatibility():
    t = Ticket.model_validate(ticket(subject="hi", priority=3))
    assert "subject" not in t.model_dump()


def test_categories_order_is_fixed():
    assert CATEGORIES == ("billing", "after_sales", "technical", "account", "shipping", "general")


def test_routing_weights_must_be_integers_summing_to_100():
    ok = RoutingConfig.model_validate(
        {"name": "m", "versions": {"v1": 90, "v2": 10}, "default": "v1"}
    )
    assert ok.versions == {"v1": 90, "v2": 10}
    for versions in (
        {"v1": "50", "v2": 50},
        {"v1": 90, "v2": 20},
        {"v1": 101},
        {"v1": 50.0, "v2": 50},
    ):
        with pytest.raises(ValidationError):
            RoutingConfig.model_validate({"name": "m", "versions": versions, "default": "v1"})
    with pytest.raises(ValidationError, match="default"):
        RoutingConfig.model_validate({"name": "m", "versions": {"v1": 100}, "default": "v9"})


def test_result_requires_a_decision_path():
    with pytest.raises(ValidationError, match="decision_path"):
        TicketResult.model_validate(
            {
                "ticket_id": "t",
                "route": "r",
                "category": "billing",
                "confidence": 0.5,
                "model_name": None,
                "model_version": None,
                "latency_ms": 1,
                "completed_at": NOW.isoformat(),
            }
        )


def test_feature_view_requires_ttl_and_signature_tracks_definition():
    base = {
        "name": "v",
        "entity": "user_id",
        "source_topic": "tickets.in",
        "features": [{"name": "n", "type": "int", "default": 0, "aggregation": "count"}],
    }
    with pytest.raises(ValidationError, match="ttl_seconds"):
        FeatureView.model_validate(base)
    a = FeatureView.model_validate({**base, "ttl_seconds": 300})
    b = FeatureView.model_validate({**base, "ttl_seconds": 301})
    assert a.signature() == FeatureView.model_validate({**base, "ttl_seconds": 300}).signature()
    assert a.signature() != b.signature() and len(a.signature()) == 64


def test_every_record_exports_a_json_schema():
    schemas = json_schemas()
    assert {"Ticket", "Envelope", "TicketResult", "RoutingConfig"} <= set(schemas)
    assert "ticket_id" in schemas["Ticket"]["properties"]
