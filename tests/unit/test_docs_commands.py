"""Every `ticketflow ...` command that the docs, the runbook and the alerts tell people to run
exists: an on-call engineer who pastes one at 3 a.m. must not meet "No such command"."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import typer

from ticketflow.cli import app

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
    *sorted((ROOT / "deploy" / "alerts").glob("*.yml")),
]
# a command as people paste it: in backticks, at the start of a code line, after a prompt or
# the venv's bin folder (`ticketflow dlq ls`, `.venv/bin/ticketflow review stats`); prose such
# as "ticketflow creates ..." is not one
COMMAND = re.compile(
    r"(?:`|^[ \t]*|\$ |\.venv/bin/)ticketflow((?:[ \t]+[a-z][a-z0-9-]*)+)", re.MULTILINE
)
# a command line to run as written (not a name in prose): it must reach a leaf command
RUNNABLE = re.compile(r"\.venv/bin/ticketflow((?:[ \t]+[a-z][a-z0-9-]*)+)")


def _mentions() -> set[tuple[str, ...]]:
    found: set[tuple[str, ...]] = set()
    for path in SOURCES:
        for match in COMMAND.finditer(path.read_text()):
            found.add(tuple(match.group(1).split()))
    return found


def _runnable() -> set[tuple[str, ...]]:
    return {
        tuple(m.group(1).split()) for path in SOURCES for m in RUNNABLE.finditer(path.read_text())
    }


def _leaf(words: tuple[str, ...]) -> bool:
    """Whether the words reach a command that runs, not a group that only prints its help."""
    command = typer.main.get_command(app)
    for word in words:
        if not hasattr(command, "commands"):
            return True
        command = command.commands.get(word)
        if command is None:
            return False
    return not hasattr(command, "commands")


def _resolves(words: tuple[str, ...]) -> bool:
    """Whether the leading words name a command; trailing words may be arguments."""
    command = typer.main.get_command(app)
    if not words or words[0] not in getattr(command, "commands", {}):
        return False
    for word in words:
        if not hasattr(command, "commands"):
            return True  # the rest are arguments of a leaf command
        sub = command.commands.get(word)
        if sub is None:
            return False
        command = sub
    return True


def test_the_docs_mention_commands() -> None:
    assert len(_mentions()) >= 20  # the scan finds what it is meant to check


@pytest.mark.parametrize("words", sorted(_mentions()), ids=" ".join)
def test_every_mentioned_command_exists(words: tuple[str, ...]) -> None:
    assert _resolves(words), f"`ticketflow {' '.join(words)}` is not a command"


@pytest.mark.parametrize("words", sorted(_runnable()), ids=" ".join)
def test_every_command_line_runs_a_command(words: tuple[str, ...]) -> None:
    assert _leaf(words), f"`.venv/bin/ticketflow {' '.join(words)}` only prints a group's help"
