"""The `rule_engine` step's rules: business decisions on top of the model's prediction."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass

from agents.steps.refund_words import asks_for_refund, rules_out_refund
from schemas.tickets import Category, Context, RuleOutcome


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


# A rule returns the route it decides, or None to let the next rule decide.
Rule = Callable[[RuleInput], "RuleOutcome | None"]


def refund_check(data: RuleInput) -> RuleOutcome | None:
    """The words alone (see refund_words): kept for definitions that name it."""
    if asks_for_refund(data.text):
        return _after_sales("refund_check", "refund or return request")
    return None


def refund_intent(data: RuleInput) -> RuleOutcome | None:
    """The words, or the model's after_sales probability at the step's threshold: a request
    phrased without any refund word ("it broke after two days, I want my money") still
    reaches after_sales. Words win whatever the model says, and without a prediction."""
    if asks_for_refund(data.text):
        return _after_sales("refund_intent", "refund or return request")
    pred, threshold = data.context.prediction, data.after_sales_threshold
    if pred is None or data.context.degraded or threshold is None:
        return None
    # A customer who rules a refund or return out ("I'm not asking for a refund, I need the
    # invoice", "thinking of buying one") is believed unless the model ranks after_sales
    # first: the model reads the refund word, not its negation (v1 gave such tickets
    # 0.3-0.8 while ranking another category first)
    if rules_out_refund(data.text) and pred.category != Category.after_sales:
        return None
    p = pred.scores.get(Category.after_sales.value, 0.0)
    if p >= threshold:
        return _after_sales("refund_intent", f"after_sales probability {p:.2f} >= {threshold}")
    return None


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
