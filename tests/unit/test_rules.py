import pytest

from agents.steps.rules import RuleInput, apply_rules
from schemas.tickets import Category, Context, Prediction

RULES = ["refund_check", "score_threshold"]


def ctx(category="technical", confidence=0.9, degraded=False):
    pred = Prediction(category=category, confidence=confidence, model_name="m", model_version="v1")
    return Context(
        prediction=None if degraded else pred,
        degraded=degraded,
        degraded_reason="RETRIES_EXHAUSTED" if degraded else None,
    )


@pytest.mark.parametrize(
    "text",
    [
        "我要退款",
        "申请退货，东西坏了",
        "I want a refund for order 123",
        "Please give me my money back",
        "I'd like to return this jacket",
        "Can I get a REFUND?",
        "how do I send it back",
        "要求退钱",
    ],
)
def test_refund_requests_go_to_after_sales_whatever_the_confidence(text):
    out = apply_rules(RULES, RuleInput(text, ctx(confidence=0.99), 0.5))
    assert out.route == "after_sales" and out.category == Category.after_sales


@pytest.mark.parametrize(
    "text",
    [
        "The API returns 500 on every call",
        "my password reset link is broken",
        "Return key does nothing in the editor",
        "发票抬头写错了",
    ],
)
def test_non_refund_text_is_not_caught(text):
    assert apply_rules(RULES, RuleInput(text, ctx(confidence=0.9), 0.5)).route == "auto_classify"


def test_low_confidence_goes_to_manual_review():
    out = apply_rules(RULES, RuleInput("hello", ctx(confidence=0.49), 0.5))
    assert out.route == "manual_review" and out.fired == ["score_threshold"]
    assert apply_rules(RULES, RuleInput("hello", ctx(confidence=0.5), 0.5)).route == "auto_classify"


def test_degraded_tickets_go_to_manual_review_with_the_reason():
    out = apply_rules(RULES, RuleInput("hello", ctx(degraded=True), 0.5))
    assert out.route == "manual_review" and "RETRIES_EXHAUSTED" in out.reason


def test_refund_beats_degradation():
    assert apply_rules(RULES, RuleInput("退款", ctx(degraded=True), 0.5)).route == "after_sales"
