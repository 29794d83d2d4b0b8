"""A CI-sized `ticketflow chaos`: two short rounds against the test stack.

The broker is SIGKILLed, Triton, Redis and the campaign's own gateway are killed and brought
back, while two workers carry steady traffic and hostile records. The stack must be whole
afterwards, whatever happened, so that the tests after this one still have it.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

import devstack as stack
from chaos.campaign import Campaign
from chaos.plan import FAULT_KINDS, Options, draw_campaign
from chaos.report import write_report
from devstack import app_processes
from streams.settings import Settings

pytestmark = pytest.mark.integration

# drawn for this test: round 1 kills the gateway, then the broker (static members);
# round 2 kills Triton, then Redis (dynamic members); every hold is under 7 s
SEED = 3676
OPTIONS = Options(
    rounds=2,
    workers=2,
    rate=40,
    round_s=40,
    seed=SEED,
    faults=FAULT_KINDS,
    drain_s=60,
    settle_s=3,
    tail_s=4,
)
PARTS_KILLED = {"broker_kill", "triton_kill", "redis_kill", "gateway_kill"}


def test_the_seed_draws_a_kill_of_every_part():
    plans = draw_campaign(SEED, OPTIONS.rounds, OPTIONS.round_s, OPTIONS.workers, FAULT_KINDS)
    assert {f.kind for p in plans for f in p.faults} == PARTS_KILLED
    assert {p.static_members for p in plans} == {True, False}


@pytest.fixture(scope="module")
def campaign(live_stack: Settings, tmp_path_factory) -> tuple[dict[str, Any], Path]:
    out = tmp_path_factory.mktemp("chaos")
    run = Campaign(live_stack, OPTIONS)
    try:
        run.run()
    finally:
        _make_whole(live_stack)
    report = run.report()
    write_report(report, out)
    return report, out


def _make_whole(settings: Settings) -> None:
    """Whatever the campaign left down is started again (idempotent for what is up), and a
    gateway of the session's waits until it reaches Triton again."""
    stack.up(settings)
    if app_processes.http_ok(settings.gateway_url.rstrip("/") + "/healthz"):
        deadline = time.monotonic() + 90
        while not app_processes.gateway_ready(settings) and time.monotonic() < deadline:
            time.sleep(0.5)


def test_every_fault_was_injected_and_healed_and_the_stack_is_whole(campaign, live_stack):
    report, out = campaign
    faults = [f for r in report["rounds"] for f in r["faults"]]
    assert {f["kind"] for f in faults} == PARTS_KILLED
    for f in faults:
        assert f["note"] == "", f
        assert f["started_at_s"] is not None and f["healthy_at_s"] is not None, f
    assert all(p.healthy for p in stack.status(live_stack)), stack.status(live_stack)
    for r in report["rounds"]:
        assert r["published"] >= 0.9 * OPTIONS.rate * OPTIONS.round_s, r["published"]
        assert r["errors"] == [], r["errors"]
    assert (out / "chaos.json").exists() and (out / "chaos.png").exists()


def test_every_round_is_exact(campaign):
    report, out = campaign
    failed = [r for r in report["rounds"] if not r["exact"]]
    figures = [
        {k: r[k] for k in ("index", "problems", "lost_ids", "doubled_ids", "where_lost", "logs")}
        for r in failed
    ]
    assert not failed, f"{figures}; report in {out}"
