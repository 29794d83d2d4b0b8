"""Issue 12: a step scaled on its own. `infer` runs in a pool worker of its own (its own
consumer group, no state table); the home worker runs every other step and keeps the
state. A SIGKILL of the pool mid-stream loses no ticket and doubles none."""

from __future__ import annotations

import threading
import urllib.request

import orjson
import pytest

from devstack import app_processes
from streams.admin import topic_size
from tests.integration.kafka_helpers import tickets
from tests.integration.test_faults import PrivatePipeline, assert_exactly_once

pytestmark = pytest.mark.integration

HOME_STEPS = "validate,clean,features,rules,route"  # the complement of the pool's
POOL_STEPS = "infer"


class PooledPipeline(PrivatePipeline):
    """The home worker and one `infer` pool, each a process of its own, on one prefix."""

    def __init__(self) -> None:
        super().__init__()
        port = app_processes.free_port()
        self.pool_env = {**self.env, "TICKETFLOW_WORKER_WEB_PORT": str(port)}
        self.pool_settings = self.settings.model_copy(update={"worker_web_port": port})
        self.pool: app_processes.Service | None = None
        self._pool_starts = 0

    def start_worker(self) -> None:
        self._starts += 1
        name = f"worker-{self.settings.topic_prefix}home-{self._starts}"
        self.worker = app_processes.start_worker(
            self.settings, self.env, name, loglevel="info", steps=HOME_STEPS
        )

    def start_pool(self) -> None:
        self._pool_starts += 1
        name = f"worker-{self.settings.topic_prefix}infer-{self._pool_starts}"
        self.pool = app_processes.start_worker(
            self.pool_settings, self.pool_env, name, loglevel="info", steps=POOL_STEPS
        )

    def close(self) -> None:
        if self.pool is not None:
            self.pool.stop()
        super().close()


def step_runs(port: str, step: str) -> float:
    """How many batches of `step` a worker ran, from its /metrics (0 when it has none)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    prefix = f'workflow_step_duration_seconds_count{{step="{step}"}}'
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(prefix))


def state_of(port: str, ticket_id: str) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/ticket/{ticket_id}", timeout=5) as r:
        return orjson.loads(r.read())


@pytest.fixture
def pooled(live_stack, gateway):
    p = PooledPipeline()
    p.start_worker()
    p.start_pool()
    yield p
    p.close()


def test_infer_in_a_pool_of_its_own_gives_exactly_one_result_through_a_sigkill(pooled):
    p = pooled
    batch = tickets(2000, "pool", seed=47)
    # 10 s of traffic, so that the kill lands with tickets still arriving
    feeder = threading.Thread(target=p.publish, args=(batch, 200), daemon=True)
    feeder.start()
    p.watch.until(lambda rs: len(rs) >= 500, 120, settle_s=0)
    p.pool.kill()
    assert len(p.watch.records) < len(batch), "the kill came after the last result"
    p.start_pool()
    feeder.join(120)
    records = p.results_for(batch, 240)
    assert_exactly_once(batch, records, p)

    home_port, pool_port = (
        p.env["TICKETFLOW_WORKER_WEB_PORT"],
        p.pool_env["TICKETFLOW_WORKER_WEB_PORT"],
    )
    # infer ran in the pool only (the restarted one too), and every result went through it
    assert step_runs(home_port, "infer") == 0
    assert step_runs(pool_port, "infer") > 0
    assert all(
        "infer" in [e["step"] for e in orjson.loads(m.value())["decision_path"]] for m in records
    )
    # the pool's moves reached the home worker's table: at least one per ticket was sent,
    # and a ticket's history shows `running rules`, which only infer's hop writes (a move
    # that arrives after the home worker took the ticket further is rightly ignored)
    assert topic_size(p.settings, p.topics.state) >= len(batch)
    states = [state_of(home_port, t["ticket_id"]) for t in batch[:: len(batch) // 40]]
    assert all(s["status"] in {"completed", "awaiting_review", "degraded"} for s in states)
    assert any(h[:2] == ["rules", "running"] for s in states for h in s["history"]), states[:2]
