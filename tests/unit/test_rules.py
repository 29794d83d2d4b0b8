import pytest

from agents.steps.refund_intent import IntentScore
from agents.steps.rules import RuleInput, apply_rules, audit_detail
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


# ---- refund_intent: the intent head decides the route, the category stays the model's -------

INTENT = ["refund_intent", "score_threshold"]
BAND = (0.3, 0.6)


def scored(after_sales: float, top: str = "technical", top_p: float = 0.6, degraded=False):
    scores = {c.value: 0.0 for c in Category}
    scores.update({top: top_p, "after_sales": after_sales})
    pred = Prediction(
        category=top, confidence=top_p, scores=scores, model_name="m", model_version="v1"
    )
    return Context(prediction=pred, degraded=degraded, degraded_reason="late" if degraded else None)


def intent(text, context, score=None, after_sales_threshold=0.25, band=BAND):
    head = IntentScore(score, "refund_intent/1@abc") if score is not None else None
    data = RuleInput(
        text, context, 0.5, after_sales_threshold, intent=head, intent_band=band if head else None
    )
    return apply_rules(INTENT, data)


def test_a_confident_intent_routes_to_after_sales_and_keeps_the_models_category():
    out = intent("you billed me twice, put it back on my card", scored(0.3, "billing"), 0.9)
    assert (out.route, out.category, out.fired) == (
        "after_sales",
        Category.billing,
        ["refund_intent"],
    )
    # both scores and the head's version in the reason (the audit detail)
    assert "0.90" in out.reason and "0.30" in out.reason and "refund_intent/1@abc" in out.reason
    assert audit_detail(out).startswith("refund_intent: ")
    out = intent("broken, refund", scored(0.7, "after_sales", 0.7), 0.95)
    assert (out.route, out.category) == ("after_sales", Category.after_sales)


def test_an_uncertain_intent_goes_to_people_with_both_scores():
    out = intent("what is this", scored(0.2, "general", 0.7), 0.45)
    assert (out.route, out.category, out.fired) == (
        "manual_review",
        Category.general,
        ["refund_intent_uncertain"],
    )
    assert "0.45" in out.reason and "0.20" in out.reason


def test_a_low_intent_leaves_the_model_its_decision():
    out = intent("the app crashes on start", scored(0.24, "technical", 0.7), 0.05)
    assert (out.route, out.category) == ("auto_classify", Category.technical)


def test_a_model_that_ranks_after_sales_first_against_the_head_goes_to_people():
    # the product name alone: the model's after_sales is not believed over the head
    out = intent("model TX-200", scored(0.63, "after_sales", 0.63), 0.05)
    assert (out.route, out.fired) == ("manual_review", ["refund_intent_disagree"])


def test_without_a_head_the_models_probability_decides_but_not_the_category():
    out = intent("it broke, sort it out", scored(0.3, "billing", 0.6))
    assert (out.route, out.category) == ("after_sales", Category.billing)
    assert intent("the app crashes", scored(0.2, "technical", 0.7)).route == "auto_classify"
    assert intent("I want a refund", scored(0.0, "billing", 0.9), None, None).route == (
        "auto_classify"
    )


def test_the_words_are_the_fallback_of_a_degraded_ticket_only():
    assert intent("我要退款", ctx(degraded=True)).route == "after_sales"
    # with a prediction the words alone do not decide
    assert intent("我要退款", scored(0.01, "billing", 0.99), 0.05).route == "auto_classify"
    out = intent("it broke", scored(0.9, "after_sales", 0.9, degraded=True), 0.99)
    assert out.route == "manual_review" and out.fired == ["degraded"]


async def test_the_rules_step_scores_the_intent_when_its_definition_has_a_band(monkeypatch):
    from datetime import datetime, timezone

    from agents.steps import handlers
    from schemas.tickets import Envelope, Ticket
    from schemas.workflow import Step

    def env():
        now = datetime.now(timezone.utc)
        e = Envelope(
            ticket=Ticket(ticket_id="t-1", text="it broke on day two, sort it out", created_at=now),
            workflow="ticket_classify",
            workflow_version=1,
            step="rules",
            trace_id="a" * 32,
            arrival="0:1",
            started_at=now,
        )
        e.context.prediction = scored(0.1, "technical", 0.6).prediction
        return e

    class Head:
        def score(self, text, pred):
            assert pred.model_version == "v1" and "broke" in text
            return IntentScore(0.8, "refund_intent/1@fake")

    monkeypatch.setattr(handlers, "load_head", lambda: Head())
    step = Step(name="rules", type="rule_engine", rules=INTENT, intent_band=BAND)
    e = env()
    await handlers.RuleEngineStep().run(e, step)
    assert (e.context.rule.route, e.context.rule.category) == ("after_sales", Category.technical)
    e = env()
    await handlers.RuleEngineStep().run(e, step.model_copy(update={"intent_band": (0.7, 0.9)}))
    assert e.context.rule.route == "manual_review"
    # no band: no head, the model's probability at after_sales_threshold
    e = env()
    no_band = step.model_copy(update={"intent_band": None, "after_sales_threshold": 0.25})
    await handlers.RuleEngineStep().run(e, no_band)
    assert e.context.rule.route == "auto_classify"
