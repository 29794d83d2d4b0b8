"""RetryableError's default code is one a workflow definition can give a policy to."""

from __future__ import annotations

from typing import get_args

from agents.errors import RetryableError
from schemas.workflow import RetryableCode, RetryPolicy, Step


def test_the_default_code_is_a_retryable_code() -> None:
    assert RetryableError("gateway unreachable").code in get_args(RetryableCode)


def test_a_step_finds_its_own_policy_for_the_default_code() -> None:
    own = RetryPolicy(max_attempts=5, backoff_ms=50)
    step = Step(
        name="infer",
        type="inference_call",
        model="ticket_classifier",
        retry=RetryPolicy(max_attempts=2),
        retry_on={"MODEL_UNAVAILABLE": own},
    )
    assert step.policy_for(RetryableError("down").code) == own


def test_a_code_given_is_kept() -> None:
    assert RetryableError("busy", code="OVERLOADED").code == "OVERLOADED"
