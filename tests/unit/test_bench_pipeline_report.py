"""The pipeline benchmark's arithmetic and report, on made-up figures (the run itself needs
the whole stack and minutes: `ticketflow bench pipeline`)."""

import json

import orjson

from ticketflow.bench_pipeline import BETWEEN, Variant, _report, _step_breakdown


def result(latency_ms: float, steps: dict[str, float]) -> bytes:
    path = [{"step": s, "latency_ms": ms} for s, ms in steps.items()]
    return orjson.dumps({"latency_ms": latency_ms, "decision_path": path})


def test_the_breakdown_puts_what_no_step_took_between_the_steps():
    values = [
        result(100.0, {"clean": 2.0, "infer": 18.0}),
        result(60.0, {"clean": 4.0, "infer": 6.0}),
    ]
    assert _step_breakdown(values) == {"clean": 3.0, "infer": 12.0, BETWEEN: 65.0}


def variant(name: str, max_per_s: float, p99: float, recovery: dict | None = None) -> Variant:
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
    )


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
    assert report["ratios"] == {"c_over_a": 0.04, "c_over_b": 3.2, "d_over_a": 0.1, "d_over_b": 8.0}
    assert report["variants"][2]["recovery"]["same_worker_id"]["flowing_again_s"] == 7.0
    png = (tmp_path / "pipeline.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 10_000
