"""Whether a ticket's words ask for a refund, a return or an exchange: the word half of the
`refund_intent` rule (the model's after_sales probability is the other half).

A word counts unless the customer says they do not want it ("I do NOT want a refund",
"不想退货"): a negated desire, in the same clause, a few words before it. Complaints about
a refund keep it ("still no refund", "商家不给退款"): only wanting is negated, not getting.
Questions about a policy in general ("what is your refund policy?") are no request.
"""

from __future__ import annotations

import re

# Refund, return and exchange words. "return" alone is too broad ("the API returns 500",
# "the return key"), so it must be about sending something back; 退 alone is too ("退出登录",
# "退订"), so it must be the verb of a refund or return.
_NOT_GOODS = r"(?!invoice|receipt|bill|email|form|document|contract|link|code|message)"
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
    rf"\b(?:send|ship|mail|bring|take|post) (?:it|this|that|them|these|those|the {_NOT_GOODS}\w+) "
    r"back\b|\b(?:send|ship|mail|bring|post)(?:ing)? (?:it )?back\b|"
    r"\b(?:exchange|swap) (?:it|this|that|them|these|the|an?|for)\b|"
    r"\b(?:exchange|swap) my (?!(?:\w+ )?(?:points|miles|coupons?|vouchers?|currency))|"
    r"\breplacement (?:unit|item|one)\b|\b(?:send|give) me a (?:new|replacement) one\b|"
    r"(?:(?<=want )|(?<=need )|(?<=like )|(?<=get )|(?<=request ))(?:a )?replacement\b|"
    r"\b(?:a|the) replacement\b(?! (?:card|code|password|link|key))|"
    r"\b(?:get|have) (?:it |this |them |these )?(?:replaced|exchanged|swapped|refunded)\b|"
    r"\b(?:exchanged|swapped|replaced) (?:for|with) (?:a|an|one|another|the)\b|"
    r"(?:(?<=要)|(?<=要个)|(?<=要个 )|(?<=想换)|(?<=想换 ))(?:replacement|exchange|new one)\b|"
    r"\breplace (?:it|this|that|them|these|the \w+)\b|"
    r"\b(?:just|only) (?:a |an |the )?(?:replacement|exchange|new one)\b"
)
_ZH = (
    r"退款|退货|退钱|退费|(?<!被)退回|退掉|退换|换货|换新|调换|退给我|原路(?:退回|返回)|"
    r"钱(?:还|退|返)(?:给)?我|把钱(?:还|退|返)|钱(?:要|拿)回来|返还货款|"
    r"钱[^，。,.!?！？]{0,6}(?:还给我|还我|退给我|打回|返还|返回|回来|拿回)|"
    r"(?:(?<=想)|(?<=要)|(?<=想 )|(?<=要 ))return\b|"
    r"(?:要|还)回?我的钱|还我钱|(?<!被)寄回|寄还|(?:申请|走|办)了?售后|赔偿|赔钱|补偿|"
    r"换(?:一个|个)?(?:能用|正常)的|"
    r"(?:申请|走|办)了?(?:七|7)天无理由|"
    # lookbehinds, so that a negation before the verb stays before the match
    r"(?:(?<=能)|(?<=可以)|(?<=要)|(?<=想)|(?<=给我)|(?<=帮我)|(?<=申请)|(?<=怎么)|(?<=如何)|"
    r"(?<=不给)|(?<=不让)|(?<=拒绝))退(?![出订休役步缩])|"
    r"退(?:了吧|吗|一下)|换(?:一个|个|一台|一件|一双)?(?:新的|好的)|"
    r"换(?:大|小)一?码|换(?:个|一个)?(?:尺码|码数|颜色)"
)
REQUEST = re.compile(f"{_EN}|{_ZH}", re.IGNORECASE)

# "refund policy" and the like, asked about in general, and parcels sent back by the
# courier: masked before REQUEST is searched, so that only a request elsewhere counts
NOT_A_REQUEST = re.compile(
    r"\b(?:refund|return|exchange)s? (?:policy|policies|rules?|terms|window|period)\b|"
    r"(?:退款|退货|退换货|换货|售后)(?:政策|规则|条款)|"
    # a parcel the courier takes back is a shipping matter
    r"\breturn(?:ed|ing)? to (?:the )?sender\b|\b(?:how )?do (?:refunds|returns) work\b|"
    r"(?:被|要|已|已经)?退回(?:到)?(?:仓库|发件人|寄件人|原地址)",
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


def refund_words(text: str) -> list[str]:
    """The refund, return or exchange words of `text` that ask for one (not negated)."""
    masked = NOT_A_REQUEST.sub(lambda m: " " * len(m[0]), text)
    return [m[0] for m in REQUEST.finditer(masked) if not _negated(masked[: m.start()], m[0])]


def asks_for_refund(text: str) -> bool:
    return bool(refund_words(text))
