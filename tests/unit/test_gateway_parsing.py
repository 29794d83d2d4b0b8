"""The gateway's request parsing and text normalisation: bounded work, same answers.

`parse_predict_sliced` (large bodies, in pieces) must accept and refuse exactly what
`parse_predict` (one pydantic call) does, and `normalize_text` in slices must equal NFKC of
the whole text; neither may repeat the caller's input in an error.
"""

from __future__ import annotations

import json
import random
import time
import unicodedata

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inference_gateway import cache
from inference_gateway.cache import normalize_text
from inference_gateway.config import (
    MAX_INPUTS,
    MAX_TEXT_CHARS,
    GatewayConfig,
    largest_legal_body,
)
from inference_gateway.errors import GatewayError
from inference_gateway.parsing import parse_predict, parse_predict_sliced

SECRET_TEXT = "my-card-4111111111111111"


def outcome(parse, body: bytes):
    try:
        return ("ok", parse(body).model_dump())
    except GatewayError as error:
        return ("error", error.code.value)


BODIES = [
    {"inputs": [{"id": "a", "text": "hello"}]},
    {"inputs": [{"id": "a", "text": "hello", "features": {"n": 1.5, "x": [1, None]}}]},
    {"inputs": [{"id": "a", "text": "x"}], "version": "v2", "timeout_ms": 300},
    {"inputs": [{"id": "a", "text": "x"}], "timeout_ms": 5.0},
    {"inputs": [{"id": "a", "text": "x"}], "timeout_ms": "7"},
    {"inputs": [{"id": "a", "text": "x"}], "timeout_ms": 0},
    {"inputs": [{"id": "a", "text": "x"}], "timeout_ms": 5.5},
    {"inputs": [{"id": "a", "text": ""}]},
    {"inputs": [{"id": "a"}]},
    {"inputs": [{"id": "a", "text": "x", SECRET_TEXT: 1}]},
    {"inputs": [{"id": "a", "text": "x"}], SECRET_TEXT: 1},
    {"inputs": []},
    {"inputs": "not a list"},
    {"inputs": None},
    {},
    {"version": 3},
    [],
    "text",
    {"inputs": [{"id": "a", "text": "x"}] * (MAX_INPUTS + 1)},
    {"inputs": [{"id": "a", "text": "x" * (MAX_TEXT_CHARS + 1)}]},
    {"inputs": [1, "two", None]},
]


@pytest.mark.parametrize("payload", BODIES)
def test_the_sliced_parser_agrees_with_pydantic(payload: object) -> None:
    for body in (orjson.dumps(payload), json.dumps(payload, indent=2).encode()):
        assert outcome(parse_predict_sliced, body) == outcome(parse_predict, body)


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"{",
        b'{"inputs": [{"id": "a", "text": "x"}]',
        b'{"inputs": [{"id": "a", "text": "x"}]} trailing',
        b'{"inputs": [{"id": "a", "text": "x"},]}',
        b'{"inputs": [{"id": "a", "text": "x"}], "timeout_ms": NaN}',
        b'{"inputs": [{"id": "a", "text": "\xff"}]}',
        b'{"inputs" [1]}',
        b"\xef\xbb\xbf{}",
    ],
)
def test_malformed_bodies_are_refused_by_both(body: bytes) -> None:
    assert outcome(parse_predict_sliced, body)[0] == "error"
    assert outcome(parse_predict, body)[0] == "error"


TEXT = st.characters(blacklist_categories=("Cs",))


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.fixed_dictionaries(
            {"id": st.text(TEXT, max_size=3), "text": st.text(TEXT, max_size=8)},
            optional={
                "features": st.dictionaries(st.text(TEXT, max_size=3), st.integers(), max_size=2)
            },
        ),
        max_size=4,
    ),
    st.one_of(st.none(), st.integers(-5, 70_000), st.text(TEXT, max_size=3)),
)
def test_the_sliced_parser_agrees_on_generated_requests(inputs: list, timeout: object) -> None:
    payload = {"inputs": inputs, "timeout_ms": timeout}
    body = json.dumps(payload, ensure_ascii=False).encode()  # integers past 64 bits too
    assert outcome(parse_predict_sliced, body) == outcome(parse_predict, body)


def test_errors_name_fields_never_the_input() -> None:
    payloads = [
        {"inputs": [{"id": "a", "text": "x", SECRET_TEXT: 1}]},
        {"inputs": [{"id": "a", "text": "x"}], SECRET_TEXT: 1},
        {"inputs": [{"id": "a", "text": 1}], "version": 7, "timeout_ms": SECRET_TEXT},
        {"inputs": [{"id": SECRET_TEXT * 10, "text": "x"}]},
    ]
    for payload in payloads:
        for parse in (parse_predict, parse_predict_sliced):
            with pytest.raises(GatewayError) as caught:
                parse(orjson.dumps(payload))
            assert SECRET_TEXT not in caught.value.message
            assert "<unknown field>" in caught.value.message or "inputs" in caught.value.message


def reference(text: str, limit: int = MAX_TEXT_CHARS) -> str:
    text = cache._tables()[0].sub(r"\1", text)
    text = " ".join(unicodedata.normalize("NFKC", text).split())
    return text if len(text) <= limit else text[:limit].rstrip()


# characters that NFKC reorders, composes, expands or folds, and whitespace
ALPHABET = [
    *"ab \t\n",
    "\u0301", "\u0316", "\u0323", "\u1100", "\u1161", "\u11a8", "\uac00", "\ufdfa", "\uff21",
    "\u3000", "\u0f73", "\u0f71", "\u0f72", "\uff9e", "\u30ab", "\u0b47", "\u0b3e", "\u00e9",
    "\u1e08", "\u2126", "\u00a0", "\u0344", "\U0001d400", "\u0bc6", "\u0bbe", "\u09c7", "退",
]  # fmt: skip


def test_sliced_normalisation_equals_nfkc_of_the_whole_text() -> None:
    rng = random.Random(7)
    for _ in range(400):
        text = "".join(rng.choice(ALPHABET) for _ in range(rng.choice([50, 1500, 5000])))
        limit = rng.choice([MAX_TEXT_CHARS, 700, 3000])
        assert normalize_text(text, limit) == reference(text, limit)


@pytest.mark.parametrize(
    "text",
    [
        "\ufdfa" * MAX_TEXT_CHARS,  # NFKC makes 18 characters of each
        "\u0316\u0301\u0323\u0300" * (MAX_TEXT_CHARS // 4),  # quadratic reordering
        "退款" * (MAX_TEXT_CHARS // 2),
        "a " * (MAX_TEXT_CHARS // 2),
    ],
)
def test_the_worst_texts_normalise_in_a_few_milliseconds(text: str) -> None:
    normalize_text(text)  # the tables are built once, on first use
    started = time.perf_counter()
    normalized = normalize_text(text)
    assert time.perf_counter() - started < 0.05  # ~5 ms on the project's machine
    assert len(normalized) <= MAX_TEXT_CHARS


def test_the_body_limit_is_the_largest_legal_batch() -> None:
    # every input at full length, every character escaped as \uXXXX (json.dumps' default)
    escaped = {"inputs": [{"id": "i" * 128, "text": "退" * MAX_TEXT_CHARS}] * MAX_INPUTS}
    size = len(json.dumps(escaped).encode())
    assert size < largest_legal_body() == GatewayConfig().max_body_bytes
    assert largest_legal_body() < 128 * 1024 * 1024
