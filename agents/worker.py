"""The workflow worker: builds the Faust app with one agent per step and runs it.

By default a worker runs every step; with `--steps` it runs some of them, as the home
worker (which keeps the state table) or as a pool (agents/step_selection.py).
"""

from __future__ import annotations

import contextlib
import logging

import faust
import mode
from faust.exceptions import ConsumerNotStarted
from prometheus_client import generate_latest

from agents.definition import Workflows, load_workflows
from agents.engine import Dependencies, WorkflowEngine
from agents.probes import DependencyProbe, record_lag
from agents.step_selection import StepSet, step_set
from agents.topology import Topology
from feature_jobs.reader import OnlineFeatureReader
from feature_jobs.views import VIEWS
from inference_gateway.client import GatewayClient
from streams import faust_adapter, recovery_watch
from streams.admin import ensure_topics, pipeline_topics
from streams.app import create_app, tune_gc, use_uvloop
from streams.faust_adapter import restore_seconds
from streams.gaps import GapGuard, KafkaProbe
from streams.kafka_config import aiokafka_kwargs
from streams.settings import Settings

log = logging.getLogger(__name__)


def _definitions(settings: Settings) -> Workflows:
    # every workflow the selector may pick, and earlier versions, kept so that tickets
    # started on them finish on them (agents/definition.py)
    return load_workflows(settings.workflow_file, settings.workflow_selector_file)


def _topology(workflows: Workflows) -> Topology:
    return Topology(workflows.default, workflows.others(), workflows.selector)


def worker_steps(settings: Settings) -> StepSet:
    """The steps this worker runs, or StepSetError (unknown steps, kept steps in a pool)."""
    return step_set(settings.worker_steps, _topology(_definitions(settings)))


def build_worker(settings: Settings) -> tuple[faust.App, WorkflowEngine]:
    workflows = _definitions(settings)
    steps = step_set(settings.worker_steps, _topology(workflows))
    # a pool is a consumer group of its own: Faust's assignor co-partitions every topic
    # of a group, and assumes each member subscribes to all of them
    app = create_app(settings, app_id=steps.app_id)
    deps = Dependencies(
        gateway=GatewayClient(settings.gateway_url),
        features=OnlineFeatureReader(settings.redis, VIEWS),
    )
    engine = WorkflowEngine(
        app, workflows.default, settings, deps, workflows.others(), steps, workflows.selector
    )
    engine.build()
    # our topics get their partition counts and configs before Faust would auto-create them
    names = [s.name for s in engine.later_steps()]
    topics = pipeline_topics(engine.topics, names, engine.topology.routes)
    if steps.home:
        # the state table's changelog too: a worker that subscribes before it exists never
        # learns its partitions, and every state write then fails (two workers starting on
        # fresh topics at once)
        topics[engine.table.changelog_topic.get_topic_name()] = {"cleanup.policy": "compact"}
    ensure_topics(settings, topics)
    log.info("worker %s runs %s", app.conf.id, ", ".join(sorted(steps.steps)))

    @app.timer(1.0)
    async def _breaker_clock() -> None:
        engine.breaker.refresh()

    # Faust would commit past records its fetcher dropped: read them again (streams/gaps.py)
    isolation = "read_committed" if app.in_transaction else "read_uncommitted"
    probe = KafkaProbe(aiokafka_kwargs(settings), app.conf.id, isolation)
    gaps = GapGuard(app, engine.topics.written_by_workers, probe)
    gaps.install()

    @app.timer(0.5)
    async def _gap_clock() -> None:
        try:
            await gaps.check()
        except Exception:  # a seek during a broker outage: the next tick tries again
            log.warning("gap guard check failed", exc_info=True)

    restore = recovery_watch.watch(app)

    # started with the table manager: Faust starts app timers and services only once the
    # first restore has ended, the one they would have to watch
    class _RestoreWatch(mode.Service):
        @mode.Service.timer(5.0)
        async def _restore_clock(self) -> None:
            try:
                await restore.check()
            except Exception:  # a seek during a broker outage: the next tick tries again
                log.warning("table restore watch failed", exc_info=True)

    app.tables.add_dependency(_RestoreWatch())

    dependencies = DependencyProbe(settings)

    @app.timer(5.0)
    async def _probe_clock() -> None:
        # gauges for the alert rules (agents/probes.py)
        await dependencies.check()
        # before the consumer has started there is no lag to tell yet
        with contextlib.suppress(ConsumerNotStarted):
            record_lag(app.consumer)

    @app.page("/metrics")
    async def _metrics(web, request):
        # aiohttp refuses a charset inside content_type; Prometheus reads this one fine
        return web.bytes(generate_latest(), content_type="text/plain; version=0.0.4")

    @app.page("/ready")
    async def _ready(web, request):
        # ready = partitions assigned and every table restored from its changelog
        recovered = faust_adapter.tables_recovered(app)
        try:
            assigned = bool(faust_adapter.assignment(app))
        except ConsumerNotStarted:  # asked before the consumer has started: not ready
            assigned = False
        ok = recovered and assigned and not app.rebalancing
        body: dict[str, bool | float] = {"ready": ok, "recovered": recovered, "assigned": assigned}
        restore_s = restore_seconds(app)  # how long the last table restore took
        if restore_s is not None:
            body["restore_s"] = round(restore_s, 3)
        return web.json(body, status=200 if ok else 503)

    if steps.home:
        _ticket_view(app, engine)

    @app.service
    class _CloseClients(mode.Service):
        async def on_stop(self) -> None:
            await deps.gateway.close()
            await deps.features.close()
            await probe.close()
            await dependencies.close()
            engine.close()

    return app, engine


def _ticket_view(app: faust.App, engine: WorkflowEngine) -> None:
    """`/ticket/{id}`: the ticket's state, from the home worker that owns its partition."""
    table = engine.table

    @app.page("/ticket/{ticket_id}")
    @app.table_route(table=table, match_info="ticket_id")
    async def _ticket(web, request, ticket_id: str):
        state = table.get(ticket_id)
        if state is None:
            return web.json({"error": f"unknown ticket {ticket_id}"}, status=404)
        return web.json(state)


def run_worker(settings: Settings, loglevel: str = "warning") -> None:
    # the clients log every produced record at DEBUG: building those records is measurable
    level = max(logging.INFO, logging.getLevelName(loglevel.upper()))
    for name in ("aiokafka", "faust", "mode"):
        logging.getLogger(name).setLevel(level)
    use_uvloop()
    app, _ = build_worker(settings)
    tune_gc()
    worker = faust.Worker(app, loglevel=loglevel, quiet=True)
    worker.execute_from_commandline()
