"""The `rule_engine` step's rules: business decisions on top of the model's prediction."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from schemas.tickets import Category, Context, RuleOutcome

# Refund and return requests, in Chinese and English. "return" alone is too broad
# ("the API returns 500"), so it must be about sending something back.
REFUND = re.compile(
    r"退款|退货|退钱|退费|退回|退掉|退换|"
    r"\brefund|\bmoney back\b|\bcharge ?back\b|\breimburse|"
    r"\breturn(?:ing)? (?:it|this|them|these|the|my|an?|both)\b|"
    r"\breturn (?:request|label|policy|window)|\bwant to return\b|\bsend (?:it|this|them) back\b",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class RuleInput:
    text: str
    context: Context
    threshold: float


# A rule returns the route it decides, or None to let the next rule decide.
Rule = Callable[[RuleInput], "RuleOutcome | None"]


def refund_check(data: RuleInput) -> RuleOutcome | None:
    if REFUND.search(data.text):
        return RuleOutcome(
            route="after_sales",
            category=Category.after_sales,
            fired=["refund_check"],
            reason="refund or return request",
        )
    return None


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


RULES: dict[str, Rule] = {"refund_check": refund_check, "score_threshold": score_threshold}


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
