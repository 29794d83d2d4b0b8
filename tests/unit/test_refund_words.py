"""The word half of `refund_intent`: refund, return and exchange requests, negation-aware."""

from __future__ import annotations

import pytest

from agents.steps.clean import clean_text
from agents.steps.refund_words import asks_for_refund, refund_words


def asks(text: str) -> bool:
    return asks_for_refund(clean_text(text))  # the rules step reads the cleaned text


@pytest.mark.parametrize(
    "text",
    [
        "I want a refund for order 123",
        "Please give me my money back",
        "I'd like to return this jacket",
        "how do I send it back",
        "我要退款",
        "申请退货，东西坏了",
        "东西坏了，钱退我",
        "不想要了，还没拆封，可以退吗",  # 不想要了: rid of it, which is a return
        "东西不要了退款吧",
        "order 1234 的鞋子不合脚，想 return",
        "I want a replacement unit",
        "鞋子码数小了，能换大一码吗",
        "Where is my RMA label?",
        "Please credit my card for the missing item",
        "It broke twice, I want compensation",
        "Can you repair or replace it?",
        "摔坏的不是我，要求赔偿",
    ],
)
def test_requests_are_found(text: str) -> None:
    assert asks(text)


@pytest.mark.parametrize(
    "text",
    [
        "I don't want to return the router, I need help getting it online",
        "I'm not asking for a refund, only a corrected invoice",
        "This isn't about a refund, I need the invoice in my company's name",
        "I'm not returning the printer",
        "No need to refund anything",
        "我不想退货，就是不会连蓝牙",
        "不是要退款，我就想问发票怎么开",
        "不是退款的事，发票抬头要改",
        "不用退了，已经修好了",
        "我不打算退，想问下怎么设置",
        "不是 refund 的事， invoice 抬头要改",  # mixed: a space after the negation
    ],
)
def test_declined_requests_are_not(text: str) -> None:
    assert not asks(text), refund_words(clean_text(text))


@pytest.mark.parametrize(
    "text",
    [
        "I do NOT want a refund, just a replacement",  # the refund declined, the exchange asked
        "我不要退款，给我换一个好的就行",
        "我不要 refund，只想要个 replacement",
        "I don't want a replacement, I want a refund",
    ],
)
def test_a_declined_word_leaves_the_other_request(text: str) -> None:
    assert asks(text)


@pytest.mark.parametrize(
    "text",
    [
        "I don't want to wait any longer for my refund",  # the negation is about waiting
        "still no refund after 3 weeks",  # not getting is a complaint, not a negation
        "The order was cancelled but not refunded",
        "I can't request a refund in the app",
        "商家不给退款",
        "I'm not happy, I want my money back",
    ],
)
def test_complaints_keep_their_request(text: str) -> None:
    assert asks(text)


@pytest.mark.parametrize(
    "text",
    [
        "The API returns 500 on every call",
        "Return key does nothing in the editor",
        "What is your refund policy for next year's plan?",
        "How long is the return window?",
        "退出登录以后进不去了",
        "怎么退订营销短信",
        "包裹被退回发件人了，能重新寄吗",
        "Tracking says return to sender",
        "The exchange rate on my bill is wrong",
        "How do I exchange my loyalty points for a voucher?",
        "Please send the invoice back with the right address",
    ],
)
def test_near_misses_are_not_requests(text: str) -> None:
    assert not asks(text), refund_words(clean_text(text))


def test_a_policy_question_does_not_hide_a_request() -> None:
    assert asks("我要退货，你们的退货政策是什么")
    assert asks("Your return policy says 30 days, so I want to return it")


def test_clauses_bound_the_negation() -> None:
    # the negation ends with its clause (full-width comma folded by NFKC to ",")
    assert asks("我不想等了，退款吧")
    assert asks("I don't want this anymore. Refund me")
