"""Whether a ticket's words ask for a refund, a return or an exchange: the word half of the
`refund_intent` rule (the model's after_sales probability is the other half).

A word counts unless the customer says they do not want it ("I do NOT want a refund",
"不想退货"): a negated desire, in the same clause, a few words before it. Complaints about
a refund keep it ("still no refund", "商家不给退款"): only wanting is negated, not getting.
Questions about a policy in general ("what is your refund policy?") are no request.
"""

from __future__ import annotations

import re
from functools import lru_cache

from agents.steps.refund_spelling import normalise

# Refund, return and exchange words. "return" alone is too broad ("the API returns 500",
# "the return key"), so it must be about sending something back; 退 alone is too ("退出登录",
# "退订"), so it must be the verb of a refund or return.
_NOT_GOODS = r"(?!invoice|receipt|bill|email|form|document|contract|link|code|message)"
_CURRENCY = r"dollars|bucks|euros|pounds|quid"
# "cash back" alone is a billing promotion: cash counts with an owner ("my cash back")
_MONEY = (
    rf"money|payment|(?:my|the|our) cash|funds|amount|difference|charges?|{_CURRENCY}|\$\d+|"
    rf"\d+ (?:{_CURRENCY})"
)
_EN = (
    r"\brefund|\bmoney back\b|\bcharge ?back\b|\breimburse|\bstore credit\b|\brma\b|"
    r"\b(?:pay|paid) (?:me )?back\b|\b(?:money|payment|charge) (?:returned|reversed)\b|"
    r"\breverse (?:the|my|that|this) (?:payment|charge|transaction)\b|\bcredited back\b|"
    r"\bcredit (?:it |that |the (?:money|amount|payment) )?(?:back )?(?:to|on|onto) my\b|"
    r"\bcredit my (?:card|account)\b|\bcompensat(?:e|ion)\b|"
    r"\b(?:repair|fix) (?:it )?or (?:replace|swap|exchange)|"
    r"\breplace (?:it )?or (?:repair|refund)\b|"
    r"\bgive (?:it|them|this|these) back\b|"
    # desire verbs as lookbehinds, so that a negation before them stays before the match
    r"(?:(?<=want )|(?<=get )|(?<=give me )|(?<=need ))(?:back )?my (?:money|cash\b|\$)|"
    r"\breturn(?:ing|ed)? (?:it|this|that|them|these|those|the|my|an?|both|everything)\b|"
    r"\breturn (?:request|label|shipping|window)|"
    r"(?:(?<=want to )|(?<=like to )|(?<=need to ))return\b|"
    # sent back already (a refund chased) as well as to be sent
    rf"\b(?:send|ship|mail|bring|take|post|sent|shipped|mailed|brought|took|posted|dropped) "
    rf"(?:it|this|that|them|these|those|the {_NOT_GOODS}\w+) "
    r"back\b|\b(?:send|ship|mail|bring|post)(?:ing)? (?:it )?back\b|"
    r"\b(?:exchange|swap) (?:it|this|that|them|these|the|an?|for)\b|"
    r"\b(?:exchange|swap) my (?!(?:\w+ )?(?:points|miles|coupons?|vouchers?|currency))|"
    r"\breplacement (?:unit|item|one)\b|\b(?:send|give) me a (?:new|replacement) one\b|"
    # another one of the goods sent: "just send a new charger" (not a new password or code)
    r"\b(?:send|ship) (?:me |us )?an? (?:new|replacement|working) "
    r"(?!password|code|link|invoice|receipt|email|bill|verification|card)\w+|"
    r"(?:(?<=want )|(?<=need )|(?<=like )|(?<=get )|(?<=request ))(?:a )?replacement\b|"
    r"\b(?:a|the) replacement\b(?! (?:card|code|password|link|key))|"
    r"\b(?:get|have) (?:it |this |them |these )?(?:replaced|exchanged|swapped|refunded)\b|"
    r"(?:(?<=want )|(?<=need ))(?:it |this |them |these |the (?:\w+ ){0,3})?"
    r"(?:replaced|exchanged|swapped|refunded)\b|"
    r"\b(?:exchanged|swapped|replaced) (?:for|with) (?:a|an|one|another|the)\b|"
    r"(?:(?<=要)|(?<=要个)|(?<=要个 )|(?<=想换)|(?<=想换 ))(?:replacement|exchange|new one)\b|"
    # the money named, then "back" a few words on: "put the second payment back on my card"
    rf"\b(?:{_MONEY})\b(?: \w+){{0,3}} back\b(?! to (?:the )?(?:client|server|caller|app))|"
    r"\bback (?:on|to|onto) my (?:\w+ )?(?:card|account)\b|"
    # another size or the item that was ordered: a swap, whatever verb comes with it
    r"\b(?:smaller|bigger|larger) (?:size|one)\b|\bsize (?:up|down)\b|\bnext size\b|"
    r"\bwrong (?:size|colou?r)\b|\bnot what i (?:ordered|paid for)\b|"
    r"\b(?:a|the|size) \d{1,2}(?:\.5)? instead\b|"
    # cash preferred to what was offered: "I'd rather have the cash"
    r"\b(?:rather|prefer to) (?:have|get|take) (?:the |my )?(?:cash|money)\b|"
    # refusing to keep the thing is returning it
    r"(?:\bnot|n[’']t)\s+(?:be\s+)?keep(?:ing)?\b(?! (?:up|track|going|me|us|you|crashing))|"
    r"\b(?:don[’']?t|do not) want (?:it|this|them|these)(?: \w+)? any ?more\b|"
    # the remedy left to the seller: after-sales, whatever the fault
    r"\bmake (?:it|this|that|things) right\b(?!-)|\bstand behind (?:it|this|your|the)\b|"
    r"\breplace (?:it|this|that|them|these|the \w+)\b|"
    r"\b(?:just|only) (?:a |an |the )?(?:replacement|exchange|new one)\b"
)
_ZH = (
    r"退款|退货|退钱|退费|(?<!被)退回|退掉|退换|换货|换新|调换|退给我|原路(?:退回|返回)|"
    r"钱(?:还|退|返)(?:给)?我|把钱(?:还|退|返)|钱(?:要|拿)回来|返还货款|"
    r"钱[^，。,.!?！？]{0,6}(?:还给我|还我|退给我|打回|返还|返回|回来|拿回)|"
    r"(?:(?<=想)|(?<=要)|(?<=想 )|(?<=要 ))(?:return|exchange|swap|send (?:it )?back)\b|"
    r"(?:要|还)回?我的钱|还我钱|(?<!被)寄回|寄还|(?:申请|走|办)了?售后|赔偿|赔钱|补偿|"
    r"(?:换|补发)(?:一个|个)?(?:能用|正常|好|新)的|"
    r"(?:七|7)天无理由|发错(?:货|了)|货不对板|买错了|"
    r"给(?:我|个)?(?:一个)?说法|(?:你们)?看着办|"
    r"不想要了|"
    # 换 asked for, not 换手机号: the verb ends the clause or takes a count
    r"(?:能|可以|能不能|可不可以|想|要)换(?=[吗呢吧？?。，,！!\s]|$|一下|一个|个|货)|"
    r"(?:尺码|码数|码子|尺寸|size)\s?(?:不对|不合适|错了|偏大|偏小|太大|太小)|"
    # lookbehinds, so that a negation before the verb stays before the match
    r"(?:(?<=能)|(?<=可以)|(?<=要)|(?<=想)|(?<=给我)|(?<=帮我)|(?<=申请)|(?<=怎么)|(?<=如何)|"
    r"(?<=不给)|(?<=不让)|(?<=拒绝))退(?![出订休役步缩])|"
    r"退(?:了吧|吗|一下)|换(?:成|一个|个|一台|一件|一双)?(?:新的|好的)|"
    r"换(?:大|小)一?码|换(?:个|一个)?(?:尺码|码数|颜色)"
)
REQUEST = re.compile(f"{_EN}|{_ZH}", re.IGNORECASE)

_THANKS = (
    r"(?=(?:(?!\bbut\b)[^.?!]){0,30}(?:[.?!] *)?"
    r"(?:thanks|thank you|thx|thnx|ty|cheers)\b(?! for nothing))"
)
# "refund policy" and the like, asked about in general, and parcels sent back by the
# courier: masked before REQUEST is searched, so that only a request elsewhere counts
NOT_A_REQUEST = re.compile(
    r"\b(?:refund|return|exchange)s? (?:policy|policies|rules?|terms|window|period)\b|"
    r"(?:退款|退货|退换货|换货|售后)(?:政策|规则|条款)|"
    # a parcel the courier takes back is a shipping matter
    r"\breturn(?:ed|ing)? to (?:the )?sender\b|\b(?:how )?do (?:refunds|returns) work\b|"
    r"(?:被|要|已|已经)?退回(?:到)?(?:仓库|发件人|寄件人|原地址)|"
    # a refund that arrived, with thanks: the ticket is about something else
    rf"\b(?:got|received|have) (?:my|the) refund\b{_THANKS}|"
    rf"(?:\brefund|退款) (?:came through|arrived|went through|has arrived)\b{_THANKS}|"
    # a pre-sale question: "支持七天无理由吗"
    r"(?:支持|有没有|是不是|是否)(?:七|7)天无理由(?:退货|退换)?|"
    r"退款(?:已经)?(?:收到|到账)了?(?=[，,!！。 ]*(?:谢谢|感谢|多谢))",
    re.IGNORECASE,
)

# where a clause starts: what precedes a word there is not about it
_CLAUSE = re.compile(r"[.;!?，。；！？、\n]|,(?!\d)|\b(?:but|just|only)\b|但|只")
# English: a negated desire, then at most three words, right before the word
_NEG_EN = re.compile(
    r"(?:(?<!\bcan )(?<!\bcould )\bnot|\b(?:do|does|did|am|is|are|was|were)n[’']?t|"
    r"\bnever|\bno longer)\s+"
    r"(?:want|wanting|need|needing|ask|asking|looking|request|requesting|seeking|"
    r"interested|planning|plan|trying|going|intend|intending|after)\b"
    r"(?:\W+\w+){0,3}\W*$|"
    r"\bno need (?:for|to)\b(?:\W+\w+){0,3}\W*$|"
    r"(?:\bnot|n[’']t) (?:a|an|about|for|after)(?: a| an| my| any)?\s*$|"
    r"\b(?:instead of|rather than)(?: a| an| my)?\s*$",
    re.IGNORECASE,
)
# Chinese: a negated desire, then at most three characters (no 了: "不想要了" is a wish to
# be rid of the thing, which is a return), right before the word
_NEG_ZH = re.compile(
    r"(?:不要|不想|不用|不需要|不打算|没打算|不是要|不是想|无需|不必|没想|不考虑|不申请)"
    r"[^了]{0,3}$|不是\s?$"
)
# what the customer would do ("I'm not returning it", "won't be sending them back"): a bare
# negation right before such a verb negates it; a refund not received is still asked for
_DOING = re.compile(r"(?:return|send|ship|mail|bring|take|post|exchange|swap)(?!ed\b)", re.I)
_NEG_BARE = re.compile(
    r"(?:\bnot|n[’']t|\bnever|\bno longer)(?: be| going to| planning to| trying to)?\s*$", re.I
)


def _negated(prefix: str, word: str) -> bool:
    """Whether the clause that ends at `word` says the customer does not want it."""
    clause = _CLAUSE.split(prefix)[-1]
    if _DOING.match(word) and _NEG_BARE.search(clause):
        return True
    return bool(_NEG_EN.search(clause) or _NEG_ZH.search(clause))


@lru_cache(maxsize=32)  # the same ticket twice in a row: a few entries suffice
def _scan(text: str) -> tuple[str, tuple[tuple[str, bool], ...]]:
    """The normalised text, and its request words with whether each is negated: cached, as
    refund_intent asks both `asks_for_refund` and `rules_out_refund` of the same text."""
    text = normalise(text)
    masked = NOT_A_REQUEST.sub(lambda m: " " * len(m[0]), text)
    found = tuple((m[0], _negated(masked[: m.start()], m[0])) for m in REQUEST.finditer(masked))
    return text, found


def refund_words(text: str) -> list[str]:
    """The refund, return or exchange words of `text` that ask for one (not negated)."""
    return [word for word, negated in _scan(text)[1] if not negated]


def asks_for_refund(text: str) -> bool:
    return bool(refund_words(text))


# "不退不换": both declined at once, a set phrase the negation rules do not see
_DECLINED_BOTH = re.compile(r"不退(?:也)?不换")
# asked before buying: nothing to send back yet
_PRESALE = re.compile(
    r"\b(?:thinking of|planning to|before I|about to) (?:buy|order|purchase)|"
    r"\bbefore (?:buying|ordering|purchasing)\b|(?:买|下单|购买)之前|打算买|准备买",
    re.IGNORECASE,
)
# a fault reported: a customer who declines a refund of a broken thing wants another remedy
_FAULT = re.compile(
    r"\b(?:broken|broke|faulty|defective|damaged|cracked|dead|leaks?|leaking|overheats?|"
    r"overheating|sparks?|smoke|smoking)\b|"
    r"\b(?:doesn[’']?t|does not|won[’']?t|stopped|isn[’']?t) (?:work|working|turn on|charge)|"
    r"坏了|坏的|故障|质量问题|不能用|用不了|碎了|漏水|有毛病|冒烟|发烫",
    re.IGNORECASE,
)


def rules_out_refund(text: str) -> bool:
    """Whether the customer rules a refund, return or exchange out and reports no fault:
    every request word is negated ("I'm not asking for a refund, I need the invoice"),
    "不退不换", or nothing is bought yet ("thinking of buying one")."""
    text, found = _scan(text)
    if any(not negated for _, negated in found) or _FAULT.search(text):
        return False
    return bool(found) or bool(_DECLINED_BOTH.search(text) or _PRESALE.search(text))
