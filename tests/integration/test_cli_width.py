"""Every table the command line prints stays readable in an 80-column terminal.

Each command runs in a real terminal, a tmux pane of 80 x 50 on a tmux server of its own,
against the live stack, on topics and a Redis key prefix of this module's own that it fills
first. The pane's text is captured with wrapped lines joined (`capture-pane -J`), so a line
wider than 80 columns shows as one long line, and the values each command is there to show
must appear whole: a table squeezed into empty or cut columns fails. (`dlq ls` used to
collapse into six empty columns here.)
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

import pytest
from confluent_kafka import Producer

from schemas.review import ReviewOutcome, SpotCheck
from schemas.tickets import Category, DecisionStep, TicketResult
from streams.admin import ensure_topics
from streams.kafka_config import confluent_config
from streams.settings import Settings
from streams.topics import Topics

ROOT = Path(__file__).resolve().parents[2]
TICKETFLOW = Path(sys.executable).parent / "ticketflow"
RUN = uuid.uuid4().hex[:8]
PREFIX = f"w80{RUN}."
KEYS_PREFIX = f"ticketflow:w80{RUN}:"
WIDTH, HEIGHT = 80, 50
# a ticket id near the contract's 128 characters: the key column must cut it, not widen
LONG_KEY = "t-" + "long" * 30
DEAD = [
    ("w80-bad-json", "DESERIALIZATION", "validate", "not JSON: unexpected character at 1"),
    ("w80-no-text", "SCHEMA_VALIDATION", "validate", "text: Field required; " + "x" * 120),
    (LONG_KEY, "INFERENCE_TIMEOUT", "infer", "deadline passed after 3 attempts"),
]


# ---- a terminal of 80 columns ----------------------------------------------------------------


class Terminal:
    """Runs one command at a time in a fresh 80-column tmux session and returns its screen."""

    def __init__(self, env: dict[str, str]) -> None:
        self.socket = f"ticketflow-w80-{RUN}"
        self.env = env
        self.n = 0

    def _tmux(self, *args: str) -> str:
        out = subprocess.run(
            ["tmux", "-L", self.socket, *args], capture_output=True, text=True, timeout=30
        )
        return out.stdout

    def run(self, command: str, timeout_s: float = 120) -> tuple[int, list[str]]:
        self.n += 1
        name, done = f"c{self.n}", Path(f"/tmp/ticketflow-w80-{RUN}-{self.n}.rc")
        # COLUMNS would override the terminal's width: unset, rich asks the tty (80)
        exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env.items())
        script = (
            f"cd {shlex.quote(str(ROOT))} && env -u COLUMNS -u LINES {exports} "
            f"{TICKETFLOW} {command}; echo $? > {done}; sleep 600"
        )
        self._tmux("new-session", "-d", "-s", name, "-x", str(WIDTH), "-y", str(HEIGHT), script)
        try:
            deadline = time.monotonic() + timeout_s
            while not (done.exists() and done.read_text().strip()):
                assert time.monotonic() < deadline, f"`ticketflow {command}` did not finish"
                time.sleep(0.2)
            screen = self._tmux("capture-pane", "-p", "-J", "-S", "-", "-t", name)
            return int(done.read_text()), screen.rstrip("\n").splitlines()
        finally:
            self._tmux("kill-session", "-t", name)
            done.unlink(missing_ok=True)

    def close(self) -> None:
        self._tmux("kill-server")


@pytest.fixture(scope="module")
def terminal() -> Iterator[Terminal]:
    assert shutil.which("tmux"), "tmux is missing: `make setup` installs it"
    env = {"TICKETFLOW_TOPIC_PREFIX": PREFIX, "TICKETFLOW_INGEST_REDIS_PREFIX": KEYS_PREFIX}
    term = Terminal(env)
    yield term
    term.close()


def readable(lines: list[str], *values: str) -> None:
    """No line wider than the terminal, and every value shown whole on some line."""
    wide = [line for line in lines if len(line) > WIDTH]
    assert not wide, "wider than 80 columns:\n" + "\n".join(wide)
    text = "\n".join(lines)
    for value in values:
        assert value in text, f"{value!r} not shown whole in:\n{text}"


# ---- what the commands show ------------------------------------------------------------------


def _result(ticket_id: str) -> TicketResult:
    return TicketResult(
        ticket_id=ticket_id,
        route="auto_classify",
        category=Category.billing,
        confidence=0.91,
        model_name="ticket_classifier",
        model_version="v1",
        decision_path=[DecisionStep(step="route", status="ok", attempt=1, latency_ms=1.0)],
        latency_ms=12.0,
        completed_at=datetime.now(timezone.utc),
    )


def _outcome(ticket_id: str, kind: str, agreed: bool) -> ReviewOutcome:
    decided = Category.billing if agreed else Category.shipping
    return ReviewOutcome(
        ticket_id=ticket_id,
        kind=kind,
        proposed=Category.billing,
        decided=decided,
        agreed=agreed,
        model_name="ticket_classifier",
        model_version="v1",
    )


@pytest.fixture(scope="module")
def seeded(live_stack: Settings) -> Settings:
    """Dead letters, review outcomes and spot checks on this module's topics."""
    s = live_stack.model_copy(update={"topic_prefix": PREFIX})
    topics = Topics(PREFIX)
    names = [topics.dlq, topics.review_outcomes, topics.review_spot_checks]
    ensure_topics(s, {n: {} for n in names})
    p = Producer(confluent_config(s))
    for key, error_class, step, reason in DEAD:
        headers = {"x-dlq-error-class": error_class, "x-dlq-step": step, "x-dlq-reason": reason}
        p.produce(topics.dlq, key=key.encode(), value=b"{not json", headers=headers)
    for i, (kind, agreed) in enumerate([("manual", True), ("spot_check", False)]):
        outcome = _outcome(f"w80-review-{i}", kind, agreed)
        p.produce(
            topics.review_outcomes, key=outcome.ticket_id.encode(), value=outcome.model_dump_json()
        )
    check = SpotCheck(ticket_id="w80-spot-pending", result=_result("w80-spot-pending"))
    p.produce(topics.review_spot_checks, key=b"w80-spot-pending", value=check.model_dump_json())
    assert p.flush(30) == 0
    return s


# ---- the commands ----------------------------------------------------------------------------


def test_stack_status(terminal: Terminal, live_stack: Settings) -> None:
    _, lines = terminal.run("stack status")
    readable(lines, "kafka", "redis", "triton", "9092", "up")


def test_dlq_ls_shows_every_column(terminal: Terminal, seeded: Settings) -> None:
    rc, lines = terminal.run("dlq ls")
    assert rc == 0
    readable(lines, "w80-bad-json", "DESERIALIZATION", "SCHEMA_VALIDATION", "INFERENCE_TIMEOUT")
    readable(lines, "validate", "infer", "not JSON: unexpected character at 1", "3 dead letter")
    # the long key is cut with an ellipsis, never wrapped
    assert any(LONG_KEY[:20] in line and "…" in line for line in lines)
    assert not any(LONG_KEY in line for line in lines)


def test_dlq_show(terminal: Terminal, seeded: Settings) -> None:
    _, listing = terminal.run("dlq ls --error-class INFERENCE_TIMEOUT")
    position = next(line.split()[0] for line in listing if "INFERENCE_TIMEOUT" in line)
    rc, lines = terminal.run(f"dlq show {position}")
    assert rc == 0
    readable(lines, '"x-dlq-error-class": "INFERENCE_TIMEOUT"', "deadline passed", "{not json")


def test_dlq_replay_dry_run(terminal: Terminal, seeded: Settings) -> None:
    rc, lines = terminal.run("dlq replay --dry-run")
    assert rc == 0
    readable(lines, "w80-bad-json", "would replay", "step validate", "3 would replay")


def test_review_stats_and_spot_checks(terminal: Terminal, seeded: Settings) -> None:
    rc, lines = terminal.run("review stats --idle 1")
    assert rc == 0
    readable(lines, "v1", "manual", "spot check", "50.0%")
    rc, lines = terminal.run("review spot-checks --idle 1")
    assert rc == 0
    readable(lines, "w80-spot-pending", "billing", "0.91")


def test_review_decide_refusal(terminal: Terminal, seeded: Settings) -> None:
    _, lines = terminal.run("review decide w80-unknown-ticket --category billing")
    readable(lines)
    assert any(line.strip() for line in lines)


def test_features_describe(terminal: Terminal, live_stack: Settings) -> None:
    rc, lines = terminal.run("features describe")
    assert rc == 0
    readable(lines, "user_ticket_stats", "refund_mentions_30d", "count_matching", "30 d / 1 d")
    readable(lines, "created_at", "list[str]", "default")


def test_keys_and_limits(terminal: Terminal, seeded: Settings) -> None:
    rc, _ = terminal.run("keys create --name w80-webform --scopes submit,read,admin")
    assert rc == 0
    rc, lines = terminal.run("keys list")
    assert rc == 0
    readable(lines, "w80-webform", "admin,read,submit")
    rc, lines = terminal.run("limits set --kind key --name w80-webform --rate 50 --burst 100")
    assert rc == 0
    rc, lines = terminal.run("limits get")
    assert rc == 0
    readable(lines, "key:w80-webform", '"burst": 100')


def test_config_get_and_route_test(terminal: Terminal, seeded: Settings) -> None:
    rc, lines = terminal.run("config get")
    assert rc == 0
    readable(lines, "ticket_classifier", '"default": "v1"')
    rc, lines = terminal.run("config route-test t-1 " + LONG_KEY[:60])
    assert rc == 0
    readable(lines, "ticket_classifier", "t-1", "bucket", "version")
