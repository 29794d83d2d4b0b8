"""The word half of `refund_intent`: refund, return and exchange requests, negation-aware."""

from __future__ import annotations

import pytest

from agents.steps.clean import clean_text
from agents.steps.refund_words import asks_for_refund, refund_words, rules_out_refund


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


@pytest.mark.parametrize(
    "text",
    [
        "refnd pls, it never worked",  # a letter dropped
        "i wnat to retrun this jacket",  # two neighbours swapped
        "can I exhcange it for a blue one",
        "the earbuds are busted, swap em?",  # slang spelled out
        "this thing is trash, gimme my money back",
        "wanna return this asap",
    ],
)
def test_slang_and_typos_of_the_words_count(text: str) -> None:
    assert asks(text), refund_words(clean_text(text))


@pytest.mark.parametrize(
    "text",
    [
        "Please put the second payment back on my card",  # the money named, then "back"
        "I want my 39 dollars back",
        "I'd like the full amount back please",
        "Size 42 is too big, need a 41 instead",  # another size is a swap
        "Too tight, can I get the next size up?",
        "Wrong colour, I ordered grey",
        "this is not what I ordered, what now",
        "size 不对，想 exchange 一下",  # mixed: the English verb after 想
        "能不能换一个",
        "鞋子小了能换吗",
        "码数偏小",
        "买错了",
        "七天无理由",
        "你们发错货了",
        "不是要退款，是想把坏的换成好的",
        "I want the faulty charger exchanged",
        "You charged me 120 for a watch that dies in an hour. Make it right.",
        "花了钱买个坏的，你们看着办吧",
        "The toaster sparks. I'm not keeping a fire hazard in my house",
        "I don't want it anymore, it's still sealed",
        "质量太差，不想要了",
        "I don't need a refund - could you just ship me a working charger",  # another one
        "我不用你们退钱，给我补发一个能用的遥控器就行",
        "No store credit, I'd rather have the cash",
        "Dropped the parcel back at the post office, the money hasn't shown up",  # chased
    ],
)
def test_requests_without_refund_words_are_found(text: str) -> None:
    assert asks(text), refund_words(clean_text(text))


@pytest.mark.parametrize(
    "text",
    [
        "rerun the import job please, it failed overnight",  # one edit from "return"
        "How do I get cash back at checkout?",  # a promotion, not money returned
        "The API returns the wrong amount back to the client",
        "I got my refund yesterday, thanks! How do I add a second user?",
        "退款已经到账了，谢谢！另外怎么改昵称",
        "买之前问一下，支持七天无理由吗",
        "我想换手机号",  # 换 of something that is no purchase
        "I dont wanna return it, just help me set it up",
        "I don't want it replaced, just fixed",  # the negation before the lookbehind's verb
        "the refund came through, thx. now how do I change my username",
        "I can't make it right-aligned in the editor",
        "I can't keep up with all the notification emails",
        "the app doesn't keep me logged in",
        "包裹丢了，能补发吗",  # a lost parcel sent again is shipping
        "please send me a new password reset link",
        "I sent the form back last week, is my account verified?",
    ],
)
def test_look_alikes_of_the_new_forms_are_not_requests(text: str) -> None:
    assert not asks(text), refund_words(clean_text(text))


def test_thanks_for_a_refund_that_fell_short_keeps_the_request() -> None:
    assert asks("my refund arrived but it is half of what I paid, thanks for nothing")


@pytest.mark.parametrize(
    ("text", "declined"),
    [
        ("I'm not asking for a refund, I need a corrected invoice", True),
        ("不退不换，我就想知道这个怎么安装", True),
        ("I don't want to return the router, I need help getting it online", True),
        ("I do NOT want a refund, just a replacement", False),  # another request
        ("I do NOT want a refund, the unit is faulty", False),  # a fault: another remedy
        ("我不要退款，东西坏了", False),
        ("the app crashes on start", False),  # nothing declined
        ("I want a refund", False),
        ("Does the warranty cover accidental damage? Thinking of buying one.", True),
        ("下单之前想问一下保修多久", True),
    ],
)
def test_rules_out_refund(text: str, declined: bool) -> None:
    assert rules_out_refund(clean_text(text)) is declined


def test_spelling_is_normalised_before_matching() -> None:
    from agents.steps.refund_spelling import normalise

    assert normalise("gimme my money back, pls") == "give me my money back, please"
    assert normalise("retrun it, refnd me, exhcange em") == "return it, refund me, exchange them"
    # real words one edit away stay, and so do the request words themselves
    assert normalise("rerun the returns report") == "rerun the returns report"
    assert normalise("v2 replaces the API; we retuned it") == "v2 replaces the API; we retuned it"
