"""`ticketflow eval models`: v1, v2, the ensemble and the cascade on the held-out set.

The held-out set is the stratified 20 % split that `training.train` evaluates
both versions on (seed 13, `train.split`). Every ticket goes, one at a time, through the
workflow's own step handlers (`InferenceStep`, `ParallelStep`, the cascade) to a gateway
started for the run with its response cache off, and on to the running Triton:

- accuracy on the whole set and on its second half (the cascade's threshold is picked on the
  first half, so that the half it is judged on did not choose it);
- latency per ticket (p50, p99), as the step sees it;
- Triton's CPU per ticket from /proc: the stub process of each version, per inference it
  made (others' traffic on the same Triton does not bias it), plus tritonserver's share;
- for the cascade, the share of tickets sent to v2.

Writes bench/results/eval_models.json and docs/img/eval_models.png.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import typer

REPO = Path(__file__).resolve().parent.parent
ENSEMBLE = REPO / "agents" / "workflows" / "ticket_classify_ensemble.yaml"
MODEL = "ticket_classifier"
WARM_UP = 20  # calls per version before measuring: the first ones load sessions and caches

app = typer.Typer(help="Measure models and workflows on the held-out set.", no_args_is_help=True)


@dataclass(frozen=True)
class Triton:
    """The Triton measured: its gRPC address and metrics port."""

    grpc: str
    metrics_port: int

    @property
    def grpc_port(self) -> int:
        return int(self.grpc.rpartition(":")[2])

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"


@dataclass
class Run:
    """One variant over the rows: per ticket its answer and latency; CPU over the run."""

    name: str
    categories: list[str | None] = field(default_factory=list)
    confidences: list[float] = field(default_factory=list)
    versions: list[str | None] = field(default_factory=list)
    latencies_ms: list[float] = field(default_factory=list)
    degraded: int = 0
    failed: int = 0
    cpu: Any = None  # triton_cpu.Sample, the run's difference
    gateway_cpu_s: float = 0.0
    seconds: float = 0.0


@app.command("models")
def models(
    limit: Annotated[int | None, typer.Option(help="the first N held-out tickets only")] = None,
    below: Annotated[
        float | None, typer.Option(help="the cascade's threshold (default: picked on half 1)")
    ] = None,
    out: Annotated[Path, typer.Option(help="the JSON result")] = REPO
    / "bench/results/eval_models.json",
    plot_to: Annotated[Path, typer.Option(help="the plot")] = REPO / "docs/img/eval_models.png",
    own_triton: Annotated[
        bool,
        typer.Option(
            help="start a Triton of our own on the model repository as it is now (the "
            "running one may serve models older than their files, and serves others too)"
        ),
    ] = False,
) -> None:
    """v1 alone, v2 alone, the ensemble and the cascade: accuracy, latency, CPU per ticket."""
    with _own_triton() if own_triton else contextlib.nullcontext(_shared_triton()) as triton:
        summary = asyncio.run(_evaluate(triton, limit, below))
    from evaluation.report import plot

    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary, indent=2) + "\n")
    plot(summary, plot_to)
    _print(summary)
    typer.echo(f"wrote {out} and {plot_to}")


async def _evaluate(triton: Triton, limit: int | None, below: float | None) -> dict:
    from agents.steps.handlers import InferenceStep
    from agents.steps.parallel import ParallelStep
    from evaluation.report import halves
    from inference_gateway.client import GatewayClient
    from training.train import split

    rows = split()[1][:limit]
    pick, judge = halves([f"{r['category']}/{r['language']}" for r in rows])
    steps = _steps()
    with _private_gateway(triton) as (url, gateway_pid):
        async with GatewayClient(url) as client:
            infer = InferenceStep(client, lambda _env: 60_000)
            group = ParallelStep({"inference_call": infer})
            for version in ("v1", "v2"):
                await _measure(version, infer, steps[version], rows[:WARM_UP], gateway_pid, triton)
            runs = {
                v: await _measure(v, infer, steps[v], rows, gateway_pid, triton)
                for v in ("v1", "v2")
            }
            below, curve = _choose_below(rows, runs, pick, below)
            # the same curve on the half that did not choose: does the choice carry over?
            _, test_curve = _choose_below(rows, runs, judge, None)
            cascade = steps["v1"].model_copy(
                update={"name": "infer", "version": None, "cascade": _cascade(below)}
            )
            ensemble = steps["ensemble"]
            runs["ensemble"] = await _measure(
                "ensemble", group, ensemble, rows, gateway_pid, triton
            )
            runs["cascade"] = await _measure("cascade", infer, cascade, rows, gateway_pid, triton)
    summary = _summary(rows, runs, pick, judge, below, curve)
    served = _served(triton)
    return {**summary, "threshold_curve_test_half": test_curve, "served": served}


def _choose_below(
    rows: list[dict], runs: dict[str, Run], pick: list[int], below: float | None
) -> tuple[float, list[dict]]:
    """The cascade's threshold: given, or picked from v1's and v2's answers on half 1."""
    from evaluation.report import pick_threshold

    if below is not None:
        return below, []
    right = {v: [runs[v].categories[i] == rows[i]["category"] for i in pick] for v in ("v1", "v2")}
    return pick_threshold([runs["v1"].confidences[i] for i in pick], right["v1"], right["v2"])


def _steps() -> dict:
    from agents.definition import load_definition
    from schemas.workflow import Step

    ensemble = load_definition(ENSEMBLE).step("infer_ensemble")
    timeouts = {b.version: b.timeout_ms for b in ensemble.branches}
    pinned = {
        v: Step(name=f"infer_{v}", type="inference_call", model=MODEL, version=v, timeout_ms=t)
        for v, t in timeouts.items()
    }
    # the cascade's two calls share one timeout: the slower version's
    pinned["v1"] = pinned["v1"].model_copy(update={"timeout_ms": max(timeouts.values())})
    return {**pinned, "ensemble": ensemble}


def _cascade(below: float) -> Any:
    from schemas.workflow import Cascade

    return Cascade(first="v1", then="v2", below=below)


async def _measure(
    name: str, handler: Any, step: Any, rows: list[dict], gateway_pid: int, triton: Triton
) -> Run:
    from evaluation import triton_cpu

    run = Run(name)
    before = triton_cpu.sample(MODEL, triton.metrics_url, triton.grpc_port)
    gw_before = triton_cpu.cpu_seconds(gateway_pid) or 0.0
    t0 = time.perf_counter()
    for i, row in enumerate(rows):
        env = _envelope(f"eval-{name}-{i}", row["text"])
        t1 = time.perf_counter()
        [outcome] = await handler.run_batch([env], step)
        run.latencies_ms.append((time.perf_counter() - t1) * 1000)
        pred = env.context.prediction
        answered = outcome is None and pred is not None and not env.context.degraded
        run.failed += outcome is not None
        run.degraded += outcome is None and env.context.degraded
        run.categories.append(pred.category.value if answered else None)
        run.confidences.append(pred.confidence if answered else 0.0)
        run.versions.append(pred.model_version if answered else None)
    run.seconds = time.perf_counter() - t0
    run.cpu = triton_cpu.sample(MODEL, triton.metrics_url, triton.grpc_port).minus(before)
    run.gateway_cpu_s = (triton_cpu.cpu_seconds(gateway_pid) or 0.0) - gw_before
    return run


def _envelope(ticket_id: str, text: str) -> Any:
    from datetime import datetime, timezone

    from agents.steps.clean import clean_text
    from schemas.tickets import Envelope, Ticket

    now = datetime.now(timezone.utc)
    env = Envelope(
        ticket=Ticket(ticket_id=ticket_id, text=text, created_at=now),
        workflow="eval",
        workflow_version=1,
        step="infer",
        trace_id="0" * 32,
        arrival="0:0",
        started_at=now,
    )
    env.context.clean_text = clean_text(text)  # what the model reads in the workflow
    return env


def _shared_triton() -> Triton:
    """The running Triton of the settings (the local stack's)."""
    from streams.settings import Settings

    s = Settings()
    return Triton(s.triton_grpc, s.triton_metrics_port)


@contextlib.contextmanager
def _own_triton() -> Iterator[Triton]:
    """A Triton of our own on free ports, serving the model repository as it is now."""
    from devstack import app_processes
    from inference_gateway import triton_server
    from streams.settings import Settings

    grpc, http, metrics = (app_processes.free_port() for _ in range(3))
    log = Settings().state_dir / "logs" / f"triton-eval-{grpc}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    typer.echo(f"starting a Triton of our own on :{grpc} (log {log})")
    with triton_server.running(
        triton_server.DEFAULT_MODEL_REPOSITORY, grpc, http, metrics, timeout_s=300, log_path=log
    ):
        yield Triton(f"127.0.0.1:{grpc}", metrics)


@contextlib.contextmanager
def _private_gateway(triton: Triton) -> Iterator[tuple[str, int]]:
    """A gateway of our own in front of `triton`, response cache off (a repeated text would
    be free): its URL and pid."""
    from devstack import app_processes
    from streams.settings import Settings

    url = f"http://127.0.0.1:{app_processes.free_port()}"
    env = {
        "TICKETFLOW_GATEWAY_URL": url,
        "TICKETFLOW_GATEWAY_CACHE_SIZE": "0",
        "TICKETFLOW_TRITON_GRPC": triton.grpc,
    }
    service = app_processes.start_gateway(Settings(gateway_url=url), env)
    try:
        yield url, service.process.pid
    finally:
        service.stop()


def _served(triton: Triton) -> dict:
    """Each version's files against the stub that serves them: a version rebuilt after its
    stub started is not what Triton answers with until it is loaded again."""
    from evaluation import triton_cpu
    from inference_gateway.model.repository import MODEL_DIR

    _, stubs = triton_cpu.triton_processes(MODEL, triton.grpc_port)
    served = {}
    for version, pid in sorted(stubs.items()):
        folder = MODEL_DIR / version.removeprefix("v")
        files = [f for f in folder.iterdir() if f.is_file()] if folder.is_dir() else []
        built = max((f.stat().st_mtime for f in files), default=None)
        loaded = triton_cpu.started_at(pid)
        metrics = folder / "metrics.json"
        served[version] = {
            "held_out_accuracy_at_build": json.loads(metrics.read_text()).get("accuracy")
            if metrics.is_file()
            else None,
            "files_newer_than_the_loaded_model": bool(built and loaded and built > loaded),
        }
    return served


def _calls(run: Run, n: int) -> dict[str, int]:
    """Inferences this run asked of each version."""
    if run.name in ("v1", "v2"):
        return {run.name: n}
    if run.name == "ensemble":
        return {"v1": n, "v2": n}
    return {"v1": n, "v2": sum(v == "v2" for v in run.versions)}


def _cpu_ms_per_ticket(run: Run, n: int) -> dict[str, float]:
    """Raw: all of Triton's CPU over the run / tickets. Attributed: each version's CPU per
    inference (its stub's CPU / every inference it made, ours or not) times ours, plus
    tritonserver's CPU in proportion of the inferences that were ours."""
    cpu = run.cpu
    ours = _calls(run, n)
    attributed, all_inferences = 0.0, 0.0
    for version, count in ours.items():
        made = cpu.inferences.get(version, 0.0)
        if made > 0:
            attributed += cpu.stubs_s.get(version, 0.0) / made * count
        all_inferences += made
    if all_inferences > 0:
        attributed += cpu.server_s * sum(ours.values()) / all_inferences
    raw = cpu.server_s + sum(cpu.stubs_s.values())
    return {
        "cpu_ms_per_ticket": round(attributed / n * 1000, 3),
        "cpu_ms_per_ticket_raw": round(raw / n * 1000, 3),
        "others_inferences": round(all_inferences - sum(ours.values())),
    }


def _summary(rows, runs, pick, judge, below, curve) -> dict:
    from evaluation.report import percentile

    truth = [r["category"] for r in rows]
    n = len(rows)

    def accuracy(run: Run, idx) -> float:
        return round(sum(run.categories[i] == truth[i] for i in idx) / len(idx), 4)

    variants = {}
    for name, run in runs.items():
        variants[name] = {
            "accuracy": accuracy(run, range(n)),
            "accuracy_test_half": accuracy(run, judge),
            "accuracy_pick_half": accuracy(run, pick),
            "latency_ms": {
                "p50": round(percentile(run.latencies_ms, 50), 2),
                "p99": round(percentile(run.latencies_ms, 99), 2),
                "mean": round(sum(run.latencies_ms) / n, 2),
            },
            **_cpu_ms_per_ticket(run, n),
            "gateway_cpu_ms_per_ticket": round(run.gateway_cpu_s / n * 1000, 3),
            "inferences": _calls(run, n),
            "degraded": run.degraded,
            "failed": run.failed,
            "seconds": round(run.seconds, 1),
        }
    cascade = variants["cascade"]
    cascade["share_to_v2"] = round(cascade["inferences"]["v2"] / n, 4)
    v2 = variants["v2"]
    return {
        "tickets": n,
        "halves": {"pick": len(pick), "test": len(judge)},
        "split": "training.train.split(): stratified 20 % held out, seed 13",
        "cascade_below": below,
        "threshold_curve_pick_half": curve,
        "variants": variants,
        "targets": {
            "cascade_accuracy_gap_to_v2_points": round(
                100 * (cascade["accuracy_test_half"] - v2["accuracy_test_half"]), 2
            ),
            "cascade_cpu_share_of_v2": round(
                cascade["cpu_ms_per_ticket"] / max(v2["cpu_ms_per_ticket"], 1e-9), 4
            ),
        },
    }


def _print(summary: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"held-out set, {summary['tickets']} tickets")
    for col in ("variant", "acc (all)", "acc (test half)", "p50 ms", "p99 ms", "CPU ms/ticket"):
        table.add_column(col)
    for name, v in summary["variants"].items():
        table.add_row(
            name,
            f"{v['accuracy']:.4f}",
            f"{v['accuracy_test_half']:.4f}",
            f"{v['latency_ms']['p50']:.1f}",
            f"{v['latency_ms']['p99']:.1f}",
            f"{v['cpu_ms_per_ticket']:.2f}",
        )
    Console().print(table)
    share = summary["variants"]["cascade"]["share_to_v2"]
    typer.echo(f"cascade below {summary['cascade_below']}: {share:.1%} of tickets sent to v2")
    if share == 0:
        typer.echo(
            "no ticket went to v2: on these tickets asking v2 where v1 is unsure did not pay, "
            "so the cascade is v1 alone; --below sets a threshold to measure instead"
        )
    typer.echo(f"targets: {summary['targets']}")
    stale = [v for v, s in summary["served"].items() if s["files_newer_than_the_loaded_model"]]
    if stale:
        typer.echo(
            f"warning: {stale} rebuilt after Triton loaded them: the figures are the old "
            "models' on the new split; restart Triton (ticketflow stack down/up) and run again"
        )
