"""The PNG of `ticketflow chaos`: what each round lost or doubled, when its faults hit and how
the results flowed around them, and how long each fault kept the results from flowing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display: the plot goes to a file
import matplotlib.pyplot as plt
from matplotlib.axes import Axes

COLOURS = {
    "worker_kill": "tab:red",
    "workers_kill": "darkred",
    "worker_pause": "tab:purple",
    "broker_kill": "black",
    "broker_restart": "tab:gray",
    "triton_kill": "tab:orange",
    "redis_kill": "tab:brown",
    "gateway_kill": "tab:olive",
}


def plot(report: dict[str, Any], path: Path) -> None:
    rounds = report["rounds"]
    fig, (counts, timeline, ttf) = plt.subplots(
        3, 1, figsize=(11, 4 + 1.1 * max(len(rounds), 2)), height_ratios=[1, 1.6, 1]
    )
    _counts(counts, rounds)
    _timeline(timeline, rounds)
    _time_to_flow(ttf, rounds)
    c = report["campaign"]
    fig.suptitle(
        f"ticketflow chaos: seed {c['seed']}, {c['workers']} workers, {c['rate']:.0f} tickets/s, "
        f"{report['summary']['exact_rounds']}/{len(rounds)} rounds exact"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _counts(ax: Axes, rounds: list[dict[str, Any]]) -> None:
    """Lost, doubled and hostile-not-dead-lettered per round: all bars at zero is the goal."""
    xs = [r["index"] for r in rounds]
    series = [
        ("lost", [r["lost"] for r in rounds], "tab:red"),
        ("doubled", [r["doubled"] for r in rounds], "tab:blue"),
        ("hostile not in DLQ", [len(r["dlq_missing"]) for r in rounds], "tab:orange"),
    ]
    width = 0.25
    for i, (label, values, colour) in enumerate(series):
        bars = ax.bar([x + (i - 1) * width for x in xs], values, width, label=label, color=colour)
        ax.bar_label(bars, fontsize=7)
    for r in rounds:
        if not r["exact"]:
            ax.annotate(
                "not exact",
                (r["index"], 0.97),
                xycoords=("data", "axes fraction"),
                ha="center",
                va="top",
                color="red",
            )
    ax.set_xticks(xs, [f"round {x}" for x in xs])
    ax.set_xlim(min(xs, default=1) - 0.8, max(max(xs, default=1), 3) + 0.8)
    ax.set_ylabel("tickets")
    ax.set_ylim(bottom=0, top=max([1, *(max(v, default=0) for _, v, _ in series)]) * 1.3)
    ax.legend(fontsize=8, loc="upper right")
    ax.set_title("exactly once: lost / doubled per round", fontsize=10)


def _timeline(ax: Axes, rounds: list[dict[str, Any]]) -> None:
    """One lane per round: results per second (line), faults (spans), flowing again (dot)."""
    seen: set[str] = set()
    for lane, r in enumerate(rounds):
        flow = r["flow_per_s"]
        peak = max(flow, default=0) or 1
        ax.plot(range(len(flow)), [lane + 0.8 * v / peak for v in flow], lw=0.8, color="tab:green")
        for f in r["faults"]:
            if f["started_at_s"] is None:
                continue
            label = None if f["kind"] in seen else f["kind"]
            seen.add(f["kind"])
            _fault_span(ax, f, lane, len(rounds), label)
    ax.set_ylim(0, len(rounds))
    ax.set_yticks([i + 0.4 for i in range(len(rounds))], [f"round {r['index']}" for r in rounds])
    ax.set_xlabel("seconds since publishing began (line: results per second, scaled per round)")
    ax.legend(fontsize=7, loc="upper right", ncol=4)
    ax.set_title(
        "faults (dark: injected → healing began; light: until healthy; ▼ first result after)",
        fontsize=10,
    )


def _fault_span(ax: Axes, f: dict[str, Any], lane: int, lanes: int, label: str | None) -> None:
    """Dark from injection to healing, light while the healed part comes back, ▼ at the
    first result after healing began."""
    colour = COLOURS.get(f["kind"], "tab:gray")
    low, high = lane / lanes, (lane + 0.9) / lanes
    end = f["ended_at_s"] if f["ended_at_s"] is not None else f["started_at_s"]
    ax.axvspan(f["started_at_s"], end, low, high, color=colour, alpha=0.45, label=label)
    if f["healthy_at_s"] is not None:
        ax.axvspan(end, f["healthy_at_s"], low, high, color=colour, alpha=0.15)
    if f["time_to_flow_s"] is not None:
        ax.plot(end + f["time_to_flow_s"], lane + 0.85, "v", color=colour, ms=5)


def _time_to_flow(ax: Axes, rounds: list[dict[str, Any]]) -> None:
    """Per fault: seconds from healing to the next result ("none" where none came), and the
    longest time without results from the fault until 10 s after it was healed."""
    labels, ttf, stall, colours = [], [], [], []
    for r in rounds:
        for f in r["faults"]:
            if f["ended_at_s"] is None:
                continue
            labels.append(f"r{r['index']} {f['kind']}")
            ttf.append(f["time_to_flow_s"])
            stall.append(f["stall_s"] or 0.0)
            colours.append(COLOURS.get(f["kind"], "tab:gray"))
    xs = list(range(len(labels)))
    bars = ax.bar([x - 0.2 for x in xs], [v or 0 for v in ttf], 0.4, color=colours)
    ax.bar_label(bars, labels=["none" if v is None else f"{v:.1f}" for v in ttf], fontsize=7)
    bars = ax.bar([x + 0.2 for x in xs], stall, 0.4, color=colours, alpha=0.4, hatch="//")
    ax.bar_label(bars, labels=[f"{v:.1f}" for v in stall], fontsize=7)
    ax.set_xticks(xs, labels, rotation=30, ha="right", fontsize=7)
    ax.set_xlim(-0.8, max(len(xs), 3) - 0.2)
    ax.set_ylabel("seconds")
    ax.set_title(
        "time to flow again after each fault (solid) and longest stall (hatched)", fontsize=10
    )
