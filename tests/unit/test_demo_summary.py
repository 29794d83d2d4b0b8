"""The demo's summary counts: real (non-fallback) features, and tickets with user history."""

from __future__ import annotations

from ticketflow.demo import USERS, feature_share, sample_tickets, with_history


def _result(**features: tuple[object, bool]) -> dict:
    return {"features": {k: {"value": v, "is_fallback": fb} for k, (v, fb) in features.items()}}


def test_feature_share_counts_values_and_whole_tickets() -> None:
    results = [
        _result(tickets_7d=(3, False), channels=(["chat"], False)),
        _result(tickets_7d=(0, True), channels=([], False)),
        {"features": {}},  # a ticket without features counts as none real
    ]
    assert feature_share(results) == (3, 4, 1)


def test_with_history_needs_a_real_non_empty_value() -> None:
    results = [
        _result(tickets_7d=(0, False), channels=([], False), last_ticket_at=(None, False)),
        _result(tickets_7d=(0, False), mean_text_len_7d=(12.5, False)),
        _result(tickets_7d=(2, True)),
    ]
    assert with_history(results) == 1


def test_the_warm_up_wave_has_one_ticket_per_user() -> None:
    tickets = sample_tickets(USERS + 5, "abc123")
    assert len({t["user_id"] for t in tickets[:USERS]}) == USERS
    assert {t["user_id"] for t in tickets[USERS:]} <= {t["user_id"] for t in tickets[:USERS]}
