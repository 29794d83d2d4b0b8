"""Slot values of the synthetic ticket corpus and the English/Chinese terms of code-switching."""

from __future__ import annotations

import random
import re
import string
from collections.abc import Callable

# (English, Chinese) pairs; a slot picks the side of the ticket's language, or either when mixed.
PRODUCTS = [
    ("wireless earbuds", "无线耳机"),
    ("smart watch", "智能手表"),
    ("laptop", "笔记本电脑"),
    ("phone case", "手机壳"),
    ("coffee maker", "咖啡机"),
    ("running shoes", "跑鞋"),
    ("air purifier", "空气净化器"),
    ("desk lamp", "台灯"),
    ("backpack", "双肩包"),
    ("mechanical keyboard", "机械键盘"),
    ("robot vacuum", "扫地机器人"),
    ("rice cooker", "电饭煲"),
    ("tablet", "平板电脑"),
    ("winter jacket", "羽绒服"),
    ("electric toothbrush", "电动牙刷"),
    ("bluetooth speaker", "蓝牙音箱"),
    ("monitor", "显示器"),
    ("router", "路由器"),
    ("blender", "破壁机"),
    ("yoga mat", "瑜伽垫"),
    ("hair dryer", "吹风机"),
    ("gaming mouse", "游戏鼠标"),
    ("power bank", "充电宝"),
    ("camera", "相机"),
    ("dress", "连衣裙"),
    ("sofa cover", "沙发套"),
    ("thermos", "保温杯"),
    ("e-reader", "电子书阅读器"),
    ("printer", "打印机"),
    ("headphones", "头戴式耳机"),
    ("TF Pro X2", "TF Pro X2"),
    ("Nova 5 phone", "Nova 5 手机"),
    ("smart bulb", "智能灯泡"),
    ("kids bike", "儿童自行车"),
]
PAYMENTS = [
    ("Visa card", "信用卡"),
    ("Mastercard", "银行卡"),
    ("PayPal", "PayPal"),
    ("Apple Pay", "Apple Pay"),
    ("debit card", "借记卡"),
    ("Alipay", "支付宝"),
    ("WeChat Pay", "微信支付"),
    ("gift card", "礼品卡"),
    ("Amex", "花呗"),
    ("bank transfer", "银行转账"),
]
CITIES = [
    ("London", "伦敦"),
    ("Berlin", "柏林"),
    ("Toronto", "多伦多"),
    ("Sydney", "悉尼"),
    ("Singapore", "新加坡"),
    ("New York", "纽约"),
    ("Shanghai", "上海"),
    ("Shenzhen", "深圳"),
    ("Beijing", "北京"),
    ("Guangzhou", "广州"),
    ("Hangzhou", "杭州"),
    ("Chengdu", "成都"),
    ("Wuhan", "武汉"),
    ("Nanjing", "南京"),
    ("Hong Kong", "香港"),
    ("Manchester", "曼彻斯特"),
]
COUNTRIES = [
    ("Canada", "加拿大"),
    ("Japan", "日本"),
    ("Brazil", "巴西"),
    ("Australia", "澳大利亚"),
    ("Germany", "德国"),
    ("Malaysia", "马来西亚"),
    ("the US", "美国"),
    ("France", "法国"),
    ("South Korea", "韩国"),
    ("Mexico", "墨西哥"),
]
COURIERS = [
    ("DHL", "DHL"),
    ("UPS", "UPS"),
    ("FedEx", "联邦快递"),
    ("USPS", "EMS"),
    ("Royal Mail", "邮政"),
    ("SF Express", "顺丰"),
    ("ZTO", "中通"),
    ("YTO", "圆通"),
    ("JD Logistics", "京东物流"),
    ("Yunda", "韵达"),
]
DEVICES = [
    ("iPhone 13", "苹果手机"),
    ("Android phone", "安卓手机"),
    ("Samsung Galaxy", "三星手机"),
    ("iPad", "iPad"),
    ("Huawei phone", "华为手机"),
    ("Windows laptop", "笔记本"),
    ("MacBook", "MacBook"),
    ("Pixel 8", "小米手机"),
]
OSES = [
    ("Windows 11", "Windows 11"),
    ("Windows 10", "Win10"),
    ("macOS", "Mac系统"),
    ("Ubuntu", "Linux"),
    ("iOS 17", "iOS"),
    ("Android 14", "安卓14"),
    ("HarmonyOS", "鸿蒙系统"),
]
BROWSERS = [
    ("Chrome", "Chrome"),
    ("Safari", "Safari"),
    ("Firefox", "火狐浏览器"),
    ("Edge", "Edge"),
    ("the WeChat browser", "微信内置浏览器"),
    ("Opera", "360浏览器"),
]
DATES_EN = [
    "yesterday",
    "last week",
    "three days ago",
    "last Friday",
    "this morning",
    "two weeks ago",
    "last month",
    "on Monday",
    "over the weekend",
    "a few days ago",
]
DATES_ZH = [
    "昨天",
    "上周",
    "三天前",
    "上周五",
    "今天早上",
    "两周前",
    "上个月",
    "周一",
    "前天",
    "前几天",
]
MONTHS = ["Jan", "Feb", "March", "April", "May", "June", "July", "Aug", "Sept", "Oct", "Nov", "Dec"]
NAMES = [
    "Anna",
    "Tom",
    "Li Wei",
    "Maria",
    "David",
    "Chen Jing",
    "Sam",
    "Priya",
    "Zhang Min",
    "Lucas",
    "Emma",
    "Wang Fang",
    "Omar",
    "Sofia",
    "Liu Yang",
    "James",
    "小王",
    "阿杰",
    "Kevin",
    "Mei",
]
DOMAINS = ["gmail.com", "qq.com", "163.com", "outlook.com", "yahoo.com", "company.cn", "icloud.com"]
PROMOS = ["SAVE20", "WELCOME10", "SPRING15", "VIP50", "FREESHIP", "NEWYEAR", "BF2024", "SUMMER5"]

# Terms a code-switching customer swaps: (English, Chinese).
TERMS = [
    ("refund", "退款"),
    ("return", "退货"),
    ("invoice", "发票"),
    ("order", "订单"),
    ("account", "账号"),
    ("password", "密码"),
    ("package", "包裹"),
    ("tracking number", "快递单号"),
    ("delivery", "配送"),
    ("app", "软件"),
    ("error", "报错"),
    ("charge", "扣费"),
    ("payment", "付款"),
    ("login", "登录"),
    ("verification code", "验证码"),
    ("exchange", "换货"),
    ("warranty", "保修"),
    ("shipping", "运费"),
    ("subscription", "订阅"),
    ("customer service", "客服"),
    ("discount", "优惠"),
    ("bill", "账单"),
    ("update", "更新"),
    ("courier", "快递"),
    ("crash", "闪退"),
    ("money back", "退钱"),
    ("email", "邮箱"),
    ("bug", "bug"),
]


def _pair(rng: random.Random, pairs: list[tuple[str, str]], lang: str) -> str:
    en, zh = rng.choice(pairs)
    if lang == "mixed":
        return rng.choice((en, zh))
    return zh if lang == "zh" else en


def _digits(rng: random.Random, k: int) -> str:
    return "".join(rng.choice(string.digits) for _ in range(k))


def _order(rng: random.Random, lang: str) -> str:
    forms = [
        lambda: "#" + _digits(rng, 5),
        lambda: f"TF-{_digits(rng, 6)}",
        lambda: f"{rng.randint(2023, 2025)}{_digits(rng, 8)}",
        lambda: rng.choice(string.ascii_uppercase) + _digits(rng, 7),
        lambda: _digits(rng, 10),
    ]
    return rng.choice(forms)()


def _amount(rng: random.Random, lang: str) -> str:
    value = rng.choice([rng.randint(5, 300), rng.randint(5, 2000) + 0.99, rng.randint(1, 99) * 10])
    if lang == "zh" or (lang == "mixed" and rng.random() < 0.5):
        fmt = rng.choice(["{}元", "¥{}", "{}块", "RMB {}", "{} 元"])
    else:
        fmt = rng.choice(["${}", "{} USD", "€{}", "£{}", "{} dollars", "${} "])
    return fmt.format(value).strip()


def _date(rng: random.Random, lang: str) -> str:
    zh = lang == "zh" or (lang == "mixed" and rng.random() < 0.5)
    if rng.random() < 0.4:
        m, d = rng.randint(1, 12), rng.randint(1, 28)
        return f"{m}月{d}日" if zh else rng.choice([f"{MONTHS[m - 1]} {d}", f"{d}/{m}"])
    return rng.choice(DATES_ZH if zh else DATES_EN)


def _error(rng: random.Random, lang: str) -> str:
    forms = [
        lambda: f"E{rng.randint(100, 999)}",
        lambda: f"ERR_{rng.choice(['TIMEOUT', 'AUTH', 'NETWORK', 'UNKNOWN', 'SSL'])}",
        lambda: rng.choice(["500", "403 Forbidden", "502 Bad Gateway", "404"]),
        lambda: "0x8007" + _digits(rng, 4),
        lambda: f"code {rng.randint(1, 99)}",
    ]
    return rng.choice(forms)()


def _user(rng: random.Random, lang: str) -> str:
    base = rng.choice(NAMES).lower().replace(" ", rng.choice(["", "_", "."]))
    if not base.isascii():
        base = rng.choice(["xiaowang", "ajie", "user"])
    return base + _digits(rng, rng.randint(0, 4))


def _email(rng: random.Random, lang: str) -> str:
    return f"{_user(rng, lang)}@{rng.choice(DOMAINS)}"


def _tracking(rng: random.Random, lang: str) -> str:
    prefix = rng.choice(["1Z", "SF", "JD", "YT", "LX", "RR", "ZTO"])
    return prefix + _digits(rng, rng.randint(9, 13))


def _model_code(rng: random.Random, lang: str) -> str:
    """A product's model code ("TX-200", "KT90"): no category of its own (issue 24)."""
    letters = "".join(rng.choice(string.ascii_uppercase) for _ in range(rng.randint(1, 3)))
    return letters + rng.choice(["-", "", " "]) + str(rng.randint(2, 9999))


FILLERS: dict[str, Callable[[random.Random, str], str]] = {
    "order": _order,
    "amount": _amount,
    "date": _date,
    "error": _error,
    "user": _user,
    "email": _email,
    "tracking": _tracking,
    "product": lambda rng, lang: _pair(rng, PRODUCTS, lang),
    "payment": lambda rng, lang: _pair(rng, PAYMENTS, lang),
    "city": lambda rng, lang: _pair(rng, CITIES, lang),
    "country": lambda rng, lang: _pair(rng, COUNTRIES, lang),
    "courier": lambda rng, lang: _pair(rng, COURIERS, lang),
    "device": lambda rng, lang: _pair(rng, DEVICES, lang),
    "os": lambda rng, lang: _pair(rng, OSES, lang),
    "browser": lambda rng, lang: _pair(rng, BROWSERS, lang),
    "name": lambda rng, lang: rng.choice(
        NAMES if lang != "en" else [n for n in NAMES if n.isascii()]
    ),
    "promo": lambda rng, lang: rng.choice(PROMOS),
    "n": lambda rng, lang: str(rng.randint(1, 30)),
    "txn": lambda rng, lang: "TXN" + _digits(rng, 10),
    "rma": lambda rng, lang: "RMA-" + _digits(rng, 6),
    "model": _model_code,
}

_SLOT = re.compile(r"\{(\w+)\}")


def fill(template: str, rng: random.Random, lang: str) -> str:
    """Replace every `{slot}` with a fresh value; each occurrence draws its own."""
    return _SLOT.sub(lambda m: FILLERS[m.group(1)](rng, lang), template)
