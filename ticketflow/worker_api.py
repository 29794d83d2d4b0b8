"""A ticket's state from the workers' web view (`/ticket/<id>` of the home worker)."""

from __future__ import annotations

import urllib.error
import urllib.request
from urllib.parse import quote

import orjson

from streams.settings import Settings


def ticket_url(settings: Settings, ticket_id: str) -> str:
    return f"http://127.0.0.1:{settings.worker_web_port}/ticket/{quote(ticket_id, safe='')}"


def ticket_state(settings: Settings, ticket_id: str) -> dict | None:
    """The ticket's state from the worker that owns it; None for an unknown ticket."""
    try:
        with urllib.request.urlopen(ticket_url(settings, ticket_id), timeout=5) as resp:
            return orjson.loads(resp.read())
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return None
        raise
