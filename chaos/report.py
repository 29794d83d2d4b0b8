"""The report of a campaign: what each fault and round recorded, the totals, the terminal
lines, and chaos.json with its plot (chaos/plot.py)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from statistics import median
from typing import Any

from rich.console import Console

SAMPLE = 20  # ids listed in the report per kind of problem


@dataclass
class FaultRecord:
    kind: str
    target: int | None
    planned_at_s: float
    hold_s: float
    started_at_s: float | None = None  # when it was injected
    ended_at_s: float | None = None  # when healing began (restart, SIGCONT)
    healthy_at_s: float | None = None  # when the healed part answered again
    time_to_flow_s: float | None = None  # first result after ended_at_s
    stall_s: float | None = None  # longest time without results, start to 10 s after healthy
    note: str = ""  # skipped, or what went wrong while injecting or healing


@dataclass
class RoundReport:
    index: int
    seed: int
    prefix: str
    static_members: bool
    faults: list[FaultRecord] = field(default_factory=list)
    published: int = 0
    publish_failed: int = 0
    results: int = 0
    lost: int = 0
    doubled: int = 0
    lost_ids: list[str] = field(default_factory=list)
    doubled_ids: dict[str, int] = field(default_factory=dict)
    # lost tickets found dead-lettered: "<class> at <step>: <reason>" -> tickets
    lost_in_dlq: dict[str, int] = field(default_factory=dict)
    dlq_duplicates: int = 0  # dead letters beyond the first for the same key
    unexpected: int = 0
    dlq_expected: int = 0
    dlq_found: int = 0
    dlq_missing: list[str] = field(default_factory=list)
    dlq_parked: int = 0
    workers_died: list[dict[str, Any]] = field(default_factory=list)
    drained: bool = False
    drain_s: float = 0.0
    duration_s: float = 0.0
    flow_per_s: list[int] = field(default_factory=list)
    where_lost: dict[str, dict[str, int]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    logs: list[str] = field(default_factory=list)

    def problems(self) -> list[str]:
        out = [f"{self.lost} lost"] if self.lost else []
        out += [f"{self.doubled} doubled"] if self.doubled else []
        out += [f"{len(self.dlq_missing)} hostile not in the DLQ"] if self.dlq_missing else []
        out += [f"{w['worker']} died (rc {w['rc']})" for w in self.workers_died]
        out += [] if self.drained else [f"not drained in {self.drain_s:.0f} s"]
        return out + self.errors

    @property
    def exact(self) -> bool:
        return not self.problems()

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "exact": self.exact, "problems": self.problems()}


def summarize(rounds: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Totals over the rounds, and time to flow again per fault kind."""
    ttf: dict[str, list[float]] = {}
    never = 0
    for r in rounds:
        for f in r["faults"]:
            if f["ended_at_s"] is None:
                continue
            if f["time_to_flow_s"] is None:
                never += 1
            else:
                ttf.setdefault(f["kind"], []).append(f["time_to_flow_s"])
    return {
        "rounds": len(rounds),
        "exact_rounds": sum(1 for r in rounds if r["exact"]),
        "published": sum(r["published"] for r in rounds),
        "lost": sum(r["lost"] for r in rounds),
        "doubled": sum(r["doubled"] for r in rounds),
        "dlq_missing": sum(len(r["dlq_missing"]) for r in rounds),
        "workers_died": sum(len(r["workers_died"]) for r in rounds),
        "faults": sum(len(r["faults"]) for r in rounds),
        "never_flowed_again": never,
        "time_to_flow_s": {
            k: {"n": len(v), "median": round(median(v), 2), "max": max(v)}
            for k, v in sorted(ttf.items())
        },
    }


def round_line(r: dict[str, Any], total: int) -> str:
    """The one terminal line per round."""
    faults = ", ".join(_fault_text(f) for f in r["faults"]) or "none"
    verdict = "[green]exact[/]" if r["exact"] else f"[red]NOT exact: {'; '.join(r['problems'])}[/]"
    return (
        f"round {r['index']}/{total} seed {r['seed']}: {faults} | published {r['published']}, "
        f"results {r['results']}, lost {r['lost']}, doubled {r['doubled']}, "
        f"dlq {r['dlq_found']}/{r['dlq_expected']} | {verdict}"
    )


def _fault_text(f: dict[str, Any]) -> str:
    who = "" if f["target"] is None else f"#{f['target']}"
    at = "?" if f["started_at_s"] is None else f"{f['started_at_s']:.0f}"
    ttf = f["time_to_flow_s"]
    flow = "no flow" if ttf is None else f"flow in {ttf:.1f}s"
    return f"{f['kind']}{who}@{at}s ({f['note'] or flow})"


def write_report(report: dict[str, Any], out: Path) -> tuple[Path, Path]:
    """chaos.json and chaos.png in `out`."""
    from chaos.plot import plot

    out.mkdir(parents=True, exist_ok=True)
    path = out / "chaos.json"
    path.write_text(json.dumps(report, indent=1) + "\n")
    png = out / "chaos.png"
    plot(report, png)
    return path, png


def print_summary(report: dict[str, Any], console: Console) -> int:
    """The closing lines of the campaign; its exit code: 0 when every round was exact."""
    s = report["summary"]
    ttf = ", ".join(
        f"{k} {v['median']:.1f}s (max {v['max']:.1f}s, n={v['n']})"
        for k, v in s["time_to_flow_s"].items()
    )
    console.print(
        f"summary: {s['exact_rounds']}/{s['rounds']} rounds exact; {s['published']} published, "
        f"{s['lost']} lost, {s['doubled']} doubled, {s['dlq_missing']} hostile not "
        f"dead-lettered, {s['workers_died']} died on their own; {s['faults']} faults, "
        f"{s['never_flowed_again']} never followed by a result"
    )
    console.print(f"time to flow again (median): {ttf or '-'}")
    return 0 if s["exact_rounds"] == s["rounds"] == report["campaign"]["rounds"] else 1
