"""The arithmetic of `ticketflow eval models` (evaluation/report.py, triton_cpu.py)."""

from __future__ import annotations

import os
import time
from collections import Counter

import pytest

from evaluation import report as eval_report
from evaluation import triton_cpu
from evaluation.models import Run, _cpu_ms_per_ticket


def test_halves_split_every_stratum_evenly_and_cover_every_row_once():
    strata = ["a/en"] * 5 + ["b/zh"] * 4 + ["a/en"] * 3
    pick, judge = eval_report.halves(strata)
    assert sorted(pick + judge) == list(range(len(strata)))
    assert Counter(strata[i] for i in pick) == Counter({"a/en": 4, "b/zh": 2})
    assert Counter(strata[i] for i in judge) == Counter({"a/en": 4, "b/zh": 2})


def test_cascade_accuracy_takes_the_second_answer_below_the_threshold_only():
    conf = [0.9, 0.6, 0.4]
    first_ok = [True, False, False]
    then_ok = [False, True, True]
    assert eval_report.cascade_accuracy(conf, first_ok, then_ok, 0.5) == (
        pytest.approx(2 / 3),
        pytest.approx(1 / 3),
    )
    assert eval_report.cascade_accuracy(conf, first_ok, then_ok, 0.7) == (1.0, pytest.approx(2 / 3))


def test_the_threshold_is_the_lowest_as_good_as_the_best():
    # v1 is wrong on its two least confident answers, where v2 is right
    conf = [0.99, 0.95, 0.91, 0.62, 0.55]
    first_ok = [True, True, True, False, False]
    then_ok = [False, False, True, True, True]
    below, curve = eval_report.pick_threshold(conf, first_ok, then_ok)
    assert below == 0.63  # sends both unsure ones, and no confident one, to v2
    best = max(p["accuracy"] for p in curve)
    assert best == 1.0 and {p["below"] for p in curve} == set(eval_report.GRID)


def test_nearest_rank_percentiles():
    values = list(range(1, 101))
    assert eval_report.percentile(values, 50) == 50
    assert eval_report.percentile(values, 99) == 99
    assert eval_report.percentile([7.0], 99) == 7.0


def test_cpu_of_this_process_grows_with_work():
    before = triton_cpu.cpu_seconds(os.getpid())
    end = time.process_time() + 0.05
    while time.process_time() < end:
        pass
    assert triton_cpu.cpu_seconds(os.getpid()) > before
    assert triton_cpu.cpu_seconds(2**22 + 12345) is None  # no such process


def test_inference_counts_are_read_per_version_of_the_model(monkeypatch):
    text = (
        "# HELP nv_inference_count x\n"
        'nv_inference_count{model="ticket_classifier",version="1"} 120\n'
        'nv_inference_count{model="ticket_classifier",version="2"} 30\n'
        'nv_inference_count{model="other",version="1"} 9\n'
    )

    class Resp:
        def __enter__(self):
            return self

        def __exit__(self, *a):
            return False

        def read(self):
            return text.encode()

    monkeypatch.setattr(triton_cpu.urllib.request, "urlopen", lambda *a, **k: Resp())
    assert triton_cpu.inference_counts("http://x/metrics", "ticket_classifier") == {
        "v1": 120.0,
        "v2": 30.0,
    }


def test_cpu_per_ticket_charges_each_version_per_inference_whoever_else_called():
    run = Run("cascade", versions=["v1"] * 8 + ["v2"] * 2)
    # the v2 stub made 4 inferences (2 ours) for 0.2 s: 50 ms each; v1 10 for 0.01 s
    run.cpu = triton_cpu.Sample(
        server_s=0.014, stubs_s={"v1": 0.01, "v2": 0.2}, inferences={"v1": 10, "v2": 4}
    )
    cpu = _cpu_ms_per_ticket(run, 10)
    # (10 x 1 ms + 2 x 50 ms + 14 ms x 12/14) / 10 tickets
    assert cpu["cpu_ms_per_ticket"] == pytest.approx((10 + 100 + 12) / 10)
    assert cpu["cpu_ms_per_ticket_raw"] == pytest.approx(224 / 10)
    assert cpu["others_inferences"] == 2
