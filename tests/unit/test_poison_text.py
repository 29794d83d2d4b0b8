"""Issue 11: normalising an accepted ticket's text never makes it invalid.

NFKC lengthens some characters many times (U+FDFA to 18 characters, U+FDFB to 8, squared
Katakana, parenthesised numbers, ligatures): a short ticket must not come out of the
cleaner, or the gateway's own normalisation, longer than any later step takes.
"""

from __future__ import annotations

import asyncio
import unicodedata
from datetime import datetime, timezone

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from agents.steps.clean import clean_text
from agents.steps.handlers import predict_input, text_cleaner
from inference_gateway.cache import normalize_text
from schemas.gateway import PredictInput
from schemas.tickets import MAX_TEXT_CHARS, Envelope, Ticket

NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)
EXPANDERS = ["\ufdfa", "\ufdfb", "\u3300", "\u2474", "\ufb03", "\u33fe", "\U0001f16a", "\u00bd"]
PROPERTY = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# every category but lone surrogates (which no JSON parser lets through to a ticket)
any_text = st.text(st.characters(exclude_categories=["Cs"]), min_size=1, max_size=400)
bombs = st.builds(
    lambda ch, n, tail: (ch * n + tail)[:MAX_TEXT_CHARS],
    st.sampled_from(EXPANDERS),
    st.integers(min_value=1, max_value=MAX_TEXT_CHARS),
    st.text(max_size=50),
)
mixed = st.lists(
    st.sampled_from([*EXPANDERS, " ", "<b>", "&amp;", "\u200b", "\x07", "a"]) | any_text,
    min_size=1,
    max_size=60,
).map(lambda parts: "".join(parts)[:MAX_TEXT_CHARS])
ticket_texts = (any_text | bombs | mixed).filter(lambda t: len(t) >= 1)


def test_the_expanders_really_expand():
    assert len(unicodedata.normalize("NFKC", "\ufdfa")) == 18
    assert len(unicodedata.normalize("NFKC", "\ufdfa" * 2000)) > MAX_TEXT_CHARS


@PROPERTY
@given(ticket_texts)
@example("\ufdfa" * MAX_TEXT_CHARS)
@example("\ufdfa" * 1112)  # 20,016 characters once normalised
@example("<b></b>")
@example(" \u200b ")
def test_an_accepted_tickets_cleaned_text_is_an_accepted_text(text):
    ticket = Ticket(ticket_id="t", text=text, created_at=NOW)  # accepted
    cleaned = clean_text(ticket.text)
    assert len(cleaned) <= MAX_TEXT_CHARS
    if cleaned:
        Ticket(ticket_id="t", text=cleaned, created_at=NOW)


@PROPERTY
@given(ticket_texts)
@example("\ufdfa" * 1112)
@example("<p>&nbsp;</p>")
def test_an_accepted_ticket_always_makes_a_valid_gateway_input(text):
    env = Envelope(
        ticket=Ticket(ticket_id="t", text=text, created_at=NOW),
        workflow="w",
        workflow_version=1,
        step="clean",
        trace_id="a" * 32,
        arrival="0:1",
        started_at=NOW,
    )
    asyncio.run(text_cleaner(env))
    item = predict_input(env)  # BadRecord here would dead-letter an accepted ticket
    assert 1 <= len(item.text) <= MAX_TEXT_CHARS


@PROPERTY
@given(ticket_texts)
@example("\ufdfa" * MAX_TEXT_CHARS)
def test_the_gateway_normalises_an_accepted_input_within_the_limit(text):
    item = PredictInput(id="i", text=text)
    assert len(normalize_text(item.text)) <= MAX_TEXT_CHARS


@pytest.mark.parametrize("normalise", [clean_text, normalize_text])
def test_a_bomb_keeps_its_first_characters(normalise):
    out = normalise("refund " + "\ufdfa" * 5000)
    assert out.startswith("refund ") and len(out) == MAX_TEXT_CHARS


@pytest.mark.parametrize("normalise", [clean_text, normalize_text])
def test_text_within_the_limit_is_not_cut(normalise):
    text = "x" * (MAX_TEXT_CHARS - 1) + "\ufb03"  # the ligature ends at 20,002
    assert normalise(text[:-1]) == text[:-1]
    assert len(normalise(text)) == MAX_TEXT_CHARS
