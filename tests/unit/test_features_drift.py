"""Drift checks on generated samples: Great Expectations and PSI against a reference."""

from __future__ import annotations

import numpy as np
import pytest

from feature_jobs import drift
from feature_jobs.drift import Thresholds, build_reference, evaluate, psi, split_fallbacks
from feature_jobs.views import VIEWS
from schemas.tickets import FeatureValue

VIEW = VIEWS["user_ticket_stats"]


def rows(n: int, seed: int, shift: bool = False) -> list[dict]:
    rng = np.random.default_rng(seed)
    channels = ["email", "chat", "web"]
    out = []
    for _ in range(n):
        used = list(rng.choice(channels, size=rng.integers(1, 3), replace=False))
        if shift and rng.random() < 0.3:
            used.append("api")
        out.append(
            {
                "tickets_1h": int(rng.poisson(1.2) + 1 + (2 if shift else 0)),
                "tickets_7d": int(rng.poisson(3) + 1),
                "refund_mentions_30d": int(rng.binomial(3, 0.2)),
                "mean_text_len_7d": float(rng.lognormal(4.6, 0.4) * (1.6 if shift else 1.0)),
                "channels": sorted(used),
                "last_ticket_at": "2026-01-01T00:00:00+00:00",
            }
        )
    return out


@pytest.fixture(scope="module")
def reference():
    return build_reference(VIEW, rows(400, seed=1))


def test_unshifted_sample_raises_no_drift(reference):
    report = evaluate(VIEW, reference, rows(400, seed=2), excluded_fallback=0)
    assert not report.drifted, {k: v.get("reasons") for k, v in report.features.items()}
    assert report.sample_size == 400
    assert all(f["expectations"] for f in report.features.values())
    assert report.features["mean_text_len_7d"]["psi"] < 0.1
    assert drift.metrics.DRIFT.labels(VIEW.name, "channels")._value.get() == 0


def test_shifted_sample_raises_a_report_naming_the_features(reference):
    report = evaluate(VIEW, reference, rows(400, seed=3, shift=True), excluded_fallback=0)
    assert report.drifted
    f = report.features
    assert f["mean_text_len_7d"]["drifted"] and f["mean_text_len_7d"]["mean_shift"] > 0.15
    assert f["tickets_1h"]["drifted"]
    assert f["channels"]["drifted"] and f["channels"]["unexpected_values"] == ["api"]
    assert not f["tickets_7d"]["drifted"] and not f["refund_mentions_30d"]["drifted"]
    assert drift.metrics.DRIFT.labels(VIEW.name, "channels")._value.get() == 1
    assert drift.metrics.DRIFT.labels(VIEW.name, "tickets_7d")._value.get() == 0


def test_null_rate_rise_is_drift(reference):
    sample = rows(400, seed=4)
    for r in sample[:100]:
        r["mean_text_len_7d"] = None
    report = evaluate(VIEW, reference, sample, excluded_fallback=0)
    assert report.features["mean_text_len_7d"]["drifted"]
    assert report.features["mean_text_len_7d"]["null_rate"] == 0.25


def test_fallback_rows_are_left_out_and_a_degraded_sample_is_not_judged(reference):
    served = [{k: FeatureValue(value=v) for k, v in r.items()} for r in rows(100, seed=5)]
    fallback = [
        {f.name: FeatureValue(value=f.default, is_fallback=True) for f in VIEW.features}
        for _ in range(300)
    ]
    real, excluded = split_fallbacks(served + fallback)
    assert len(real) == 100 and excluded == 300
    # the fallbacks' zeros would look like a huge shift; they are out of the comparison
    report = evaluate(VIEW, reference, real, excluded)
    assert not report.drifted and report.excluded_fallback == 300
    assert "degraded" in report.features["tickets_1h"]["skipped"]
    small = evaluate(VIEW, reference, real[:10], 0, Thresholds(min_sample=50))
    assert not small.drifted and "fewer than 50" in small.features["tickets_1h"]["skipped"]


def test_psi_of_a_distribution_with_itself_is_zero_and_grows_with_shift():
    p = [0.25, 0.25, 0.25, 0.25]
    assert psi(p, p) == pytest.approx(0.0)
    assert 0.0 < psi(p, [0.3, 0.3, 0.2, 0.2]) < 0.1
    assert psi(p, [0.7, 0.1, 0.1, 0.1]) > 0.25
