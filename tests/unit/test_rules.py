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


# ---- refund_intent: the words, or the model's after_sales probability ------------------------

INTENT = ["refund_intent", "score_threshold"]


def scored(after_sales: float, top: str = "technical", top_p: float = 0.6, degraded=False):
    scores = {c.value: 0.0 for c in Category}
    scores.update({top: top_p, "after_sales": after_sales})
    pred = Prediction(
        category=top, confidence=top_p, scores=scores, model_name="m", model_version="v1"
    )
    return Context(prediction=pred, degraded=degraded, degraded_reason="late" if degraded else None)


def intent(text, context, after_sales_threshold=0.25):
    return apply_rules(INTENT, RuleInput(text, context, 0.5, after_sales_threshold))


def test_refund_intent_sends_a_probable_request_without_refund_words():
    out = intent("this thing broke after two days, sort it out", scored(0.3, "billing"))
    assert (out.route, out.category, out.fired) == (
        "after_sales",
        Category.after_sales,
        ["refund_intent"],
    )
    assert "0.30" in out.reason


def test_refund_intent_below_the_threshold_leaves_the_model_its_decision():
    out = intent("the app crashes on start", scored(0.24, "technical", 0.7))
    assert (out.route, out.category) == ("auto_classify", Category.technical)


def test_refund_intent_without_a_threshold_is_the_words_alone():
    assert intent("it broke, what now", scored(0.9, "after_sales", 0.9), None).route == (
        "auto_classify"
    )
    assert intent("I want a refund", scored(0.0), None).route == "after_sales"


def test_refund_intent_words_win_over_the_model_and_degradation():
    assert intent("我要退款", scored(0.01, "billing", 0.99)).route == "after_sales"
    assert intent("我要退款", ctx(degraded=True)).route == "after_sales"


def test_refund_intent_ignores_the_probability_of_a_degraded_ticket():
    out = intent("it broke", scored(0.9, "after_sales", 0.9, degraded=True))
    assert out.route == "manual_review" and out.fired == ["degraded"]


def test_refund_intent_declined_words_do_not_fire_but_the_model_still_may():
    # words declined: the rule's word half is silent; a low probability keeps the model's
    out = intent("I don't want to return it, how do I pair it?", scored(0.1, "technical", 0.8))
    assert out.route == "auto_classify"
    # a replacement asked for without a refund word: the probability decides
    out = intent("I do NOT want a refund, the unit is faulty", scored(0.7, "after_sales", 0.7))
    assert out.route == "after_sales"


def test_refund_intent_a_declined_refund_needs_after_sales_first():
    # the customer says no refund and asks for something else: the model's 0.6 is the
    # refund word it read, while it ranks billing first
    text = "不是要退款，我就想问一下发票怎么开"
    out = intent(text, scored(0.3, "billing", 0.6))
    assert (out.route, out.category) == ("auto_classify", Category.billing)
    # the model ranks after_sales first: it decides, at the usual threshold
    out = intent(text, scored(0.6, "after_sales", 0.6))
    assert out.route == "after_sales" and out.fired == ["refund_intent"]
    # 不退不换 declines both at once
    out = intent("不退不换，就想知道怎么安装", scored(0.4, "technical", 0.55))
    assert out.route == "auto_classify"
    # a fault reported with the refund declined: another remedy is wanted, the usual threshold
    out = intent("I don't want a refund, it stopped working", scored(0.3, "technical", 0.6))
    assert out.route == "after_sales"


async def test_the_rules_step_takes_the_threshold_from_its_definition():
    from datetime import datetime, timezone

    from agents.steps.handlers import RuleEngineStep
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
        e.context.prediction = scored(0.3, "technical", 0.6).prediction
        return e

    step = Step(name="rules", type="rule_engine", rules=INTENT, after_sales_threshold=0.25)
    e = env()
    await RuleEngineStep().run(e, step)
    assert e.context.rule.route == "after_sales"
    e = env()
    await RuleEngineStep().run(e, step.model_copy(update={"after_sales_threshold": 0.35}))
    assert e.context.rule.route == "auto_classify"
