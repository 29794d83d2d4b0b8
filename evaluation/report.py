"""The arithmetic of `ticketflow eval models`: halves of the held-out set, the cascade's
threshold, percentiles, the summary and its plot. Pure: no services."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

# thresholds tried for the cascade: below this confidence of v1, ask v2
GRID = [round(0.30 + 0.01 * i, 2) for i in range(70)]  # 0.30 .. 0.99
# a threshold this close (in accuracy) to the best one is as good, and fewer v2 calls win
TOLERANCE = 0.001


def halves(strata: Sequence[str]) -> tuple[list[int], list[int]]:
    """Two halves of the rows, each stratum split alternately: the first picks the cascade's
    threshold, the second measures it (picking and judging on the same rows flatters)."""
    seen: dict[str, int] = defaultdict(int)
    pick, judge = [], []
    for i, stratum in enumerate(strata):
        (pick if seen[stratum] % 2 == 0 else judge).append(i)
        seen[stratum] += 1
    return pick, judge


def cascade_accuracy(
    first_conf: Sequence[float], first_ok: Sequence[bool], then_ok: Sequence[bool], below: float
) -> tuple[float, float]:
    """(accuracy, share sent to the second version) of a cascade at `below`."""
    n = len(first_conf)
    sent = [c < below for c in first_conf]
    right = sum(t if s else f for s, f, t in zip(sent, first_ok, then_ok, strict=True))
    return right / n, sum(sent) / n


def pick_threshold(
    first_conf: Sequence[float], first_ok: Sequence[bool], then_ok: Sequence[bool]
) -> tuple[float, list[dict]]:
    """The cascade's threshold: the lowest whose accuracy is within TOLERANCE of the best."""
    curve = []
    for below in GRID:
        acc, share = cascade_accuracy(first_conf, first_ok, then_ok, below)
        curve.append(
            {"below": below, "accuracy": round(acc, 4), "share_to_second": round(share, 4)}
        )
    best = max(point["accuracy"] for point in curve)
    chosen = min(p["below"] for p in curve if p["accuracy"] >= best - TOLERANCE)
    return chosen, curve


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of non-empty `values`."""
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def plot(summary: dict, path: Path) -> None:
    """Accuracy against CPU per ticket, one point per variant; latency p50/p99 beside it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    variants = summary["variants"]
    names = list(variants)
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for name in names:
        v = variants[name]
        left.scatter(v["cpu_ms_per_ticket"], 100 * v["accuracy_test_half"], s=60)
        left.annotate(
            name,
            (v["cpu_ms_per_ticket"], 100 * v["accuracy_test_half"]),
            textcoords="offset points",
            xytext=(6, 4),
        )
    left.set_xlabel("Triton CPU ms per ticket")
    left.set_ylabel("accuracy on the held-out test half (%)")
    left.set_title("accuracy vs CPU")
    x = range(len(names))
    right.bar(
        [i - 0.2 for i in x], [variants[n]["latency_ms"]["p50"] for n in names], 0.4, label="p50"
    )
    right.bar(
        [i + 0.2 for i in x], [variants[n]["latency_ms"]["p99"] for n in names], 0.4, label="p99"
    )
    right.set_xticks(list(x), names)
    right.set_ylabel("ms per ticket (gateway + Triton)")
    right.set_title("latency")
    right.legend()
    fig.suptitle(
        f"held-out set: {summary['tickets']} tickets; cascade below {summary['cascade_below']}"
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
