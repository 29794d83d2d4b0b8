"""`replay_count`: a missing header is 0, a well-formed count its value, anything else None."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streams.headers import REPLAY_COUNT_DIGITS, replay_count


def test_a_missing_header_means_no_replays_yet() -> None:
    assert replay_count(None) == 0


@pytest.mark.parametrize("value", ["0", "1", "3", "007", "999999", b"2", b"10"])
def test_a_well_formed_count_is_its_value(value: str | bytes) -> None:
    text = value.decode() if isinstance(value, bytes) else value
    assert replay_count(value) == int(text)


@pytest.mark.parametrize(
    "value",
    [
        "-1",
        b"-3",
        "",
        b"",
        " 1",
        "1 ",
        "+1",
        "1.0",
        "1e3",
        "0x10",
        "one",
        "1_000",
        "9" * (REPLAY_COUNT_DIGITS + 1),
        "١",  # an Arabic-Indic one: a digit to str.isdigit, not to us
        "²",
        b"\xff\xfe",
        "1\x00",
    ],
)
def test_anything_else_is_forged(value: str | bytes) -> None:
    assert replay_count(value) is None


@given(st.integers(min_value=0, max_value=10**REPLAY_COUNT_DIGITS - 1))
def test_every_count_in_range_reads_back_as_str_and_bytes(n: int) -> None:
    assert replay_count(str(n)) == n
    assert replay_count(str(n).encode()) == n


@given(st.one_of(st.text(max_size=12), st.binary(max_size=12)))
def test_any_value_is_a_non_negative_count_or_none(value: str | bytes) -> None:
    count = replay_count(value)
    raw = value if isinstance(value, bytes) else value.encode("utf-8")
    well_formed = 0 < len(raw) <= REPLAY_COUNT_DIGITS and all(0x30 <= b <= 0x39 for b in raw)
    assert count == (int(raw) if well_formed else None)
