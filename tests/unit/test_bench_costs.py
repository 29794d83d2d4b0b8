"""`ticketflow bench costs`: its report and its clocks, on made-up figures (the run itself
needs the whole stack: `ticketflow bench costs`)."""

import json
import os
import time

from benchmarks import costs


def test_the_report_writes_every_phase_and_the_table(tmp_path, capsys):
    phases = [
        {
            "offered_per_s": 50.0,
            "tickets": 750,
            "cpu_ms_per_ticket": {"worker": 11.9, "broker": 8.1, "client": 1.5},
            "cores_busy": 1.29,
            "p50": 53.5,
            "p95": 91.2,
            "p99": 167.8,
        }
    ]
    costs._report(phases, tmp_path)
    assert json.loads((tmp_path / "costs.json").read_text()) == phases
    shown = capsys.readouterr().out
    assert "11.90" in shown and "8.10" in shown and "168" in shown


def test_the_clients_clock_counts_this_process_only():
    before = costs._own_cpu_s()
    # burn 50 ms of CPU here, by a finer clock: os.times() ticks in 10 ms steps, so a fixed
    # loop can finish inside one tick on a fast machine
    start = time.process_time()
    while time.process_time() - start < 0.05:
        sum(i * i for i in range(10_000))
    assert costs._own_cpu_s() > before
    t = os.times()
    assert costs._own_cpu_s() <= t.user + t.system + 0.01
