"""The `rule_engine` step's rules: business decisions on top of the model's prediction."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass

from agents.steps.refund_intent import IntentScore
from agents.steps.refund_words import asks_for_refund
from schemas.tickets import Category, Context, Prediction, RuleOutcome


@dataclass(frozen=True)
class RuleInput:
    text: str
    context: Context
    threshold: float
    # the step's `after_sales_threshold`: None leaves refund_intent to the words alone
    after_sales_threshold: float | None = None
    # for `sample`: whose decision it is, and the step's `sample_share`
    ticket_id: str = ""
    sample_share: float = 0.0
    # the refund-intent head's score of this ticket (agents/steps/refund_intent.py), and the
    # step's `intent_band`: at or above its top, after_sales; inside it, manual_review
    intent: IntentScore | None = None
    intent_band: tuple[float, float] | None = None


# A rule returns the route it decides, or None to let the next rule decide.
Rule = Callable[[RuleInput], "RuleOutcome | None"]


def refund_check(data: RuleInput) -> RuleOutcome | None:
    """The words alone (see refund_words): kept for definitions that name it."""
    if asks_for_refund(data.text):
        return _after_sales("refund_check", "refund or return request")
    return None


def refund_intent(data: RuleInput) -> RuleOutcome | None:
    """The refund-intent head decides the route; the category stays the model's (it is
    after_sales only where the model ranks after_sales first). A score inside the step's
    `intent_band`, or a model and a head that disagree, goes to people with both scores.
    Without a prediction (a degraded ticket) the refund words are the fallback."""
    pred = data.context.prediction
    if pred is None or data.context.degraded:
        if asks_for_refund(data.text):
            return _after_sales("refund_intent", "refund or return words (no prediction)")
        return None
    if data.intent is None or data.intent_band is None:
        return _by_probability(pred, data.after_sales_threshold)
    low, high = data.intent_band
    s = data.intent.score
    first = pred.category == Category.after_sales
    scores = (
        f"intent {s:.2f} ({data.intent.model}), after_sales {_p(pred):.2f} "
        f"({pred.model_name} {pred.model_version})"
    )
    if s >= high:
        return _route("after_sales", pred, "refund_intent", f"refund intent >= {high}: {scores}")
    if s >= low:
        reason = f"refund intent uncertain ({low} <= score < {high}): {scores}"
        return _route("manual_review", pred, "refund_intent_uncertain", reason)
    if first:
        reason = f"the model ranks after_sales first, the intent head reads no request: {scores}"
        return _route("manual_review", pred, "refund_intent_disagree", reason)
    return None


def _p(pred: Prediction) -> float:
    return pred.scores.get(Category.after_sales.value, 0.0)


def _by_probability(pred: Prediction, threshold: float | None) -> RuleOutcome | None:
    """Without an intent head (never built): the model's after_sales probability."""
    if threshold is None or _p(pred) < threshold:
        return None
    reason = f"after_sales probability {_p(pred):.2f} >= {threshold} (no intent head)"
    return _route("after_sales", pred, "refund_intent", reason)


def _route(route: str, pred: Prediction, rule: str, reason: str) -> RuleOutcome:
    return RuleOutcome(route=route, category=pred.category, fired=[rule], reason=reason)


def audit_detail(rule: RuleOutcome | None) -> str | None:
    """The rule step's entry in the decision path and the audit: what fired, and why (the
    intent head's version, digest and score among it)."""
    if rule is None or not rule.fired:
        return None
    return f"{','.join(rule.fired)}: {rule.reason}" if rule.reason else ",".join(rule.fired)


def _after_sales(rule: str, reason: str) -> RuleOutcome:
    return RuleOutcome(
        route="after_sales", category=Category.after_sales, fired=[rule], reason=reason
    )


def score_threshold(data: RuleInput) -> RuleOutcome | None:
    pred = data.context.prediction
    if data.context.degraded or pred is None:
        reason = data.context.degraded_reason or "no prediction"
        category = pred.category if pred else Category.general  # the model's advice, if any
        return RuleOutcome(
            route="manual_review", category=category, fired=["degraded"], reason=reason
        )
    if pred.confidence < data.threshold:
        return RuleOutcome(
            route="manual_review",
            category=pred.category,
            fired=["score_threshold"],
            reason=f"confidence {pred.confidence:.2f} below {data.threshold}",
        )
    return None


SAMPLE = "sample"  # in a rule outcome's `fired`: a spot check (agents/spot_check.py)


def sample(data: RuleInput) -> RuleOutcome | None:
    """Spot check: the model's decision stands (auto_classify), and for `sample_share` of
    the tickets, by ticket_id, a copy goes to reviewers. Last in its list (the definition
    check insists), so only what no earlier rule routed elsewhere is sampled."""
    pred = data.context.prediction
    if pred is None or data.context.degraded or not sampled(data.ticket_id, data.sample_share):
        return None
    return RuleOutcome(
        route="auto_classify",
        category=pred.category,
        fired=[SAMPLE],
        reason=f"spot check ({data.sample_share:.0%} of automatic decisions)",
    )


def sampled(ticket_id: str, share: float) -> bool:
    """Whether `ticket_id` falls in the sampled `share`: the same answer on every worker
    and replay. Salted, so that the sample is not the gateway's canary share of ids."""
    digest = hashlib.sha256(b"spot-check:" + ticket_id.encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < share


RULES: dict[str, Rule] = {
    "refund_check": refund_check,
    "refund_intent": refund_intent,
    "score_threshold": score_threshold,
    SAMPLE: sample,
}


def apply_rules(names: list[str], data: RuleInput) -> RuleOutcome:
    """First rule that decides wins; with none, the model's category is auto-classified."""
    for name in names:
        outcome = RULES[name](data)
        if outcome is not None:
            return outcome
    pred = data.context.prediction
    if pred is None:  # only reachable with a rule list that lacks score_threshold
        return RuleOutcome(route="manual_review", category=Category.general, reason="no prediction")
    return RuleOutcome(route="auto_classify", category=pred.category)
