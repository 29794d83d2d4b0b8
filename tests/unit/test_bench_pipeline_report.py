"""The pipeline benchmark's arithmetic and report, on made-up figures (the run itself needs
the whole stack and minutes: `ticketflow bench pipeline`)."""

import json
import math
import os
import subprocess
import sys
import time

import orjson

from benchmarks.pipeline import (
    BETWEEN,
    Variant,
    _report,
    _step_breakdown,
    _tickets,
    hop_split,
    process_cpu_s,
)


def result(latency_ms: float, steps: dict[str, float]) -> bytes:
    path = [{"step": s, "latency_ms": ms} for s, ms in steps.items()]
    return orjson.dumps({"latency_ms": latency_ms, "decision_path": path})


def test_the_breakdown_puts_what_no_step_took_between_the_steps():
    values = [
        result(100.0, {"clean": 2.0, "infer": 18.0}),
        result(60.0, {"clean": 4.0, "infer": 6.0}),
    ]
    assert _step_breakdown(values) == {"clean": 3.0, "infer": 12.0, BETWEEN: 65.0}


def variant(
    name: str,
    max_per_s: float,
    p99: float,
    recovery: dict | None = None,
    cpu_ms: float | None = None,
) -> Variant:
    loads = {
        f"{pct}%": {"offered_per_s": max_per_s * pct / 100, "p50": p99 / 2, "p95": p99, "p99": p99}
        for pct in (25, 50, 75)
    }
    return Variant(
        name,
        max_per_s,
        loads,
        {"infer": 20.0, BETWEEN: 200.0} if recovery else {},
        recovery or {},
        cpu_ms,
    )


RECOVERY = {
    "same_worker_id": {"flowing_again_s": 7.0},
    "new_worker": {"flowing_again_s": 11.0},
}


def test_the_report_writes_ratios_figures_and_a_plot(tmp_path):
    recovery = {
        "same_worker_id": {"flowing_again_s": 7.0},
        "new_worker": {"flowing_again_s": 11.0},
    }
    variants = [
        variant("raw relay (a)", 8000.0, 90.0),
        variant("naive (b)", 100.0, 20.0),
        variant("ticketflow (c)", 320.0, 500.0, recovery),
        variant("ticketflow fused (d)", 800.0, 300.0, recovery),
    ]
    _report(variants, tmp_path)
    report = json.loads((tmp_path / "pipeline.json").read_text())
    assert report["ratios"] == {
        "c_over_a": 0.04,
        "c_over_b": 3.2,
        "c_over_e": None,  # no peer in this run
        "d_over_a": 0.1,
        "d_over_b": 8.0,
        "d_over_e": None,
    }
    assert report["variants"][2]["recovery"]["same_worker_id"]["flowing_again_s"] == 7.0
    png = (tmp_path / "pipeline.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 10_000


def test_the_report_sets_ticketflow_against_the_peer_in_throughput_and_cpu(tmp_path, capsys):
    peer = variant("quix-streams EOS (e)", 160.0, 3000.0, cpu_ms=4.0)
    peer.steps_ms = {"infer": 5.0, BETWEEN: 900.0}
    variants = [
        variant("raw relay (a)", 8000.0, 90.0, cpu_ms=0.25),
        variant("naive (b)", 100.0, 20.0, cpu_ms=2.0),
        variant("ticketflow (c)", 320.0, 500.0, RECOVERY, cpu_ms=3.0),
        variant("ticketflow fused (d)", 800.0, 300.0, RECOVERY, cpu_ms=1.0),
        peer,
    ]
    _report(variants, tmp_path)
    report = json.loads((tmp_path / "pipeline.json").read_text())
    assert report["ratios"]["c_over_e"] == 2.0 and report["ratios"]["d_over_e"] == 5.0
    assert report["cpu_ratios"] == {
        "c_over_a": 12.0,
        "c_over_b": 1.5,
        "c_over_e": 0.75,
        "d_over_a": 4.0,
        "d_over_b": 0.5,
        "d_over_e": 0.25,
    }
    assert [v["cpu_ms_per_ticket"] for v in report["variants"]] == [0.25, 2.0, 3.0, 1.0, 4.0]
    assert "not counted" in report["cpu_ms_per_ticket"] and report["skipped"] == {}
    printed = capsys.readouterr().out
    assert "CPU ms/ticket" in printed and "4.00" in printed
    assert (tmp_path / "pipeline.png").read_bytes().startswith(b"\x89PNG")


def test_without_the_peer_its_ratios_are_none_and_the_report_says_why(tmp_path, capsys):
    variants = [
        variant("raw relay (a)", 8000.0, 90.0),  # no CPU figure: shown as n/a
        variant("naive (b)", 100.0, 20.0, cpu_ms=2.0),
        variant("ticketflow (c)", 320.0, 500.0, RECOVERY, cpu_ms=3.0),
        variant("ticketflow fused (d)", 800.0, 300.0, RECOVERY, cpu_ms=1.0),
    ]
    why = ".venv-peer/bin/python is missing; build it with `make peer`"
    _report(variants, tmp_path, {"e": why})
    report = json.loads((tmp_path / "pipeline.json").read_text())
    assert report["ratios"]["c_over_e"] is None and report["cpu_ratios"]["d_over_e"] is None
    assert report["cpu_ratios"]["c_over_a"] is None and report["cpu_ratios"]["c_over_b"] == 1.5
    assert report["skipped"] == {"e": why}
    printed = capsys.readouterr().out
    assert "make peer" in printed and "n/a" in printed


def test_process_cpu_counts_the_process_and_its_children():
    before = process_cpu_s(os.getpid())
    end = time.process_time() + 0.3
    while time.process_time() < end:  # burn 0.3 s of CPU here
        pass
    assert process_cpu_s(os.getpid()) - before >= 0.25
    spin = "import time\nend = time.process_time() + 0.5\nwhile time.process_time() < end: pass"
    # a shell parent waiting on a child that burns 0.5 s, then idles: the CPU is the child's
    child = f"{sys.executable} -c '{spin}\ntime.sleep(30)'"
    proc = subprocess.Popen(["sh", "-c", f"{child}; true"])
    try:
        deadline = time.monotonic() + 20
        while process_cpu_s(proc.pid) < 0.45 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert process_cpu_s(proc.pid) >= 0.45
    finally:
        proc.kill()
        proc.wait()


def hop_metrics(fetched: tuple[float, float], delivered: tuple[float, float]) -> str:
    """A worker's /metrics text with the two hop histograms (sum, count) over two steps."""
    lines = []
    for name, (total, count) in (
        ("workflow_hop_fetched_seconds", fetched),
        ("workflow_hop_delivered_seconds", delivered),
    ):
        lines.append(f"# TYPE {name} histogram")
        for step in ("infer", "rules"):  # split evenly: the split must add them up again
            lines.append(f'{name}_bucket{{le="+Inf",step="{step}"}} {count / 2}')
            lines.append(f'{name}_count{{step="{step}"}} {count / 2}')
            lines.append(f'{name}_sum{{step="{step}"}} {total / 2}')
    return "\n".join(lines) + "\n"


def test_the_hop_split_is_the_mean_hop_between_two_scrapes():
    before = hop_metrics(fetched=(1.0, 100), delivered=(2.0, 100))
    # 200 more hops: 1.2 s to the fetch, 3.0 s to the handler, all told
    after = hop_metrics(fetched=(2.2, 300), delivered=(5.0, 300))
    assert hop_split(before, after) == {
        "produce → fetched": 6.0,
        "fetched → handler": 9.0,
        "hop": 15.0,
    }


def test_no_hop_between_two_scrapes_is_not_a_number():
    same = hop_metrics(fetched=(1.0, 100), delivered=(2.0, 100))
    assert all(math.isnan(x) for x in hop_split(same, same).values())


def test_two_processes_and_both_peer_cadences_get_ratios_and_the_low_rate_a_column(
    tmp_path, capsys
):
    c, c2 = variant("ticketflow (c)", 300.0, 400.0, cpu_ms=2.0), variant("c x2", 420.0, 300.0)
    c.key, c2.key = "c", "c2"
    c.latency_ms["5/s"] = {"offered_per_s": 5.0, "p50": 45.0, "p95": 90.0, "p99": 100.0}
    e1, e01 = variant("quix 1 s", 150.0, 2000.0, cpu_ms=1.0), variant("quix 0.1 s", 100.0, 900.0)
    e1.key, e01.key = "e", "e0.1"
    variants = [
        variant("raw relay (a)", 3000.0, 50.0),
        variant("naive (b)", 100.0, 20.0),
        c,
        c2,
        variant("ticketflow fused (d)", 600.0, 300.0),
        e1,
        e01,
    ]
    _report(variants, tmp_path)
    ratios = json.loads((tmp_path / "pipeline.json").read_text())["ratios"]
    assert ratios["c2_over_c"] == 1.4 and ratios["c_over_e"] == 2.0
    assert ratios["c_over_e0.1"] == 3.0 and ratios["c2_over_a"] == 0.14
    assert "5/s" in capsys.readouterr().out.replace("\n", "")


def test_the_machines_busy_seconds_grow_with_work() -> None:
    from benchmarks.pipeline import machine_busy_s

    before, started = machine_busy_s(), time.process_time()
    while time.process_time() - started < 0.3:  # 0.3 s of this process's CPU
        pass
    assert machine_busy_s() - before >= 0.2  # jiffies: 10 ms steps


def test_each_phase_sends_texts_the_gateway_has_not_answered_yet():
    """A phase repeating an earlier phase's texts would measure the response cache."""

    def texts(run: str) -> set[str]:
        return {orjson.loads(v)["text"] for _, v in _tickets(300, run)}

    warm, burst = texts("abc123c1-warm"), texts("abc123c1-max")
    assert len(warm) > 290 and len(burst) > 290
    assert len(warm & burst) < 15
    assert texts("abc123c1-max") == burst  # one run's phase is reproducible
