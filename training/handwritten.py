"""A small hand-written check set, outside the corpus's templates: 48 tickets, 8 a category
(English, Chinese, mixed), worded freely, with no phrase taken from `phrases_en.py` /
`phrases_zh.py`. The synthetic held-out split measures how well a model learned the corpus;
this measures how it copes with wording the corpus never used (`train.py` reports both).
"""

from __future__ import annotations

TICKETS: list[tuple[str, str]] = [
    # billing
    ("Why does my statement show two identical payments of 49.99 this month?", "billing"),
    ("The VAT on my receipt looks wrong, can someone recalculate it", "billing"),
    ("I cancelled the premium plan but you still took money from my card", "billing"),
    ("please send me a proper tax invoice with my company name on it", "billing"),
    ("这个月的账单金额比平时高了一倍，能帮我核对一下吗", "billing"),
    ("为什么我的信用卡被扣了两次费用？", "billing"),
    ("发票抬头开错了，需要重新开一张", "billing"),
    ("我的 subscription 续费扣款金额不对", "billing"),
    # after_sales
    ("The blender arrived cracked, I'd like to send it back and get my money back", "after_sales"),
    ("How do I exchange these shoes for a bigger size?", "after_sales"),
    ("The headphones stopped working after two weeks, is this covered by warranty", "after_sales"),
    ("I want to return the jacket, it doesn't fit at all", "after_sales"),
    ("收到的杯子有裂缝，我要退货", "after_sales"),
    ("衣服尺码不合适，可以换货吗？", "after_sales"),
    ("买了不到一个月就坏了，保修怎么申请", "after_sales"),
    ("这个 order 我想 return，钱什么时候退回来", "after_sales"),
    # technical
    ("The app freezes on a white screen whenever I open my profile", "technical"),
    ("I get error code 503 every time I try to upload a photo", "technical"),
    ("Your website won't load on Safari, just a spinning wheel", "technical"),
    ("notifications stopped arriving on my android phone after the update", "technical"),
    ("应用一打开就闪退，已经重装过了", "technical"),
    ("网页一直显示加载中，什么都点不了", "technical"),
    ("更新以后蓝牙连接总是断开", "technical"),
    ("app 登录后页面 crash 了，显示 unknown error", "technical"),
    # account
    ("I can't sign in, it keeps saying my password is incorrect", "account"),
    ("How can I change the email address linked to my profile?", "account"),
    ("Someone else may have logged into my account, please lock it", "account"),
    ("I never received the verification code for two-factor login", "account"),
    ("我想注销我的账号，请问怎么操作", "account"),
    ("手机号换了，怎么修改绑定的号码？", "account"),
    ("账户被冻结了，登录不上去", "account"),
    ("我的 account 密码忘了，reset 邮件也没收到", "account"),
    # shipping
    ("My package has said 'in transit' for ten days now, where is it?", "shipping"),
    ("Can you deliver to a different address than the one on my order?", "shipping"),
    ("The courier marked it delivered but there is nothing at my door", "shipping"),
    ("how long does express delivery to Canada usually take", "shipping"),
    ("快递三天没有更新物流信息了", "shipping"),
    ("能不能帮我改一下收货地址？", "shipping"),
    ("显示已签收但我根本没收到包裹", "shipping"),
    ("我的 parcel 什么时候能 deliver 到？", "shipping"),
    # general
    ("What are your customer service opening hours on weekends?", "general"),
    ("Do you have a physical store in Berlin?", "general"),
    ("I just wanted to say the support team was great, thanks!", "general"),
    ("Is there a student discount program I could join?", "general"),
    ("你们周末客服几点上班？", "general"),
    ("请问你们有线下门店吗", "general"),
    ("想提个建议，希望增加夜间模式", "general"),
    ("想问一下你们有没有 membership 的优惠活动", "general"),
]
