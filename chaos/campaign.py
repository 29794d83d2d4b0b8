"""The campaign of `ticketflow chaos`: rounds of seeded faults against the local stack.

`Campaign` runs each round on a fresh topic prefix with workers of its own: it starts the
traffic (chaos/traffic.py) and the watcher (chaos/watch.py), plays the round's faults
(chaos/plan.py) on the stack and its children (chaos/children.py), lets the pipeline drain,
and records the checks (chaos/checks.py) in the round's report (chaos/report.py). `main` is
the command.
"""

from __future__ import annotations

import contextlib
import signal
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console

import devstack as stack
from chaos.checks import check_exactly_once, flow_figures, per_second
from chaos.children import Child, spawn_all
from chaos.plan import STACK_PARTS, FaultPlan, Options, RoundPlan, draw_campaign
from chaos.report import (
    SAMPLE,
    FaultRecord,
    RoundReport,
    print_summary,
    round_line,
    summarize,
    write_report,
)
from chaos.traffic import Traffic, corpus_texts, now_iso
from chaos.watch import ROUTES, Seen, Watcher, locate, watched_topics
from devstack import app_processes
from devstack.process import log_tail
from streams.admin import delete_prefixed
from streams.kafka_config import confluent_config
from streams.settings import Settings
from streams.topics import Topics

console = Console()


class ChaosError(RuntimeError):
    """The campaign cannot run (the stack is not up)."""


class Campaign:
    """Runs the rounds of `options` against the stack of `settings`; `report()` says how."""

    def __init__(
        self,
        settings: Settings,
        options: Options,
        on_round: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        self.s, self.o, self.on_round = settings, options, on_round
        self.run_id = uuid.uuid4().hex[:6]
        o = options
        self.plans = draw_campaign(o.seed, o.rounds, o.round_s, o.workers, o.faults, o.hostile)
        self.rounds: list[dict[str, Any]] = []
        self.started_at = now_iso()
        self.down_parts: set[str] = set()
        self.gateway: Child | None = None
        self.workers: list[Child] = []
        self.current = RoundReport(0, 0, "", False)
        self.t0 = time.time()
        self.published_until = self.t0

    def run(self) -> dict[str, Any]:
        self._check_stack()
        try:
            self.gateway = self._gateway_child()
            spawn_all([self.gateway], self.o.ready_s)
            for plan in self.plans:
                result = self._round(plan).to_dict()
                self.rounds.append(result)
                if self.on_round:
                    self.on_round(result)
        finally:
            self.restore()
            if self.gateway is not None:
                self.gateway.stop()
        return self.report()

    def report(self) -> dict[str, Any]:
        o = self.o
        return {
            "campaign": {
                "started_at": self.started_at,
                "seed": o.seed,
                "rounds": o.rounds,
                "workers": o.workers,
                "rate": o.rate,
                "round_s": o.round_s,
                "faults": list(o.faults),
                "hostile": list(o.hostile),
                "kafka": self.s.kafka_bootstrap,
                "state_dir": str(self.s.state_dir),
            },
            "rounds": self.rounds,
            "summary": summarize(self.rounds),
        }

    # ---- stack and children -------------------------------------------------------------------

    def _check_stack(self) -> None:
        down = [p.name for p in stack.status(self.s) if not p.healthy]
        if down:
            raise ChaosError(f"{', '.join(down)} not up; run `ticketflow stack up` first")

    def _gateway_child(self) -> Child:
        url = f"http://127.0.0.1:{app_processes.free_port()}"
        gs = self.s.model_copy(update={"gateway_url": url})
        return Child(
            f"chaos-{self.run_id}-gateway", gs, ["gateway"], lambda: app_processes.gateway_ready(gs)
        )

    def _worker_child(self, rs: Settings, index: int, i: int, static: bool) -> Child:
        assert self.gateway is not None
        ws = rs.model_copy(
            update={
                "worker_web_port": app_processes.free_port(),
                "gateway_url": self.gateway.settings.gateway_url,
                "worker_id": f"w{i}" if static else None,
            }
        )
        name = f"chaos-{self.run_id}-r{index}-w{i}"
        # one process: a kill or freeze of the child is then one of a worker
        args = ["worker", "--loglevel", "warning", "--processes", "1"]
        return Child(name, ws, args, lambda: app_processes.worker_ready(ws))

    def restore(self) -> None:
        """Every stack part we stopped is started again, every child of ours runs again."""
        for part in [p for p in stack.PARTS if p in self.down_parts]:
            for attempt in (1, 2):
                try:
                    stack.start_part(self.s, part)
                    self.down_parts.discard(part)
                    break
                except stack.StackError as exc:
                    self.current.errors.append(f"restoring {part} (try {attempt}): {exc}"[:500])
        for child in [c for c in [self.gateway, *self.workers] if c is not None and c.down]:
            try:
                spawn_all([child], self.o.ready_s)
            except (RuntimeError, TimeoutError) as exc:
                self.current.errors.append(f"restarting {child.name}: {exc}"[:500])
        for child in self.workers:
            child.signal(signal.SIGCONT)

    def _supervise(self) -> None:
        """A child that exited without our kill is reported, and started again as a
        supervisor would, so that the round's counts still mean something."""
        for child in [self.gateway, *self.workers]:
            rc = None if child is None else child.exit_code()
            if child is None or rc is None:
                continue
            assert child.service is not None
            self.current.workers_died.append(
                {
                    "worker": child.name,
                    "at_s": self._at(),
                    "rc": rc,
                    "log": str(child.service.log_path),
                    "tail": log_tail(child.service.log_path, 10),
                }
            )
            child.spawn()

    def _at(self) -> float:
        return round(time.time() - self.t0, 2)

    def _sleep_until(self, wall: float) -> None:
        while (left := wall - time.time()) > 0:
            time.sleep(min(left, 0.5))
            self._supervise()

    # ---- a round ------------------------------------------------------------------------------

    def _round(self, plan: RoundPlan) -> RoundReport:
        prefix = f"{self.base_prefix}r{plan.index}."
        report = self.current = RoundReport(plan.index, plan.seed, prefix, plan.static_members)
        rs = self.s.model_copy(update={"topic_prefix": prefix})
        began = time.time()
        self.workers = [
            self._worker_child(rs, plan.index, i, plan.static_members)
            for i in range(self.o.workers)
        ]
        report.logs = [str(self.s.state_dir / "logs" / f"{w.name}.log") for w in self.workers]
        traffic: Traffic | None = None
        watcher: Watcher | None = None
        try:
            spawn_all(self.workers, self.o.ready_s)
            topics = Topics(prefix)
            watcher = Watcher(confluent_config(rs), watched_topics(topics))
            watcher.start()
            traffic = Traffic(
                confluent_config(rs), topics.tickets_in, f"r{plan.index}", self.o.rate,
                plan.hostile, corpus_texts(plan.seed),
            )  # fmt: skip
            self.t0 = time.time()
            traffic.start()
            self._play(plan.faults)
            _finish(traffic)
            self.published_until = time.time()
            self._drain(traffic, watcher)
            self._check_alive()
            _finish(watcher)
            self._check(report, traffic, watcher.seen(), rs)
        except Exception as exc:  # reported as the round's failure; the campaign goes on
            report.errors.append(f"{type(exc).__name__}: {exc}"[:500])
        finally:
            for thread in (traffic, watcher):
                if thread is not None and thread.is_alive():
                    _finish(thread)
            self.restore()
            for w in self.workers:
                w.stop()
            report.duration_s = round(time.time() - began, 1)
        if report.exact:  # a failed round's topics stay for a post-mortem
            with contextlib.suppress(Exception):
                delete_prefixed(self.s, prefix, prefix)
        return report

    @property
    def base_prefix(self) -> str:
        return f"{self.s.topic_prefix}chaos{self.run_id}"

    def _play(self, faults: Sequence[FaultPlan]) -> None:
        """The faults one after another, then publishing for the rest of the round."""
        last = 0.0
        for plan in faults:
            self._sleep_until(self.t0 + max(plan.at_s, last))
            record = self._fault(plan)
            self.current.faults.append(record)
            last = record.healthy_at_s or self._at()
        self._sleep_until(self.t0 + max(self.o.round_s, last + self.o.tail_s))

    def _fault(self, plan: FaultPlan) -> FaultRecord:
        record = FaultRecord(plan.kind, plan.target, plan.at_s, plan.hold_s)
        part = STACK_PARTS.get(plan.kind)
        if part and not stack.part_status(self.s, part).ours:
            record.note = f"skipped: {part} was not started by `ticketflow stack up` here"
            return record
        record.started_at_s = self._at()
        try:
            self._inject(plan)
            self._sleep_until(time.time() + plan.hold_s)
            record.ended_at_s = self._at()
            self._heal(plan)
            record.healthy_at_s = self._at()
        except Exception as exc:
            record.note = f"{type(exc).__name__}: {exc}"[:300]
            self.current.errors.append(f"{plan.kind}: {record.note}")
            self.restore()
        return record

    def _inject(self, plan: FaultPlan) -> None:
        kind = plan.kind
        if kind in STACK_PARTS:
            part = STACK_PARTS[kind]
            self.down_parts.add(part)
            # broker_restart is the clean shutdown; every other part is SIGKILLed
            if not stack.stop_part(self.s, part, kill=kind != "broker_restart"):
                raise ChaosError(f"{part} was not running")
        elif kind == "gateway_kill":
            assert self.gateway is not None
            self.gateway.kill()
        elif kind == "workers_kill":
            for w in self.workers:
                w.kill()
        elif kind == "worker_kill":
            self.workers[plan.target or 0].kill()
        elif kind == "worker_pause":
            self.workers[plan.target or 0].signal(signal.SIGSTOP)

    def _heal(self, plan: FaultPlan) -> None:
        kind = plan.kind
        if kind in STACK_PARTS:
            stack.start_part(self.s, STACK_PARTS[kind])
            self.down_parts.discard(STACK_PARTS[kind])
        elif kind == "gateway_kill":
            assert self.gateway is not None
            spawn_all([self.gateway], self.o.ready_s)
        elif kind == "workers_kill":
            spawn_all(self.workers, self.o.ready_s)
        elif kind == "worker_kill":
            spawn_all([self.workers[plan.target or 0]], self.o.ready_s)
        elif kind == "worker_pause":
            worker = self.workers[plan.target or 0]
            worker.signal(signal.SIGCONT)
            # the zombie must find out it was fenced and rejoin the group
            worker.await_ready(self.o.ready_s)

    def _drain(self, traffic: Traffic, watcher: Watcher) -> None:
        """Wait (bounded) for every result and dead letter, then a while for duplicates."""
        expected = {t for t in traffic.sent if t in traffic.acked}
        hostile = {k for k in traffic.hostile_sent if k in traffic.acked}
        topics = Topics(self.current.prefix)
        outs, dlqs = {topics.out(r) for r in ROUTES}, {topics.dlq, topics.dlq_parked}
        start = time.monotonic()
        while time.monotonic() - start < self.o.drain_s:
            seen = watcher.seen()
            results = {x.key for x in seen if x.topic in outs}
            dead = {x.key for x in seen if x.topic in dlqs}
            if expected <= results and hostile <= dead:
                self.current.drained = True
                break
            self._sleep_until(time.time() + 0.5)
        self.current.drain_s = round(time.monotonic() - start, 1)
        self._sleep_until(time.time() + self.o.settle_s)

    def _check_alive(self, timeout_s: float = 30.0) -> None:
        """Every worker must be serving at the end: alive but not ready is a stuck worker
        (a moment of rebalancing is allowed for)."""
        deadline = time.time() + timeout_s
        waiting = list(self.workers)
        while waiting and time.time() < deadline:
            waiting = [w for w in waiting if not w.ready()]
            self._sleep_until(time.time() + 0.5)
        self.current.errors += [f"{w.name} not ready at the end (stuck)" for w in waiting]

    def _check(self, report: RoundReport, traffic: Traffic, seen: list[Seen], rs: Settings) -> None:
        topics = Topics(rs.topic_prefix)
        outs = {topics.out(r) for r in ROUTES}
        results = [x for x in seen if x.topic in outs]
        dead = [x for x in seen if x.topic in (topics.dlq, topics.dlq_parked)]
        expected = [t for t in traffic.sent if t in traffic.acked]
        tally = check_exactly_once(expected, (x.key for x in results), set(traffic.sent))
        lost = set(tally.lost)
        hostile = {k for k in traffic.hostile_sent if k in traffic.acked}
        report.published, report.publish_failed = len(expected), len(traffic.failed)
        report.results, report.unexpected = len(results), len(tally.unexpected)
        report.lost, report.lost_ids = len(tally.lost), tally.lost[:SAMPLE]
        report.doubled = len(tally.doubled)
        report.doubled_ids = dict(list(tally.doubled.items())[:SAMPLE])
        # once per ticket: a redelivered record may be dead-lettered twice
        report.lost_in_dlq = dict(
            Counter({x.key: x.dead_letter for x in dead if x.key in lost}.values())
        )
        report.dlq_duplicates = len(dead) - len({x.key for x in dead})
        report.dlq_expected = len(hostile)
        report.dlq_missing = sorted(hostile - {x.key for x in dead})
        report.dlq_found = len(hostile) - len(report.dlq_missing)
        report.dlq_parked = sum(1 for x in dead if x.topic == topics.dlq_parked)
        times = sorted(x.at for x in results)
        report.flow_per_s = per_second(times, self.t0, int(time.time() - self.t0) + 1)
        for f in report.faults:
            flow_figures(f, times, self.t0, self.published_until)
        if lost:
            report.where_lost = locate(confluent_config(rs), rs.topic_prefix, set(tally.lost[:3]))


def _finish(thread: Traffic | Watcher) -> None:
    thread.halt.set()
    thread.join(180)


def main(settings: Settings, options: Options, out: Path) -> int:
    """Run the campaign, write chaos.json and chaos.png, print a summary; 1 unless exact."""
    console.print(
        f"chaos: {options.rounds} round(s) of {options.round_s:.0f} s, {options.workers} "
        f"workers, {options.rate:.0f} tickets/s, seed {options.seed}, faults "
        f"{','.join(options.faults)}, hostile {','.join(options.hostile) or 'none'}; "
        f"Kafka at {settings.kafka_bootstrap}"
    )
    campaign = Campaign(settings, options, lambda r: console.print(round_line(r, options.rounds)))
    try:
        campaign.run()
    except ChaosError as exc:
        console.print(f"[red]chaos: {exc}[/]")
        return 2
    finally:
        if campaign.rounds:
            json_path, png = write_report(campaign.report(), out)
            console.print(f"report: {json_path}  plot: {png}")
    return print_summary(campaign.report(), console)
