"""`ticketflow chaos` without a stack: the seeded schedule, the counting, the report and plot,
and which stack calls each fault makes (with the stack faked)."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import orjson
import pytest
from pydantic import ValidationError
from rich.console import Console

import chaos.campaign
import chaos.children
from chaos.checks import check_exactly_once, flow_figures, longest_stall, per_second, time_to_flow
from chaos.children import Child
from chaos.plan import (
    FAULT_KINDS,
    HOLD_S,
    HOSTILE_KINDS,
    FaultPlan,
    Options,
    draw_campaign,
    draw_round,
    max_faults,
    parse_faults,
    parse_hostile,
)
from chaos.report import (
    FaultRecord,
    RoundReport,
    print_summary,
    round_line,
    summarize,
    write_report,
)
from chaos.traffic import hostile_record
from schemas.tickets import Ticket
from streams.settings import Settings

# ---- the schedule -----------------------------------------------------------------------------


def test_the_same_seed_draws_the_same_campaign_and_another_seed_another():
    first = draw_campaign(7, 5, 60, 2, FAULT_KINDS)
    assert first == draw_campaign(7, 5, 60, 2, FAULT_KINDS)
    assert first != draw_campaign(8, 5, 60, 2, FAULT_KINDS)
    assert [p.index for p in first] == [1, 2, 3, 4, 5]
    assert len({p.seed for p in first}) == 5  # each round its own seed, kept in the report


def test_a_round_is_the_same_whatever_the_rounds_around_it():
    # a failed round can be replayed alone
    assert draw_campaign(7, 5, 60, 2, FAULT_KINDS)[2] == draw_round(7, 3, 60, 2, FAULT_KINDS)


@pytest.mark.parametrize("seed", range(40))
def test_only_allowed_faults_in_order_within_the_round_with_their_holds(seed):
    allowed = ("worker_pause", "redis_kill", "broker_kill")
    plan = draw_round(seed, 1, 60, 3, allowed)
    assert 1 <= len(plan.faults) <= max_faults(60) == 3
    starts = [f.at_s for f in plan.faults]
    assert starts == sorted(starts) and len(set(starts)) == len(starts)
    for f in plan.faults:
        assert f.kind in allowed
        assert 9 <= f.at_s <= 45  # after a warm-up, within the first 3/4 of the round
        low, high = HOLD_S[f.kind]
        assert low <= f.hold_s <= high
        if f.kind == "worker_pause":
            assert f.target in range(3)
            assert f.hold_s > 6  # past Faust's session timeout: a zombie
        else:
            assert f.target is None


def test_every_kind_is_drawn_sometime_and_both_membership_kinds():
    plans = draw_campaign(1, 200, 60, 2, FAULT_KINDS)
    assert {f.kind for p in plans for f in p.faults} == set(FAULT_KINDS)
    assert {p.static_members for p in plans} == {True, False}


def test_short_rounds_get_one_fault():
    assert all(len(p.faults) == 1 for p in draw_campaign(3, 20, 20, 2, FAULT_KINDS))


def test_hostile_records_once_each_within_the_round_and_the_faults_do_not_depend_on_them():
    full = draw_round(5, 2, 30, 2, FAULT_KINDS)
    assert sorted(k for _, k in full.hostile) == sorted(HOSTILE_KINDS)
    assert all(0 < at < 30 for at, _ in full.hostile)
    some = draw_round(5, 2, 30, 2, FAULT_KINDS, ("bad_json",))
    assert [k for _, k in some.hostile] == ["bad_json"]
    assert some.faults == full.faults and some.static_members == full.static_members
    assert draw_round(5, 2, 30, 2, FAULT_KINDS, ()).hostile == ()


def test_fault_and_hostile_lists_are_parsed_and_checked():
    assert parse_faults("") == FAULT_KINDS
    assert parse_faults(" broker_kill, redis_kill,broker_kill ") == ("broker_kill", "redis_kill")
    with pytest.raises(ValueError, match="broker_crash"):
        parse_faults("broker_crash")
    assert parse_hostile(None) == HOSTILE_KINDS
    assert parse_hostile("none") == ()
    assert parse_hostile("not_utf8") == ("not_utf8",)
    with pytest.raises(ValueError, match="evil"):
        parse_hostile("evil")


@pytest.mark.parametrize("kind", HOSTILE_KINDS)
def test_every_hostile_record_is_one_validate_must_refuse(kind):
    value, headers = hostile_record(kind, "r1-hostile-x")
    with pytest.raises((UnicodeDecodeError, orjson.JSONDecodeError, ValidationError, ValueError)):
        if len(value) > Settings().max_record_bytes:
            raise ValueError("too large")
        Ticket.model_validate(orjson.loads(value.decode("utf-8")))
    if kind == "bad_replay_count":
        assert ("x-replay-count", b"abc") in headers


# ---- counting ---------------------------------------------------------------------------------


def test_exactly_once_names_the_lost_the_doubled_and_the_unexpected():
    tally = check_exactly_once(
        ["a", "b", "c", "d"], ["a", "b", "b", "c", "zz", "maybe"], maybe=["maybe"]
    )
    assert tally.lost == ["d"]
    assert tally.doubled == {"b": 2}
    assert tally.unexpected == ["zz"]
    assert not tally.exact
    assert check_exactly_once(["a"], ["a"]).exact


def test_time_to_flow_and_the_longest_stall():
    times = [1.0, 2.0, 2.5, 9.0, 9.5, 10.0]
    assert time_to_flow(times, 3.0) == 6.0
    assert time_to_flow(times, 2.0) == 0.0
    assert time_to_flow(times, 10.5) is None
    assert longest_stall(times, 2.0, 12.0) == 6.5
    assert longest_stall(times, 9.2, 20.0) == 10.0  # none after the last: up to the end
    assert longest_stall([], 1.0, 4.0) == 3.0
    assert per_second([0.1, 0.9, 1.5, 7.0, -1.0], 0.0, 3) == [2, 1, 0]


def test_the_stall_is_looked_for_until_after_the_part_is_healthy():
    f = FaultRecord("worker_kill", 0, 4, 2, started_at_s=4.0, ended_at_s=6.0, healthy_at_s=10.0)
    # flowing at once after the kill, then stopped by the restarted worker's rejoin
    times = [100 + t for t in (4.5, 6.1, 6.5, 11.0, 17.0, 17.5)]
    flow_figures(f, times, 100.0, until=200.0)
    assert f.time_to_flow_s == pytest.approx(0.1)
    assert f.stall_s == 6.0


# ---- the report -------------------------------------------------------------------------------


def _round(index: int, **kw: Any) -> dict[str, Any]:
    r = RoundReport(index, 1000 + index, f"chaosx r{index}.", index % 2 == 0, drained=True)
    r.published = r.results = 500
    r.dlq_expected = r.dlq_found = 6
    r.flow_per_s = [10, 50, 0, 0, 30, 50, 50]
    r.faults = [
        FaultRecord("broker_kill", None, 1, 2, 1.2, 3.2, 5.0, 1.1, 3.0),
        FaultRecord("worker_pause", 1, 4, 10, 4.0, 14.0, 15.0, None, 9.0),
        FaultRecord("redis_kill", None, 5, 3, note="skipped: redis was not started here"),
    ]
    for k, v in kw.items():
        setattr(r, k, v)
    return r.to_dict()


def test_a_round_is_exact_only_without_any_problem():
    assert _round(1)["exact"] and _round(1)["problems"] == []
    lossy = _round(2, lost=3, doubled=1, dlq_missing=["h"], drained=False, drain_s=60.0)
    assert not lossy["exact"]
    assert lossy["problems"] == [
        "3 lost",
        "1 doubled",
        "1 hostile not in the DLQ",
        "not drained in 60 s",
    ]
    died = _round(3, workers_died=[{"worker": "w1", "rc": -6, "at_s": 3.0}])
    assert died["problems"] == ["w1 died (rc -6)"]
    assert _round(4, errors=["broker_kill: StackError: boom"])["problems"] == [
        "broker_kill: StackError: boom"
    ]


def test_the_summary_adds_up_and_gives_time_to_flow_per_kind():
    rounds = [_round(1), _round(2, lost=2, doubled=1), _round(3)]
    s = summarize(rounds)
    assert (s["rounds"], s["exact_rounds"], s["lost"], s["doubled"]) == (3, 2, 2, 1)
    assert s["published"] == 1500 and s["faults"] == 9
    assert s["never_flowed_again"] == 3  # the pause, once a round; skipped faults don't count
    assert s["time_to_flow_s"] == {"broker_kill": {"n": 3, "median": 1.1, "max": 1.1}}


def test_the_round_line_and_the_exit_code(capsys):
    line = round_line(_round(2, lost=2), 5)
    assert "round 2/5" in line and "lost 2" in line and "NOT exact: 2 lost" in line
    assert "broker_kill@1s (flow in 1.1s)" in line and "worker_pause#1@4s (no flow)" in line
    assert "skipped" in line
    report = {"campaign": {"rounds": 2}, "rounds": [], "summary": summarize([_round(1)] * 2)}
    assert print_summary(report, Console()) == 0
    report["summary"] = summarize([_round(1), _round(2, doubled=1)])
    assert print_summary(report, Console()) == 1
    report["summary"] = summarize([_round(1)])  # a campaign cut short is not a pass
    assert print_summary(report, Console()) == 1
    assert "rounds exact" in capsys.readouterr().out


def test_the_report_is_written_as_json_and_png(tmp_path: Path):
    rounds = [_round(1), _round(2, lost=4, doubled=2)]
    report = {
        "campaign": {"seed": 7, "workers": 2, "rate": 100.0, "rounds": 2},
        "rounds": rounds,
        "summary": summarize(rounds),
    }
    json_path, png = write_report(report, tmp_path / "out")
    assert json.loads(json_path.read_text())["rounds"][1]["lost"] == 4
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ---- the faults, against a faked stack ------------------------------------------------------


class FakeProcess:
    def __init__(self) -> None:
        self.signals: list[int] = []
        self.returncode: int | None = None

    def poll(self) -> int | None:
        return self.returncode

    def send_signal(self, sig: int) -> None:
        self.signals.append(sig)


class FakeService:
    def __init__(self) -> None:
        self.process = FakeProcess()
        self.killed = False
        self.log_path = Path("/dev/null")

    def kill(self) -> None:
        self.killed = True
        self.process.returncode = -9


def _no_process(*args, **kwargs):
    raise AssertionError("a unit test must not start a process")


@pytest.fixture
def campaign(monkeypatch, tmp_path):
    calls: list[tuple] = []

    def stop_part(s, part, kill=False):
        calls.append(("stop", part, kill))
        return True  # one of ours was running

    monkeypatch.setattr(chaos.campaign.stack, "stop_part", stop_part)
    monkeypatch.setattr(
        chaos.campaign.stack, "start_part", lambda s, part: calls.append(("start", part))
    )
    monkeypatch.setattr(
        chaos.campaign.stack,
        "part_status",
        lambda s, part: type("S", (), {"ours": part != "redis"})(),
    )
    spawned: list[str] = []

    def spawn(child):  # no real process: a supervisor's restart spawns directly
        spawned.append(child.name)
        child.service, child.down = FakeService(), False

    monkeypatch.setattr(Child, "spawn", spawn)
    monkeypatch.setattr(Child, "await_ready", lambda child, timeout_s: None)
    monkeypatch.setattr(chaos.children.app_processes, "start", _no_process)
    c = chaos.campaign.Campaign(Settings(state_dir=tmp_path), Options(rounds=1, round_s=20))
    c.gateway = Child("gw", c.s, ["gateway"], lambda: True, FakeService())
    c.workers = [Child(f"w{i}", c.s, ["worker"], lambda: True, FakeService()) for i in (0, 1)]
    c.calls, c.spawned = calls, spawned
    return c


def _play(campaign, kind: str, target: int | None = None) -> FaultRecord:
    return campaign._fault(FaultPlan(kind, 0.0, 0.01, target))


def test_the_broker_is_killed_for_broker_kill_and_shut_down_for_broker_restart(campaign):
    records = [_play(campaign, k) for k in ("broker_kill", "broker_restart", "triton_kill")]
    assert [r.note for r in records] == ["", "", ""]
    assert campaign.current.errors == []
    assert campaign.calls == [
        ("stop", "kafka", True),
        ("start", "kafka"),
        ("stop", "kafka", False),
        ("start", "kafka"),
        ("stop", "triton", True),
        ("start", "triton"),
    ]
    assert campaign.down_parts == set()


def test_a_part_the_stack_did_not_start_is_left_alone(campaign):
    record = _play(campaign, "redis_kill")
    assert record.note.startswith("skipped") and record.started_at_s is None
    assert campaign.calls == []


def test_worker_faults_kill_restart_and_freeze_the_right_workers(campaign):
    first = campaign.workers[1].service
    record = _play(campaign, "worker_kill", 1)
    assert first.killed and campaign.spawned == ["w1"]
    assert record.ended_at_s is not None and record.healthy_at_s is not None
    _play(campaign, "workers_kill")
    assert campaign.spawned == ["w1", "w0", "w1"]
    paused = campaign.workers[0].service
    _play(campaign, "worker_pause", 0)
    assert paused.process.signals == [signal.SIGSTOP, signal.SIGCONT]
    _play(campaign, "gateway_kill")
    assert campaign.spawned[-1] == "gw"
    assert campaign.current.workers_died == []  # our own kills are not deaths


def test_a_worker_that_dies_on_its_own_is_reported_and_started_again(campaign):
    campaign.workers[0].service.process.returncode = 1
    campaign._supervise()
    (died,) = campaign.current.workers_died
    assert died["worker"] == "w0" and died["rc"] == 1
    assert campaign.spawned == ["w0"]
    assert campaign.workers[0].service.process.returncode is None  # a new process


def test_a_fault_that_fails_to_heal_is_an_error_and_the_part_is_restored(campaign, monkeypatch):
    attempts: list[str] = []

    def failing_start(s, part):
        attempts.append(part)
        if len(attempts) == 1:
            raise chaos.campaign.stack.StackError("kafka did not become healthy")

    monkeypatch.setattr(chaos.campaign.stack, "start_part", failing_start)
    record = _play(campaign, "broker_kill")
    assert "did not become healthy" in record.note
    assert campaign.current.errors and attempts == ["kafka", "kafka"]
    assert campaign.down_parts == set()


def test_a_worker_alive_but_not_serving_at_the_end_is_reported_stuck(campaign):
    campaign.workers[1].ready = lambda: False
    campaign._check_alive(timeout_s=0.6)
    assert campaign.current.errors == ["w1 not ready at the end (stuck)"]
