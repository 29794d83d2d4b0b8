"""Hard negatives of after_sales: tickets of the other categories that mention money, orders,
returns policy, delays, warranty, manuals, receipts or a product, and ask for no money back.

Issue 24: the corpus tied product mentions and refund-adjacent words to after_sales (v1 gave
"model TX-200" alone 0.63 for after_sales), so both the category model and the refund-intent
head learn from these too. `corpus.ticket` draws a ticket's problem from here with
`P_HARD`; the fragments are written for the task, not copied from any test fixture.
"""

from __future__ import annotations

# share of the tickets of a category (other than after_sales) whose problem comes from here
P_HARD = 0.22

EN: dict[str, list[str]] = {
    "general": [
        "Where can I download the manual for the {model}?",
        "{model}",
        "{product}",
        "model {model}",
        "{product} {model}",
        "Is the {model} the same as the {product} in your shop?",
        "How long is the warranty on the {product}?",
        "Does the warranty on the {model} cover accidental damage? Just asking.",
        "What is your returns policy for opened items? I haven't bought anything yet.",
        "Do you accept returns on sale items? Asking before I order a {product}.",
        "I'm not asking for a refund, I only want to know when the {product} is back in stock.",
        "I don't want to return it, how do I clean the {product}?",
        "The {product} I bought {date} is great, do you sell spare parts for it?",
        "Is there a user guide for the {model} in another language?",
        "What accessories fit the {model}?",
        "The refund you sent arrived, thanks! Is the {product} coming in other colours?",
        "Does the {product} come with a plug for {country}?",
        "Is the {model} still sold or was it replaced by a newer model?",
        "Before I buy: can the {product} be returned if it doesn't fit?",
        "I'm not returning anything, does the {model} work with my {device}?",
        "How much is return postage if the {product} doesn't fit? I haven't ordered yet.",
        "Got my refund already, all sorted, thanks! Do you have the {product} in blue?",
        "No money back needed, I just want to know if the {product} has a warranty card.",
    ],
    "billing": [
        "Please send me the receipts for all my orders from last year, for my taxes.",
        "I need an invoice for order {order} with my company name.",
        "No refund needed, I just need a VAT invoice for the {product}.",
        "I'm not after my money back, please correct the address on invoice {order}.",
        "Order {order} isn't paid yet, can I cancel it before paying?",
        "I haven't paid for order {order}, can I switch the payment to {payment}?",
        "Can I get a receipt for the {amount} I paid for the {product}?",
        "The receipt for the {model} is missing the tax line.",
        "Checkout failed so order {order} is unpaid, should I just cancel it?",
        "How much will the {product} cost with tax in {amount} instalments?",
        "Please resend the invoice for the {product}, I lost the email.",
        "Can I pay the rest of the {product} by {payment}?",
        "Can I exchange my loyalty points for a voucher?",
        "I'm not after a refund, I just need a receipt for order {order}.",
        "Don't want my money back, just reissue the invoice with my full name.",
        "Not looking for a refund here, what is the {amount} charge from {date}?",
        "No refund please, I only need the payment confirmation for order {order}.",
        "I see two charges of {amount}, is one of them just a hold?",
    ],
    "shipping": [
        "My {product} is late, can you expedite the delivery? I still want it.",
        "The {product} has been in transit for {n} days, any update?",
        "Order {order} is delayed again, where is it?",
        "The courier returned the parcel to the depot, can they deliver it again?",
        "Can I change the delivery address for the {product} before it ships?",
        "When will the {model} ship? I ordered it {date}.",
        "Shipping is so slow, please hurry up the {product}.",
        "The tracking for my {product} hasn't moved since {date}.",
        "I don't want a refund, I just want my {product} delivered.",
        "Not cancelling and not asking for money back, where is my parcel?",
        "No refund, just want my parcel, it's been {n} days.",
        "Please don't refund me, I still want the {product}, when does it arrive?",
    ],
    "technical": [
        "The {model} won't pair with the app after the update.",
        "The app returns error {error} when I open my orders.",
        "Pressing the back button crashes the app.",
        "How do I update the firmware of the {model}?",
        "The {product} app keeps logging me out.",
        "No need to return it, just tell me how to reset the {model}.",
        "I'm keeping the {product}, I only need help setting it up.",
    ],
    "account": [
        "Close my account please, nothing to refund, just delete my data.",
        "How do I unsubscribe from the marketing emails about the {product}?",
        "I want to change the phone number on my account, not return anything.",
        "I lost my 2FA phone, how do I recover access to my account?",
        "Not a refund question: how do I recover my password?",
        "Nothing to return, I just can't log in since {date}.",
    ],
}

ZH: dict[str, list[str]] = {
    "general": [
        "{model} 的说明书在哪里下载？",
        "{model}",
        "{product}",
        "型号 {model}",
        "{product} {model}",
        "{product}保修多久？",
        "{model} 是全国联保吗？只是问问",
        "你们的退货政策是什么？我还没买",
        "定制的{product}支持七天无理由吗？还没下单",
        "不是要退款，就想问{product}什么时候补货",
        "我不想退货，想问一下{product}怎么清洗",
        "{date}买的{product}很好用，有配件卖吗？",
        "{model} 有中文说明书吗",
        "上次的退款已经收到了，谢谢，想问还有别的颜色吗",
        "{model} 和{product}有什么区别？",
        "买之前问一下，{product}不合适能退吗？",
        "不退货，就问一下{model}能不能配我的{device}",
        "还没下单，{product}不合适的话退货运费谁出？",
        "退款已经收到了，没问题了，谢谢",
        "不用退钱，就想问{product}有没有保修卡",
    ],
    "billing": [
        "去年的购物发票能补开吗？报销要用",
        "订单 {order} 的发票抬头要改成公司名",
        "不用退款，开张发票就行",
        "订单 {order} 还没付款，可以取消吗？",
        "还没付款，能换成{payment}支付吗？",
        "{product}的收据能发我一份吗",
        "电子发票少了税号，麻烦重开",
        "付款失败了订单没付，直接取消重新下单可以吗",
        "积分可以换优惠券吗？",
        "不是要退款，就要订单 {order} 的收据",
        "钱不用退，发票重新开一下，写全名",
        "不退款，就想问{date}那笔{amount}是什么扣费",
        "扣了两笔{amount}，其中一笔是不是预授权？",
    ],
    "shipping": [
        "物流太慢了，{product}能不能加急",
        "{product}运输中{n}天了，帮我催一下",
        "订单 {order} 又延误了，到底什么时候到",
        "包裹被退回快递站了，能重新派送吗",
        "{product}还没发货，能改地址吗",
        "快递{date}以后就没更新了，帮我查查",
        "不要退款，我就想要我的{product}赶紧送到",
        "不取消也不退钱，包裹到底在哪",
        "不用退，东西我还要，什么时候到？",
    ],
    "technical": [
        "{model} 更新后连不上APP",
        "APP 打开订单页面报错 {error}",
        "按返回键就闪退",
        "{model} 的固件怎么升级？",
        "不退货，就想知道{model}怎么恢复出厂设置",
    ],
    "account": [
        "注销账号，没有要退的，直接删除数据",
        "怎么退订营销短信",
        "想换绑手机号，不是退货",
        "换手机了收不到两步验证码，账号怎么恢复？",
        "没有要退的，就是{date}以后登录不上了",
    ],
}

# after_sales with the same product names and model codes, colloquial and misspelt, so that
# a product or a model code alone carries no class
EN["after_sales"] = [
    "my {model} died after a week, i want my money back",
    "the {model} is faulty, pls refund",
    "wanna send the {product} back, it's not what i ordered",
    "can u swap the {model} for a working one",
    "{product} {model} broken on arrival, refund please",
    "i want to retrun the {product}, it leaks",
    "not keeping the {model}, how do I return it?",
    "the {product} stopped working, I'd like a replacment",
]
ZH["after_sales"] = [
    "{model} 用了一周就坏了，退钱",
    "{product}{model} 到手就是坏的，申请退款",
    "{product}不想要了，怎么退",
    "{model} 有质量问题，换个新的",
    "{product}和描述不一样，退了吧",
    "买的{model}开不了机，要求换货",
]

BANKS = {"en": EN, "zh": ZH}
